"""The megatron backend for real on CPU (megatron-core, one rank, gloo), against the Hugging
Face model and the fsdp2 backend on the same weights."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("megatron.core")

from plugrl.algorithms import token_log_probs
from plugrl.errors import CheckpointError, RecipeError
from tests.crafted import SYSTEM, plant_in_torch_file, runs_when_unpickled
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    TokenMeanReinforce,
    full_weights,
    make_backend,
    make_batch,
    make_recipe,
    max_weight_difference,
    plain_log_probs,
    plain_token_columns,
)
from tests.plugins.backends.megatron.megatron_testing import (
    make_megatron_backend,
    megatron_recipe,
    save_tiny_qwen3,
)

# float32 on CPU: megatron's and Hugging Face's layers differ in operation order only
LOG_PROB_TOLERANCE = 1e-5
# after one AdamW step of lr 1e-3 (weights move by about 1e-3)
UPDATE_TOLERANCE = 5e-5


@pytest.fixture(scope="module", autouse=True)
def cpu_shims():
    """The cpu prepare_backend patches, undone after this module (other tests expect
    torch.cuda to fail without CUDA)."""
    from megatron.core.tensor_parallel import random as megatron_random

    from plugrl_megatron import cpu_shims

    tracker = megatron_random.CudaRNGStatesTracker
    saved = (
        torch.cuda.current_device,
        tracker.fork,
        megatron_random._get_cuda_rng_state,
        megatron_random._set_cuda_rng_state,
    )
    cpu_shims.apply()
    yield
    (
        torch.cuda.current_device,
        tracker.fork,
        megatron_random._get_cuda_rng_state,
        megatron_random._set_cuda_rng_state,
    ) = saved


@pytest.fixture(scope="module")
def actor(tiny_model):
    return make_megatron_backend(megatron_recipe(tiny_model))


def hf_weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_log_probs_and_entropy_equal_the_hugging_face_model_and_fsdp2(actor, tiny_model):
    batch = make_batch(8)
    batch.meta["temperature"] = 0.7
    out = actor.compute_log_prob(batch, calculate_entropy=True, calculate_sum_pi_squared=True)
    expected, entropy, squares = plain_token_columns(tiny_model, batch, temperature=0.7)
    torch.testing.assert_close(out["log_probs"], expected, atol=LOG_PROB_TOLERANCE, rtol=0)
    torch.testing.assert_close(out["entropys"], entropy, atol=LOG_PROB_TOLERANCE, rtol=0)
    torch.testing.assert_close(out["sum_pi_squared"], squares, atol=LOG_PROB_TOLERANCE, rtol=0)
    fsdp2 = make_backend(make_recipe(tiny_model))
    reference = fsdp2.compute_log_prob(batch, calculate_entropy=True)
    torch.testing.assert_close(out["log_probs"], reference["log_probs"], atol=1e-5, rtol=0)


def test_weights_come_back_in_hugging_face_names_exactly_as_loaded(actor, tiny_model):
    sent = dict(actor.named_weights())
    loaded = hf_weights(tiny_model)
    assert sorted(sent) == sorted(loaded)
    for name, tensor in sent.items():
        assert torch.equal(tensor, loaded[name]), name
    metadata = actor.weight_metadata()
    assert [(m.name, tuple(m.shape), m.dtype) for m in metadata] == [
        (name, tuple(tensor.shape), "float32") for name, tensor in actor.named_weights()
    ]
    buckets = list(actor.weight_buckets(bucket_bytes=64 * 1024))
    assert len(buckets) > 1
    assert [name for bucket in buckets for name, _ in bucket] == [m.name for m in metadata]


def test_one_update_equals_the_fsdp2_backend_s(tiny_model, monkeypatch):
    batch = make_batch(8)
    megatron = make_megatron_backend(megatron_recipe(tiny_model, ppo_micro_batch_size_per_gpu=3))
    fsdp2 = make_backend(make_recipe(tiny_model, ppo_micro_batch_size_per_gpu=3))
    # megatron's log-probs write their gradient over the logits (its memory plan counts no
    # other gradient tensor), and the update still equals fsdp2's
    overwritten = []
    backward = token_log_probs._TokenLogProbs.backward

    def watched(ctx, *grads):
        result = backward(ctx, *grads)
        overwritten.append(ctx.overwritten)
        return result

    with monkeypatch.context() as patch:
        patch.setattr(token_log_probs._TokenLogProbs, "backward", staticmethod(watched))
        got = megatron.update_policy(batch, TokenMeanReinforce())
    assert overwritten == [True] * 3  # one backward a micro-batch of 3 rows
    expected = fsdp2.update_policy(batch, TokenMeanReinforce())
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-6), name
    after = full_weights(megatron)
    moved = max_weight_difference(after, {k: v.float() for k, v in hf_weights(tiny_model).items()})
    assert moved > 5e-4
    assert max_weight_difference(after, full_weights(fsdp2)) < UPDATE_TOLERANCE


def test_micro_batches_recompute_and_on_policy_old_log_probs_give_the_same_update(tiny_model):
    batch = make_batch(8)
    whole = make_megatron_backend(megatron_recipe(tiny_model))
    whole.update_policy(batch, TokenMeanReinforce())
    split = make_megatron_backend(
        megatron_recipe(
            tiny_model,
            ppo_micro_batch_size_per_gpu=2,
            recompute_granularity="full",
            override_transformer_config={"recompute_num_layers": 1},
        )
    )
    assert split.transformer_config.recompute_granularity == "full"
    on_policy = batch.select(list(range(8)))
    on_policy.pop("old_log_probs")
    metrics = split.update_policy(on_policy, TokenMeanReinforce())
    assert "actor/pg_loss" in metrics
    # the same sums in another order: Adam divides each gradient by its own size, so a weight
    # whose gradient is rounding noise (a key bias's is zero in exact arithmetic) moves by up to
    # lr x noise / eps, a few 1e-6, differently in the two runs
    assert max_weight_difference(full_weights(split), full_weights(whole)) < 1e-5


def test_a_checkpoint_restores_weights_optimizer_and_schedule(tiny_model, tmp_path):
    backend = make_megatron_backend(megatron_recipe(tiny_model))
    backend.update_policy(make_batch(8, seed=1), TokenMeanReinforce())
    backend.save_checkpoint(tmp_path / "ckpt")
    saved = full_weights(backend)
    backend.update_policy(make_batch(8, seed=2), TokenMeanReinforce())
    after_save = full_weights(backend)
    backend.load_checkpoint(tmp_path / "ckpt")
    assert max_weight_difference(full_weights(backend), saved) == 0.0
    assert backend.update_steps == 1
    backend.update_policy(make_batch(8, seed=2), TokenMeanReinforce())
    # the same second step again: AdamW's moments and the step count came back too
    assert max_weight_difference(full_weights(backend), after_save) == 0.0


def test_a_checkpoint_of_another_layout_or_a_missing_one_is_refused(actor, tmp_path):
    with pytest.raises(CheckpointError, match=r"megatron.json is missing or unreadable"):
        actor.load_checkpoint(tmp_path / "nothing")
    actor.save_checkpoint(tmp_path / "ckpt")
    manifest = tmp_path / "ckpt" / "megatron.json"
    manifest.write_text(manifest.read_text().replace('"world_size": 1', '"world_size": 2'))
    with pytest.raises(CheckpointError) as error:
        actor.load_checkpoint(tmp_path / "ckpt")
    assert "was written with world_size=2, this run has world_size=1" in str(error.value)


FIX = "resume from an earlier global_step_N folder or start fresh with trainer.resume_mode=disable"


def _refused(file):
    return (
        f"checkpoint file {str(file)!r} holds something other than a checkpoint's data (it "
        f"refers to {SYSTEM}), so the run did not load it; {FIX}"
    )


def test_a_crafted_rank_file_is_refused_without_running_it(actor, tmp_path):
    actor.save_checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "ran"
    file = tmp_path / "ckpt" / "megatron_rank_0.pt"
    plant_in_torch_file(file, marker)
    assert runs_when_unpickled(file, marker)
    with pytest.raises(CheckpointError) as error:
        actor.load_checkpoint(tmp_path / "ckpt")
    assert str(error.value) == _refused(file)
    assert not marker.exists(), "loading the checkpoint ran its command"


def test_a_rank_file_of_something_else_is_refused(actor, tmp_path):
    actor.save_checkpoint(tmp_path / "ckpt")
    file = tmp_path / "ckpt" / "megatron_rank_0.pt"
    torch.save({"model": []}, file)
    with pytest.raises(CheckpointError) as error:
        actor.load_checkpoint(tmp_path / "ckpt")
    assert str(error.value) == (
        f"{file} is not a megatron rank file (it holds ['model'], not model, optimizer and "
        f"extra_state); {FIX}"
    )
    file.write_bytes(b"cut")
    with pytest.raises(CheckpointError, match=r"megatron_rank_0\.pt is missing or corrupt \("):
        actor.load_checkpoint(tmp_path / "ckpt")


class DistributedOptimizerStandIn:
    """What megatron's distributed optimizer offers a checkpoint; records what it was given."""

    def __init__(self):
        self.calls = []

    def load_state_dict(self, state):
        self.calls.append(("load_state_dict", state))

    def load_parameter_state(self, filename):
        self.calls.append(("load_parameter_state", filename))


