"""run_in_process: results back, errors as their last line, timeouts that leave nothing
running, and the resource limits a worker applies."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from plugrl.agents import limits, processes
from plugrl.agents.processes import RemoteError, ResourceLimits, ToolTimeout, run_in_process

FUNCTIONS = """
import os
import subprocess
import time


def add(a, b):
    return a + b


async def add_later(a, b):
    return a + b


def pid():
    return os.getpid()


def hang_with_child(pid_file, leave_the_group=False):
    child = subprocess.Popen(["sleep", "1000"], start_new_session=leave_the_group)
    with open(pid_file, "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    while True:
        time.sleep(1)


def fail(name):
    raise ValueError(f"no such file: {name}")


def die():
    os._exit(3)


def unpicklable():
    return lambda: None


def allocate(megabytes):
    return len(bytearray(megabytes * 1024 * 1024))


def spin():
    while True:
        pass


def write(path, megabytes):
    with open(path, "wb") as f:
        f.write(b"x" * megabytes * 1024 * 1024)
"""


@pytest.fixture(scope="module")
def functions(tmp_path_factory):
    folder = tmp_path_factory.mktemp("process-functions")
    (folder / "process_functions.py").write_text(FUNCTIONS, encoding="utf-8")
    sys.path.insert(0, str(folder))
    yield "process_functions"
    sys.path.remove(str(folder))
    processes.close_workers()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped by its new parent, does
    not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_a_result_comes_back_and_the_worker_stays_warm(functions):
    assert asyncio.run(run_in_process(f"{functions}:add", 2, 3, timeout_s=30)) == 5
    assert asyncio.run(run_in_process(f"{functions}:add_later", 2, 3, timeout_s=30)) == 5
    first = asyncio.run(run_in_process(f"{functions}:pid", timeout_s=30))
    assert asyncio.run(run_in_process(f"{functions}:pid", timeout_s=30)) == first


def test_calls_run_at_once_in_workers_of_their_own(functions):
    async def together():
        return await asyncio.gather(
            *(run_in_process(f"{functions}:add", i, 1, timeout_s=30) for i in range(6))
        )

    assert asyncio.run(together()) == [1, 2, 3, 4, 5, 6]
    assert len(processes._idle) <= processes.MAX_IDLE_WORKERS


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_timeout_kills_the_worker_and_the_processes_it_started(functions, tmp_path):
    pid_file = tmp_path / "pids"
    with pytest.raises(ToolTimeout) as raised:
        asyncio.run(run_in_process(f"{functions}:hang_with_child", str(pid_file), timeout_s=1.5))
    assert str(raised.value) == (
        f"{functions}:hang_with_child took over 1.5 s; its process was killed"
    )
    worker, child = (int(p) for p in pid_file.read_text().split())
    assert not alive(worker)
    deadline = time.monotonic() + 10  # the orphaned child dies as its SIGKILL lands
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
    # the next call gets a fresh worker
    assert asyncio.run(run_in_process(f"{functions}:pid", timeout_s=30)) != worker


def test_a_timeout_kills_a_child_that_left_the_process_group(functions, tmp_path):
    # the drill: a child that called setsid() escaped the group kill and ran on
    pid_file = tmp_path / "pids"
    with pytest.raises(ToolTimeout):
        asyncio.run(
            run_in_process(f"{functions}:hang_with_child", str(pid_file), True, timeout_s=1.5)
        )
    _, child = (int(p) for p in pid_file.read_text().split())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_an_exception_comes_back_as_its_last_line(functions):
    with pytest.raises(RemoteError) as raised:
        asyncio.run(run_in_process(f"{functions}:fail", "a.txt", timeout_s=30))
    assert str(raised.value) == "ValueError: no such file: a.txt"
    assert "in fail" in raised.value.remote_traceback


def test_an_unknown_module_comes_back_as_an_error(functions):
    with pytest.raises(RemoteError, match=r"^ModuleNotFoundError: No module named 'nowhere'$"):
        asyncio.run(run_in_process("nowhere:f", timeout_s=30))


def test_a_worker_that_dies_says_how(functions):
    with pytest.raises(RemoteError) as raised:
        asyncio.run(run_in_process(f"{functions}:die", timeout_s=30))
    assert str(raised.value) == (f"the worker process running {functions}:die died (exit code 3)")


def test_a_result_that_does_not_pickle_is_an_error(functions):
    with pytest.raises(RemoteError) as raised:
        asyncio.run(run_in_process(f"{functions}:unpicklable", timeout_s=30))
    assert str(raised.value).startswith(
        f"the result of {functions}:unpicklable cannot be pickled ("
    )
    assert str(raised.value).endswith("); return plain data (str, numbers, lists, dicts)")


def test_arguments_are_checked_before_a_worker_starts():
    with pytest.raises(ValueError) as raised:
        asyncio.run(run_in_process("no_colon", timeout_s=1))
    assert str(raised.value) == (
        "run_in_process takes a 'module:function' path, got 'no_colon'; "
        "write it as 'package.module:function'"
    )
    with pytest.raises(ValueError, match=r"^run_in_process needs a positive timeout_s, got 0$"):
        asyncio.run(run_in_process("m:f", timeout_s=0))
    with pytest.raises(TypeError) as raised:
        asyncio.run(run_in_process("m:f", lambda: None, timeout_s=1))
    assert str(raised.value).startswith("the arguments of m:f cannot be pickled (")
    assert str(raised.value).endswith("pass plain data (str, numbers, lists, dicts)")


def test_cancelling_the_call_kills_its_worker(functions, tmp_path):
    pid_file = tmp_path / "pids"

    async def cancel():
        task = asyncio.ensure_future(
            run_in_process(f"{functions}:hang_with_child", str(pid_file), timeout_s=60)
        )
        while not pid_file.exists() or not pid_file.read_text():
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    worker, _ = (int(p) for p in pid_file.read_text().split())
    assert not alive(worker)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux resource limits")
def test_limits_stop_memory_cpu_and_file_size(functions, tmp_path):
    with pytest.raises(RemoteError, match=r"^MemoryError"):
        asyncio.run(
            run_in_process(
                f"{functions}:allocate", 2048, timeout_s=30, limits=ResourceLimits(memory_mb=1024)
            )
        )
    with pytest.raises(RemoteError, match=r"died \(killed by SIG(XCPU|KILL)\)$"):
        asyncio.run(
            run_in_process(f"{functions}:spin", timeout_s=60, limits=ResourceLimits(cpu_s=1))
        )
    with pytest.raises(RemoteError, match=r"died \(killed by SIGXFSZ\)$|^OSError"):
        asyncio.run(
            run_in_process(
                f"{functions}:write",
                str(tmp_path / "big"),
                4,
                timeout_s=30,
                limits=ResourceLimits(file_size_mb=1),
            )
        )
    # a limited worker is not kept: the next call runs without the limits
    assert asyncio.run(run_in_process(f"{functions}:allocate", 64, timeout_s=30)) == 64 << 20


def test_user_tasks_counts_this_process():
    assert limits.user_tasks() >= (1 if os.path.isdir("/proc") else 0)


def test_a_worker_that_cannot_start_says_what_to_check(monkeypatch):
    processes.close_workers()
    monkeypatch.setattr(processes, "_WORKER_CODE", "import sys\nsys.exit(5)\n")
    with pytest.raises(RemoteError) as raised:
        asyncio.run(run_in_process("m:f", timeout_s=30))
    assert str(raised.value) == (
        f"a worker process ended as it started (exit code 5); check that {sys.executable} "
        "-c 'import plugrl' runs"
    )
    monkeypatch.setattr(processes, "_WORKER_CODE", "import time\ntime.sleep(60)\n")
    monkeypatch.setattr(processes, "START_TIMEOUT_S", 0.5)
    with pytest.raises(RemoteError) as raised:
        asyncio.run(run_in_process("m:f", timeout_s=30))
    assert str(raised.value) == (
        f"a worker process did not start in 0.5 s; check that {sys.executable} "
        "-c 'import plugrl' runs"
    )
