"""``plugrl serve reward FILE.py:function``: a scoring function served over HTTP, for the
``remote`` reward manager (``reward.manager: remote``) or an OpenRLHF run
(``--remote_rm_url``).

Endpoints:

* ``POST /score``, plugrl's schema: ``{"samples": [{"data_source", "prompt", "response",
  "ground_truth", "extra_info"}, ...]}`` -> ``{"scores": [number | {"score": number, ...},
  ...]}``;
* ``POST /get_reward``, OpenRLHF's: ``{"query": [...], "prompts": [...], "labels": [...]}`` ->
  ``{"rewards": [...], "scores": [...], "extra_logs": {field: [...]}}``; each response is the
  query with its prompt cut off the front, the label is the ground truth and the data source
  is ``openrlhf``;
* ``GET /health`` -> ``{"status": "ok", "function": ...}``.

Every sample is scored in the kernel's worker processes (:mod:`plugrl.rewards.workers`), each
under ``--timeout-s``; a batch function (one with ``solution_strs``) is called once per request
under it. Requests are scored at once, sharing the ``--workers`` workers: a sample that hangs
holds one worker, not the other requests. A sample whose scoring fails or times out fails its
request with HTTP 500 and a JSON ``{"error": ...}`` naming the sample, so the client's failure
policy applies to it; a request that does not follow the schema (or is not JSON, or nests it
too deeply) gets HTTP 400 saying what is wrong, and one whose body passes ``--max-body-bytes``
or whose samples pass ``--max-samples`` gets HTTP 413. A client that disconnects before its
body arrived is dropped with a debug line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from plugrl.errors import PlugrlError, RecipeError
from plugrl.parts.scoring import FileFunction, Scorer
from plugrl.rewards.workers import Call, Outcome, ProcessPool

INSTALL_HINT = "plugrl serve needs uvicorn and starlette: pip install 'plugrl[serve]'"
OPENRLHF_DATA_SOURCE = "openrlhf"
SAMPLE_FIELDS = ("data_source", "prompt", "response", "ground_truth", "extra_info")
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_SAMPLES = 4096

# uvicorn's own logger for what goes wrong, printed in its format; the per-request access log
# is off by default (--access-log), as a run makes hundreds of requests a step.
error_log = logging.getLogger("uvicorn.error")


class BadRequest(ValueError):
    """A request that does not follow the endpoint's schema (HTTP 400)."""


class ScoringFailed(RuntimeError):
    """A sample's scoring failed or timed out (HTTP 500)."""


def load_scorer(spec: str) -> Scorer:
    """The scorer ``FILE.py:function`` names (``:compute_score`` when left out), checked now."""
    path, _, name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    name = name or "compute_score"
    if not path.endswith(".py"):
        raise RecipeError(
            f"{spec!r} is not FILE.py:function; name the Python file and, after a colon, the "
            "function (compute_score when left out)"
        )
    function = FileFunction(str(Path(path).expanduser().resolve()), name)
    try:
        function.load()
    except RecipeError as exc:
        # the loader's fixes name recipe keys; here the function is named on the command line
        message = exc.bare_message
        if exc.key == "reward.custom_function.name":
            message = message.rsplit("; ", 1)[0] + "; name it after the colon: FILE.py:FUNCTION"
        raise PlugrlError(message) from None
    scorer = Scorer.wrap(function, f"reward function {name!r} from {path}")
    scorer.check_picklable()
    return scorer


# --------------------------------------------------------------------------------------------
# Reading requests
# --------------------------------------------------------------------------------------------


def read_plugrl_request(body: Any) -> list[dict[str, Any]]:
    """The samples of a ``/score`` request, as scorer keyword arguments."""
    if not isinstance(body, Mapping) or not isinstance(body.get("samples"), list):
        raise BadRequest('the body must be a JSON object {"samples": [...]}')
    samples = []
    for index, sample in enumerate(body["samples"]):
        if not isinstance(sample, Mapping):
            raise BadRequest(f"sample {index} is not a JSON object")
        missing = [f for f in ("data_source", "response", "ground_truth") if f not in sample]
        if missing:
            raise BadRequest(f"sample {index} has no {', '.join(map(repr, missing))}")
        samples.append(
            {
                "data_source": str(sample["data_source"]),
                "solution_str": str(sample["response"]),
                "ground_truth": sample["ground_truth"],
                "extra_info": sample.get("extra_info"),
            }
        )
    return samples


