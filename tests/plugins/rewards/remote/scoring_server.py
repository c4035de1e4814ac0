"""A real HTTP scoring server on localhost for the remote manager's tests: uvicorn in a thread,
with an endpoint per way a server can behave, counting the requests each got and the most it
held at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

TOKEN = "s3cret"


def exact_scores(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """1 for a response equal to its ground truth; ``acc`` and ``length`` as extra fields."""
    return [
        {
            "score": float(s["response"] == s["ground_truth"]),
            "acc": s["response"] == s["ground_truth"],
            "length": len(s["response"]),
        }
        for s in samples
    ]


class ScoringServer:
    """``base`` is its address; ``requests[path]`` how many requests a path got,
    ``most_at_once[path]`` the most it was answering at the same time, ``bodies[path]`` the
    JSON bodies it got."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.most_at_once: Counter[str] = Counter()
        self.bodies: dict[str, list[Any]] = defaultdict(list)
        self.headers: dict[str, list[str | None]] = defaultdict(list)
        self.fail_first = 2
        self.slow_s = 0.2
        self._at_once: Counter[str] = Counter()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        app = Starlette(
            routes=[
                Route(f"/{name}", self._handle, methods=["POST"])
                for name in (
                    "score",
                    "slow",
                    "flaky",
                    "always_500",
                    "hang",
                    "not_json",
                    "wrong_count",
                    "not_number",
                    "auth",
                    "bad_request",
                    "busy",
                    "get_reward",
                )
            ]
        )
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self) -> ScoringServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the test scoring server did not start in 30 s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()

    def reset(self) -> None:
        self.requests.clear()
        self.most_at_once.clear()
        self.bodies.clear()
        self.headers.clear()

    def url(self, path: str) -> str:
        return f"{self.base}/{path}"

    async def _handle(self, request: Request) -> Response:
        path = request.url.path.strip("/")
        self.requests[path] += 1
        self._at_once[path] += 1
        self.most_at_once[path] = max(self.most_at_once[path], self._at_once[path])
        try:
            body = json.loads(await request.body())
            self.bodies[path].append(body)
            self.headers[path].append(request.headers.get("authorization"))
            return await self._answer(path, body, request)
        finally:
            self._at_once[path] -= 1

    async def _answer(self, path: str, body: Any, request: Request) -> Response:
        if path == "get_reward":
            rewards = [
                float(q.endswith(str(label)))
                for q, label in zip(body["query"], body["labels"], strict=True)
            ]
            return JSONResponse(
                {
                    "rewards": rewards,
                    "scores": rewards,
                    "extra_logs": {"query_length": [len(q) for q in body["query"]]},
                }
            )
        samples = body.get("samples") or [  # OpenRLHF's schema posted to a plugrl endpoint
            {"response": q, "ground_truth": label}
            for q, label in zip(body["query"], body["labels"], strict=True)
        ]
        scores: list[Any] = exact_scores(samples)
        if path == "slow":
            await asyncio.sleep(self.slow_s)
        elif path == "flaky" and self.requests[path] <= self.fail_first:
            return JSONResponse({"error": "warming up"}, status_code=503)
        elif path == "busy" and self.requests[path] <= self.fail_first:
            return JSONResponse({"error": "slow down"}, status_code=429)
        elif path == "always_500":
            return JSONResponse({"error": "sample 0 (data_source 'x') failed: boom"}, 500)
        elif path == "hang":
            # cancelled when the server stops, without a traceback
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(60)
        elif path == "not_json":
            return PlainTextResponse("<html>oops</html>")
        elif path == "wrong_count":
            scores = scores[:-1]
        elif path == "not_number":
            scores = ["high", *scores[1:]]
        elif path == "auth" and request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"error": "missing or wrong token"}, status_code=401)
        elif path == "bad_request":
            return JSONResponse({"error": "unknown field 'samples'"}, status_code=422)
        return JSONResponse({"scores": scores})
