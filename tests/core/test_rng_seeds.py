"""The seeds of what a run samples (plugrl.state.seeds): the values the quickstart's runs depend on,
the streams kept apart, and the inverse an agent's one-sample requests use."""

from __future__ import annotations

import itertools

import pytest

from plugrl.run.steps import sampling_params
from plugrl.state.seeds import (
    SEED_MODULUS,
    Stream,
    derive_seed,
    mini_batch_order_seed,
    one_sample_request_seed,
    round_seed,
    sampling_seed,
)

# Computed with the formulas the kernel wrote out in four places before seeds had a module of
# their own: a run with the same seed must keep sampling exactly these, so its metrics repeat.
# (run seed, step) -> (training rollout, validation, fully_async sample number `step`)
OLD_STEP_SEEDS = {
    (0, 1): (7919, 7920, 7921),
    (0, 2): (15838, 15839, 15840),
    (0, 100): (791900, 791901, 791902),
    (1, 1): (1007922, 1007923, 1007924),
    (1, 7): (1055436, 1055437, 1055438),
    (42, 2): (42015964, 42015965, 42015966),
    (42, 100): (42792026, 42792027, 42792028),
}


@pytest.mark.parametrize(("run_seed", "step"), sorted(OLD_STEP_SEEDS))
def test_rollout_validation_and_streamed_seeds_keep_their_values(run_seed, step):
    rollout, validation, streamed = OLD_STEP_SEEDS[run_seed, step]
    assert round_seed(run_seed, step) == rollout
    assert sampling_seed(run_seed, Stream.ROLLOUT, step) == rollout
    assert sampling_seed(run_seed, Stream.VALIDATION, step) == validation
    assert sampling_seed(run_seed, Stream.SAMPLE_ROLLOUT, step) == streamed


def test_per_sample_seeds_keep_their_values():
    # run seed 7, step 3: prompt p, sample s of training, validation; sample s of a streamed
    # request; turns 1 and 2 of prompt 1, sample 2 (an agent's later turns)
    assert [sampling_seed(7, Stream.ROLLOUT, 3, p, s) for p, s in ((0, 0), (2, 1))] == [
        7023820150650245678,
        7023820166488301111,
    ]
    assert [sampling_seed(7, Stream.VALIDATION, 3, p, s) for p, s in ((0, 0), (2, 1))] == [
        7023821150656245687,
        7023821166494301120,
    ]
    assert [sampling_seed(7, Stream.SAMPLE_ROLLOUT, 3, s) for s in (0, 3)] == [
        7023801079259,
        7023801103016,
    ]
    assert [sampling_seed(7, Stream.ROLLOUT, 3, 1, 2, t) for t in (1, 2)] == [
        3616291890979670175,
        3616291890979678094,
    ]
    assert derive_seed(12345, 0) == 12345044954
    assert derive_seed(2**62, 4, 7, 1) == 5151285819363450166


def test_one_sample_request_seeds_keep_their_values():
    assert one_sample_request_seed(sampling_seed(7, Stream.ROLLOUT, 3, 1, 2)) == (
        4741737586126477287
    )
    assert one_sample_request_seed(sampling_seed(7, Stream.ROLLOUT, 3, 1, 2, 1)) == (
        4782999421305592427
    )
    assert one_sample_request_seed(5) == 6942521985039076890


def test_mini_batch_order_seeds_keep_their_values():
    assert [mini_batch_order_seed(0, u, e) for u, e in ((0, 0), (5, 1))] == [0, 5000016]
    assert mini_batch_order_seed(7, 12, 3) == 12000046


def test_dynamic_sampling_later_rounds_do_not_draw_validation_seeds():
    """Round 1 of a step once drew on validation's stream at that step; no later round of any
    step may meet validation's seeds, nor another round's or step's."""
    for run_seed in (0, 1, 42):
        validation = {sampling_seed(run_seed, Stream.VALIDATION, step) for step in range(0, 200)}
        rounds = {
            (step, round_index): round_seed(run_seed, step, round_index)
            for step in range(1, 200)
            for round_index in range(0, 12)
        }
        assert not validation & set(rounds.values())
        assert len(set(rounds.values())) == len(rounds)
        assert round_seed(run_seed, 5, 1) != sampling_seed(run_seed, Stream.VALIDATION, 5)


def test_the_streams_are_pairwise_disjoint_down_to_each_sample():
    """Every (stream, position, prompt, sample) over a grid gets a seed of its own, and so do
    the requests the samples derive from."""
    run_seed = 3
    positions, prompts, samples = range(0, 40), range(6), range(4)
    request_seeds: dict[int, tuple] = {}
    sample_seeds: dict[int, tuple] = {}
    for stream, position in itertools.product(Stream, positions):
        key = (stream, position)
        seed = sampling_seed(run_seed, stream, position)
        assert request_seeds.setdefault(seed, key) == key
        for prompt, sample in itertools.product(prompts, samples):
            sample_key = (*key, prompt, sample)
            seed = sampling_seed(run_seed, stream, position, prompt, sample)
            assert sample_seeds.setdefault(seed, sample_key) == sample_key
    for step, round_index in itertools.product(positions, range(1, 6)):
        key = ("round", step, round_index)
        seed = round_seed(run_seed, step, round_index)
        assert request_seeds.setdefault(seed, key) == key
        for prompt, sample in itertools.product(prompts, samples):
            sample_key = (*key, prompt, sample)
            seed = derive_seed(seed, prompt, sample)
            assert sample_seeds.setdefault(seed, sample_key) == sample_key
    assert not set(request_seeds) & set(sample_seeds)


def test_derive_seed_chains_and_stays_below_the_modulus():
    seed = SEED_MODULUS - 1
    assert derive_seed(seed, 3, 5) == derive_seed(derive_seed(seed, 3), 5)
    assert derive_seed(seed) == seed
    assert all(0 <= derive_seed(seed, index) < SEED_MODULUS for index in range(50))
    assert 0 <= sampling_seed(2**70, Stream.JUDGE, 2**32 - 1, 9) < SEED_MODULUS


def test_one_sample_request_seed_inverts_the_first_sample():
    for request_seed in (0, 1, 987654321, SEED_MODULUS - 1):
        for sample in range(5):
            wanted = derive_seed(request_seed, sample)
            assert derive_seed(one_sample_request_seed(wanted), 0) == wanted


def test_bad_streams_positions_and_rounds_are_refused():
    with pytest.raises(ValueError, match="stream 7919"):
        sampling_seed(0, 7919, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="counted from 0, got -1"):
        sampling_seed(0, Stream.ROLLOUT, -1)
    with pytest.raises(ValueError, match="rounds are counted from 0"):
        round_seed(0, 1, -1)


def test_sampling_params_seeds_training_rounds_and_other_streams(plugrl_recipe):
    recipe = plugrl_recipe()
    seed = recipe.trainer.seed
    assert sampling_params(recipe, 4).seed == round_seed(seed, 4)
    assert sampling_params(recipe, 4, 2).seed == round_seed(seed, 4, 2)
    streamed = sampling_params(recipe, 9, stream=Stream.SAMPLE_ROLLOUT)
    assert streamed.seed == sampling_seed(seed, Stream.SAMPLE_ROLLOUT, 9)
    with pytest.raises(ValueError, match="got round 1 on stream VALIDATION"):
        sampling_params(recipe, 4, 1, stream=Stream.VALIDATION)
