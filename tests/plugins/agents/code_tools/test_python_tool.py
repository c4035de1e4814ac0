"""The python tool: output back, limits that stop a program, nothing left running, a fresh
empty folder, no network where the kernel allows it."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time

import pytest

from plugrl.agents import limits
from plugrl.parts.agent import ToolArgumentError, ToolContext
from plugrl_code_tools.python import PythonTool, PythonToolConfig

CONTEXT = ToolContext(row={}, sample_id="uid/0")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux limits")


def run(code: str, **options):
    tool = PythonTool(PythonToolConfig(**options), None)
    return asyncio.run(tool.call({"code": code}, CONTEXT))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def running_with(argument: str) -> list[int]:
    """The live processes (seen from here: a PID namespace numbers its own) whose command line
    holds ``argument``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if argument.encode() in f.read().split(b"\0") and alive(int(entry.name)):
                        found.append(int(entry.name))
            except OSError:
                pass
    return found


def wait_gone(argument: str, seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := running_with(argument)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_output_errors_and_exit_code_come_back():
    result = run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert result.text == "out\nerr\n[exit code 3]"
    assert result.metrics["exit_code"] == 3.0 and result.metrics["timed_out"] == 0.0
    assert run("pass").text == "[no output]"
    traceback = run("1/0").text
    assert traceback.splitlines()[-2:] == ["ZeroDivisionError: division by zero", "[exit code 1]"]


def test_the_same_code_prints_the_same_in_every_run():
    code = "print(hash('abc'), list({'a', 'b', 'c', 'd'}))\ninput()"
    first, second = run(code), run(code)
    assert first.text == second.text
    assert first.text.splitlines()[-3:] == [
        '  File "<stdin>", line 2, in <module>',
        "EOFError: EOF when reading a line",
        "[exit code 1]",
    ]


def test_each_run_has_a_fresh_empty_folder_and_no_secrets(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "s3cret")
    code = "import os\nprint(os.listdir('.'), os.environ.get('SECRET_TOKEN'))\nopen('f', 'w')"
    assert run(code).text == "[] None"
    assert run(code).text == "[] None"  # the file of the run before is gone


def test_long_output_is_cut_and_marked():
    result = run("print('x' * 10000)", max_output_chars=100)
    assert result.text == "x" * 100 + "\n[output cut to its first 100 characters]"
    assert result.metrics["truncated"] == 1.0


@linux_only
def test_a_timeout_kills_the_program_and_what_it_started():
    code = (
        "import subprocess, time\n"
        "child = subprocess.Popen(['sleep', '1000.25'])\n"
        "print('started', flush=True)\n"
        "time.sleep(1000)\n"
    )
    result = run(code, timeout_s=1.5)
    assert result.text == "started\n[timed out after 1.5 s; the program was killed]"
    assert result.metrics["timed_out"] == 1.0
    assert wait_gone("1000.25") == []


@linux_only
def test_cancelling_the_call_kills_the_program():
    code = "import subprocess\nsubprocess.run(['sleep', '1000.5'])"

    async def cancel():
        tool = PythonTool(PythonToolConfig(), None)
        task = asyncio.ensure_future(tool.call({"code": code}, CONTEXT))
        while not running_with("1000.5"):
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel(), 60))
    assert wait_gone("1000.5") == []


@linux_only
def test_memory_cpu_and_file_size_limits_stop_the_program():
    memory = run("x = bytearray(2048 * 1024 * 1024)", memory_mb=256)
    assert "MemoryError" in memory.text and memory.text.endswith("[exit code 1]")
    cpu = run("while True:\n    pass", cpu_s=1, timeout_s=30)
    assert cpu.text in ("[killed by SIGXCPU (CPU limit of 1 s)]", "[killed by SIGKILL]")
    big = run("open('big', 'wb').write(b'x' * 4 * 1024 * 1024)", file_size_mb=1)
    # Python ignores SIGXFSZ: the write fails instead
    assert "OSError: [Errno 27] File too large" in big.text


@linux_only
def test_the_network_is_out_of_reach_when_the_metrics_say_isolated(caplog):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
        "    print('reached')\n"
        "except OSError as exc:\n"
        "    print('unreachable')\n"
    )
    with caplog.at_level(logging.WARNING, logger="plugrl.agents"):
        result = run(code)
    listener.close()
    if result.metrics["network_isolated"]:
        assert result.text == "unreachable"
    else:  # the kernel refused a namespace: the run goes on, and says so once
        assert result.text == "reached"
        assert "python tool: network: not isolated" in caplog.text
    assert (
        run(code.replace(str(port), "9"), isolate_network=False).metrics["network_isolated"] == 0.0
    )


def test_where_the_kernel_refuses_a_namespace_the_reason_is_given(monkeypatch):
    import ctypes

    class RefusingLibc:
        def unshare(self, flags):
            ctypes.set_errno(1)
            return -1

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: RefusingLibc())
    assert limits.isolate_network() == "not isolated: unshare refused (Operation not permitted)"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert limits.isolate_network() == "not isolated: no network namespaces on darwin"


def test_code_that_is_not_a_string_is_an_argument_error():
    tool = PythonTool(PythonToolConfig(), None)
    with pytest.raises(ToolArgumentError) as raised:
        asyncio.run(tool.call({"source": "print(1)"}, CONTEXT))
    assert str(raised.value) == 'python takes {"code": "<Python source>"}'


