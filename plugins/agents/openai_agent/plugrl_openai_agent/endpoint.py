"""An OpenAI-compatible HTTP endpoint over the run's engines, for agents written against the
``openai`` client (the ``openai`` agent loop; any adapter whose agent only takes a client).

One server per run, on ``127.0.0.1`` and a free port, in a thread with its own event loop.
Each running sample has its own route, ``/samples/<sample id>/v1``, with:

* ``POST .../chat/completions``: the request's ``messages`` (and ``tools``) rendered by the
  run's chat template, one model turn sampled by the sample's :class:`~plugrl.parts.agent.Session`,
  the answer as a ``chat.completion`` (tool calls read by the run's tool-call parser when the
  request offers tools; ``logprobs`` when asked);
* ``POST .../completions``: a text (or token ids, each within the tokenizer's vocabulary)
  prompt, continued as a ``text_completion``;
* ``GET .../models``: the one model name the endpoint answers to (any name is accepted).

Every call is recorded in the sample's :class:`~plugrl_openai_agent.recording.SampleRecording`. The
run's sampling applies whatever the request says (the log-probs train the policy that sampled):
``max_tokens`` (or ``max_completion_tokens``) is clipped to what is left of
``data.max_response_length``; ``stop`` cuts the answer before the first stop text (the
tokens sampled after it are dropped); ``temperature``, ``top_p``, ``seed`` and
``tool_choice`` are ignored; ``n`` must be 1. A ``stream`` request gets the whole answer
as server-sent events once it is sampled: a chunk with the text (and the tool calls), one
with the finish reason, one with the usage when ``stream_options.include_usage`` asks.

Errors are OpenAI's shape, ``{"error": {"message", "type", "code"}}``, so the ``openai`` client
raises them with their message: 404 for a sample that is not running, 400 for a body that does
not follow the schema (one line saying what is wrong), 500 when the engines failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import attrs

from plugrl.api import PluginError
from plugrl.api.agents import Message, Session
from plugrl_openai_agent.recording import SampleRecording, rendered_span

if TYPE_CHECKING:
    from plugrl.parts.rollout import Completion

INSTALL_HINT = (
    "the OpenAI-compatible endpoint needs uvicorn and starlette: pip install 'plugrl[serve]'"
)
DEFAULT_MODEL_NAME = "plugrl"
START_TIMEOUT_S = 30.0


class EndpointError(Exception):
    """A request the endpoint refuses: an HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def body(self) -> dict[str, Any]:
        kind = {400: "invalid_request_error", 404: "not_found_error"}.get(self.status, "api_error")
        return {"error": {"message": str(self), "type": kind, "code": self.status}}


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ChatRequest:
    """What the endpoint reads from a chat or text completion request."""

    model: str
    max_tokens: int | None
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    stop: tuple[str, ...] = ()
    messages: list[Message] = attrs.field(factory=list)
    tools: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None


def _bad(message: str) -> EndpointError:
    return EndpointError(400, message)


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise _bad(f"the body must be a JSON object, not {type(body).__name__}")
    return body


def _common(body: Mapping[str, Any]) -> dict[str, Any]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise _bad(f"stream must be true or false, got {stream!r}")
    n = body.get("n", 1)
    if n not in (None, 1):
        raise _bad(f"n must be 1, got {n!r}: send one request per sample")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise _bad(f"max_tokens must be a positive integer, got {max_tokens!r}")
    model = body.get("model", DEFAULT_MODEL_NAME)
    return {
        "model": model if isinstance(model, str) else DEFAULT_MODEL_NAME,
        "max_tokens": max_tokens,
        "return_token_ids": bool(body.get("return_token_ids", False)),
        "stop": _stop_strings(body.get("stop")),
    }


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _bad(f"stop must be a text or a list of non-empty texts, got {stop!r}")
    return tuple(stop)