def test_the_distributed_optimizer_file_is_checked_before_megatron_reads_it(actor, tmp_path):
    from plugrl_megatron import checkpoint

    layout = {"role": "actor", "world_size": 1}
    (tmp_path / "megatron.json").write_text(json.dumps(layout))
    torch.save(
        {"model": [], "optimizer": {"param_groups": []}, "extra_state": {"step": 1}},
        checkpoint.rank_file(tmp_path, 0),
    )
    shard = checkpoint.distributed_optimizer_file(tmp_path, "tp0_pp0")
    torch.save(
        {"buckets_coalesced": True, 0: {(torch.bfloat16, torch.float32): {"param": torch.ones(4)}}},
        shard,
    )

    def load(optimizer):
        return checkpoint.load(
            tmp_path, chunks=[], optimizer=optimizer, layout=layout, rank=0, model_shard="tp0_pp0"
        )

    optimizer = DistributedOptimizerStandIn()
    assert load(optimizer) == {"step": 1}
    assert optimizer.calls == [
        ("load_state_dict", {"param_groups": []}),
        ("load_parameter_state", str(shard)),
    ]
    marker = tmp_path / "ran"
    plant_in_torch_file(shard, marker)
    assert runs_when_unpickled(shard, marker)
    optimizer = DistributedOptimizerStandIn()
    with pytest.raises(CheckpointError) as error:
        load(optimizer)
    assert str(error.value) == _refused(shard)
    assert optimizer.calls == []  # nothing was loaded from a checkpoint with a crafted file
    assert not marker.exists(), "loading the checkpoint ran its command"


