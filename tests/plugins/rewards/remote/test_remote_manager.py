"""The remote reward manager against a real HTTP server on localhost."""

from __future__ import annotations

import logging
import socket

import pytest
import torch

from plugrl.compose.run_parts import build_reward_manager
from plugrl.errors import RecipeError
from plugrl.parts.scoring import ScoringError
from plugrl_remote.manager import RemoteClient, RemoteRewardConfig, RemoteRewardManager
from tests.plugins.rewards.remote.scoring_server import TOKEN, ScoringServer
from tests.plugins.rewards.rewards_testlib import make_batch

DS = "exact"
FALLBACK = "or set reward.on_error=fallback to score such samples reward.fallback_score"


@pytest.fixture(scope="module")
def server():
    running = ScoringServer().start()
    yield running
    running.stop()


@pytest.fixture
def build(make_recipe, tokenizer, plugins, server):
    """build(path, **reward keys) -> a remote manager posting to the server's ``path``."""
    server.reset()
    built = []

    def make(path, **reward):
        keys = {"manager": "remote", "url": server.url(path), "backoff_s": 0.01, **reward}
        manager = build_reward_manager(make_recipe(keys), tokenizer, plugins)
        built.append(manager)
        return manager

    yield make
    for manager in built:
        manager.close()


def batch_of(tokenizer, texts, truths, **kwargs):
    return make_batch(tokenizer, texts, DS, truths, **kwargs)


# ------------------------------------------------------------------------------ scoring


def test_scores_land_on_the_last_valid_token_with_the_built_in_metrics(build, tokenizer, server):
    manager = build("score", batch_size=2)
    assert isinstance(manager, RemoteRewardManager)
    texts = ["4", "5", "12", "7", "x"]
    batch = batch_of(tokenizer, texts, ["4", "4", "12", "8", "x"], width=6)
    output = manager(batch)
    lengths = batch["response_mask"].sum(-1)
    for row, expected in enumerate([1.0, 0.0, 1.0, 0.0, 1.0]):
        assert output.token_level_scores[row, lengths[row] - 1] == expected
        assert output.token_level_scores[row].sum() == expected
    assert output.extra == {
        "score": [1.0, 0.0, 1.0, 0.0, 1.0],
        "acc": [True, False, True, False, True],
        "length": [1, 1, 2, 1, 1],
    }
    metrics = output.metrics
    assert metrics["critic/score/mean"] == pytest.approx(0.6)
    assert metrics[f"reward/{DS}/acc"] == pytest.approx(0.6)
    assert metrics[f"reward/{DS}/length"] == pytest.approx(1.2)
    assert metrics["reward/errors"] == 0.0 and metrics["reward/timeouts"] == 0.0
    assert metrics["reward/remote/calls"] == 3.0  # 5 samples, 2 a request
    assert metrics["reward/remote/retries"] == 0.0
    assert metrics["reward/remote/latency_s"] > 0
    assert server.requests["score"] == 3
    # the requests are in flight at once, so they may arrive in any order
    posted = [sample for body in server.bodies["score"] for sample in body["samples"]]
    assert sorted(sample["extra_info"]["index"] for sample in posted) == [0, 1, 2, 3, 4]
    first = min(posted, key=lambda sample: sample["extra_info"]["index"])
    assert first == {
        "data_source": DS,
        "prompt": "",
        "response": "4",
        "ground_truth": "4",
        "extra_info": {"index": 0},
    }


def test_the_prompt_is_decoded_from_the_rows_prompt_ids(build, tokenizer, server):
    manager = build("score")
    batch = batch_of(tokenizer, ["4"], ["4"])
    batch["raw_prompt_ids"] = [tokenizer.encode("2 + 2 =")]
    manager(batch)
    assert server.bodies["score"][0]["samples"][0]["prompt"] == "2 + 2 ="


@pytest.mark.parametrize("path", ["flaky", "busy"])
def test_503_and_429_are_retried_until_the_server_answers(build, tokenizer, server, path):
    manager = build(path, max_retries=3)
    output = manager(batch_of(tokenizer, ["1", "2"], ["1", "1"]))
    assert output.extra["score"] == [1.0, 0.0]
    assert server.requests[path] == 3  # two refusals, then the answer
    assert output.metrics["reward/remote/retries"] == 2.0
    assert output.metrics["reward/remote/calls"] == 3.0


