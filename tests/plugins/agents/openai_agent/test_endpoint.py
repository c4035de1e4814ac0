"""The OpenAI-compatible endpoint, through the real ``openai`` client on a real server: what
each route answers, how calls become trajectories, the limits, and the errors."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from plugrl.errors import PluginError
from plugrl_openai_agent.endpoint import EndpointError, OpenAIEndpoint, read_chat_request

from .endpoint_support import ADD_TOOL, ScriptedSession, make_tokenizer

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]
CALL_TEXT = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return make_tokenizer()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[OpenAIEndpoint]:
    served = OpenAIEndpoint()
    served.start()
    yield served
    served.stop()


def client_for(endpoint: OpenAIEndpoint, sample_id: str) -> Any:
    return openai.AsyncOpenAI(
        base_url=endpoint.sample_url(sample_id), api_key="x", max_retries=0, timeout=30
    )


def served(endpoint: OpenAIEndpoint, session: ScriptedSession, talk: Any) -> Any:
    """Run ``talk(client)`` with ``session`` served; the sample's endpoint side after."""

    async def main() -> Any:
        sample = endpoint.open(session.sample_id, session)
        try:
            async with client_for(endpoint, session.sample_id) as client:
                await talk(client)
        finally:
            endpoint.release(session.sample_id)
        return sample

    return asyncio.run(main())


def test_a_chat_call_answers_in_openai_shape_and_records_the_sampled_tokens(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, ["It is 3."])
    answers = []

    async def talk(client):
        answers.append(
            await client.chat.completions.create(
                model="anything", messages=QUESTION, logprobs=True, max_tokens=50
            )
        )

    sample = served(endpoint, session, talk)
    answer = answers[0]
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "It is 3."
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert answer.model == "anything"
    prompt_ids, max_tokens = session.calls[0]
    rendered = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert max_tokens == 50
    [trajectory] = sample.recording.trajectories()
    sampled = [*tokenizer.encode("It is 3."), tokenizer.eos_token_id]
    assert trajectory.prompt_ids == prompt_ids
    assert trajectory.response_ids == sampled
    assert trajectory.loss_mask == [1] * len(sampled)
    assert trajectory.token_versions == [3] * len(sampled)
    assert trajectory.turn_ends == [len(sampled) - 1]
    assert trajectory.finish_reason == "stop"
    assert [t.logprob for t in choice.logprobs.content] == pytest.approx(trajectory.log_probs)
    assert "".join(t.token for t in choice.logprobs.content) == "It is 3.<|im_end|>"
    assert answer.usage.prompt_tokens == len(prompt_ids)
    assert answer.usage.completion_tokens == len(sampled)
    assert trajectory.messages[-1] == {"role": "assistant", "content": "It is 3."}
    trajectory.check()


def test_a_tool_call_and_its_result_continue_one_trajectory(endpoint, tokenizer):
    """The client sends back the assistant message it got; the template renders its call as
    indented JSON, not as the model wrote it, yet the second prompt holds the sampled ids."""
    session = ScriptedSession(tokenizer, [CALL_TEXT, "The sum is 3."])
    answers = []

    async def talk(client):
        first = await client.chat.completions.create(model="m", messages=QUESTION, tools=[ADD_TOOL])
        answers.append(first)
        call = first.choices[0].message.tool_calls[0]
        messages = [
            *QUESTION,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "3"},
        ]
        answers.append(
            await client.chat.completions.create(model="m", messages=messages, tools=[ADD_TOOL])
        )

    sample = served(endpoint, session, talk)
    first, second = answers
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    [call] = message.tool_calls
    assert call.type == "function" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
    assert second.choices[0].message.content == "The sum is 3."

    (prompt1, _), (prompt2, _) = session.calls
    sampled1 = [*tokenizer.encode(CALL_TEXT), tokenizer.eos_token_id]
    # the re-rendered call tokenizes differently: only substitution keeps one trajectory
    rendered2 = tokenizer.apply_chat_template(
        [*QUESTION, _template_form(message), {"role": "tool", "content": "3"}],
        tools=[ADD_TOOL],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert tokenizer.encode(rendered2)[: len(prompt1) + len(sampled1)] != prompt1 + sampled1
    assert prompt2[: len(prompt1) + len(sampled1)] == prompt1 + sampled1

    [trajectory] = sample.recording.trajectories()
    trajectory.check()
    sampled2 = [*tokenizer.encode("The sum is 3."), tokenizer.eos_token_id]
    between = prompt2[len(prompt1) + len(sampled1) :]
    assert tokenizer.decode(between) == "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"
    assert trajectory.prompt_ids == prompt1
    assert trajectory.response_ids == sampled1 + between + sampled2
    assert trajectory.loss_mask == [1] * len(sampled1) + [0] * len(between) + [1] * len(sampled2)
    assert trajectory.log_probs[len(sampled1) : len(sampled1) + len(between)] == [0.0] * len(
        between
    )
    assert trajectory.turn_ends == [len(sampled1) - 1, len(trajectory.response_ids) - 1]
    assert trajectory.num_turns == 2
    assert sample.metrics()["endpoint_substituted_prompts"] == 1
    assert sample.metrics()["endpoint_sequences"] == 1
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]


