#!/usr/bin/env bash
# The latency benchmarks that a shared 2-core machine cannot measure, run on a quiet machine from
# prebuilt binaries: the proxy overhead benchmark (direct vs nginx vs kinference-proxy, as
# scripts/bench_proxy.sh) and the routing core's criterion decision benchmark.
#
#   scripts/bench_quiet_machine.sh prepare DIR   # here: release builds, stripped, plus nginx and
#                                                # the shared libraries it needs, into DIR
#   scripts/bench_quiet_machine.sh run DIR OUT   # there: writes OUT/proxy/results.* and
#                                                # OUT/decision.txt, and OUT/machine.txt
#
# The quiet machine needs no Rust toolchain and no nginx package: everything runs from DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:?prepare or run}
dir=${2:?binary directory}

case "$cmd" in
prepare)
    command -v nginx >/dev/null || { echo "nginx not found: apt-get install -y nginx" >&2; exit 1; }
    target=${CARGO_TARGET_DIR:-target}
    cargo build --release -p kinference-proxy --bin kinference-proxy -p kinference-loadgen \
        -p kinference-policy-controller --bin kinference-policy-controller
    bench=$(cargo bench -p kinference-routing --bench decision --no-run --message-format json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "decision":
        print(m["executable"])')
    mkdir -p "$dir/lib"
    for b in kinference-proxy kinference-loadgen kinference-policy-controller; do
        cp "$target/release/$b" "$dir/$b"
    done
    cp "$bench" "$dir/decision-bench"
    cp "$(command -v nginx)" "$dir/nginx"
    # nginx's libraries beyond glibc, so a machine without the package can run it.
    ldd "$(command -v nginx)" | awk '/=> \// {print $3}' | grep -v -e libc.so -e ld-linux |
        xargs -I{} cp -L {} "$dir/lib/"
    strip "$dir"/kinference-* "$dir/decision-bench"
    du -sh "$dir"
    ;;
run)
    out=${3:?output directory}
    mkdir -p "$out"
    { nproc; grep -m1 'model name' /proc/cpuinfo; uptime; } > "$out/machine.txt"
    # The routing decision (2 models x 32 endpoints, 8,000-token prompt), criterion's estimates.
    (cd "$out" && CRITERION_HOME="$out/criterion" "$dir/decision-bench" --bench \
        --warm-up-time 1 --measurement-time 3) > "$out/decision.txt" 2>&1
    # The overhead benchmark, the same harness and settings as scripts/bench_proxy.sh but
    # shorter rounds, at 1,000 requests/s.
    LD_LIBRARY_PATH="$dir/lib" "$dir/kinference-loadgen" bench \
        --proxy-bin "$dir/kinference-proxy" \
        --controller-bin "$dir/kinference-policy-controller" \
        --nginx-bin "$dir/nginx" \
        --examples examples --out-dir "$out/proxy" \
        --rate-per-s 1000 --warmup-s 3 --duration-s "${DURATION_S:-10}" --rounds "${ROUNDS:-2}" \
        > "$out/loadgen.log" 2>&1
    ;;
*)
    echo "usage: $0 prepare DIR | run DIR OUT" >&2
    exit 2
    ;;
esac