def test_retries_run_out_and_raise_names_the_url_status_and_fix(build, tokenizer, server):
    manager = build("always_500", max_retries=2)
    with pytest.raises(ScoringError) as caught:
        manager(batch_of(tokenizer, ["1", "2"], ["1", "1"]))
    assert str(caught.value) == (
        f"remote reward at {server.url('always_500')} answered HTTP 500: sample 0 "
        "(data_source 'x') failed: boom (samples 0-1, 3 tries); check the server (its log "
        f"names the sample), {FALLBACK}"
    )
    assert server.requests["always_500"] == 3


def test_fallback_scores_failed_requests_and_counts_them(build, tokenizer, server, caplog):
    manager = build(
        "always_500", max_retries=1, on_error="fallback", fallback_score=0.25, batch_size=2
    )
    with caplog.at_level(logging.WARNING, logger="plugrl.rewards"):
        output = manager(batch_of(tokenizer, ["1", "2", "3"], ["1", "1", "3"]))
    assert output.token_level_scores.sum(-1).tolist() == [0.25, 0.25, 0.25]
    assert output.metrics["reward/errors"] == 3.0
    assert output.metrics["reward/timeouts"] == 0.0
    assert output.metrics[f"reward/{DS}/score"] == 0.25
    assert server.requests["always_500"] == 4  # 2 requests, each tried twice
    assert [r.getMessage() for r in caplog.records] == [
        f"reward: 2 of 2 requests to {server.url('always_500')} failed and their 3 samples "
        "were scored 0.25 (reward.on_error=fallback); first: samples 0-1, answered HTTP 500: "
        "sample 0 (data_source 'x') failed: boom (2 tries)"
    ]


def test_score_zero_scores_failed_requests_zero(build, tokenizer):
    manager = build("always_500", max_retries=0, on_error="score_zero", fallback_score=0.5)
    output = manager(batch_of(tokenizer, ["1"], ["1"]))
    assert output.token_level_scores.sum().item() == 0.0
    assert output.metrics["reward/errors"] == 1.0


def test_a_server_that_never_answers_times_out_and_is_retried(build, tokenizer, server):
    manager = build("hang", timeout_s=0.3, max_retries=1)
    with pytest.raises(ScoringError) as caught:
        manager(batch_of(tokenizer, ["1", "2"], ["1", "1"]))
    assert str(caught.value) == (
        f"remote reward at {server.url('hang')} did not answer in 0.3 s (reward.timeout_s) "
        "(samples 0-1, 2 tries); raise reward.timeout_s or lower reward.batch_size, "
        f"{FALLBACK}"
    )
    assert server.requests["hang"] == 2


def test_timeouts_under_fallback_count_in_reward_timeouts(build, tokenizer, server):
    manager = build("hang", timeout_s=0.2, max_retries=0, on_error="fallback")
    output = manager(batch_of(tokenizer, ["1", "2"], ["1", "1"]))
    assert output.metrics["reward/timeouts"] == 2.0
    assert output.metrics["reward/errors"] == 0.0
    assert output.token_level_scores.sum().item() == 0.0
    assert server.requests["hang"] == 1


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("not_json", "answered HTTP 200 with a body that is not JSON ('<html>oops</html>')"),
        ("wrong_count", "answered 1 scores for 2 samples"),
        ("not_number", 'answered score 0 as str "high", not a finite number'),
    ],
)
def test_malformed_answers_fail_at_once_without_retries(build, tokenizer, server, path, what):
    manager = build(path, max_retries=3)
    with pytest.raises(ScoringError) as caught:
        manager(batch_of(tokenizer, ["1", "2"], ["1", "1"]))
    assert str(caught.value) == (
        f"remote reward at {server.url(path)} {what} (samples 0-1, 1 try); the server must "
        'answer {"scores": [number or {"score": number, ...}, ...]} with one per sample, in '
        "order (reward.schema=plugrl; see docs/rewards.md, Remote rewards)"
    )
    assert server.requests[path] == 1


def test_other_4xx_answers_are_not_retried(build, tokenizer, server):
    manager = build("bad_request", max_retries=3)
    with pytest.raises(ScoringError) as caught:
        manager(batch_of(tokenizer, ["1"], ["1"]))
    assert str(caught.value) == (
        f"remote reward at {server.url('bad_request')} answered HTTP 422: unknown field "
        "'samples' (sample 0, 1 try); check reward.url (its path: /score for plugrl's schema, "
        "/get_reward for OpenRLHF's) and that reward.schema is the one the server speaks"
    )
    assert server.requests["bad_request"] == 1