def _template_form(message: Any) -> dict[str, Any]:
    out = message.model_dump(exclude_none=True)
    for call in out.get("tool_calls", []):
        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def test_sampled_tokens_the_tokenizer_would_merge_stay_as_sampled(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, ["Hello there", "Fine", "Hi"], spelled=True)
    elsewhere = [{"role": "user", "content": "Hello there"}]

    async def talk(client):
        first = await client.chat.completions.create(model="m", messages=QUESTION)
        messages = [
            *QUESTION,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And?"},
        ]
        await client.chat.completions.create(model="m", messages=messages)
        # the same text in another conversation is the user's: tokenized as usual
        await client.chat.completions.create(model="m", messages=elsewhere)

    sample = served(endpoint, session, talk)
    (prompt1, _), (prompt2, _), (prompt3, _) = session.calls
    rendered3 = tokenizer.apply_chat_template(elsewhere, add_generation_prompt=True, tokenize=False)
    assert prompt3 == tokenizer.encode(rendered3)
    spelled = [i for c in "Hello there" for i in tokenizer.encode(c)] + [tokenizer.eos_token_id]
    assert tokenizer.encode("Hello there") != spelled[:-1]
    assert prompt2[: len(prompt1) + len(spelled)] == prompt1 + spelled
    trajectory, _ = sample.recording.trajectories()
    assert trajectory.response_ids[: len(spelled)] == spelled
    assert sample.metrics()["endpoint_substituted_prompts"] == 1


def test_two_unrelated_calls_are_two_sequences_the_latest_last(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, ["3", "Paris"])

    async def talk(client):
        await client.chat.completions.create(model="m", messages=QUESTION)
        other = [{"role": "user", "content": "The capital of France?"}]
        await client.chat.completions.create(model="m", messages=other)

    sample = served(endpoint, session, talk)
    first, second = sample.recording.trajectories()
    assert tokenizer.decode(first.response_ids) == "3<|im_end|>"
    assert tokenizer.decode(second.response_ids) == "Paris<|im_end|>"
    assert first.prompt_ids == session.calls[0][0] and second.prompt_ids == session.calls[1][0]
    assert sample.metrics()["endpoint_sequences"] == 2


def test_the_completions_route_continues_text_and_takes_token_ids(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, [" 3", " yes", " no"])
    answers = []

    async def talk(client):
        first = await client.completions.create(
            model="m", prompt="Q: 1 + 2 =", logprobs=1, max_tokens=20
        )
        answers.append(first)
        answers.append(
            await client.completions.create(
                model="m", prompt="Q: 1 + 2 =" + first.choices[0].text + "\nSure?"
            )
        )
        answers.append(await client.completions.create(model="m", prompt=[5, 6, 7]))

    sample = served(endpoint, session, talk)
    first = answers[0].choices[0]
    assert first.text == " 3"
    assert first.finish_reason == "stop"
    assert first.logprobs.tokens[-1] == "<|im_end|>"
    assert len(first.logprobs.token_logprobs) == len(first.logprobs.text_offset) == 3
    assert session.calls[2][0] == [5, 6, 7]
    # the text the client got back never held the end token, so the second prompt does not
    # continue the first sampled tokens: a sequence of its own, like the token-id prompt
    assert sample.metrics()["endpoint_sequences"] == 3
    assert session.calls[1][0][: len(session.calls[0][0])] == session.calls[0][0]


