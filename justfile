# Kinference's recipes. `just --list` shows them.

set shell := ["bash", "-euo", "pipefail", "-c"]

default:
    @just --list

# Build everything (debug).
build:
    cargo build --workspace --all-targets

# Run the whole test suite (the README's test command).
test:
    cargo nextest run --workspace

# Formatting and lints, as CI would want them.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings

# Format the code.
fmt:
    cargo fmt --all

# Criterion benchmarks of the pure crates (results go to docs/benchmarks/ by hand, with the command).
bench:
    cargo bench -p kinference-sim
    cargo bench -p kinference-routing
    cargo bench -p kinference-classify

# Run the whole system locally: controller, simulated fleet and proxy (the README's first command).
run *ARGS:
    cargo run -p kinference-viz -- local {{ARGS}}

# Run a simulated vLLM fleet on loopback: two glm-5.3 and two qwen-3.6-27b replicas.
sim *ARGS:
    cargo run --release -p kinference-vllm-sim --bin vllm-sim -- fleet --replicas glm-5.3=2,qwen-3.6-27b=2 --base-port 8001 --enable-server-load-tracking {{ARGS}}

# Run one simulated replica.
sim-one PROFILE="qwen-3.6-27b" PORT="8001" *ARGS:
    cargo run --release -p kinference-vllm-sim --bin vllm-sim -- serve --profile {{PROFILE}} --port {{PORT}} {{ARGS}}

# Regenerate the simulator's curves (TTFT against prompt length, throughput against concurrency).
sim-curves:
    mkdir -p target/sim-curves
    cargo run --release -p kinference-sim --bin sim-curves > target/sim-curves/curves.csv
    python3 scripts/plot_sim_curves.py target/sim-curves/curves.csv docs/benchmarks/sim-engine

# Regenerate the CRD YAML in charts/ from the Rust types.
crds:
    cargo run -p kinference-api --bin kinference-crdgen

# Retrain the complexity classifier from ../shared/classify (fixed split).
classify-train:
    cargo run --release -p kinference-classify --bin kinference-classify-train -- --data ../shared/classify --out proxy/classify/model/complexity-v1.json

# Evaluate the complexity classifier on the held-out split; writes docs/benchmarks/classification.md.
classify-eval:
    python3 scripts/plot_classify.py

# Run the policy controller on the example manifests.
controller:
    cargo run -p kinference-policy-controller -- --manifests examples --grpc-addr 127.0.0.1:8090 --admin-addr 127.0.0.1:9990

# The fleet benchmark: every strategy on every workload in virtual time (release; under 10 minutes).
fleet SUITE="full" SEED="1":
    cargo build --release -p kinference-fleet
    ./target/release/kinference-fleet --suite {{SUITE}} --seed {{SEED}} --out docs/benchmarks/fleet
    python3 scripts/plot_fleet.py docs/benchmarks/fleet/results.csv docs/benchmarks/fleet

# Kinference against the field over seeds FIRST..LAST (about 35 s a seed on 2 cores): per-seed and per-cell ratios.
fleet-seeds FIRST="1" LAST="12" OUT="/tmp/kinference-fleet-seeds":
    cargo build --release -p kinference-fleet
    for s in $(seq {{FIRST}} {{LAST}}); do \
        ./target/release/kinference-fleet --suite full --seed $s --strategies round-robin,random,least-request,peak-ewma-p2c,gie-default,llm-d-precise,dynamo-kv,sglang-cache-aware,aibrix-prefix --out {{OUT}}/peers-s$s > /dev/null && \
        ./target/release/kinference-fleet --suite full --seed $s --strategies kinference --out {{OUT}}/k-s$s > /dev/null || exit 1; \
    done
    python3 scripts/fleet_seeds.py --peers '{{OUT}}/peers-s{seed}' --kinference '{{OUT}}/k-s{seed}' --seeds {{FIRST}}-{{LAST}}

# Kinference's prediction error against utilisation over seeds FIRST..LAST, from `fleet-seeds`'s
# runs in OUT and one run past saturation for each fleet's capacity (about 15 s).
fleet-utilization FIRST="1" LAST="12" OUT="/tmp/kinference-fleet-seeds":
    cargo build --release -p kinference-fleet
    ./target/release/kinference-fleet --suite full --strategies kinference --workloads shared-prefix,mooncake,azure,two-model --loads 5,6,8,10,12,16,24,40,60,80 --out {{OUT}}/overload > /dev/null
    python3 scripts/fleet_utilization.py --kinference '{{OUT}}/k-s{seed}' --seeds {{FIRST}}-{{LAST}} --overload {{OUT}}/overload