def test_an_unreachable_server_is_retried_then_named(build, tokenizer):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    manager = build("score", max_retries=1)
    manager.config.url = manager.url = manager.client.url = f"http://127.0.0.1:{port}/score"
    with pytest.raises(ScoringError) as caught:
        manager(batch_of(tokenizer, ["1"], ["1"]))
    message = str(caught.value)
    assert message.startswith(
        f"remote reward at http://127.0.0.1:{port}/score could not be reached (ConnectError: "
    )
    assert message.endswith(
        "(sample 0, 2 tries); check that the server runs and reward.url is right, " + FALLBACK
    )


# ------------------------------------------------------------------------------ token


def test_the_token_comes_from_the_environment(build, tokenizer, server, monkeypatch):
    monkeypatch.setenv("REWARD_TOKEN", TOKEN)
    output = build("auth", token_env="REWARD_TOKEN")(batch_of(tokenizer, ["1"], ["1"]))
    assert output.extra["score"] == [1.0]
    assert server.headers["auth"] == [f"Bearer {TOKEN}"]


def test_without_a_token_a_401_says_where_the_token_goes(build, tokenizer, server):
    with pytest.raises(ScoringError) as caught:
        build("auth", max_retries=3)(batch_of(tokenizer, ["1"], ["1"]))
    assert str(caught.value) == (
        f"remote reward at {server.url('auth')} answered HTTP 401: missing or wrong token "
        "(sample 0, 1 try); the server refused no token: set reward.token_env to the "
        "environment variable holding one"
    )
    assert server.requests["auth"] == 1


def test_a_wrong_token_names_its_variable(build, tokenizer, server, monkeypatch):
    monkeypatch.setenv("REWARD_TOKEN", "wrong")
    with pytest.raises(ScoringError) as caught:
        build("auth", token_env="REWARD_TOKEN")(batch_of(tokenizer, ["1"], ["1"]))
    assert str(caught.value).endswith(
        "(sample 0, 1 try); the server refused the token in $REWARD_TOKEN (reward.token_env)"
    )


def test_a_missing_token_variable_stops_the_run_at_start_up(build, monkeypatch):
    monkeypatch.delenv("NO_SUCH_REWARD_TOKEN", raising=False)
    with pytest.raises(RecipeError) as caught:
        build("auth", token_env="NO_SUCH_REWARD_TOKEN")
    assert str(caught.value) == (
        "reward.token_env: the environment variable NO_SUCH_REWARD_TOKEN is not set; export "
        "it with the scoring server's token before the run (tokens are read from the "
        "environment, never from the recipe)"
    )


# ------------------------------------------------------------------------------ start-up


def test_the_url_is_required_and_checked(make_recipe, tokenizer, plugins):
    with pytest.raises(RecipeError) as caught:
        build_reward_manager(make_recipe({"manager": "remote"}), tokenizer, plugins)
    assert str(caught.value) == (
        "reward.url: the remote manager needs the scoring server's address: set reward.url "
        "(http://host:8000/score for `plugrl serve reward`)"
    )
    recipe = make_recipe({"manager": "remote", "url": "localhost:8000/score"})
    with pytest.raises(RecipeError) as caught:
        build_reward_manager(recipe, tokenizer, plugins)
    assert str(caught.value) == (
        "reward.url: 'localhost:8000/score' is not an http(s) address; write it as "
        "http://host:port/path"
    )


def test_the_section_reads_into_the_remote_config(make_recipe):
    recipe = make_recipe({"manager": "remote", "url": "http://h/score", "max_in_flight": 2})
    assert isinstance(recipe.reward, RemoteRewardConfig)
    assert recipe.reward.max_in_flight == 2 and recipe.reward.schema == "plugrl"


def test_backoff_doubles_each_retry_within_its_jitter():
    client = RemoteClient(RemoteRewardConfig(url="http://h/score", backoff_s=1.0), {})
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0)]:
        waits = [client.backoff(attempt) for _ in range(50)]
        assert all(0.5 * base <= w < 1.5 * base for w in waits)
        assert len(set(waits)) > 1  # jittered


# ------------------------------------------------------------------------------ limits