def test_stop_texts_cut_the_answer_and_the_agent_continues_one_trajectory(endpoint, tokenizer):
    """A ReAct-style agent: the answer is cut before "Observation:", which the agent writes
    itself with the tool's result; the sampled tokens after the cut are not kept."""
    thought = " I add.\nAction: add 1 2"
    session = ScriptedSession(tokenizer, [thought + "\nObservation: 7\nmore", " So 3."])
    answers = []
    prompt = "Q: 1 + 2?\n"

    async def talk(client):
        first = await client.completions.create(model="m", prompt=prompt, stop="\nObservation:")
        answers.append(first)
        second_prompt = prompt + first.choices[0].text + "\nObservation: 3\n"
        answers.append(
            await client.completions.create(model="m", prompt=second_prompt, stop=["\nObs"])
        )

    sample = served(endpoint, session, talk)
    first, second = (a.choices[0] for a in answers)
    assert first.text == thought and first.finish_reason == "stop"
    assert second.text == " So 3."
    [trajectory] = sample.recording.trajectories()
    kept = trajectory.response_ids[: trajectory.turn_ends[0] + 1]
    assert tokenizer.decode(kept) == thought
    assert trajectory.log_probs[: len(kept)] == pytest.approx(
        [-0.01 - 0.001 * i for i in range(len(kept))]
    )
    rest = tokenizer.decode(trajectory.response_ids[len(kept) :])
    assert rest == "\nObservation: 3\n So 3.<|im_end|>"
    assert trajectory.loss_mask[len(kept)] == 0 and trajectory.num_turns == 2


def test_max_tokens_is_clipped_to_what_is_left_of_the_response_length(endpoint, tokenizer):
    session = ScriptedSession(
        tokenizer, ["one two three four five six", "six"], max_response_length=12
    )
    answers = []

    async def talk(client):
        first = await client.chat.completions.create(model="m", messages=QUESTION, max_tokens=500)
        answers.append(first)
        messages = [*QUESTION, {"role": "assistant", "content": first.choices[0].message.content}]
        messages.append({"role": "user", "content": "and then a long question?"})
        answers.append(await client.chat.completions.create(model="m", messages=messages))

    sample = served(endpoint, session, talk)
    assert session.calls[0][1] == 12
    assert answers[0].choices[0].finish_reason == "length"
    # the second call's appended tokens already fill the response: nothing is sampled
    assert len(session.calls) == 1
    assert answers[1].choices[0].finish_reason == "length"
    assert answers[1].choices[0].message.content is None
    [trajectory] = sample.recording.trajectories()
    assert trajectory.finish_reason == "length"
    assert sample.metrics()["endpoint_limited_calls"] == 1


def test_calls_past_max_turns_get_nothing_and_end_the_trajectory(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, ["a", "b", "c"], max_turns=2)
    reasons = []

    async def talk(client):
        for _ in range(3):
            answer = await client.chat.completions.create(model="m", messages=QUESTION)
            reasons.append(answer.choices[0].finish_reason)

    sample = served(endpoint, session, talk)
    assert reasons == ["stop", "stop", "length"]
    assert len(session.calls) == 2
    assert sample.recording.trajectories()[-1].finish_reason == "max_turns"


def test_return_token_ids_gives_the_prompt_and_completion_ids(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, ["ok"])
    answers = []

    async def talk(client):
        answers.append(
            await client.chat.completions.create(
                model="m", messages=QUESTION, extra_body={"return_token_ids": True}
            )
        )

    served(endpoint, session, talk)
    answer = answers[0]
    assert answer.model_extra["prompt_token_ids"] == session.calls[0][0]
    assert answer.choices[0].model_extra["token_ids"] == [
        *tokenizer.encode("ok"),
        tokenizer.eos_token_id,
    ]


