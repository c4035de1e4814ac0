"""The ``remote`` reward manager: each batch's samples posted to a scoring server over HTTP.

The batch is cut into requests of ``reward.batch_size`` samples, sent concurrently (at most
``reward.max_in_flight`` at a time, at most ``reward.max_calls_per_s`` started per second) from
an event loop in a thread of its own, so that :meth:`RemoteRewardManager.prefetch` can start
requests and return at once. Each request is retried on what may pass (a connection error, a
timeout, HTTP 429 or 5xx) after ``reward.backoff_s``, doubled each retry, with jitter; never on
another 4xx or a malformed answer.

Two schemas (``reward.schema``, docs/rewards.md "Remote rewards" has the details):

* ``plugrl``: request ``{"samples": [{"data_source", "prompt", "response", "ground_truth",
  "extra_info"}, ...]}`` with prompt and response decoded without special tokens; answer
  ``{"scores": [number | {"score": number, ...extra fields}, ...]}``, one per sample, in order;
* ``openrlhf``: OpenRLHF's remote reward request ``{"query": [prompt + response, ...],
  "prompts": [...], "labels": [...]}`` (decoded with special tokens, as OpenRLHF sends them);
  answer ``{"rewards": [...]}``, and optionally ``scores`` and ``extra_logs``.

A request that still fails after its retries fails its samples: under ``reward.on_error:
raise`` the run stops with one line naming the URL, what went wrong and the fix; under
``score_zero``/``fallback`` they score 0/``reward.fallback_score``, count in ``reward/errors``
(``reward/timeouts`` for a timeout), and a warning line says so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import torch

from plugrl.api import RecipeError, non_negative, option, positive
from plugrl.api.data import response_attention_mask
from plugrl.api.rewards import (
    RewardConfig,
    RewardManager,
    RewardOutput,
    SampleResult,
    ScoringError,
    expect_config,
    extra_columns,
    score_metrics,
)

if TYPE_CHECKING:
    from plugrl.api import PartContext
    from plugrl.api.data import Batch

logger = logging.getLogger("plugrl.rewards")

SCHEMAS = ("plugrl", "openrlhf")
FALLBACK_HINT = "or set reward.on_error=fallback to score such samples reward.fallback_score"


@attrs.define(kw_only=True)
class RemoteRewardConfig(RewardConfig):
    """The ``reward`` section for ``manager: remote``."""

    url: str | None = option(
        None,
        "The scoring server's endpoint (http://host:8000/score for `plugrl serve reward`, "
        "http://host:5000/get_reward for an OpenRLHF remote reward server).",
    )
    schema: str = option(
        "plugrl",
        "The JSON the server speaks: 'plugrl' ({samples: [...]} -> {scores: [...]}) or "
        "'openrlhf' ({query, prompts, labels} -> {rewards: [...]}, OpenRLHF's --remote_rm_url).",
        choices=list(SCHEMAS),
    )
    batch_size: int = option(32, "Samples per HTTP request.", validator=positive)
    timeout_s: float = option(
        60.0,
        "Seconds one HTTP request (each try) may take before it counts as timed out.",
        validator=positive,
    )
    max_retries: int = option(
        3,
        "Retries of a request that failed on a connection error, a timeout, HTTP 429 or 5xx "
        "(never on another 4xx or a malformed answer).",
        validator=non_negative,
    )
    backoff_s: float = option(
        0.5,
        "Seconds before the first retry, doubled each retry, each wait scaled by a random "
        "factor in [0.5, 1.5) so that many clients do not retry in step.",
        validator=non_negative,
    )
    max_in_flight: int = option(
        8, "Most requests waiting for an answer at once.", validator=positive
    )
    max_calls_per_s: float | None = option(
        None,
        "Most requests started per second (tries included); unset: no limit.",
        validator=positive,
    )
    token_env: str | None = option(
        None,
        "Name of the environment variable holding a bearer token, sent as 'Authorization: "
        "Bearer <token>' (the token itself never goes in a recipe).",
    )


# --------------------------------------------------------------------------------------------
# What one request ended as
# --------------------------------------------------------------------------------------------


@attrs.frozen
class Failure:
    """Why a request failed: ``status`` is ``error`` or ``timeout``, ``what`` what went wrong
    (``answered HTTP 500: ...``), ``fix`` what to do about it; ``retry`` whether another try
    may go differently."""

    status: str
    what: str
    fix: str
    retry: bool


@attrs.define
class Reply:
    """One request's outcome: a result per sample (all failed, with ``failure`` set, when the
    request failed), and the HTTP calls it took."""

    results: list[SampleResult] = attrs.field(factory=list)
    failure: Failure | None = None
    calls: int = 0
    retries: int = 0
    latency_s: float = 0.0


class MalformedAnswer(ValueError):
    """The server answered 2xx with a body that does not follow the schema."""


# --------------------------------------------------------------------------------------------
# The two schemas
# --------------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: numpy arrays and scalars (how parquet columns arrive) and
    tensors become lists and numbers, mappings get string keys, anything else its ``str``."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return jsonable(tolist())
    return str(value)


def request_body(schema: str, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON body of one request of ``samples`` (each the wire form of a sample:
    ``data_source``, ``prompt``, ``response``, ``ground_truth``, ``extra_info``, plus
    ``query``, the prompt and response decoded with special tokens, for ``openrlhf``)."""
    if schema == "openrlhf":
        return {
            "query": [s["query"] for s in samples],
            "prompts": [s["prompt"] for s in samples],
            "labels": [s["ground_truth"] for s in samples],
        }
    return {"samples": [dict(s) for s in samples]}