def read_chat_request(body: Any) -> ChatRequest:
    """A ``/chat/completions`` body; :class:`EndpointError` (400) naming what is wrong."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of chat messages")
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools)
    ):
        raise _bad("tools must be a list of function schemas")
    top = body.get("top_logprobs") or 0
    if not isinstance(top, int) or not 0 <= top <= 20:
        raise _bad(f"top_logprobs must be an integer from 0 to 20, got {top!r}")
    return ChatRequest(
        **_common(body),
        logprobs=bool(body.get("logprobs", False)),
        top_logprobs=top,
        messages=[_message(m, i) for i, m in enumerate(messages)],
        tools=[dict(t) for t in tools] if tools else None,
    )


def read_completion_request(body: Any) -> ChatRequest:
    """A ``/completions`` body: one prompt, a text or a list of token ids."""
    body = _object(body)
    prompt = body.get("prompt")
    is_ids = isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    )
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
        is_ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    if not (isinstance(prompt, str) or (is_ids and prompt)):
        raise _bad("prompt must be one text or one non-empty list of token ids")
    logprobs = body.get("logprobs")
    if logprobs is not None and (not isinstance(logprobs, int) or not 0 <= logprobs <= 5):
        raise _bad(f"logprobs must be an integer from 0 to 5, got {logprobs!r}")
    return ChatRequest(
        **_common(body),
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        prompt=prompt,
    )


def _message(message: Any, index: int) -> Message:
    """A message as the chat template takes it: text content, and tool-call arguments as
    objects (the API carries them as JSON strings; templates write them as JSON)."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise _bad(f"message {index} must be a JSON object with a string role")
    out = dict(message)
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise _bad(f"message {index} has a {kind!r} content part; only text is supported")
            parts.append(str(part.get("text", "")))
        content = "".join(parts)
    elif content is not None and not isinstance(content, str):
        raise _bad(f"message {index} content must be a text or a list of text parts")
    out["content"] = content or ""
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list) or not all(isinstance(c, Mapping) for c in calls):
            raise _bad(f"message {index} tool_calls must be a list of objects")
        out["tool_calls"] = [_template_call(call, index) for call in calls]
    return out


def _template_call(call: Mapping[str, Any], index: int) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise _bad(f"message {index} has a tool call without function.name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        # a text that is not JSON is kept as the model wrote it
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments) if arguments.strip() else {}
    return {
        **call,
        "type": "function",
        "function": {**function, "name": function["name"], "arguments": arguments},
    }


# --------------------------------------------------------------------------------------------
# One sample
# --------------------------------------------------------------------------------------------