def test_several_samples_are_served_at_once_each_on_its_own_route(endpoint, tokenizer):
    sessions = [
        ScriptedSession(tokenizer, [f"first {i}", f"second {i}"], sample_id=f"u{i}/0", delay_s=0.05)
        for i in range(4)
    ]

    async def agent(session: ScriptedSession) -> None:
        async with client_for(endpoint, session.sample_id) as client:
            first = await client.chat.completions.create(model="m", messages=QUESTION)
            messages = [
                *QUESTION,
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Again?"},
            ]
            await client.chat.completions.create(model="m", messages=messages)

    async def main() -> list[Any]:
        samples = [endpoint.open(s.sample_id, s) for s in sessions]
        try:
            await asyncio.gather(*(agent(s) for s in sessions))
        finally:
            for s in sessions:
                endpoint.release(s.sample_id)
        return samples

    samples = asyncio.run(main())
    for i, sample in enumerate(samples):
        [trajectory] = sample.recording.trajectories()
        text = tokenizer.decode(trajectory.response_ids)
        assert text.startswith(f"first {i}<|im_end|>") and text.endswith(f"second {i}<|im_end|>")
        assert trajectory.num_turns == 2


def test_a_streamed_chat_call_gets_the_whole_answer_as_chunks(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, [CALL_TEXT])
    chunks = []

    async def talk(client):
        stream = await client.chat.completions.create(
            model="m",
            messages=QUESTION,
            tools=[ADD_TOOL],
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
        )
        chunks.extend([chunk async for chunk in stream])

    sample = served(endpoint, session, talk)
    first, last, usage = chunks
    assert first.object == "chat.completion.chunk"
    assert first.choices[0].delta.role == "assistant"
    [call] = first.choices[0].delta.tool_calls
    assert call.index == 0 and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
    [trajectory] = sample.recording.trajectories()
    assert len(first.choices[0].logprobs.content) == len(trajectory.response_ids)
    assert last.choices[0].finish_reason == "tool_calls"
    assert usage.choices == [] and usage.usage.completion_tokens == len(trajectory.response_ids)
    assert len({c.id for c in chunks}) == 1


def test_a_streamed_completion_gets_its_text_and_finish_reason(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, [" 3"])
    chunks = []

    async def talk(client):
        stream = await client.completions.create(model="m", prompt="1 + 2 =", stream=True)
        chunks.extend([chunk async for chunk in stream])

    served(endpoint, session, talk)
    assert "".join(c.choices[0].text for c in chunks) == " 3"
    assert [c.choices[0].finish_reason for c in chunks] == [None, "stop"]


def test_a_call_in_flight_when_its_sample_ends_is_cancelled_and_not_recorded(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, ["late"], delay_s=60)

    async def main() -> tuple[Any, Any]:
        sample = endpoint.open(session.sample_id, session)
        async with client_for(endpoint, session.sample_id) as client:
            call = asyncio.ensure_future(
                client.chat.completions.create(model="m", messages=QUESTION)
            )
            while not session.calls:
                await asyncio.sleep(0.01)
            endpoint.release(session.sample_id)
            with pytest.raises(openai.NotFoundError) as caught:
                await call
        # a call that reaches the sample after it ended
        with pytest.raises(EndpointError) as late:
            await sample.handle("chat", {"messages": QUESTION})
        return sample, (caught.value, late.value)

    sample, (caught, late) = asyncio.run(main())
    assert caught.body["message"] == "sample 'uid0/0' ended before this call was answered"
    assert (late.status, str(late)) == (404, "sample 'uid0/0' has ended")
    assert sample.recording.trajectories() == []


def test_models_lists_the_model_name(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, [])
    names = []

    async def talk(client):
        names.extend(m.id for m in (await client.models.list()).data)

    served(endpoint, session, talk)
    assert names == ["plugrl"]


# --------------------------------------------------------------------------------------------
# Errors