def test_export_writes_a_folder_transformers_loads_with_the_same_weights(actor, tmp_path):
    import transformers

    (tmp_path / ".hf.k1ll3d_9").mkdir()  # the staging folder of an export killed with -9
    actor.export_hf(tmp_path / "hf")
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    sent = dict(actor.named_weights())
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, sent[name]), name


@pytest.mark.parametrize("tie", [False, True])
def test_qwen3_with_qk_norms_and_tied_embeddings_matches_hugging_face(tmp_path, tie):
    folder = save_tiny_qwen3(tmp_path / "qwen3", tie=tie)
    backend = make_megatron_backend(megatron_recipe(folder))
    batch = make_batch(4)
    expected, _ = plain_log_probs(folder, batch)
    got = backend.compute_log_prob(batch)["log_probs"]
    torch.testing.assert_close(got, expected, atol=LOG_PROB_TOLERANCE, rtol=0)
    names = [name for name, _ in backend.named_weights()]
    assert ("lm_head.weight" in names) is not tie
    assert "model.layers.0.self_attn.q_norm.weight" in names


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            {"pipeline_model_parallel_size": 2},
            "actor.pipeline_model_parallel_size: pipeline parallelism needs a CUDA device "
            "(megatron's pipeline schedules allocate on CUDA); set it to 1 on cpu",
        ),
        (
            {"use_dist_checkpointing": True},
            "actor.dist_checkpointing_path: use_dist_checkpointing is true but no folder is "
            "named; give the megatron-core dist_checkpointing folder to load, or set "
            "actor.use_dist_checkpointing false to load model.path",
        ),
        (
            {"context_parallel_size": 2},
            "actor.context_parallel_size: context parallelism is not implemented by the "
            "megatron backend yet (inputs are not split along the sequence); set it to 1",
        ),
    ],
)
def test_layouts_this_backend_cannot_run_are_refused_in_one_line(tiny_model, setting, message):
    from plugrl.parts.context import DistInfo, PartContext
    from plugrl_cpu.device import CpuDevice
    from plugrl_megatron.backend import MegatronBackend

    recipe = megatron_recipe(tiny_model, **setting)
    context = PartContext(
        recipe=recipe, role="actor", device=CpuDevice(), dist=DistInfo(rank=0, world_size=2)
    )
    with pytest.raises(RecipeError) as error:
        MegatronBackend(recipe.actor, context)
    assert str(error.value) == message


