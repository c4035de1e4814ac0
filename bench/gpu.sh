#!/usr/bin/env bash
# plugrl's GRPO step on one GPU, in the units peers publish (bench/bench_gpu.py), then the
# device's smoke test; about 4-6 minutes on an H100, nothing downloaded.
#
#   bash bench/gpu.sh [--cpu-tiny] [--wheels DIR] [bench_gpu.py options...]
#
# Where plugrl is installed (`pip install -e .`) it runs as it is. On a machine without a
# package registry, --wheels DIR (or PLUGRL_WHEELS=DIR) installs plugrl and the dependencies
# it lacks from wheels in DIR, without the network, into a scratch folder put on PYTHONPATH.
# --cpu-tiny runs the same path on a tiny model on the CPU (under a minute), without the smoke.
# Results: ${OUT:-bench/results}/gpu-bench.json and gpu-bench.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
wheels="${PLUGRL_WHEELS:-}"
# the folder of wheels prepared beside the checkout for a machine without a registry
[[ -z "$wheels" && -d .whl ]] && wheels=.whl
args=()
while (($#)); do
    case "$1" in
        --wheels) wheels="$2"; shift 2 ;;
        --wheels=*) wheels="${1#--wheels=}"; shift ;;
        --cpu-tiny) args+=(--device cpu --shapes tiny --no-smoke); shift ;;
        *) args+=("$1"); shift ;;
    esac
done

if ! "$PYTHON" -c "import plugrl_fsdp2, plugrl_hf, plugrl_cuda" 2>/dev/null; then
    if [[ -z "$wheels" ]]; then
        echo "plugrl is not installed: pip install -e . (or --wheels DIR on a machine without a registry)" >&2
        exit 2
    fi
    shopt -s nullglob
    found=("$wheels"/*.whl)
    if ((${#found[@]} == 0)); then
        echo "--wheels $wheels: no .whl files there" >&2
        exit 2
    fi
    site="$(mktemp -d -t plugrl-site-XXXXXX)"
    echo "installing ${#found[@]} wheels from $wheels into $site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" "${found[@]}"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    "$PYTHON" -c "import plugrl_fsdp2, plugrl_hf, plugrl_cuda"
fi

exec "$PYTHON" bench/bench_gpu.py "${args[@]}"