class EndpointSample:
    """A running sample's side of the endpoint: it answers the calls made on its route with
    its session, on the event loop it was created on, and records them."""

    def __init__(self, session: Session, loop: asyncio.AbstractEventLoop, model_name: str) -> None:
        self.sample_id = session.sample_id
        self.session = session
        self.loop = loop
        self.model_name = model_name
        self.tokenizer = session.tokenizer
        self.recording = SampleRecording(
            session.tokenizer, session.max_response_length, session.config.max_turns
        )
        self.malformed_tool_calls = 0
        self.closed = False
        self._call_ids = 0
        self._answering: set[asyncio.Task[Any]] = set()

    async def handle(self, kind: str, body: Any) -> dict[str, Any]:
        """The answer to a ``chat`` or ``completions`` request body."""
        if self.closed:
            raise EndpointError(404, f"sample {self.sample_id!r} has ended")
        task = asyncio.current_task()
        if task is not None:
            self._answering.add(task)
        try:
            if kind == "chat":
                return await self._chat(read_chat_request(body))
            return await self._complete(read_completion_request(body))
        except asyncio.CancelledError:
            if self.closed:
                raise EndpointError(
                    404, f"sample {self.sample_id!r} ended before this call was answered"
                ) from None
            raise
        finally:
            self._answering.discard(task)  # type: ignore[arg-type]

    def close(self) -> None:
        """Answer no more calls; those being answered are cancelled (their sampling too), so
        that the record no longer changes. Call it on the sample's event loop."""
        self.closed = True
        for task in list(self._answering):
            task.cancel()

    async def _chat(self, request: ChatRequest) -> dict[str, Any]:
        prompt_text = self._render(request.messages, request.tools, generation_prompt=True)
        prompt_ids = self.recording.encode(prompt_text)
        completion, limited = await self._generate(prompt_ids, request.max_tokens)
        completion = self._stopped(completion, request.stop)
        text = self._decode(completion)
        tool_calls: list[dict[str, Any]] = []
        content = text
        if request.tools and completion.token_ids:
            parsed = self.session.parse_tool_calls(text)
            if any(call.error for call in parsed.tool_calls):
                # like an OpenAI-compatible server whose parser fails: the text as it is
                self.malformed_tool_calls += 1
            else:
                content = parsed.content
                tool_calls = [self._api_call(c.name, c.arguments) for c in parsed.tool_calls]
        answer: Message = {"role": "assistant", "content": content or None}
        if tool_calls:
            answer["tool_calls"] = tool_calls
        if completion.token_ids:
            conversation = [*request.messages, _message(answer, len(request.messages))]
            self._remember_chat(prompt_text, conversation, request.tools, completion)
        if not limited:
            self.recording.record(prompt_ids, completion, [*request.messages, answer])
        choice: dict[str, Any] = {
            "index": 0,
            "message": answer,
            "logprobs": self._chat_logprobs(completion) if request.logprobs else None,
            "finish_reason": _api_finish(completion, bool(tool_calls)),
        }
        return self._response(
            "chat.completion", "chatcmpl", request, prompt_ids, completion, choice
        )

    async def _complete(self, request: ChatRequest) -> dict[str, Any]:
        prompt = request.prompt
        if isinstance(prompt, list):
            self._check_token_ids(prompt)
            prompt_ids = list(prompt)
        else:
            prompt_ids = self.recording.encode(prompt or "")
        completion, limited = await self._generate(prompt_ids, request.max_tokens)
        completion = self._stopped(completion, request.stop)
        text = self._decode(completion)
        if not limited:
            prompt_text = prompt if isinstance(prompt, str) else None
            if prompt_text is not None:  # a client that sends ids continues with ids
                ids = _without_trailing_specials(completion, self.tokenizer)
                self.recording.remember(prompt_text, text, ids)
            messages = [
                {"role": "prompt", "content": prompt_text},
                {"role": "completion", "content": text},
            ]
            self.recording.record(prompt_ids, completion, messages if prompt_text else [])
        choice = {
            "index": 0,
            "text": text,
            "logprobs": self._text_logprobs(completion) if request.logprobs else None,
            "finish_reason": _api_finish(completion, False),
        }
        return self._response("text_completion", "cmpl", request, prompt_ids, completion, choice)

    def _check_token_ids(self, token_ids: list[int]) -> None:
        """Refuse ids outside the vocabulary here: sent on, one would fail the engine's whole
        batch (other samples' calls with it) or, on a GPU, end the engine's process."""
        vocabulary = len(self.tokenizer)
        for position, token_id in enumerate(token_ids):
            if not 0 <= token_id < vocabulary:
                raise _bad(
                    f"prompt token id {token_id} (at position {position}) is outside the "
                    f"model's vocabulary: ids run from 0 to {vocabulary - 1}"
                )

    async def _generate(
        self, prompt_ids: list[int], max_tokens: int | None
    ) -> tuple[Completion, bool]:
        """The completion, and whether a limit answered it with nothing (not a turn).

        The turn is reserved before the engines are awaited and the reservation ends when
        they answer (the caller records the turn before it next awaits): calls made at once
        cannot all pass the ``max_turns`` check while none has been counted yet."""
        from plugrl.api.rollout import Completion

        budget = self.recording.budget(prompt_ids, max_tokens)
        if budget.limit is not None:
            self.recording.record_limit(prompt_ids, budget.limit)
            return Completion(token_ids=[], log_probs=[], finish_reason="length"), True
        self.recording.calls_in_flight += 1
        try:
            return await self.session.generate(prompt_ids, budget.max_tokens), False
        except Exception as exc:
            raise EndpointError(
                500, f"the engines failed to answer: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            self.recording.calls_in_flight -= 1

    def _stopped(self, completion: Completion, stop: tuple[str, ...]) -> Completion:
        """``completion`` cut before the first of the ``stop`` texts: the tokens whose text
        lies wholly before it (the engine sampled on; what follows the stop text is not part
        of the answer, and the client continues the text before it)."""
        text = self._decode(completion)
        found = [text.find(s) for s in stop if s in text]
        if not found:
            return completion
        before = text[: min(found)]
        ids = list(completion.token_ids)
        # the longest run of tokens whose text begins ``before``; prefixes only grow
        low, high = 0, len(ids)
        while low < high:
            middle = (low + high + 1) // 2
            prefix = self.tokenizer.decode(ids[:middle], skip_special_tokens=True)
            if before.startswith(prefix):
                low = middle
            else:
                high = middle - 1
        return attrs.evolve(
            completion,
            token_ids=ids[:low],
            log_probs=list(completion.log_probs[:low]),
            token_versions=list(completion.token_versions[:low]),
            finish_reason="stop",
        )

    def _render(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, generation_prompt: bool
    ) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=generation_prompt,
                tokenize=False,
            )
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise _bad(
                f"the model's chat template cannot render these messages: "
                f"{type(exc).__name__}: {first}"
            ) from exc

    def _remember_chat(
        self,
        prompt_text: str,
        conversation: list[Message],
        tools: list[dict[str, Any]] | None,
        completion: Completion,
    ) -> None:
        try:
            full_text = self._render(conversation, tools, generation_prompt=False)
        except EndpointError:
            full_text = ""  # a template that cannot end on an assistant turn
        span = rendered_span(prompt_text, full_text, completion.token_ids, self.tokenizer)
        self.recording.remember(prompt_text, span, completion.token_ids)

    def _decode(self, completion: Completion) -> str:
        return self.tokenizer.decode(list(completion.token_ids), skip_special_tokens=True)

    def _api_call(self, name: str, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
        self._call_ids += 1
        return {
            "id": f"call_{self._call_ids}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments or {})},
        }

    def _token_texts(self, completion: Completion) -> list[str]:
        return [self.tokenizer.decode([t], skip_special_tokens=False) for t in completion.token_ids]

    def _chat_logprobs(self, completion: Completion) -> dict[str, Any]:
        # the engines return the sampled token's log-prob only: top_logprobs stay empty
        return {
            "content": [
                {
                    "token": text,
                    "logprob": float(logprob),
                    "bytes": list(text.encode("utf-8")),
                    "top_logprobs": [],
                }
                for text, logprob in zip(
                    self._token_texts(completion), completion.log_probs, strict=True
                )
            ]
        }

    def _text_logprobs(self, completion: Completion) -> dict[str, Any]:
        texts = self._token_texts(completion)
        offsets = [0, *itertools.accumulate(len(t) for t in texts)][: len(texts)]
        return {
            "tokens": texts,
            "token_logprobs": [float(v) for v in completion.log_probs],
            "top_logprobs": [{} for _ in texts],
            "text_offset": offsets,
        }

    def _response(
        self,
        obj: str,
        prefix: str,
        request: ChatRequest,
        prompt_ids: list[int],
        completion: Completion,
        choice: dict[str, Any],
    ) -> dict[str, Any]:
        if request.return_token_ids:
            choice["token_ids"] = list(completion.token_ids)
        response: dict[str, Any] = {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": obj,
            "created": int(time.time()),
            "model": request.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(completion.token_ids),
                "total_tokens": len(prompt_ids) + len(completion.token_ids),
            },
        }
        if request.return_token_ids:
            response["prompt_token_ids"] = list(prompt_ids)
        return response

    def metrics(self) -> dict[str, float]:
        """The recording's figures and the answers whose tool calls could not be read."""
        return {
            **self.recording.metrics(),
            "endpoint_malformed_tool_calls": float(self.malformed_tool_calls),
        }


