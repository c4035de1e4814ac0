"""``python``: the model's code run by a fresh interpreter in a subprocess.

The subprocess starts from a launcher (:mod:`plugrl.agents.limits`) that moves into new network
and PID namespaces where the kernel allows it, into a ``pids`` cgroup of its own where one is
writable, becomes an unprivileged user when the trainer is root (where that user can run the
interpreter), applies the kernel limits, and then replaces itself with the Python interpreter,
which reads the code from its standard input and runs it in a fresh, empty working folder with
a minimal environment, whose total size is watched from here. This keeps a buggy or greedy
program from hurting the run; it is no defence against code written to escape: the code sees
the machine's files. Real isolation needs a container sandbox (the ``sandbox`` tool).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from plugrl.api import option, positive
from plugrl.api.agents import Tool, ToolArgumentError, ToolConfig, ToolContext, ToolResult, limits
from plugrl.api.workers import descendants
from plugrl_code_tools.output import describe_run, truncate

logger = logging.getLogger("plugrl.agents")

# what the code's environment keeps of the trainer's: no tokens or keys
_KEPT_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "TZ")
_RUN_MARK = "PLUGRL_PYTHON_TOOL_RUN"
_OUTPUT_GRACE_S = 1.0
"""After the program ended or was killed, how long its output pipes are read before the call
returns without what a process still holding them would print."""
_SIZE_CHECK_S = 0.02
_ENTRY_BYTES = 4096


@attrs.define(kw_only=True)
class PythonToolConfig(ToolConfig):
    """``rollout.agent.tool_args.python``."""

    function_name: str = option(
        "python",
        "The name the model calls the tool by (code_interpreter: the name verl's prompts use).",
    )
    timeout_s: float = option(
        10.0,
        "Wall-clock seconds a run may take; then its processes are killed and the model is told.",
        validator=positive,
    )
    cpu_s: int = option(10, "CPU seconds a run may use (RLIMIT_CPU).", validator=positive)
    memory_mb: int = option(
        1024, "Address space of the interpreter in MiB (RLIMIT_AS).", validator=positive
    )
    file_size_mb: int = option(
        16, "Largest file the code may write, in MiB (RLIMIT_FSIZE).", validator=positive
    )
    max_processes: int = option(
        16,
        "Processes and threads the code may start (RLIMIT_NPROC; not applied to root).",
        validator=positive,
    )
    max_output_chars: int = option(
        4096,
        "Characters of standard output, and of standard error, the model reads; the rest is "
        "cut and marked.",
        validator=positive,
    )
    isolate_network: bool = option(
        True,
        "Run the code in a new network namespace, with no network (Linux; where the kernel "
        "refuses, the run goes on with the network and its metrics say network_isolated 0).",
    )
    isolate_processes: bool = option(
        True,
        "Run the code in a new PID namespace, so that every process it starts ends with it, "
        "those that leave its process group too (Linux; where the kernel refuses, what the code "
        "started is found and killed through /proc, and the metrics say processes_isolated 0).",
    )
    run_as: str = option(
        "nobody",
        "The user the code runs as when the trainer is root, so that the process cap applies "
        "and root's private files are out of reach; empty to run it as root.",
    )
    max_written_mb: int = option(
        64,
        "MiB the code may write to its working folder in all; beyond it the run is killed "
        "(checked every few hundredths of a second, so a fast writer may pass it by a little).",
        validator=positive,
    )


class PythonTool(Tool):
    """Runs the ``code`` argument with the trainer's Python under :class:`PythonToolConfig`'s limits
    and returns its output. Each call has a fresh empty working folder, deleted afterwards."""

    name = "python"
    config: PythonToolConfig

    def __init__(self, config: PythonToolConfig, context: Any) -> None:
        super().__init__(config, context)
        self.name = config.function_name  # type: ignore[misc]
        self._warned_network = False
        self._warned_processes = False
        self._warned_user = False

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": (
                    "Run a Python program and read what it prints. Each call starts afresh "
                    "(no state is kept between calls) in an empty folder, without network."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "code": {"type": "string", "description": "The Python source to run."}
                    },
                    "required": ["code"],
                },
            },
        }

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolArgumentError(f'{self.name} takes {{"code": "<Python source>"}}')
        with tempfile.TemporaryDirectory(prefix="plugrl-python-") as folder:
            return await self._run(code, Path(folder))

    async def _run(self, code: str, folder: Path) -> ToolResult:
        config = self.config
        work = folder / "work"
        work.mkdir()
        options = {
            "cpu_s": config.cpu_s,
            "memory_mb": config.memory_mb,
            "file_size_mb": config.file_size_mb,
            "max_processes": config.max_processes,
            "isolate_network": config.isolate_network,
            "isolate_processes": config.isolate_processes,
            "run_as": config.run_as or None,
        }
        # a mark in the environment of everything the code starts, for the sweep that finds
        # processes which left the process group where no PID namespace holds them
        mark = f"{_RUN_MARK}={secrets.token_hex(8)}"
        # the environment is built here, not inherited: no PYTHONPATH, and a fixed hash seed,
        # so that the same code prints the same (a set of strings) in every run
        environment = {k: os.environ[k] for k in _KEPT_ENVIRONMENT if k in os.environ}
        environment.update(
            HOME=str(work),
            TMPDIR=str(work),
            PYTHONHASHSEED="0",
            PYTHONIOENCODING="utf-8",
            PYTHONDONTWRITEBYTECODE="1",
        )
        environment.update([mark.split("=", 1)])
        status_read, status_write = os.pipe()
        start = time.perf_counter()
        try:
            # the launcher, run as a script without site-packages, costs an interpreter's
            # start and no import; it execs the interpreter that runs the code
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                limits.__file__,
                json.dumps(options),
                str(status_write),
                # the code comes on standard input: tracebacks name it <stdin>, the same
                # in every run, and input() reads an end of file; -s: no user site
                sys.executable,
                "-s",
                "-",
                cwd=work,
                env=environment,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(status_write,),
                start_new_session=True,  # one group: a timeout kills what the code started
            )
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        timed_out = over_written = False
        stdout, stderr = bytearray(), bytearray()
        # bytes enough for one character more than is kept, so a longer output is seen cut
        keep = config.max_output_chars * 4 + 4
        readers = [
            asyncio.ensure_future(_feed(process.stdin, code.encode("utf-8", errors="replace"))),
            asyncio.ensure_future(_drain(process.stdout, keep, stdout)),
            asyncio.ensure_future(_drain(process.stderr, keep, stderr)),
        ]
        ended = asyncio.ensure_future(_exited(process))
        watcher = asyncio.ensure_future(_watch_size(work, config.max_written_mb * 1024 * 1024))
        report: dict[str, str] = {}
        try:
            # the deadline is the program's, not its output's: a process it started that
            # holds the output open does not keep the call waiting
            await asyncio.wait(
                (ended, watcher), timeout=config.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            timed_out = not ended.done() and not watcher.done()
            over_written = watcher.done() and not ended.done()
        finally:
            watcher.cancel()
            # whether the run ended, timed out or the call was cancelled: nothing the code
            # started outlives the call
            _kill_everything(process.pid, mark, "")
            # every writer of the report is dead or past writing it: no wait on the loop
            with os.fdopen(status_read, "rb") as status:
                report = _read_report(status.read())
            _kill_everything(process.pid, mark, report.get("cgroup", ""))
            if process.returncode is None:
                with contextlib.suppress(Exception):
                    await process.wait()
            # what was printed until the kill is kept; a pipe still held is not waited for
            _, pending = await asyncio.wait(readers, timeout=_OUTPUT_GRACE_S)
            for reader in (*pending, ended):
                reader.cancel()
            _remove_cgroup(report.get("cgroup", ""))
        network = report.get("network", "not isolated: no report")
        elapsed = time.perf_counter() - start
        out_text, out_cut = truncate(_decode(stdout), config.max_output_chars)
        err_text, err_cut = truncate(_decode(stderr), config.max_output_chars)
        returncode = process.returncode
        if timed_out:
            ending = f"timed out after {config.timeout_s:g} s; the program was killed"
        elif over_written:
            ending = f"wrote over {config.max_written_mb} MiB to its folder; the program was killed"
        elif returncode is not None and returncode < 0:
            ending = f"killed by {_signal_name(-returncode)}{_limit_hint(-returncode, config)}"
        elif returncode:
            ending = f"exit code {returncode}"
        else:
            ending = None
        isolated = network == "isolated"
        if config.isolate_network and not isolated and not self._warned_network:
            self._warned_network = True
            logger.warning("python tool: network: %s; the code can reach the network", network)
        processes = report.get("processes", "not isolated: no report")
        if config.isolate_processes and processes != "isolated" and not self._warned_processes:
            self._warned_processes = True
            logger.warning(
                "python tool: processes: %s; what the code starts is found through /proc and "
                "killed, but a process that leaves its group and clears its environment escapes",
                processes,
            )
        user = report.get("user", "not asked")
        if user.startswith("not switched") and not self._warned_user:
            self._warned_user = True
            logger.warning(
                "python tool: user: %s; the code runs as root, with no process cap but the "
                "cgroup's (%s)",
                user,
                report.get("cgroup", "none"),
            )
        return ToolResult(
            text=describe_run(out_text, err_text, ending),
            metrics={
                "exit_code": float(
                    returncode if returncode is not None and returncode >= 0 else -1
                ),
                "timed_out": float(timed_out),
                "truncated": float(out_cut or err_cut),
                "network_isolated": float(isolated),
                "processes_isolated": float(processes == "isolated"),
                "over_written": float(over_written),
                "run_s": elapsed,
            },
        )


async def _feed(stream: asyncio.StreamWriter | None, data: bytes) -> None:
    """Write the program to the interpreter's standard input and close it."""
    if stream is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stream.write(data)
        await stream.drain()
    stream.close()