def test_an_unknown_sample_gets_404_naming_it(endpoint):
    async def main():
        async with client_for(endpoint, "nope/0") as client:
            await client.chat.completions.create(model="m", messages=QUESTION)

    with pytest.raises(openai.NotFoundError) as caught:
        asyncio.run(main())
    assert caught.value.status_code == 404
    assert caught.value.body["message"] == (
        "no sample 'nope/0' is running here: use the base_url the agent was given, while its "
        "run lasts"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m"}, "messages must be a non-empty list of chat messages"),
        ({"messages": [{"content": "hi"}]}, "message 0 must be a JSON object with a string role"),
        ({"messages": QUESTION, "n": 2}, "n must be 1, got 2: send one request per sample"),
        (
            {"messages": QUESTION, "stream": "yes"},
            "stream must be true or false, got 'yes'",
        ),
        (
            {"messages": QUESTION, "max_tokens": 0},
            "max_tokens must be a positive integer, got 0",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "message 0 has a 'image_url' content part; only text is supported",
        ),
        ({"messages": QUESTION, "tools": "add"}, "tools must be a list of function schemas"),
        (
            {"messages": QUESTION, "stop": ["a", 3]},
            "stop must be a text or a list of non-empty texts, got ['a', 3]",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
            "message 0 has a tool call without function.name",
        ),
    ],
)
def test_a_malformed_chat_body_gets_400_saying_what_is_wrong(endpoint, tokenizer, body, message):
    status, answer = post(endpoint, tokenizer, "chat/completions", json.dumps(body))
    assert status == 400
    assert answer == {"error": {"message": message, "type": "invalid_request_error", "code": 400}}


def test_a_body_that_is_not_json_gets_400(endpoint, tokenizer):
    status, answer = post(endpoint, tokenizer, "chat/completions", "{not json")
    assert status == 400
    assert answer["error"]["message"].startswith("the body is not JSON (Expecting property name")


def test_a_malformed_completion_body_gets_400(endpoint, tokenizer):
    status, answer = post(endpoint, tokenizer, "completions", json.dumps({"prompt": ["a", "b"]}))
    assert status == 400
    assert (
        answer["error"]["message"] == "prompt must be one text or one non-empty list of token ids"
    )


def test_a_template_that_cannot_render_the_messages_gets_400(endpoint, tokenizer):
    body = json.dumps({"messages": [{"role": "user"}, {"role": "user", "content": None}]})
    strict = make_tokenizer()
    strict.chat_template = "{{ raise_exception('roles must alternate') }}"
    status, answer = post(endpoint, strict, "chat/completions", body)
    assert status == 400
    assert answer["error"]["message"] == (
        "the model's chat template cannot render these messages: TemplateError: roles must "
        "alternate"
    )


def test_an_engine_failure_gets_500_naming_it(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, ["x"], fail=True)

    async def talk(client):
        await client.chat.completions.create(model="m", messages=QUESTION)

    with pytest.raises(openai.InternalServerError) as caught:
        served(endpoint, session, talk)
    assert (
        caught.value.body["message"]
        == "the engines failed to answer: RuntimeError: engine 0 is gone"
    )


def post(endpoint: OpenAIEndpoint, tokenizer: Any, route: str, content: str) -> tuple[int, Any]:
    """POST ``content`` as it is to a served sample's ``route``: status and JSON answer."""
    session = ScriptedSession(tokenizer, ["x"], sample_id="raw/0")

    async def main() -> tuple[int, Any]:
        endpoint.open(session.sample_id, session)
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                response = await http.post(
                    f"{endpoint.sample_url(session.sample_id)}/{route}", content=content
                )
                return response.status_code, response.json()
        finally:
            endpoint.release(session.sample_id)

    return asyncio.run(main())


def test_a_sample_served_twice_at_once_is_refused(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, [], sample_id="twice/0")

    async def main():
        endpoint.open(session.sample_id, session)
        try:
            endpoint.open(session.sample_id, session)
        finally:
            endpoint.release(session.sample_id)

    with pytest.raises(PluginError, match=r"^sample 'twice/0' is already served by the endpoint$"):
        asyncio.run(main())