def read_openrlhf_request(body: Any) -> list[dict[str, Any]]:
    """The samples of a ``/get_reward`` request, as scorer keyword arguments."""
    if not isinstance(body, Mapping) or not isinstance(body.get("query"), list):
        raise BadRequest('the body must be a JSON object {"query": [...], "prompts": [...], ...}')
    queries = body["query"]
    prompts = body.get("prompts") or [""] * len(queries)
    labels = body.get("labels") or [None] * len(queries)
    for name, values in (("prompts", prompts), ("labels", labels)):
        if not isinstance(values, list) or len(values) != len(queries):
            raise BadRequest(f"{name!r} must be a list as long as 'query' ({len(queries)})")
    samples = []
    for index, (query, prompt) in enumerate(zip(queries, prompts, strict=True)):
        if not isinstance(query, str) or not isinstance(prompt, str):
            raise BadRequest(f"query and prompt {index} must be strings")
        response = query[len(prompt) :] if prompt and query.startswith(prompt) else query
        samples.append(
            {
                "data_source": OPENRLHF_DATA_SOURCE,
                "solution_str": response,
                "ground_truth": labels[index],
                "extra_info": None,
            }
        )
    return samples


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------


class _Lane:
    """One scoring worker and the thread that drives it: a worker process is tied to the
    thread that started it (the kernel stops it when that thread ends), and its pool runs one
    batch at a time, so each worker gets a thread of its own for the server's life."""

    def __init__(self, index: int) -> None:
        self.thread = concurrent.futures.ThreadPoolExecutor(1, f"plugrl reward worker {index}")
        self.pool = ProcessPool(1)

    async def run(self, call: Call) -> Outcome:
        loop = asyncio.get_running_loop()
        (outcome,) = await loop.run_in_executor(self.thread, self.pool.map, [call])
        return outcome

    def close(self) -> None:
        self.thread.submit(self.pool.close).result()
        self.thread.shutdown()