def _number(value: Any) -> float | None:
    if isinstance(value, Real) and math.isfinite(float(value)):
        return float(value)
    return None


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {json.dumps(value)[:40]}"


def parse_answer(schema: str, body: Any, size: int) -> list[SampleResult]:
    """One result per sample from a 2xx answer's JSON; :class:`MalformedAnswer` saying what
    does not fit the schema otherwise."""
    if not isinstance(body, Mapping):
        raise MalformedAnswer(f"answered {_describe(body)} instead of a JSON object")
    key = "rewards" if schema == "openrlhf" else "scores"
    if key not in body:
        keys = ", ".join(map(str, body)) or "none"
        raise MalformedAnswer(f"answered without {key!r} (keys: {keys})")
    values = _column(body, key, size)
    if schema == "openrlhf":
        return _openrlhf_results(body, values, size)
    results = []
    for index, item in enumerate(values):
        extras: dict[str, Any] = {}
        score = item
        if isinstance(item, Mapping):
            if "score" not in item:
                fields = ", ".join(map(str, item)) or "none"
                raise MalformedAnswer(f"answered score {index} without 'score' (keys: {fields})")
            extras = dict(item)
            score = item["score"]
        number = _number(score)
        if number is None:
            raise MalformedAnswer(
                f"answered score {index} as {_describe(score)}, not a finite number"
            )
        if extras:
            extras["score"] = number
        results.append(SampleResult(number, extras))
    return results


def _column(body: Mapping[str, Any], key: str, size: int) -> list[Any]:
    values = body[key]
    if not isinstance(values, list):
        raise MalformedAnswer(f"answered {key!r} as {_describe(values)} instead of a list")
    if len(values) != size:
        raise MalformedAnswer(f"answered {len(values)} {key} for {size} samples")
    return values