def test_a_port_in_use_is_named_with_the_fix(endpoint):
    taken = int(endpoint.base_url.rsplit(":", 1)[1])
    with pytest.raises(PluginError) as caught:
        OpenAIEndpoint(port=taken).start()
    assert str(caught.value) == (
        f"the OpenAI-compatible endpoint cannot listen on 127.0.0.1:{taken} (Address already in "
        "use); set rollout.agent.loop_args.port to a free port, or 0"
    )


def test_tool_call_arguments_reach_the_template_as_objects():
    request = read_chat_request(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c", "function": {"name": "add", "arguments": '{"a": 1}'}},
                        {"id": "d", "function": {"name": "add", "arguments": "{oops"}},
                    ],
                }
            ]
        }
    )
    [message] = request.messages
    assert message["content"] == ""
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == [{"a": 1}, "{oops"]


def test_without_uvicorn_the_endpoint_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(PluginError) as caught:
        OpenAIEndpoint().start()
    assert str(caught.value) == (
        "the OpenAI-compatible endpoint needs uvicorn and starlette: pip install 'plugrl[serve]'"
    )


def test_a_server_that_stops_at_once_is_reported(monkeypatch):
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    served = OpenAIEndpoint()
    with pytest.raises(PluginError) as caught:
        served.start()
    assert re.fullmatch(
        r"the OpenAI-compatible endpoint stopped as it started on http://127\.0\.0\.1:\d+; "
        r"its log lines above say why",
        str(caught.value),
    )
    with pytest.raises(RuntimeError, match="the endpoint is not started"):
        _ = served.base_url


def test_concurrent_calls_cannot_pass_max_turns(endpoint, tokenizer):
    """Twenty calls at once with ``max_turns`` 5: five are sampled, the others get nothing
    (the fourth drill had all twenty sampled: the count rose only after each answer)."""
    session = ScriptedSession(tokenizer, ["a"] * 20, max_turns=5, delay_s=0.05)
    reasons = []

    async def talk(client):
        answers = await asyncio.gather(
            *(client.chat.completions.create(model="m", messages=QUESTION) for _ in range(20))
        )
        reasons.extend(answer.choices[0].finish_reason for answer in answers)

    sample = served(endpoint, session, talk)
    assert len(session.calls) == 5
    assert sorted(reasons) == ["length"] * 15 + ["stop"] * 5
    assert sample.metrics()["endpoint_calls"] == 5
    assert sample.metrics()["endpoint_limited_calls"] == 15
    assert sample.recording.calls_in_flight == 0


def test_a_failed_call_gives_its_turn_back(endpoint, tokenizer):
    session = ScriptedSession(tokenizer, ["x"], max_turns=1, fail=True)

    async def talk(client):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=QUESTION)
        session.fail = False
        answer = await client.chat.completions.create(model="m", messages=QUESTION)
        assert answer.choices[0].finish_reason == "stop"

    sample = served(endpoint, session, talk)
    assert sample.recording.calls_in_flight == 0 and sample.metrics()["endpoint_calls"] == 1


@pytest.mark.parametrize("bad_id", [-1, "vocabulary", 2**70])
def test_token_ids_outside_the_vocabulary_get_400_and_reach_no_engine(endpoint, tokenizer, bad_id):
    vocabulary = len(tokenizer)
    token_id = vocabulary if bad_id == "vocabulary" else bad_id
    session = ScriptedSession(tokenizer, ["x"], sample_id="ids/0")

    async def main():
        endpoint.open(session.sample_id, session)
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                return await http.post(
                    f"{endpoint.sample_url(session.sample_id)}/completions",
                    json={"prompt": [1, 2, token_id]},
                )
        finally:
            endpoint.release(session.sample_id)

    response = asyncio.run(main())
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"prompt token id {token_id} (at position 2) is outside the model's vocabulary: ids "
        f"run from 0 to {vocabulary - 1}"
    )
    assert session.calls == []


def test_a_deeply_nested_body_gets_400(endpoint, tokenizer):
    status, answer = post(endpoint, tokenizer, "completions", "[" * 100_000 + "]" * 100_000)
    assert status == 400
    assert answer["error"]["message"] == "the body's JSON is nested too deeply to read"
