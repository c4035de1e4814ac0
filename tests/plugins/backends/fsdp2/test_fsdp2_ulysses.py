"""Ulysses sequence parallelism (``actor.ulysses_sequence_parallel_size``): two ranks that split
every sequence compute what one rank computes whole, and layouts that cannot split are refused
in one line naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from plugrl.cluster.distributed import free_port
from plugrl.errors import RecipeError
from plugrl.parts.context import DistInfo, PartContext
from plugrl_cpu.device import CpuDevice
from plugrl_fsdp2.backend import FSDP2Backend
from plugrl_fsdp2.batching import left_align
from plugrl_fsdp2.config import FSDP2ActorConfig
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    TokenMeanReinforce,
    full_weights,
    make_batch,
    make_recipe,
)
from tests.support import spawned_rank

BATCH_SEED = 2
"""make_batch(8, seed=BATCH_SEED): rows of different lengths whose two micro-batches of 4 have
an odd left-aligned width and an odd packed length (checked below), so two ranks must pad
before splitting."""

LAYOUTS = {"padded": False, "packed": True}
"""Each case's actor.use_remove_padding; the packed one also recomputes its layers in backward
(gradient checkpointing), which runs the exchanges of attention again."""


class ReinforceWithEntropy(TokenMeanReinforce):
    """The REINFORCE loss minus an entropy bonus: the entropy's gradient flows back through
    the gathered slices too."""

    needs_entropy = True

    def __call__(
        self, micro_batch: Any, log_prob: torch.Tensor, entropy: Any, scale: Any
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().__call__(micro_batch, log_prob, entropy, scale)
        mask = micro_batch["response_mask"].to(entropy.dtype)
        bonus = (entropy * mask).sum() * scale.dp_size / scale.num_tokens
        return loss - 0.1 * bonus, {**metrics, "actor/entropy": float(bonus.detach())}


def one_update(model_dir: Path, dist_info: DistInfo, sp: int, packed: bool) -> dict[str, Any]:
    """Build an actor, score the batch, take one optimizer step over two micro-batches, score
    again: everything a rank sees, gradients (full) included."""
    recipe = make_recipe(
        model_dir,
        ulysses_sequence_parallel_size=sp,
        use_remove_padding=packed,
        ppo_micro_batch_size_per_gpu=4,
        gradient_checkpointing=packed,
    )
    context = PartContext(recipe=recipe, role="actor", device=CpuDevice(), dist=dist_info)
    backend = FSDP2Backend(recipe.actor, context)
    backend.setup(10)
    batch = make_batch(8, seed=BATCH_SEED)
    before = backend.compute_log_prob(batch, calculate_entropy=True, calculate_sum_pi_squared=True)
    grads: dict[str, torch.Tensor] = {}
    step = backend._clip_and_step

    def recording_step(grad_clip: float) -> float:
        assert backend.model is not None
        for name, param in backend.model.named_parameters():
            grads[name] = param.grad.full_tensor().clone()
        return step(grad_clip)

    backend._clip_and_step = recording_step  # type: ignore[method-assign]
    metrics = backend.update_policy(batch, ReinforceWithEntropy())
    after = backend.compute_log_prob(batch)
    return {
        "before": before,
        "grads": grads,
        "metrics": metrics,
        "after": after["log_probs"],
        "weights": full_weights(backend),
        "dp": (backend.dp_rank, backend.dp_size, backend.is_output_rank),
    }


def critic_values(model_dir: Path, dist_info: DistInfo, sp: int) -> torch.Tensor:
    recipe = make_recipe(model_dir, ulysses_sequence_parallel_size=sp)
    context = PartContext(recipe=recipe, role="critic", device=CpuDevice(), dist=dist_info)
    backend = FSDP2Backend(recipe.actor, context)
    backend.setup(10)
    return backend.compute_values(make_batch(8, seed=BATCH_SEED))


def sequence_parallel_worker(rank: int, world_size: int, port: int, model_dir: str, out: str):
    from plugrl.cluster.distributed import init_process_group

    torch.set_num_threads(1)
    dist_info = DistInfo(rank=rank, world_size=world_size)
    init_process_group(CpuDevice(), dist_info, "127.0.0.1", port)
    with spawned_rank():
        results = {
            layout: one_update(Path(model_dir), dist_info, world_size, packed)
            for layout, packed in LAYOUTS.items()
        }
        results["values"] = critic_values(Path(model_dir), dist_info, world_size)
        torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def two_ranks(tiny_model, tmp_path_factory):
    """Both layouts on two ranks of one sequence-parallel group: what each rank saw."""
    out = tmp_path_factory.mktemp("ulysses")
    mp.spawn(
        sequence_parallel_worker,
        args=(2, free_port(), str(tiny_model), str(out)),
        nprocs=2,
        join=True,
    )
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]


def test_the_batch_needs_padding_to_split():
    batch = make_batch(8, seed=BATCH_SEED)
    response = batch["responses"].shape[1]
    for rows in (batch["attention_mask"][:4], batch["attention_mask"][4:]):
        assert left_align(rows, response).columns.shape[1] % 2 == 1
        assert int(rows.sum()) % 2 == 1
    assert len(set(batch["attention_mask"].sum(dim=1).tolist())) > 2


def assert_named_close(got: torch.Tensor, expected: torch.Tensor, name: str, atol: float) -> None:
    torch.testing.assert_close(got, expected, atol=atol, rtol=0, msg=lambda m: f"{name}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_sequence_parallel_ranks_compute_what_one_rank_does(two_ranks, tiny_model, layout):
    expected = one_update(tiny_model, DistInfo(), 1, LAYOUTS[layout])
    exact = {"atol": 1e-5, "rtol": 0}
    for rank, results in enumerate(two_ranks):
        got = results[layout]
        assert got["dp"] == (0, 1, rank == 0)
        for name in ("log_probs", "entropys", "sum_pi_squared"):
            torch.testing.assert_close(got["before"][name], expected["before"][name], **exact)
        for name in ("actor/loss", "actor/grad_norm", "actor/pg_loss", "actor/entropy"):
            assert got["metrics"][name] == pytest.approx(expected["metrics"][name], abs=1e-5)
        # gradients counted once, not once per sequence-parallel rank
        assert got["grads"].keys() == expected["grads"].keys()
        for name, grad in expected["grads"].items():
            assert_named_close(got["grads"][name], grad, name, atol=1e-5)
        torch.testing.assert_close(got["after"], expected["after"], **exact)
    weights = two_ranks[0][layout]["weights"]
    assert weights.keys() == expected["weights"].keys()
    for name, weight in expected["weights"].items():
        # Adam's first step divides each gradient by its own size: a gradient near 0 that
        # differs in its last bits moves its weight by a visible fraction of lr (1e-3)
        assert_named_close(weights[name], weight, name, atol=1e-4)


@pytest.mark.slow
def test_a_sequence_parallel_critic_computes_the_values_of_one_rank(two_ranks, tiny_model):
    expected = critic_values(tiny_model, DistInfo(), 1)
    for results in two_ranks:
        torch.testing.assert_close(results["values"], expected, atol=1e-5, rtol=0)


def test_backward_threads_split_attention_as_the_forward_did():
    import threading

    from plugrl_fsdp2 import ulysses

    group = object()
    seen = []
    with ulysses.sequence_group(group):
        thread = threading.Thread(target=lambda: seen.append(ulysses.current_group()))
        thread.start()
        thread.join()
    assert seen == [group]
    assert ulysses.current_group() is None


def test_a_sequence_parallel_group_is_one_data_parallel_rank(tiny_model):
    recipe = make_recipe(tiny_model, ulysses_sequence_parallel_size=2)
    placed = []
    for rank in range(4):
        dist_info = DistInfo(rank=rank, world_size=4)
        context = PartContext(recipe=recipe, role="ref", device=CpuDevice(), dist=dist_info)
        backend = FSDP2Backend(recipe.actor, context)
        placed.append((backend.dp_rank, backend.dp_size, backend.is_output_rank))
    assert placed == [(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)]


def test_ranks_the_groups_do_not_divide_are_refused(tiny_model):
    recipe = make_recipe(tiny_model, ulysses_sequence_parallel_size=2)
    context = PartContext(
        recipe=recipe, role="actor", device=CpuDevice(), dist=DistInfo(rank=0, world_size=3)
    )
    with pytest.raises(RecipeError) as info:
        FSDP2Backend(recipe.actor, context)
    assert str(info.value) == (
        "actor.ulysses_sequence_parallel_size: 2 does not divide the 3 ranks of each model "
        "(trainer.nnodes x trainer.n_gpus_per_node, 1 with cluster.mode=local); use a divisor "
        "of 3"
    )


def test_the_recipe_check_splits_mini_batches_over_the_groups():
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import apply_overrides, build_recipe

    def build(*overrides: str) -> Any:
        return build_recipe(apply_overrides({}, overrides), get_plugin_manager())

    ray = ("cluster=ray", "trainer.n_gpus_per_node=4", "rollout.n=1", "data.train_batch_size=2")
    # 2 prompts per step over 2 data-parallel ranks (4 ranks in groups of 2)
    build(*ray, "actor.ppo_mini_batch_size=2", "actor.ulysses_sequence_parallel_size=2")
    with pytest.raises(RecipeError) as info:
        build(*ray, "actor.ppo_mini_batch_size=2", "actor.ulysses_sequence_parallel_size=3")
    assert str(info.value).startswith(
        "actor.ulysses_sequence_parallel_size: 3 does not divide the 4 ranks of each model"
    )
    with pytest.raises(RecipeError) as info:
        build("actor.ulysses_sequence_parallel_size=2")
    assert "does not divide the 1 ranks" in str(info.value)
    # the token budget is per rank: two ranks hold a sequence of twice the budget
    dynamic = (*ray, "actor.ppo_mini_batch_size=2", "actor.use_dynamic_bsz=true")
    dynamic += ("data.max_prompt_length=100", "data.max_response_length=100")
    sp = "actor.ulysses_sequence_parallel_size"
    build(*dynamic, f"{sp}=2", "actor.ppo_max_token_len_per_gpu=100")
    with pytest.raises(RecipeError) as info:
        build(*dynamic, f"{sp}=4", "actor.ppo_max_token_len_per_gpu=49")
    assert str(info.value) == (
        "actor.ppo_max_token_len_per_gpu: 49 tokens on each of the 4 ranks a sequence is split "
        "over cannot hold one sequence of data.max_prompt_length + data.max_response_length = "
        "200 tokens; set it to at least 50"
    )


@pytest.mark.parametrize(
    ("sp", "fields", "message"),
    [
        (
            3,
            {},
            "3 does not divide the model's 4 attention heads, which the sequence-parallel "
            "ranks share out; use one of 1, 2, 4",
        ),
        (
            4,
            {},
            "4 does not divide the model's 2 key-value heads, which the sequence-parallel "
            "ranks share out; use one of 1, 2",
        ),
        (
            2,
            {"use_sliding_window": True, "sliding_window": 16},
            "sequence parallelism needs full causal attention in every layer, but its layers "
            "use sliding_attention; set it to 1",
        ),
    ],
)
def test_models_whose_heads_or_attention_do_not_split_are_refused(sp, fields, message):
    from transformers import Qwen2Config

    from plugrl_fsdp2 import ulysses

    config = Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **fields)
    with pytest.raises(RecipeError) as info:
        ulysses.check_model(config, sp)
    assert str(info.value) == f"actor.ulysses_sequence_parallel_size: {message}"
    ulysses.check_model(Qwen2Config(num_attention_heads=4, num_key_value_heads=2), 2)


def test_the_option_is_the_actors_and_positive():
    from plugrl.config import ConfigValueError

    assert FSDP2ActorConfig().ulysses_sequence_parallel_size == 1
    assert FSDP2ActorConfig(ulysses_sequence_parallel_size=2).data_parallel_size(8) == 4
    with pytest.raises(ConfigValueError):
        FSDP2ActorConfig(ulysses_sequence_parallel_size=0)
