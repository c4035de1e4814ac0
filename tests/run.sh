#!/usr/bin/env bash
# The whole test suite, as CI runs it, from a fresh clone:
#   1. the vLLM suite in .venv-vllm (vLLM's CPU build pins its own transformers), made by
#      plugins/rollout/vllm/test-env.sh over a build of vLLM cached outside the clone, runs in
#      the background from the start: it needs nothing of .venv, and installing .venv keeps
#      about one core busy of two;
#   2. .venv: plugrl with its test extras, and every plugin distribution of this repository
#      (megatron-core comes with plugrl-megatron, which is tested for real on the CPU);
#   3. the main suite in .venv, then the vLLM suite's report.
# Both suites run whatever the other does (the main one not when .venv fails to install); the
# exit status is 1 when either failed or did not run.
# Arguments are passed to the main suite's pytest (tests/run.sh -m "not slow" for the fast tier).
set -uo pipefail
cd "$(dirname "$0")/.."

# where it is set, every process the tests start (runs, Ray workers, ranks) would compile what
# it imports again; unset, the first import of a module writes its bytecode once
unset PYTHONDONTWRITEBYTECODE

phase() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }
started=$SECONDS

phase "1/3 the vLLM suite in the background (its environment first: seconds once cached, about 3 minutes to build it on a machine's first run)"
vllm_log="$(mktemp)"
vllm_pid=""
# an interrupted run (Ctrl-C, CI's SIGTERM) stops the background suite too
trap '[[ -n "$vllm_pid" ]] && kill "$vllm_pid" 2>/dev/null; rm -f "$vllm_log"' EXIT
trap 'exit 130' INT TERM
# made before .venv's install, not beside it: both editable installs build
# plugins/rollout/vllm in place
if plugins/rollout/vllm/test-env.sh --prepare; then
    plugins/rollout/vllm/test-env.sh >"$vllm_log" 2>&1 &
    vllm_pid=$!
else
    vllm=$?
    echo "making .venv-vllm failed: the vLLM suite does not run" >&2
fi

install_venv() {
    python3 -m venv .venv || return 1
    # setuptools first, so that the five editable distributions below build with it rather
    # than each in an isolated build environment of its own, which pip would fill with
    # setuptools
    .venv/bin/pip install --progress-bar off -q -c constraints/cpu.txt "setuptools>=77" || return 1
    # not byte-compiled here: pip would compile every installed file on one core (a minute),
    # while the suite imports a fraction of them and writes their bytecode as it goes
    .venv/bin/pip install --progress-bar off --no-build-isolation --no-compile \
        -c constraints/cpu.txt \
        -e ".[test]" \
        -e "./plugins/backends/megatron[megatron]" \
        -e ./plugins/rollout/vllm \
        -e ./plugins/rollout/sglang \
        -e ./plugins/devices/npu \
        | grep --line-buffered -E '^(Collecting|Successfully|ERROR)'
    return "${PIPESTATUS[0]}"
}

phase "2/3 installing the test environment into .venv (about a minute from the package cache, up to 12 without it)"
if install_venv; then
    phase "3/3 the main suite, two test processes (about 10 minutes on 2 cores)"
    # two processes (pytest-xdist), one a core: with one, a core idles while a test waits on
    # the subprocesses, Ray actors and reward workers it starts; a module runs whole in one
    # process (loadscope), so its module fixtures (a Ray cluster, a reference run, a model)
    # are made once, not once in each process that gets some of its tests; modules with
    # end-to-end runs go first (tests/conftest.py), so the short ones even out the end
    .venv/bin/python -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder "$@"
    main=$?
else
    main=1
    echo "installing the test environment failed: the main suite does not run" >&2
fi

if [[ -n "$vllm_pid" ]]; then
    wait "$vllm_pid"
    vllm=$?
    vllm_pid=""
    phase "the vLLM suite's report"
    cat "$vllm_log"
fi

phase "done in $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s"
echo "main suite: $([[ $main -eq 0 ]] && echo passed || echo "FAILED (exit $main)")"
echo "vLLM suite: $([[ $vllm -eq 0 ]] && echo passed || echo "FAILED (exit $vllm)")"
(( main == 0 && vllm == 0 ))