async def _drain(stream: asyncio.StreamReader | None, keep: int, kept: bytearray) -> None:
    """Read ``stream`` to its end, keeping its first ``keep`` bytes in ``kept``: a program
    printing without end costs no memory."""
    if stream is None:
        return
    while chunk := await stream.read(1 << 16):
        if len(kept) < keep:
            kept += chunk[: keep - len(kept)]


def _decode(data: bytes | bytearray) -> str:
    return data.decode("utf-8", errors="replace")


def _signal_name(number: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(number).name
    return f"signal {number}"


def _limit_hint(number: int, config: PythonToolConfig) -> str:
    if number == signal.SIGXCPU:
        return f" (CPU limit of {config.cpu_s} s)"
    if number == signal.SIGXFSZ:
        return f" (file size limit of {config.file_size_mb} MiB)"
    return ""


async def _exited(process: asyncio.subprocess.Process) -> None:
    """Return once the process has exited. ``process.wait()`` also waits for its output pipes
    to close, which a process it started can hold open for ever."""
    while process.returncode is None:
        await asyncio.sleep(_SIZE_CHECK_S)


def _read_report(data: bytes) -> dict[str, str]:
    """The launcher's JSON report; empty when it died before writing it."""
    try:
        report = json.loads(data.decode(errors="replace") or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in report.items()} if isinstance(report, dict) else {}


async def _watch_size(folder: Path, cap: int) -> None:
    """Return once the files under ``folder`` take more than ``cap`` bytes."""
    # in a thread: a folder of many files takes a while to walk, and the event loop runs
    # every sample's turns
    while await asyncio.to_thread(_folder_bytes, folder) <= cap:
        await asyncio.sleep(_SIZE_CHECK_S)


def _folder_bytes(folder: Path) -> int:
    total = 0
    stack = [str(folder)]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    # blocks really used (a sparse file counts as what it holds), and at least
                    # a block for each entry, so that a flood of empty files counts too
                    blocks = entry.stat(follow_symlinks=False).st_blocks * 512
                    total += max(blocks, _ENTRY_BYTES)
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return total


def _kill_everything(leader: int, mark: str, cgroup: str) -> None:
    """SIGKILL the launcher's process group, every descendant of ``leader`` (those that left
    the group by ``setsid`` too), every process whose environment holds ``mark`` (those whose
    parent died first), and every process in ``cgroup``: where a PID namespace holds the
    code, killing the launcher already ended all of them."""
    targets = set(descendants(leader)) | set(_marked(mark.encode()))
    if cgroup.startswith("/"):
        with contextlib.suppress(OSError), open(f"{cgroup}/cgroup.procs", encoding="utf-8") as f:
            targets.update(int(line) for line in f.read().split())
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)
    for pid in targets - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _marked(mark: bytes) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError), open(f"/proc/{entry.name}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        found.append(int(entry.name))
    return found


def _remove_cgroup(cgroup: str) -> None:
    """Remove the run's cgroup once its processes are gone (they take a moment to leave)."""
    if not cgroup.startswith("/"):
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)
    logger.warning("python tool: could not remove the cgroup %s", cgroup)
