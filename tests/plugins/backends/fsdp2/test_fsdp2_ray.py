"""Two fsdp2 ranks as Ray actors (gloo, CPU) against one rank in this process."""

import pytest
import torch
import transformers

from plugrl.cluster.local import LocalWorkerGroup
from plugrl.cluster.ray_group import RayWorkerGroup
from plugrl.errors import CheckpointError
from plugrl.plugin.manager import get_plugin_manager
from plugrl_fsdp2.checkpoint import RESUME_FIX
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    TokenMeanReinforce,
    full_weights,
    make_backend,
    make_batch,
    make_recipe,
    max_weight_difference,
)
from tests.support import shared_ray_for_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from tests.plugins.backends.fsdp2 import fsdp2_testing

    # the test objective lives in a test module the workers cannot import: send it by value
    ray.cloudpickle.register_pickle_by_value(fsdp2_testing)
    try:
        with shared_ray_for_module():
            yield ray
    finally:
        ray.cloudpickle.unregister_pickle_by_value(fsdp2_testing)


@pytest.fixture(scope="module")
def two_ranks(ray_session, tiny_model):
    # ranks agree on a micro-batch count under dynamic batching; the local rank uses a fixed
    # size: the LossScale makes both the same update
    recipe = make_recipe(
        tiny_model, cluster="ray", use_dynamic_bsz=True, ppo_max_token_len_per_gpu=40
    )
    # half a CPU per rank leaves room for the hybrid-sharding group below
    group = RayWorkerGroup(
        recipe,
        "actor",
        world_size=2,
        device_name="cpu",
        num_cpus_per_rank=0.5,
        plugins=get_plugin_manager(),
    )
    group.setup(10)
    yield group
    group.close()


def test_two_ray_ranks_match_one_local_rank(two_ranks, tiny_model, tmp_path):
    batch = make_batch(16, seed=3)
    local = LocalWorkerGroup(
        make_recipe(tiny_model, ppo_micro_batch_size_per_gpu=3),
        "actor",
        device_name="cpu",
        plugins=get_plugin_manager(),
    )
    local.setup(10)
    assert two_ranks.dp_ranks == [0, 1]

    ray_log_probs = two_ranks.compute_log_prob(batch, calculate_entropy=True)
    local_log_probs = local.compute_log_prob(batch, calculate_entropy=True)
    for key in ("log_probs", "entropys"):
        torch.testing.assert_close(ray_log_probs[key], local_log_probs[key], atol=1e-5, rtol=0)

    batch["old_log_probs"] = local_log_probs["log_probs"]
    ray_metrics = two_ranks.update_policy(batch, TokenMeanReinforce())
    local_metrics = local.update_policy(batch, TokenMeanReinforce())
    for key in ("actor/loss", "actor/grad_norm", "actor/lr"):
        assert ray_metrics[key] == pytest.approx(local_metrics[key], rel=1e-5), key
    ray_weights = dict(two_ranks.named_weights())
    local_weights = dict(local.named_weights())
    # two Adam steps of about lr (1e-3) each; only the summation order differs
    assert max_weight_difference(ray_weights, local_weights) < 5e-5

    # a checkpoint of two ranks resumes on one (torch.distributed.checkpoint reshards)
    two_ranks.save_checkpoint(tmp_path / "actor")
    resumed = make_backend(make_recipe(tiny_model))
    resumed.load_checkpoint(tmp_path / "actor")
    assert max_weight_difference(full_weights(resumed), ray_weights) == 0.0

    # and a checkpoint of one rank resumes on two; the second rank takes the first one's
    # schedule position
    local.save_checkpoint(tmp_path / "one-rank")
    two_ranks.load_checkpoint(tmp_path / "one-rank")
    assert max_weight_difference(dict(two_ranks.named_weights()), local_weights) == 0.0
    local_after = local.update_policy(batch, TokenMeanReinforce())
    ray_after = two_ranks.update_policy(batch, TokenMeanReinforce())
    assert ray_after["actor/lr"] == local_after["actor/lr"]
    assert ray_after["actor/loss"] == pytest.approx(local_after["actor/loss"], rel=1e-5)
    after = dict(two_ranks.named_weights())
    assert max_weight_difference(after, dict(local.named_weights())) < 5e-5
    two_ranks.load_checkpoint(tmp_path / "actor")

    # an export by two ranks is the whole model
    two_ranks.export_hf(tmp_path / "hf")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    for name, tensor in exported.state_dict().items():
        torch.testing.assert_close(tensor, ray_weights[name])