def test_an_unknown_transformer_config_override_is_named(tiny_model):
    recipe = megatron_recipe(tiny_model, override_transformer_config={"num_layerz": 3})
    with pytest.raises(RecipeError) as error:
        make_megatron_backend(recipe)
    assert str(error.value).startswith(
        "actor.override_transformer_config.num_layerz: TransformerConfig has no field 'num_layerz'"
    )


# ------------------------------------------------------------------------ offload

OFFLOAD_ALL = {"param_offload": True, "grad_offload": True, "optimizer_offload": True}


def _parked(backend):
    """Bytes still held on the device by the parameters, the gradient buffer and the
    optimizer's state (0 each when parked)."""
    params = list(backend._parameters())
    state = [t for s in backend.optimizer.state.values() for t in s.values()]
    return tuple(
        sum(t.untyped_storage().nbytes() for t in tensors)
        for tensors in (params, [p.main_grad for p in params], state)
    )


def test_offloaded_state_comes_back_bitwise_for_each_phase_and_leaves_after_it(
    tiny_model, tmp_path
):
    """On the cpu device "host" and "device" are one memory, so what this proves is the
    bookkeeping: the storages are emptied between phases, and every phase finds them as they
    were (the updates, weights and checkpoint equal a backend that never offloads)."""
    plain = make_megatron_backend(megatron_recipe(tiny_model))
    offloaded = make_megatron_backend(megatron_recipe(tiny_model, **OFFLOAD_ALL))
    assert _parked(offloaded) == (0, 0, 0)
    batch = make_batch(8)
    plain_log_probs_ = plain.compute_log_prob(batch)["log_probs"]
    assert torch.equal(offloaded.compute_log_prob(batch)["log_probs"], plain_log_probs_)
    for seed in (1, 2):
        step = make_batch(8, seed=seed)
        assert offloaded.update_policy(step, TokenMeanReinforce()) == plain.update_policy(
            step, TokenMeanReinforce()
        )
        assert _parked(offloaded) == (0, 0, 0)
    # the weights outlive the phase that gathered them (copies, not the parked parameters)
    assert max_weight_difference(full_weights(offloaded), full_weights(plain)) == 0.0
    offloaded.save_checkpoint(tmp_path / "ckpt")
    offloaded.load_checkpoint(tmp_path / "ckpt")  # replaces the optimizer's state: parked too
    assert _parked(offloaded) == (0, 0, 0)
    step = make_batch(8, seed=3)
    assert offloaded.update_policy(step, TokenMeanReinforce()) == plain.update_policy(
        step, TokenMeanReinforce()
    )
    assert max_weight_difference(full_weights(offloaded), full_weights(plain)) == 0.0


def test_the_reference_model_offloads_with_its_own_switch(tiny_model, actor):
    recipe = megatron_recipe(tiny_model, ref_param_offload=True)
    ref = make_megatron_backend(recipe, role="ref")
    assert sum(p.untyped_storage().nbytes() for p in ref._parameters()) == 0
    batch = make_batch(4)
    expected = actor.compute_log_prob(batch)["log_probs"]
    assert torch.equal(ref.compute_log_prob(batch)["log_probs"], expected)
    assert sum(p.untyped_storage().nbytes() for p in ref._parameters()) == 0
    assert ref.offloader.parts == ["params"]
    # the actor's switches are the actor's
    assert make_megatron_backend(recipe).offloader.parts == []


# ------------------------------------------------------------------------ dist checkpoints


def _dist_checkpoint(backend, folder, monkeypatch):
    """The backend's model written by megatron-core's own dist_checkpointing.save."""
    from megatron.core import dist_checkpointing

    folder.mkdir()
    with monkeypatch.context() as patch:
        # megatron's writer waits for device-to-host copies; on the cpu there are none
        patch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
        dist_checkpointing.save(backend.chunks[0].sharded_state_dict(), str(folder))
    return folder


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    from tests.plugins.backends.fsdp2.fsdp2_testing import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("other-qwen2"), seed=1)