def _openrlhf_results(body: Mapping[str, Any], rewards: list[Any], size: int) -> list[SampleResult]:
    columns: dict[str, list[Any]] = {}
    if body.get("scores") is not None:
        columns["scores"] = _column(body, "scores", size)
    logs = body.get("extra_logs") or {}
    if not isinstance(logs, Mapping):
        raise MalformedAnswer(f"answered 'extra_logs' as {_describe(logs)} instead of an object")
    for name in logs:
        columns[str(name)] = _column(logs, name, size)
    results = []
    for index, reward in enumerate(rewards):
        number = _number(reward)
        if number is None:
            raise MalformedAnswer(
                f"answered reward {index} as {_describe(reward)}, not a finite number"
            )
        extras = {name: column[index] for name, column in columns.items()}
        if extras:
            extras["score"] = number
        results.append(SampleResult(number, extras))
    return results


def _fix_for_malformed(schema: str) -> str:
    if schema == "openrlhf":
        shape = '{"rewards": [number, ...]} with one reward per sample'
    else:
        shape = '{"scores": [number or {"score": number, ...}, ...]} with one per sample'
    return (
        f"the server must answer {shape}, in order (reward.schema={schema}; see "
        "docs/rewards.md, Remote rewards)"
    )


def _detail(response: Any) -> str:
    """The ``error`` field of a JSON error body, else the body's start, on one line."""
    text = ""
    try:
        body = response.json()
        if isinstance(body, Mapping) and "error" in body:
            text = str(body["error"])
    except ValueError:
        pass
    text = text or response.text
    text = " ".join(text.split())[:200]
    return f": {text}" if text else ""


# --------------------------------------------------------------------------------------------
# The HTTP side, on an event loop in a thread of its own
# --------------------------------------------------------------------------------------------