def test_ranks_derive_on_policy_old_log_probs_as_one_rank_does(two_ranks, tiny_model, tmp_path):
    from plugrl.algorithms.objective import PolicyObjective

    local = LocalWorkerGroup(
        make_recipe(tiny_model, ppo_micro_batch_size_per_gpu=3),
        "actor",
        device_name="cpu",
        plugins=get_plugin_manager(),
    )
    local.setup(10)
    local.save_checkpoint(tmp_path / "start")
    two_ranks.load_checkpoint(tmp_path / "start")
    batch = make_batch(8, seed=5)  # one mini-batch: one optimizer step
    batch.pop("old_log_probs")
    objective = PolicyObjective.from_recipe(local.recipe, get_plugin_manager())
    ray_metrics = two_ranks.update_policy(batch, objective)
    local_metrics = local.update_policy(batch, objective)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert ray_metrics[key] == pytest.approx(local_metrics[key], rel=1e-5), key
    assert ray_metrics["actor/ppo_kl"] == 0.0
    assert max_weight_difference(dict(two_ranks.named_weights()), full_weights(local)) < 5e-5


def test_a_worker_error_reaches_the_driver_as_itself(two_ranks, tmp_path):
    with pytest.raises(CheckpointError) as info:
        two_ranks.load_checkpoint(tmp_path / "nowhere")
    assert str(info.value).startswith(f"checkpoint folder {str(tmp_path / 'nowhere')!r} does not")
    # the group is still usable afterwards
    assert len(two_ranks.compute_log_prob(make_batch(3))["log_probs"]) == 3


def test_a_checkpoint_problem_of_one_rank_reaches_the_driver_with_its_message(
    ray_session, two_ranks, tmp_path
):
    ray = ray_session
    two_ranks.save_checkpoint(tmp_path / "actor")
    extra = tmp_path / "actor" / "extra_state_rank_1.pt"
    extra.unlink()
    expected = (
        f"checkpoint file {str(extra)!r} is missing (the checkpoint was written by 2 ranks); "
        f"{RESUME_FIX}"
    )
    with pytest.raises(CheckpointError) as info:
        two_ranks.load_checkpoint(tmp_path / "actor")
    assert str(info.value) == expected
    # the driver reports whichever rank fails first: rank 0, which found nothing wrong, must
    # fail with rank 1's message too
    refs = [
        worker.call.remote("load_checkpoint", tmp_path / "actor") for worker in two_ranks.workers
    ]
    for ref in refs:
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(ref)
        assert str(info.value.cause) == expected


def test_hybrid_sharding_replicates_and_matches_one_rank(ray_session, two_ranks, tiny_model):
    batch = make_batch(8, seed=4)
    # fsdp_size 1: each of the two ranks holds the whole model; gradients are averaged
    hybrid = RayWorkerGroup(
        make_recipe(tiny_model, cluster="ray", fsdp_size=1),
        "actor",
        world_size=2,
        device_name="cpu",
        num_cpus_per_rank=0.5,
        plugins=get_plugin_manager(),
    )
    try:
        hybrid.setup(10)
        local = make_backend(make_recipe(tiny_model))
        hybrid_metrics = hybrid.update_policy(batch, TokenMeanReinforce())
        local_metrics = local.update_policy(batch, TokenMeanReinforce())
        assert hybrid_metrics["actor/grad_norm"] == pytest.approx(
            local_metrics["actor/grad_norm"], rel=1e-5
        )
        weights = dict(hybrid.named_weights())
        assert max_weight_difference(weights, full_weights(local)) < 2e-5
    finally:
        hybrid.close()


def test_a_critic_on_two_ranks_matches_one_local_critic(ray_session, two_ranks, tiny_model):
    batch = make_batch(8, seed=6)
    recipe = make_recipe(tiny_model, cluster="ray", critic={"cliprange_value": 0.05})
    critics = RayWorkerGroup(
        recipe,
        "critic",
        world_size=2,
        device_name="cpu",
        num_cpus_per_rank=0.5,
        plugins=get_plugin_manager(),
    )
    try:
        critics.setup(10)
        local = make_backend(make_recipe(tiny_model, critic={"cliprange_value": 0.05}), "critic")
        # the value head is drawn from the seeded RNG on rank 0 and reaches rank 1 from it
        values = critics.compute_values(batch)
        torch.testing.assert_close(values, local.compute_values(batch), atol=1e-5, rtol=0)
        batch["values"] = values
        ray_metrics = critics.update_critic(batch)
        local_metrics = local.update_critic(batch)
        for key in ("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"):
            assert ray_metrics[key] == pytest.approx(local_metrics[key], rel=1e-5), key
        weights = dict(critics.named_weights())
        assert max_weight_difference(weights, full_weights(local)) < 2e-5
    finally:
        critics.close()
