"""``python``: the model's code run by a fresh interpreter in a subprocess.

The subprocess starts from a launcher (:mod:`plugrl.agents.limits`) that moves into a new
network namespace where the kernel allows it (an unprivileged user namespace with its own,
empty network: no interface but a loopback that is down), applies the kernel limits, and then
replaces itself with the Python interpreter, which reads the code from its standard input and
runs it in a fresh, empty working folder with a minimal environment. This keeps a buggy or greedy
program from hurting the run; it is no defence against code written to escape: the code runs
as the trainer's user and sees its files. Real isolation needs a container sandbox (the
``sandbox`` tool).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
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
from plugrl_code_tools.output import describe_run, truncate

logger = logging.getLogger("plugrl.agents")

# what the code's environment keeps of the trainer's: no tokens or keys
_KEPT_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "TZ")


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


class PythonTool(Tool):
    """Runs the ``code`` argument with the trainer's Python under :class:`PythonToolConfig`'s limits
    and returns its output. Each call has a fresh empty working folder, deleted afterwards."""

    name = "python"
    config: PythonToolConfig

    def __init__(self, config: PythonToolConfig, context: Any) -> None:
        super().__init__(config, context)
        self.name = config.function_name  # type: ignore[misc]
        self._warned_network = False

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
        }
        # the environment is built here, not inherited: no PYTHONPATH, and a fixed hash seed,
        # so that the same code prints the same (a set of strings) in every run
        environment = {k: os.environ[k] for k in _KEPT_ENVIRONMENT if k in os.environ}
        environment.update(
            HOME=str(work),
            PYTHONHASHSEED="0",
            PYTHONIOENCODING="utf-8",
            PYTHONDONTWRITEBYTECODE="1",
        )
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
        timed_out = False
        stdout, stderr = bytearray(), bytearray()
        # bytes enough for one character more than is kept, so a longer output is seen cut
        keep = config.max_output_chars * 4 + 4
        try:
            try:
                await asyncio.wait_for(
                    asyncio.gather(
                        _feed(process.stdin, code.encode("utf-8", errors="replace")),
                        _drain(process.stdout, keep, stdout),
                        _drain(process.stderr, keep, stderr),
                        process.wait(),
                    ),
                    config.timeout_s,
                )
            except asyncio.TimeoutError:  # what it printed until then is kept
                timed_out = True
        finally:
            # the group, whether the run ended, timed out or the call was cancelled: nothing
            # the code started outlives the call
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            if process.returncode is None:
                with contextlib.suppress(Exception):
                    await process.wait()
            with os.fdopen(status_read, "rb") as status:
                network = status.read().decode(errors="replace") or "not isolated: no report"
        elapsed = time.perf_counter() - start
        out_text, out_cut = truncate(_decode(stdout), config.max_output_chars)
        err_text, err_cut = truncate(_decode(stderr), config.max_output_chars)
        returncode = process.returncode
        if timed_out:
            ending = f"timed out after {config.timeout_s:g} s; the program was killed"
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
        return ToolResult(
            text=describe_run(out_text, err_text, ending),
            metrics={
                "exit_code": float(
                    returncode if returncode is not None and returncode >= 0 else -1
                ),
                "timed_out": float(timed_out),
                "truncated": float(out_cut or err_cut),
                "network_isolated": float(isolated),
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