class RemoteClient:
    """Posts requests to ``config.url`` under the config's limits and retries. Its methods
    are called from any thread; the requests run on the client's own event loop thread,
    started on first use and stopped by :meth:`close`."""

    def __init__(self, config: RemoteRewardConfig, headers: Mapping[str, str]) -> None:
        self.config = config
        self.url = str(config.url)
        self.headers = dict(headers)
        self._random = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._client: Any = None
        self._in_flight: asyncio.Semaphore | None = None
        self._pace_lock: asyncio.Lock | None = None
        self._next_start = 0.0

    def submit(self, body: dict[str, Any], size: int) -> concurrent.futures.Future[Reply]:
        """Start one request of ``size`` samples; its :class:`Reply` arrives in the future."""
        loop = self._started()
        return asyncio.run_coroutine_threadsafe(self._request(body, size), loop)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="plugrl remote reward", daemon=True
                )
                thread.start()
                asyncio.run_coroutine_threadsafe(self._open(), loop).result()
                self._loop, self._thread = loop, thread
            return self._loop

    async def _open(self) -> None:
        import httpx

        # the limits are this client's: httpx's own pool limit is set above them
        limits = httpx.Limits(max_connections=self.config.max_in_flight + 4)
        self._client = httpx.AsyncClient(limits=limits, headers=self.headers)
        self._in_flight = asyncio.Semaphore(self.config.max_in_flight)
        self._pace_lock = asyncio.Lock()

    def close(self) -> None:
        """Stop the loop and its thread; requests still running are cancelled."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if not thread.is_alive():
            loop.close()

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()

    # ------------------------------------------------------------------ one request

    async def _request(self, body: dict[str, Any], size: int) -> Reply:
        reply = Reply()
        failure: Failure | None = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                reply.retries += 1
                await asyncio.sleep(self.backoff(attempt))
            results, failure = await self._try(body, size, reply)
            if failure is None:
                reply.results = results
                return reply
            if not failure.retry:
                break
        assert failure is not None
        reply.failure = failure
        reply.results = [
            SampleResult(self.config.failure_score(), {}, failure.status, failure.what)
            for _ in range(size)
        ]
        return reply

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` >= 1)."""
        return self.config.backoff_s * 2 ** (attempt - 1) * self._random.uniform(0.5, 1.5)

    async def _pace(self) -> None:
        rate = self.config.max_calls_per_s
        if not rate:
            return
        assert self._pace_lock is not None
        async with self._pace_lock:  # held while waiting: starts stay 1/rate apart
            now = time.monotonic()
            if self._next_start > now:
                await asyncio.sleep(self._next_start - now)
            self._next_start = max(now, self._next_start) + 1.0 / rate

    async def _try(
        self, body: dict[str, Any], size: int, reply: Reply
    ) -> tuple[list[SampleResult], Failure | None]:
        import httpx

        timeout = self.config.timeout_s
        assert self._in_flight is not None
        async with self._in_flight:
            await self._pace()
            reply.calls += 1
            started = time.monotonic()
            try:
                # wait_for bounds the whole call: httpx's timeout bounds each read, and a
                # server that trickles bytes would never trip it
                response = await asyncio.wait_for(
                    self._client.post(self.url, json=body, timeout=timeout), timeout
                )
            except (asyncio.TimeoutError, httpx.TimeoutException):
                return [], Failure(
                    "timeout",
                    f"did not answer in {timeout:g} s (reward.timeout_s)",
                    "raise reward.timeout_s or lower reward.batch_size, " + FALLBACK_HINT,
                    retry=True,
                )
            except httpx.HTTPError as exc:
                return [], Failure(
                    "error",
                    f"could not be reached ({type(exc).__name__}: {exc})",
                    "check that the server runs and reward.url is right, " + FALLBACK_HINT,
                    retry=True,
                )
            finally:
                reply.latency_s += time.monotonic() - started
        return self._read(response, size)

    def _read(self, response: Any, size: int) -> tuple[list[SampleResult], Failure | None]:
        status = response.status_code
        if status == 429 or status >= 500:
            return [], Failure(
                "error",
                f"answered HTTP {status}{_detail(response)}",
                "check the server (its log names the sample), " + FALLBACK_HINT,
                retry=True,
            )
        if status in (401, 403):
            where = (
                f"the token in ${self.config.token_env} (reward.token_env)"
                if self.config.token_env
                else "no token: set reward.token_env to the environment variable holding one"
            )
            return [], Failure(
                "error",
                f"answered HTTP {status}{_detail(response)}",
                f"the server refused {where}",
                retry=False,
            )
        if status >= 300:
            return [], Failure(
                "error",
                f"answered HTTP {status}{_detail(response)}",
                "check reward.url (its path: /score for plugrl's schema, /get_reward for "
                "OpenRLHF's) and that reward.schema is the one the server speaks",
                retry=False,
            )
        try:
            return parse_answer(self.config.schema, response.json(), size), None
        except ValueError as exc:  # a body that is not JSON, or MalformedAnswer
            what = (
                str(exc)
                if isinstance(exc, MalformedAnswer)
                else f"answered HTTP {status} with a body that is not JSON "
                f"({' '.join(response.text.split())[:60]!r})"
            )
            return [], Failure("error", what, _fix_for_malformed(self.config.schema), retry=False)


# --------------------------------------------------------------------------------------------
# The manager
# --------------------------------------------------------------------------------------------


@attrs.frozen
class _Pending:
    """A sample's place in a request: the request's future and the sample's position in it."""

    future: concurrent.futures.Future[Reply]
    position: int


