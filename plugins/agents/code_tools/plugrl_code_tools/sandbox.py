"""``sandbox``: the model's code run by a remote sandbox service, the way to real isolation
(a container per run, on machines apart from the trainer's).

It speaks SandboxFusion's ``POST /run_code`` API: the request carries ``code``, ``language``,
``compile_timeout``, ``run_timeout`` and ``memory_limit_MB``; the answer has a ``status``
(``Success``, ``Failed``, or ``SandboxError`` when the service itself failed), a ``message``,
and ``compile_result`` and ``run_result`` objects with ``status`` (``Finished``,
``TimeLimitExceeded``, ...), ``stdout``, ``stderr`` and ``return_code``. Any service that
answers the same shape works.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import attrs

from plugrl.api import option, positive
from plugrl.api.agents import Tool, ToolArgumentError, ToolConfig, ToolContext, ToolResult
from plugrl_code_tools.output import describe_run, truncate


@attrs.define(kw_only=True)
class SandboxToolConfig(ToolConfig):
    """``rollout.agent.tool_args.sandbox``."""

    function_name: str = option(
        "code_interpreter",
        "The name the model calls the tool by (verl's SandboxFusion tool's name by default).",
    )
    url: str = option(
        "http://localhost:8080/run_code",
        "The sandbox's run_code endpoint.",
        verl="sandbox_fusion_url",
    )
    language: str = option("python", "Language of the code (the sandbox's name for it).")
    run_timeout_s: float = option(10.0, "Seconds the code may run.", validator=positive)
    compile_timeout_s: float = option(
        10.0, "Seconds compiling may take (compiled languages).", validator=positive
    )
    memory_limit_mb: int = option(
        1024, "Memory of a run in MiB.", verl="memory_limit_mb", validator=positive
    )
    request_timeout_s: float = option(
        30.0,
        "Seconds to wait for the sandbox's answer beyond the run's own timeouts.",
        validator=positive,
    )
    max_output_chars: int = option(
        4096,
        "Characters of standard output, and of standard error, the model reads; the rest is "
        "cut and marked.",
        validator=positive,
    )
    headers: dict[str, str] = option(
        factory=dict, help="HTTP headers of each request (an Authorization token)."
    )


class SandboxToolError(RuntimeError):
    """The sandbox service could not run the code (unreachable, an HTTP error, an answer of
    another shape, or its own failure); the model sees the message as an error result."""


class SandboxTool(Tool):
    """Posts the ``code`` argument to :attr:`SandboxToolConfig.url` and returns the run's
    output. The model calls it ``code_interpreter`` by default, as verl's SandboxFusion tool,
    so prompts written for that work unchanged."""

    config: SandboxToolConfig

    def __init__(self, config: SandboxToolConfig, context: Any) -> None:
        super().__init__(config, context)
        self.name = config.function_name  # type: ignore[misc]

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": (
                    f"Run a {self.config.language} program in a sandbox and read what it "
                    "prints. Each call starts afresh."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "The source to run."}},
                    "required": ["code"],
                },
            },
        }

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        import httpx

        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolArgumentError(f'{self.name} takes {{"code": "<source>"}}')
        config = self.config
        request = {
            "code": code,
            "language": config.language,
            "compile_timeout": config.compile_timeout_s,
            "run_timeout": config.run_timeout_s,
            "memory_limit_MB": config.memory_limit_mb,
        }
        timeout = config.request_timeout_s + config.run_timeout_s + config.compile_timeout_s
        start = time.perf_counter()
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                response = await client.post(config.url, json=request, headers=config.headers)
        except httpx.TimeoutException:
            raise SandboxToolError(
                f"the sandbox at {config.url} did not answer in {timeout:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise SandboxToolError(
                f"cannot reach the sandbox at {config.url} ({type(exc).__name__}: {exc}); "
                "check rollout.agent.tool_args.sandbox.url"
            ) from None
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            raise SandboxToolError(
                f"the sandbox at {config.url} answered HTTP {response.status_code}: "
                f"{response.text.strip()[:200]}"
            )
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or "status" not in answer:
            raise SandboxToolError(
                f"the sandbox at {config.url} answered {response.text.strip()[:100]!r}, not "
                'the JSON of /run_code ({"status": ..., "run_result": {...}})'
            )
        return self._result(answer, elapsed)

    def _result(self, answer: dict[str, Any], elapsed: float) -> ToolResult:
        if answer["status"] == "SandboxError":
            raise SandboxToolError(
                f"the sandbox failed to run the code: {answer.get('message') or 'no message'}"
            )
        limit = self.config.max_output_chars
        compiled = answer.get("compile_result") or {}
        run = answer.get("run_result") or {}
        stdout, out_cut = truncate(str(run.get("stdout") or ""), limit)
        stderr, err_cut = truncate(
            str(compiled.get("stderr") or "") + str(run.get("stderr") or ""), limit
        )
        run_status = run.get("status")
        code = run.get("return_code")
        timed_out = run_status == "TimeLimitExceeded" or (
            compiled.get("status") == "TimeLimitExceeded"
        )
        if timed_out:
            ending = "timed out; the program was stopped"
        elif not run and compiled.get("status") not in (None, "Finished"):
            ending = f"compilation failed ({compiled.get('status')})"
        elif isinstance(code, int) and code != 0:
            ending = f"exit code {code}"
        elif run_status not in (None, "Finished"):
            ending = str(run_status)
        else:
            ending = None
        return ToolResult(
            text=describe_run(stdout, stderr, ending),
            metrics={
                "exit_code": float(code if isinstance(code, int) else -1),
                "timed_out": float(timed_out),
                "truncated": float(out_cut or err_cut),
                "run_s": elapsed,
            },
        )