def _api_finish(completion: Completion, called_tools: bool) -> str:
    if called_tools:
        return "tool_calls"
    # an answer cut short by a limit or a weight update ended for want of tokens
    return "stop" if completion.finish_reason == "stop" else "length"


def _without_trailing_specials(completion: Completion, tokenizer: Any) -> list[int]:
    """The sampled ids that the returned text (special tokens skipped) is made of: a text
    continued by the client never holds the end-of-text token it did not see."""
    specials = set(tokenizer.all_special_ids)
    ids = list(completion.token_ids)
    while ids and ids[-1] in specials:
        ids.pop()
    return ids


def stream_events(response: Mapping[str, Any], include_usage: bool) -> list[str]:
    """A whole answer as the server-sent events of a streamed one: the content (and tool
    calls) in one chunk, the finish reason in the next, the usage last when asked, then
    ``[DONE]``."""
    chat = response["object"] == "chat.completion"
    head = {k: response[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    choice = response["choices"][0]
    if chat:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        first = {"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}
        last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}
    else:
        first = {**choice, "finish_reason": None}
        last = {"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}
    if "token_ids" in choice:
        first["token_ids"] = choice["token_ids"]
    chunks = [{**head, "choices": [first]}, {**head, "choices": [last]}]
    if "prompt_token_ids" in response:
        chunks[0]["prompt_token_ids"] = response["prompt_token_ids"]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class OpenAIEndpoint:
    """The HTTP server: started by :meth:`start` (once; later calls do nothing), stopped by
    :meth:`stop`. Samples are served between :meth:`open` and :meth:`release`.

    ``port`` 0 takes a free port; :attr:`base_url` says which."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, model_name: str = DEFAULT_MODEL_NAME
    ) -> None:
        self.host = host
        self.port = port
        self.model_name = model_name
        self._samples: dict[str, EndpointSample] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running server."""
        if self._socket is None:
            raise RuntimeError("the endpoint is not started")
        return f"http://{self.host}:{self._socket.getsockname()[1]}"

    def sample_url(self, sample_id: str) -> str:
        """The ``base_url`` an OpenAI client of ``sample_id`` uses (ends in ``/v1``)."""
        return f"{self.base_url}/samples/{quote(sample_id, safe='/')}/v1"

    def start(self) -> None:
        """Bind the port and serve in a thread; return once the server answers (a call while
        another starts it waits for it too)."""
        with self._lock:
            if self._thread is None:
                self._launch()
            server, thread = self._server, self._thread
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive():
                where = self.base_url
                self.stop()
                raise PluginError(
                    f"the OpenAI-compatible endpoint stopped as it started on {where}; its "
                    "log lines above say why"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise PluginError(
                    f"the OpenAI-compatible endpoint did not start within {START_TIMEOUT_S:g} s"
                )
            time.sleep(0.01)

    def _launch(self) -> None:
        try:
            import uvicorn
        except ImportError:
            raise PluginError(INSTALL_HINT) from None
        app = self._app()
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: without it each answer waits out the client's
        # delayed acknowledgement (about 40 ms a call on Linux)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise PluginError(
                f"the OpenAI-compatible endpoint cannot listen on {self.host}:{self.port} "
                f"({exc.strerror}); set rollout.agent.loop_args.port to a free port, or 0"
            ) from None
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._socket = sock
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name="plugrl openai endpoint",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (in-flight requests get a second to finish)."""
        with self._lock:
            server, thread, sock = self._server, self._thread, self._socket
            self._server = self._thread = self._socket = None
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(10)
        if sock is not None:
            sock.close()

    def open(self, sample_id: str, session: Session) -> EndpointSample:
        """Serve ``sample_id`` on its route, answering with ``session`` on the running event
        loop (call it from the loop the sample's agent runs on)."""
        sample = EndpointSample(session, asyncio.get_running_loop(), self.model_name)
        with self._lock:
            if sample_id in self._samples:
                raise PluginError(f"sample {sample_id!r} is already served by the endpoint")
            self._samples[sample_id] = sample
        return sample

    def release(self, sample_id: str) -> None:
        """Stop serving ``sample_id``: later calls on its route get 404, calls in flight are
        cancelled (see :meth:`EndpointSample.close`). Call it on the sample's event loop."""
        with self._lock:
            sample = self._samples.pop(sample_id, None)
        if sample is not None:
            sample.close()

    # ----------------------------------------------------------------------------------------

    def _sample(self, sample_id: str) -> EndpointSample:
        with self._lock:
            sample = self._samples.get(sample_id)
        if sample is None:
            raise EndpointError(
                404,
                f"no sample {sample_id!r} is running here: use the base_url the agent was "
                "given, while its run lasts",
            )
        return sample

    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        async def answer(request: Request, kind: str) -> Response:
            try:
                sample = self._sample(request.path_params["sample_id"])
                try:
                    body = json.loads(await request.body())
                except ValueError as exc:
                    raise _bad(f"the body is not JSON ({exc})") from None
                except RecursionError:
                    raise _bad("the body's JSON is nested too deeply to read") from None
                # the sample's state and its engines belong to its own event loop
                future = asyncio.run_coroutine_threadsafe(sample.handle(kind, body), sample.loop)
                response = await asyncio.wrap_future(future)
                if body.get("stream"):
                    options = body.get("stream_options") or {}
                    usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
                    events = stream_events(response, usage)
                    return StreamingResponse(iter(events), media_type="text/event-stream")
                return JSONResponse(response)
            except EndpointError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            except Exception as exc:
                error = EndpointError(500, f"{type(exc).__name__}: {exc}".splitlines()[0])
                return JSONResponse(error.body(), status_code=500)

        async def chat(request: Request) -> Response:
            return await answer(request, "chat")

        async def completions(request: Request) -> Response:
            return await answer(request, "completions")

        async def models(request: Request) -> JSONResponse:
            try:
                self._sample(request.path_params["sample_id"])
            except EndpointError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "plugrl"}
            return JSONResponse({"object": "list", "data": [model]})

        prefix = "/samples/{sample_id:path}/v1"
        return Starlette(
            routes=[
                Route(f"{prefix}/chat/completions", chat, methods=["POST"]),
                Route(f"{prefix}/completions", completions, methods=["POST"]),
                Route(f"{prefix}/models", models, methods=["GET"]),
            ]
        )
