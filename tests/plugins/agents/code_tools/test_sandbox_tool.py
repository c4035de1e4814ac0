"""The sandbox tool against a local stand-in of SandboxFusion's /run_code (uvicorn in a
thread, on a free port)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from plugrl.parts.agent import ToolArgumentError, ToolContext
from plugrl_code_tools.sandbox import SandboxTool, SandboxToolConfig, SandboxToolError

CONTEXT = ToolContext(row={}, sample_id="uid/0")


def run_result(stdout="", stderr="", status="Finished", code=0):
    return {
        "status": status,
        "execution_time": 0.01,
        "return_code": code,
        "stdout": stdout,
        "stderr": stderr,
    }


# what the stand-in answers to each program: the shapes SandboxFusion answers
ANSWERS = {
    "print(1 + 1)": {"status": "Success", "message": "", "run_result": run_result("2\n")},
    "1/0": {
        "status": "Failed",
        "message": "",
        "run_result": run_result(stderr="ZeroDivisionError: division by zero\n", code=1),
    },
    "while True: pass": {
        "status": "Failed",
        "message": "",
        "run_result": run_result(status="TimeLimitExceeded", code=None),
    },
    "crash the sandbox": {"status": "SandboxError", "message": "no runner for python"},
    "long": {"status": "Success", "message": "", "run_result": run_result("y" * 500)},
}


class StandIn:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.headers: list[str | None] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        app = Starlette(
            routes=[
                Route("/run_code", self._run_code, methods=["POST"]),
                Route("/broken", self._broken, methods=["POST"]),
                Route("/not_json", self._not_json, methods=["POST"]),
            ]
        )
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    async def _run_code(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append(body)
        self.headers.append(request.headers.get("authorization"))
        return JSONResponse(ANSWERS[body["code"]])

    async def _broken(self, request: Request) -> Response:
        return JSONResponse({"detail": "internal error"}, status_code=500)

    async def _not_json(self, request: Request) -> Response:
        return PlainTextResponse("<html>gateway</html>")

    def start(self) -> StandIn:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()


@pytest.fixture(scope="module")
def sandbox():
    server = StandIn().start()
    yield server
    server.stop()


def call(url: str, code: object, **options):
    tool = SandboxTool(SandboxToolConfig(url=url, **options), None)
    return asyncio.run(tool.call({"code": code}, CONTEXT))


def test_a_run_posts_run_codes_request_and_reads_its_answer(sandbox):
    result = call(
        f"{sandbox.base}/run_code",
        "print(1 + 1)",
        run_timeout_s=5,
        memory_limit_mb=512,
        headers={"Authorization": "Bearer t"},
    )
    assert result.text == "2"
    assert result.metrics["exit_code"] == 0.0
    assert sandbox.requests[-1] == {
        "code": "print(1 + 1)",
        "language": "python",
        "compile_timeout": 10.0,
        "run_timeout": 5,
        "memory_limit_MB": 512,
    }
    assert sandbox.headers[-1] == "Bearer t"


def test_failures_timeouts_and_long_output_are_told_to_the_model(sandbox):
    url = f"{sandbox.base}/run_code"
    assert call(url, "1/0").text == "ZeroDivisionError: division by zero\n[exit code 1]"
    timed_out = call(url, "while True: pass")
    assert timed_out.text == "[timed out; the program was stopped]"
    assert timed_out.metrics["timed_out"] == 1.0
    long = call(url, "long", max_output_chars=10)
    assert long.text == "y" * 10 + "\n[output cut to its first 10 characters]"


def test_what_the_sandbox_cannot_do_is_an_error_naming_it(sandbox):
    with pytest.raises(SandboxToolError) as raised:
        call(f"{sandbox.base}/run_code", "crash the sandbox")
    assert str(raised.value) == "the sandbox failed to run the code: no runner for python"
    with pytest.raises(SandboxToolError) as raised:
        call(f"{sandbox.base}/broken", "print(1 + 1)")
    assert str(raised.value) == (
        f'the sandbox at {sandbox.base}/broken answered HTTP 500: {{"detail":"internal error"}}'
    )
    with pytest.raises(SandboxToolError) as raised:
        call(f"{sandbox.base}/not_json", "print(1 + 1)")
    assert str(raised.value) == (
        f"the sandbox at {sandbox.base}/not_json answered '<html>gateway</html>', not the JSON "
        'of /run_code ({"status": ..., "run_result": {...}})'
    )


def test_an_unreachable_sandbox_says_which_key_to_check():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/run_code"
    listener.close()  # nothing listens there now
    with pytest.raises(SandboxToolError) as raised:
        call(url, "print(1 + 1)")
    assert str(raised.value).startswith(f"cannot reach the sandbox at {url} (ConnectError: ")
    assert str(raised.value).endswith("); check rollout.agent.tool_args.sandbox.url")


def test_code_that_is_not_a_string_is_an_argument_error():
    with pytest.raises(ToolArgumentError) as raised:
        call("http://127.0.0.1:9/run_code", ["print(1)"])
    assert str(raised.value) == 'code_interpreter takes {"code": "<source>"}'


def test_the_tool_is_registered(plugrl_plugin_manager):
    entry = plugrl_plugin_manager.registry("tools").get("sandbox")
    assert entry.load() is SandboxTool and entry.load_config() is SandboxToolConfig
    tool = SandboxTool(SandboxToolConfig(), None)
    assert tool.name == tool.schema()["function"]["name"] == "code_interpreter"
    tool = SandboxTool(SandboxToolConfig(function_name="run"), None)
    assert tool.name == tool.schema()["function"]["name"] == "run"
