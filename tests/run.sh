#!/usr/bin/env bash
# The whole test suite, as CI runs it, from a fresh clone:
#   1. .venv: plugrl with its test extras, and every plugin distribution of this repository
#      (megatron-core comes with plugrl-megatron, which is tested for real on the CPU);
#   2. the main suite in .venv;
#   3. the vLLM suite in .venv-vllm (vLLM's CPU build pins its own transformers), made by
#      plugins/rollout/vllm/test-env.sh over a build of vLLM cached outside the clone.
# Both suites run even when the first fails; the exit status is 1 when either failed.
# Arguments are passed to the main suite's pytest (tests/run.sh -m "not slow" for the fast tier).
set -uo pipefail
cd "$(dirname "$0")/.."

phase() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }
started=$SECONDS

phase "1/3 installing the test environment into .venv (about a minute from the package cache, up to 12 without it)"
python3 -m venv .venv || exit 1
# setuptools first, so that the five editable distributions below build with it rather than
# each in an isolated build environment of its own, which pip would fill with setuptools
.venv/bin/pip install --progress-bar off -q -c constraints/cpu.txt "setuptools>=77" || exit 1
# not byte-compiled here: pip would compile every installed file on one core (a minute), while
# the suite imports a fraction of them and writes their bytecode as it goes
.venv/bin/pip install --progress-bar off --no-build-isolation --no-compile \
    -c constraints/cpu.txt \
    -e ".[test]" \
    -e "./plugins/backends/megatron[megatron]" \
    -e ./plugins/rollout/vllm \
    -e ./plugins/rollout/sglang \
    -e ./plugins/devices/npu \
    | grep --line-buffered -E '^(Collecting|Successfully|ERROR)'
[[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "installing the test environment failed" >&2; exit 1; }
# where it is set, every process the tests start (runs, Ray workers, ranks) would compile what
# it imports again; unset, the first import of a module writes its bytecode once
unset PYTHONDONTWRITEBYTECODE

phase "2/3 the main suite, two test processes (about 9 minutes on 2 cores)"
# two processes: most tests wait on subprocesses, Ray actors or reward workers rather than
# compute, so a second one roughly halves the suite's time on 2 cores (pytest-xdist); a module
# runs whole in one process (loadscope), so its module fixtures (a Ray cluster, a reference
# run, a model) are made once, not once in each process that gets some of its tests; modules
# with end-to-end runs go first (tests/conftest.py), so the short ones even out the end
.venv/bin/python -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder "$@"
main=$?

phase "3/3 the vLLM suite in .venv-vllm (first run on a machine: about 3 minutes to build vLLM's CPU build into a cache)"
plugins/rollout/vllm/test-env.sh
vllm=$?

phase "done in $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s"
echo "main suite: $([[ $main -eq 0 ]] && echo passed || echo "FAILED (exit $main)")"
echo "vLLM suite: $([[ $vllm -eq 0 ]] && echo passed || echo "FAILED (exit $vllm)")"
(( main == 0 && vllm == 0 ))