class RemoteRewardManager(RewardManager):
    """Scores a batch by posting its samples to ``reward.url`` (see module doc); the score on
    each response's last valid token, metrics as the built-in managers plus
    ``reward/remote/{calls,retries,latency_s}``."""

    name = "remote"

    def __init__(self, config: RewardConfig, context: PartContext) -> None:
        super().__init__(config, context)
        expect_config(config, RemoteRewardConfig, "remote")
        self.config: RemoteRewardConfig = config
        self.url = checked_url(config.url)
        self.client = RemoteClient(config, auth_headers(config.token_env))
        self._prefetched: dict[str, deque[_Pending]] = {}
        self._prefetch_lock = threading.Lock()

    def check_data_sources(self, data_sources: Any) -> None:
        """Nothing to check here: the server scores every data source, and answers an error
        for one it cannot score."""

    # ------------------------------------------------------------------ samples

    def wire_samples(self, batch: Batch) -> list[dict[str, Any]]:
        """Each row as the request carries it (see :func:`request_body`)."""
        batch.require(
            "responses",
            "response_mask",
            "data_source",
            "ground_truth",
            by=f"reward manager {self.name!r}",
        )
        responses: torch.Tensor = batch["responses"]
        mask: torch.Tensor = response_attention_mask(batch)
        size = responses.shape[0]
        prompts = self._prompt_ids(batch)
        extra_infos = list(batch.get("extra_info", [None] * size))
        special = self.config.schema == "openrlhf"  # OpenRLHF sends the text with them
        samples = []
        for row in range(size):
            response_ids = responses[row][mask[row].bool()].tolist()
            sample = {
                "data_source": str(batch["data_source"][row]),
                "prompt": self.tokenizer.decode(prompts[row], skip_special_tokens=not special),
                "response": self.tokenizer.decode(response_ids, skip_special_tokens=not special),
                "ground_truth": jsonable(batch["ground_truth"][row]),
                "extra_info": jsonable(extra_infos[row]),
            }
            if special:
                sample["query"] = self.tokenizer.decode(
                    prompts[row] + response_ids, skip_special_tokens=False
                )
            samples.append(sample)
        return samples

    @staticmethod
    def _prompt_ids(batch: Batch) -> list[list[int]]:
        size = batch["responses"].shape[0]
        if "raw_prompt_ids" in batch:
            return [list(map(int, ids)) for ids in batch["raw_prompt_ids"]]
        if "prompts" in batch and "prompt_attention_mask" in batch:
            mask = batch["prompt_attention_mask"].bool()
            return [batch["prompts"][row][mask[row]].tolist() for row in range(size)]
        return [[] for _ in range(size)]

    def _submit(self, samples: Sequence[dict[str, Any]]) -> concurrent.futures.Future[Reply]:
        return self.client.submit(request_body(self.config.schema, samples), len(samples))

    def _chunks(self, indices: Sequence[int]) -> list[Sequence[int]]:
        size = self.config.batch_size
        return [indices[start : start + size] for start in range(0, len(indices), size)]

    @staticmethod
    def _key(sample: Mapping[str, Any]) -> str:
        return json.dumps(sample, sort_keys=True)

    # ------------------------------------------------------------------ scoring

    def prefetch(self, batch: Batch) -> None:
        """Post these rows' requests now, without waiting; :meth:`__call__` takes their
        answers for the rows of its batch with the same content (prompt, response, data
        source, ground truth, extra info) instead of posting them again."""
        samples = self.wire_samples(batch)
        for chunk in self._chunks(range(len(samples))):
            future = self._submit([samples[i] for i in chunk])
            with self._prefetch_lock:
                for position, index in enumerate(chunk):
                    key = self._key(samples[index])
                    self._prefetched.setdefault(key, deque()).append(_Pending(future, position))

    def __call__(self, batch: Batch) -> RewardOutput:
        samples = self.wire_samples(batch)
        size = len(samples)
        places: list[_Pending | None] = [None] * size
        with self._prefetch_lock:
            for index, sample in enumerate(samples):
                waiting = self._prefetched.get(self._key(sample))
                if waiting:
                    places[index] = waiting.popleft()
            leftover = [p.future for queue in self._prefetched.values() for p in queue]
            self._prefetched.clear()
        missing = [i for i, place in enumerate(places) if place is None]
        for chunk in self._chunks(missing):
            future = self._submit([samples[i] for i in chunk])
            for position, index in enumerate(chunk):
                places[index] = _Pending(future, position)
        used = {id(p.future): p.future for p in places if p is not None}
        for future in leftover:  # prefetched rows this batch does not hold
            if id(future) not in used:
                future.cancel()
        try:
            replies = {key: future.result() for key, future in used.items()}
        except BaseException:
            for future in used.values():
                future.cancel()
            raise
        results = [replies[id(p.future)].results[p.position] for p in places if p is not None]
        data_sources = [s["data_source"] for s in samples]
        self._handle_failures(replies, places)
        return self._output(batch, results, data_sources, list(replies.values()))

    def _handle_failures(self, replies: dict[int, Reply], places: list[Any]) -> None:
        failed = {key: reply for key, reply in replies.items() if reply.failure is not None}
        if not failed:
            return
        key, reply = next(iter(failed.items()))
        failure = reply.failure
        assert failure is not None
        rows = [i for i, p in enumerate(places) if id(p.future) == key]
        where = f"sample {rows[0]}" if len(rows) == 1 else f"samples {rows[0]}-{rows[-1]}"
        tries = f"{reply.calls} tries" if reply.calls != 1 else "1 try"
        if self.config.on_error == "raise":
            more = f", {len(failed) - 1} more requests failed" if len(failed) > 1 else ""
            raise ScoringError(
                f"remote reward at {self.url} {failure.what} ({where}, {tries}{more}); "
                f"{failure.fix}"
            )
        samples = sum(id(p.future) in failed for p in places)  # rows of this batch
        logger.warning(
            "reward: %d of %d requests to %s failed and their %d samples were scored %g "
            "(reward.on_error=%s); first: %s, %s (%s)",
            len(failed),
            len(replies),
            self.url,
            samples,
            self.config.failure_score(),
            self.config.on_error,
            where,
            failure.what,
            tries,
        )

    def _output(
        self,
        batch: Batch,
        results: list[SampleResult],
        data_sources: list[str],
        replies: list[Reply],
    ) -> RewardOutput:
        responses: torch.Tensor = batch["responses"]
        size = responses.shape[0]
        lengths = response_attention_mask(batch).sum(dim=-1).to(torch.long)
        scores = torch.zeros(responses.shape, dtype=torch.float32)
        if size:
            last = (lengths - 1).clamp(min=0)  # an empty response keeps its score on token 0
            scores[torch.arange(size), last] = torch.tensor(
                [r.score for r in results], dtype=torch.float32
            )
        metrics = score_metrics(results, data_sources, scores.sum(dim=-1))
        calls = sum(r.calls for r in replies)
        metrics["reward/remote/calls"] = float(calls)
        metrics["reward/remote/retries"] = float(sum(r.retries for r in replies))
        if calls:
            metrics["reward/remote/latency_s"] = sum(r.latency_s for r in replies) / calls
        return RewardOutput(
            token_level_scores=scores, extra=extra_columns(results), metrics=metrics
        )

    def close(self) -> None:
        self.client.close()


# --------------------------------------------------------------------------------------------
# Start-up checks
# --------------------------------------------------------------------------------------------


def checked_url(url: str | None) -> str:
    """``reward.url``, checked to be an http(s) address; one line otherwise."""
    if not url:
        raise RecipeError(
            "the remote manager needs the scoring server's address: set reward.url "
            "(http://host:8000/score for `plugrl serve reward`)",
            key="reward.url",
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RecipeError(
            f"{url!r} is not an http(s) address; write it as http://host:port/path",
            key="reward.url",
        )
    return url


def auth_headers(token_env: str | None) -> dict[str, str]:
    """The bearer token header from the environment variable ``token_env`` (none unset);
    one line when the variable is missing or empty."""
    if not token_env:
        return {}
    token = os.environ.get(token_env, "")
    if not token:
        raise RecipeError(
            f"the environment variable {token_env} is not set; export it with the scoring "
            "server's token before the run (tokens are read from the environment, never from "
            "the recipe)",
            key="reward.token_env",
        )
    return {"Authorization": f"Bearer {token}"}