def test_the_tool_is_registered_with_verls_name_as_alias(plugrl_plugin_manager):
    tools = plugrl_plugin_manager.registry("tools")
    assert tools.get("python").load() is PythonTool
    assert tools.get("code_interpreter").load() is PythonTool
    assert tools.get("python").load_config() is PythonToolConfig
    assert PythonTool(PythonToolConfig(), None).schema()["function"]["name"] == "python"
    renamed = PythonTool(PythonToolConfig(function_name="code_interpreter"), None)
    assert renamed.name == renamed.schema()["function"]["name"] == "code_interpreter"


@linux_only
@pytest.mark.skipif(os.getuid() == 0, reason="the kernel does not limit root's processes")
def test_the_process_limit_stops_a_fork_bomb():
    code = (
        "import subprocess\n"
        "started = []\n"
        "try:\n"
        "    for _ in range(50):\n"
        "        started.append(subprocess.Popen(['sleep', '5']))\n"
        "except OSError as exc:\n"
        "    print('stopped at', len(started), exc.errno)\n"
    )
    assert run(code, max_processes=4).text == "stopped at 4 11"


ESCAPE = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()  # out of the process group a kill of the group reaches\n"
    "    os.execvp('sleep', ['sleep', '{mark}'])\n"
    "print('parent', flush=True)\n"
)


@linux_only
@pytest.mark.parametrize("isolate_processes", [True, False])
def test_a_process_that_leaves_the_group_and_holds_the_output_ends_with_the_call(
    isolate_processes,
):
    # the drill: a setsid child ran on 75 s later, and held stdout past the tool's timeout
    mark = f"1000.{int(isolate_processes) + 7}"
    started = time.monotonic()
    result = run(ESCAPE.format(mark=mark), timeout_s=30, isolate_processes=isolate_processes)
    assert time.monotonic() - started < 10
    assert result.text == "parent" and result.metrics["timed_out"] == 0.0
    assert wait_gone(mark) == []
    waiting = ESCAPE.format(mark=mark) + "time.sleep(1000)\n"
    started = time.monotonic()
    result = run(waiting, timeout_s=1.5, isolate_processes=isolate_processes)
    assert time.monotonic() - started < 6
    assert result.text == "parent\n[timed out after 1.5 s; the program was killed]"
    assert wait_gone(mark) == []


def _process_cap_holds() -> bool:
    return os.getuid() != 0 or limits.pids_cgroup_parent() is not None


@linux_only
@pytest.mark.skipif(not _process_cap_holds(), reason="root without a writable pids cgroup")
def test_the_process_cap_holds_for_root_too():
    # the drill: under root the code forked 4,150 times in 10 s
    code = (
        "import subprocess\n"
        "started = []\n"
        "try:\n"
        "    for _ in range(50):\n"
        "        started.append(subprocess.Popen(['sleep', '1000.75']))\n"
        "except OSError as exc:\n"
        "    print('stopped at', len(started), exc.errno)\n"
    )
    result = run(code, max_processes=4)
    assert result.text == "stopped at 4 11"
    assert wait_gone("1000.75") == []


@linux_only
def test_what_the_code_writes_in_all_is_capped():
    # the drill: forty 15 MB files filled 600 MB in 4 s, under a cap per file
    code = (
        "import os\n"
        "for i in range(40):\n"
        "    with open(f'f{i}', 'wb') as f:\n"
        "        f.write(os.urandom(15 * 1024 * 1024))\n"
        "print('wrote all')\n"
    )
    result = run(code, max_written_mb=32, timeout_s=60)
    assert result.text == "[wrote over 32 MiB to its folder; the program was killed]"
    assert result.metrics["over_written"] == 1.0
    assert run("open('small', 'wb').write(b'x' * 1024)", max_written_mb=1).text == "[no output]"


SYSTEM_PYTHON = "/usr/bin/python3"


@linux_only
@pytest.mark.skipif(
    os.getuid() != 0
    or not os.path.exists(SYSTEM_PYTHON)
    or limits._closed_to_others(SYSTEM_PYTHON) is not None
    or limits.user_ids("nobody") is None,
    reason="needs root and a Python that other users can run",
)
def test_as_root_the_launcher_switches_to_an_unprivileged_user_and_caps_processes(tmp_path):
    import json
    import subprocess

    code = (
        "import os, subprocess\n"
        "started = []\n"
        "try:\n"
        "    for _ in range(20):\n"
        "        started.append(subprocess.Popen(['sleep', '1000.875']))\n"
        "except OSError:\n"
        "    pass\n"
        "print(os.getuid(), len(started))\n"
    )
    options = {"run_as": "nobody", "max_processes": 4, "isolate_processes": True}
    status_read, status_write = os.pipe()
    launcher = [SYSTEM_PYTHON, "-I", "-S", limits.__file__, json.dumps(options), str(status_write)]
    done = subprocess.run(
        [*launcher, SYSTEM_PYTHON, "-c", code],
        pass_fds=(status_write,),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    os.close(status_write)
    with os.fdopen(status_read) as status:
        report = json.loads(status.read())
    assert report["user"] == "switched to nobody"
    assert done.stdout.split() == [str(limits.user_ids("nobody")[0]), "4"]
    assert wait_gone("1000.875") == []
    if report["cgroup"].startswith("/"):
        os.rmdir(report["cgroup"])


@linux_only
def test_a_flood_of_empty_files_counts_toward_the_write_cap():
    code = "for i in range(100000):\n    open(f'e{i}', 'w').close()\nprint('made all')\n"
    result = run(code, max_written_mb=4, timeout_s=60)
    assert result.text == "[wrote over 4 MiB to its folder; the program was killed]"