class RewardService:
    """Scores the samples of requests that arrive at once, ``workers`` samples at a time over
    all of them: each sample takes whichever worker is free, under its own deadline, so a
    sample that hangs holds one worker for ``timeout_s`` and no other request. Each request
    has at most ``workers`` samples waiting for a worker, so requests share the workers
    turn about instead of queueing behind a large one."""

    def __init__(self, scorer: Scorer, workers: int, timeout_s: float) -> None:
        self.scorer = scorer
        self.timeout_s = timeout_s
        self.workers = workers
        self._lanes = [_Lane(index) for index in range(workers)]
        self._free: asyncio.Queue[_Lane] | None = None
        self._closed = False

    def _free_lanes(self) -> asyncio.Queue[_Lane]:
        # made on the server's event loop, the first time a request needs it
        if self._free is None:
            self._free = asyncio.Queue()
            for lane in self._lanes:
                self._free.put_nowait(lane)
        return self._free

    async def _run(self, call: Call) -> Outcome:
        free = self._free_lanes()
        lane = await free.get()
        try:
            return await lane.run(call)
        finally:
            free.put_nowait(lane)

    async def score(self, samples: list[dict[str, Any]]) -> list[tuple[float, dict[str, Any]]]:
        """``(score, extras)`` per sample; :class:`ScoringFailed` naming the first sample
        whose scoring failed or timed out."""
        if not samples:
            return []
        if self.scorer.batch:
            columns = {
                "data_sources": [s["data_source"] for s in samples],
                "solution_strs": [s["solution_str"] for s in samples],
                "ground_truths": [s["ground_truth"] for s in samples],
                "extra_infos": [s["extra_info"] for s in samples],
            }
            outcome = await self._run(Call(self.scorer, columns, self.timeout_s, kind="batch"))
            return _checked(outcome, "the batch", samples[0]["data_source"], self.timeout_s)
        calls = [Call(self.scorer, sample, self.timeout_s) for sample in samples]
        outcomes: list[Outcome | None] = [None] * len(calls)
        pending = iter(range(len(calls)))

        async def take_turns() -> None:
            for index in pending:
                outcomes[index] = await self._run(calls[index])

        await asyncio.gather(*(take_turns() for _ in range(min(self.workers, len(calls)))))
        return [
            _checked(outcome, f"sample {index}", samples[index]["data_source"], self.timeout_s)
            for index, outcome in enumerate(outcomes)
        ]

    def close(self) -> None:
        """Stop the workers (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        for lane in self._lanes:
            lane.close()


def _checked(outcome: Outcome, which: str, data_source: str, timeout_s: float) -> Any:
    if outcome.ok:
        return outcome.value
    if outcome.status == "timeout":
        what = f"timed out: took over {timeout_s:g} s (--timeout-s)"
    else:
        what = f"failed: {outcome.message}"
    raise ScoringFailed(f"{which} (data_source {data_source!r}) {what}")


def plugrl_answer(results: Sequence[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """``{"scores": [...]}``: a number per sample, or its dict when the scorer gave one."""
    return {"scores": [extras if extras else score for score, extras in results]}


def openrlhf_answer(results: Sequence[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """``{"rewards", "scores", "extra_logs"}``: the numeric extra fields as ``extra_logs``."""
    rewards = [score for score, _ in results]
    names: list[str] = []
    for _, extras in results:
        names += [k for k, v in extras.items() if k != "score" and k not in names and _num(v)]
    logs = {name: [_log_value(extras.get(name)) for _, extras in results] for name in names}
    return {"rewards": rewards, "scores": rewards, "extra_logs": logs}


def _num(value: Any) -> bool:
    return isinstance(value, (int, float))


def _log_value(value: Any) -> float:
    return float(value) if _num(value) else 0.0


# --------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------


class BodyTooLarge(ValueError):
    """A request body past ``--max-body-bytes`` (HTTP 413)."""


async def read_body(request: Any, max_bytes: int) -> bytes:
    """The request's body, refused with :class:`BodyTooLarge` as soon as it is known to pass
    ``max_bytes``: from its ``Content-Length`` before reading, else while it streams in."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(int(declared))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(size)
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(
    service: RewardService,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_samples: int = DEFAULT_MAX_SAMPLES,
) -> Any:
    """The starlette app of the three endpoints, scoring with ``service``; bodies past
    ``max_body_bytes`` and requests of more than ``max_samples`` samples get HTTP 413."""
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def failed(request: Request, status: int, error: str) -> JSONResponse:
        error_log.warning("%s %s: %d %s", request.method, request.url.path, status, error)
        return JSONResponse({"error": error}, status_code=status)

    async def answer(request: Request, read: Any, write: Any) -> Response:
        try:
            raw = await read_body(request, max_body_bytes)
        except BodyTooLarge as exc:
            return failed(
                request,
                413,
                f"the body has {exc.args[0]} bytes or more, over --max-body-bytes "
                f"{max_body_bytes}: send fewer samples a request",
            )
        except ClientDisconnect:
            # a client that went away before sending its body: nobody is left to answer
            error_log.debug("%s %s: the client disconnected", request.method, request.url.path)
            return Response(status_code=400)
        try:
            body = json.loads(raw)
        except RecursionError:
            return failed(request, 400, "the body's JSON is nested too deeply to read")
        except ValueError as exc:
            return failed(request, 400, f"the body is not JSON ({exc})")
        try:
            samples = read(body)
        except BadRequest as exc:
            return failed(request, 400, str(exc))
        if len(samples) > max_samples:
            return failed(
                request,
                413,
                f"the request has {len(samples)} samples, over --max-samples {max_samples}: "
                "send fewer samples a request",
            )
        try:
            results = await service.score(samples)
        except (ScoringFailed, PlugrlError) as exc:
            return failed(request, 500, str(exc))
        return JSONResponse(write(results))

    async def score(request: Request) -> Response:
        return await answer(request, read_plugrl_request, plugrl_answer)

    async def get_reward(request: Request) -> Response:
        return await answer(request, read_openrlhf_request, openrlhf_answer)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "function": service.scorer.label})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        service.close()

    return Starlette(
        routes=[
            Route("/score", score, methods=["POST"]),
            Route("/get_reward", get_reward, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


def check_installed() -> None:
    """One line naming the extra when uvicorn or starlette is missing."""
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("uvicorn", "starlette")):
        raise PlugrlError(INSTALL_HINT)


def serve_reward(
    spec: str,
    host: str,
    port: int,
    workers: int,
    timeout_s: float,
    access_log: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_samples: int = DEFAULT_MAX_SAMPLES,
) -> None:
    """Serve the scorer ``spec`` names until interrupted. Failed requests are logged, one
    line each; every request only with ``access_log``."""
    check_installed()
    import uvicorn

    scorer = load_scorer(spec)
    service = RewardService(scorer, workers, timeout_s)
    try:
        uvicorn.run(
            build_app(service, max_body_bytes, max_samples),
            host=host,
            port=port,
            log_level="info",
            access_log=access_log,
        )
    finally:
        service.close()