@pytest.mark.parametrize("limit", [1, 3])
def test_requests_in_flight_never_exceed_max_in_flight(build, tokenizer, server, limit):
    manager = build("slow", batch_size=1, max_in_flight=limit)
    output = manager(batch_of(tokenizer, [str(i) for i in range(9)], ["0"] * 9))
    assert output.extra["score"] == [1.0] + [0.0] * 8
    assert server.requests["slow"] == 9
    assert 1 <= server.most_at_once["slow"] <= limit


def test_requests_run_concurrently_up_to_the_limit(build, tokenizer, server):
    server.slow_s = 0.5  # long enough that all 4 are held at once even on a loaded machine
    try:
        build("slow", batch_size=1, max_in_flight=4)(
            batch_of(tokenizer, list("abcd"), list("abcd"))
        )
    finally:
        server.slow_s = 0.2
    assert server.most_at_once["slow"] >= 2


def test_max_calls_per_s_spaces_the_starts(build, tokenizer):
    import plugrl_remote.manager as remote

    clock = remote.time.monotonic
    starts = []
    manager = build("score", batch_size=1, max_calls_per_s=20.0)
    pace = manager.client._pace

    async def recorded_pace():
        await pace()
        starts.append(clock())

    manager.client._pace = recorded_pace
    before = clock()
    manager(batch_of(tokenizer, list("abcd"), list("abcd")))
    # the i-th request starts no earlier than i / 20 s after the batch did (a loaded machine
    # only delays starts further)
    assert len(starts) == 4
    for index, start in enumerate(sorted(starts)):
        assert start - before >= index * 0.05 - 1e-6


# ------------------------------------------------------------------------------ OpenRLHF schema


def test_openrlhf_schema_sends_query_prompts_labels_and_reads_rewards(build, tokenizer, server):
    manager = build("get_reward", schema="openrlhf")
    batch = batch_of(tokenizer, ["4", "5"], ["4", "4"])
    batch["raw_prompt_ids"] = [tokenizer.encode("2+2="), tokenizer.encode("2+2=")]
    output = manager(batch)
    assert server.bodies["get_reward"] == [
        {
            "query": ["2+2=4<eos>", "2+2=5<eos>"],  # special tokens kept, as OpenRLHF sends
            "prompts": ["2+2=", "2+2="],
            "labels": ["4", "4"],
        }
    ]
    assert output.token_level_scores.sum(-1).tolist() == [0.0, 0.0]  # "<eos>" ends the query
    assert output.extra == {
        "scores": [0.0, 0.0],
        "query_length": [10, 10],
        "score": [0.0, 0.0],
    }
    assert output.metrics[f"reward/{DS}/query_length"] == 10.0


def test_openrlhf_answers_without_rewards_are_malformed(build, tokenizer, server):
    manager = build("score", schema="openrlhf")
    with pytest.raises(ScoringError) as caught:
        manager(batch_of(tokenizer, ["1"], ["1"]))
    assert str(caught.value) == (
        f"remote reward at {server.url('score')} answered without 'rewards' (keys: scores) "
        '(sample 0, 1 try); the server must answer {"rewards": [number, ...]} with one '
        "reward per sample, in order (reward.schema=openrlhf; see docs/rewards.md, Remote "
        "rewards)"
    )


# ------------------------------------------------------------------------------ prefetch


def test_prefetched_rows_are_not_posted_again_and_the_output_is_the_same(build, tokenizer, server):
    texts, truths = ["1", "2", "3", "4", "5"], ["1", "1", "3", "3", "5"]
    plain = build("score", batch_size=2)(batch_of(tokenizer, texts, truths, width=4))
    posted_plain = sum(len(b["samples"]) for b in server.bodies["score"])
    server.reset()
    manager = build("score", batch_size=2)
    whole = batch_of(tokenizer, texts, truths, width=4)
    manager.prefetch(batch_of(tokenizer, texts[:3], truths[:3], width=4))
    output = manager(whole)
    posted = [len(b["samples"]) for b in server.bodies["score"]]
    assert sum(posted) == posted_plain == 5  # the 3 prefetched rows went once
    assert torch.equal(output.token_level_scores, plain.token_level_scores)
    assert output.extra == plain.extra
    scores = {k: v for k, v in output.metrics.items() if not k.startswith("reward/remote/")}
    assert scores == {k: v for k, v in plain.metrics.items() if not k.startswith("reward/remote/")}
