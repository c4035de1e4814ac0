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
def test_a_timeout_kills_the_program_and_what_it_started(tmp_path):
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '1000'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "print('started', flush=True)\n"
        "time.sleep(1000)\n"
    )
    result = run(code, timeout_s=1.5)
    assert result.text == "started\n[timed out after 1.5 s; the program was killed]"
    assert result.metrics["timed_out"] == 1.0
    program, child = (int(p) for p in pids.read_text().split())
    deadline = time.monotonic() + 10
    while (alive(program) or alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(program) and not alive(child)


@linux_only
def test_cancelling_the_call_kills_the_program(tmp_path):
    pids = tmp_path / "pids"
    code = f"import os, time\nopen({str(pids)!r}, 'w').write(str(os.getpid()))\ntime.sleep(1000)"

    async def cancel():
        tool = PythonTool(PythonToolConfig(), None)
        task = asyncio.ensure_future(tool.call({"code": code}, CONTEXT))
        while not pids.exists() or not pids.read_text():
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    program = int(pids.read_text())
    deadline = time.monotonic() + 10
    while alive(program) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(program)


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