def test_initial_weights_come_from_a_dist_checkpointing_folder(
    tiny_model, other_model, tmp_path, monkeypatch
):
    # the folder holds other weights than model.path's: the log-probs say which were loaded
    source = make_megatron_backend(megatron_recipe(other_model))
    folder = _dist_checkpoint(source, tmp_path / "dist", monkeypatch)
    recipe = megatron_recipe(
        tiny_model, use_dist_checkpointing=True, dist_checkpointing_path=str(folder)
    )
    loaded = make_megatron_backend(recipe)
    batch = make_batch(8)
    got = loaded.compute_log_prob(batch)["log_probs"]
    assert torch.equal(got, source.compute_log_prob(batch)["log_probs"])
    expected, _ = plain_log_probs(other_model, batch)
    torch.testing.assert_close(got, expected, atol=LOG_PROB_TOLERANCE, rtol=0)
    assert (got - plain_log_probs(tiny_model, batch)[0]).abs().max() > 1e-2
    # and the dist checkpoint's weights leave in Hugging Face names exactly as the source's
    assert max_weight_difference(full_weights(loaded), full_weights(source)) == 0.0


def test_a_missing_or_corrupt_dist_checkpointing_folder_is_named_with_the_fix(
    actor, tmp_path, monkeypatch, tiny_model
):
    fix = (
        "give a folder written by megatron.core.dist_checkpointing.save from the model's "
        "sharded_state_dict(), or set actor.use_dist_checkpointing false to load model.path"
    )
    missing = tmp_path / "missing"
    recipe = megatron_recipe(
        tiny_model, use_dist_checkpointing=True, dist_checkpointing_path=str(missing)
    )
    with pytest.raises(RecipeError) as error:
        make_megatron_backend(recipe)
    assert str(error.value) == (
        f"actor.dist_checkpointing_path: {str(missing)!r} is not a megatron-core "
        f"dist_checkpointing folder (no readable metadata.json); {fix}"
    )
    corrupt = _dist_checkpoint(actor, tmp_path / "corrupt", monkeypatch)
    for shard in corrupt.glob("*.distcp"):
        shard.write_bytes(b"not a tensor")
    recipe = megatron_recipe(
        tiny_model, use_dist_checkpointing=True, dist_checkpointing_path=str(corrupt)
    )
    with pytest.raises(RecipeError) as error:
        make_megatron_backend(recipe)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"actor.dist_checkpointing_path: {str(corrupt)!r} could not be loaded into the model ("
    )
    assert message.endswith(fix)


@pytest.mark.parametrize("micro_batches", [{"ppo_micro_batch_size_per_gpu": 3}, {}])
def test_sequences_without_advantage_are_left_out_with_the_same_update(tiny_model, micro_batches):
    from plugrl.algorithms.objective import PolicyObjective
    from plugrl.plugin.manager import get_plugin_manager

    batch = make_batch(8, prompt=10, response=7, seed=3)
    batch.pop("old_log_probs")
    advantages = batch["advantages"].clone()
    advantages[[1, 4, 5]] = 0.0
    batch["advantages"] = advantages
    results = []
    for skip in (True, False):
        recipe = megatron_recipe(tiny_model, skip_zero_advantage_rows=skip, **micro_batches)
        backend = make_megatron_backend(recipe)
        objective = PolicyObjective.from_recipe(recipe, get_plugin_manager())
        results.append((backend.update_policy(batch.copy(), objective), full_weights(backend)))
    (skipped, skipped_weights), (full, full_weights_) = results
    assert skipped["actor/skipped_rows"] == pytest.approx(3 / 8)
    for name in ("actor/loss", "actor/pg_loss", "actor/grad_norm"):
        assert skipped[name] == pytest.approx(full[name], rel=1e-5, abs=1e-6), name
    # Adam's first step divides each gradient by its own size (see the test above)
    assert max_weight_difference(skipped_weights, full_weights_) < UPDATE_TOLERANCE


def test_a_raw_pickle_rank_file_is_one_line_without_torchs_advice(actor, tmp_path):
    """A rank file written with pickle, not torch.save: refused naming the file and the fix,
    without quoting torch's advice to load it with weights_only=False (which would run it)."""
    import pickle

    actor.save_checkpoint(tmp_path / "ckpt")
    file = tmp_path / "ckpt" / "megatron_rank_0.pt"
    file.write_bytes(pickle.dumps({"model": [], "optimizer": None, "extra_state": {}}))
    with pytest.raises(CheckpointError) as error:
        actor.load_checkpoint(tmp_path / "ckpt")
    message = str(error.value)
    assert message == (
        f"{file} is missing or corrupt (UnpicklingError: Unsupported operand 149); {FIX}"
    )
    assert "weights_only" not in message and "\n" not in message
