"""Checkpoints: what save writes, load restores exactly, and what a broken or crafted one
says."""

import contextlib

import pytest
import torch
import torch.distributed.checkpoint as dcp

from plugrl.errors import CheckpointError
from plugrl_fsdp2.checkpoint import PlainDataLoadPlanner, PlainDataReader, _sharded_state
from tests.crafted import (
    SYSTEM,
    plant_in_dcp_bytes,
    plant_in_dcp_metadata,
    plant_in_torch_file,
    runs_when_unpickled,
)
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    TokenMeanReinforce,
    full_weights,
    make_backend,
    make_batch,
    make_recipe,
    max_weight_difference,
)

FIX = "resume from an earlier global_step_N folder or start fresh with trainer.resume_mode=disable"


def _recipe(tiny_model):
    # shuffling and warm-up make the next step depend on the restored RNG and LR schedule
    return make_recipe(
        tiny_model, shuffle=True, ppo_mini_batch_size=4, optim={"lr_warmup_steps": 3}
    )


@pytest.fixture(scope="module")
def saved(tiny_model, tmp_path_factory):
    """A checkpoint after one update, and what the next update gives without a restart."""
    path = tmp_path_factory.mktemp("ckpt") / "actor"
    backend = make_backend(_recipe(tiny_model))
    backend.update_policy(make_batch(8, seed=1), TokenMeanReinforce())
    backend.save_checkpoint(path)
    metrics = backend.update_policy(make_batch(8, seed=2), TokenMeanReinforce())
    return path, full_weights(backend), metrics


def test_save_writes_shards_and_per_rank_state(saved):
    path, _, _ = saved
    names = {p.name for p in path.iterdir()}
    assert {".metadata", "__0_0.distcp", "extra_state_rank_0.pt", "fsdp2.json"} <= names


def test_load_then_step_equals_the_uninterrupted_step(tiny_model, saved):
    path, expected_weights, expected_metrics = saved
    resumed = make_backend(_recipe(tiny_model))
    resumed.load_checkpoint(path)
    assert resumed.update_steps == 1
    metrics = resumed.update_policy(make_batch(8, seed=2), TokenMeanReinforce())
    assert metrics == expected_metrics
    assert max_weight_difference(full_weights(resumed), expected_weights) == 0.0


def _per_tensor_loop(backend) -> None:
    """Make ``backend``'s AdamW run torch's Python loop over its DTensor parameters, the
    path it took before it ran the fused kernel."""
    for group in backend.optimizer.param_groups:
        group["fused"], group["foreach"] = False, False


def test_the_fused_adamw_steps_as_the_per_tensor_loop_and_resumes_from_its_checkpoint(
    tiny_model, saved, tmp_path
):
    _, fused_weights, fused_metrics = saved
    loop = make_backend(_recipe(tiny_model))
    _per_tensor_loop(loop)
    loop.update_policy(make_batch(8, seed=1), TokenMeanReinforce())
    loop.save_checkpoint(tmp_path / "actor")
    loop_metrics = loop.update_policy(make_batch(8, seed=2), TokenMeanReinforce())
    loop_weights = full_weights(loop)
    assert max_weight_difference(loop_weights, fused_weights) < 1e-6
    assert loop_metrics == pytest.approx(fused_metrics, rel=1e-5, abs=1e-6)

    resumed = make_backend(_recipe(tiny_model))
    resumed.load_checkpoint(tmp_path / "actor")
    group = resumed.optimizer.param_groups[0]
    assert (group["fused"], group["foreach"]) == (True, False)
    resumed.update_policy(make_batch(8, seed=2), TokenMeanReinforce())
    assert max_weight_difference(full_weights(resumed), loop_weights) < 1e-6


def test_the_reference_model_saves_and_loads_weights_only(tiny_model, tmp_path):
    ref = make_backend(make_recipe(tiny_model), role="ref")
    ref.save_checkpoint(tmp_path / "ref")
    other = make_backend(make_recipe(tiny_model), role="ref")
    other.load_checkpoint(tmp_path / "ref")
    actor = make_backend(make_recipe(tiny_model))
    with pytest.raises(CheckpointError) as info:
        actor.load_checkpoint(tmp_path / "ref")
    assert str(info.value) == (
        f"checkpoint {str(tmp_path / 'ref')!r} holds no optimizer state (it was saved by a "
        f"frozen reference model); {FIX}"
    )


def _copy(saved, tmp_path):
    import shutil

    path = tmp_path / "actor"
    shutil.copytree(saved[0], path)
    return path


def _load_error(tiny_model, path) -> str:
    backend = make_backend(_recipe(tiny_model))
    with pytest.raises(CheckpointError) as info:
        backend.load_checkpoint(path)
    return str(info.value)


def test_missing_folder(tiny_model, tmp_path):
    path = tmp_path / "global_step_9" / "actor"
    assert _load_error(tiny_model, path) == f"checkpoint folder {str(path)!r} does not exist; {FIX}"


def test_missing_metadata(tiny_model, saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / ".metadata").unlink()
    assert _load_error(tiny_model, path) == (
        f"checkpoint file {str(path / '.metadata')!r} is missing, so {str(path)!r} is incomplete "
        f"(the run probably stopped while saving); {FIX}"
    )


def test_corrupt_metadata(tiny_model, saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / ".metadata").write_bytes(b"not a pickle")
    message = _load_error(tiny_model, path)
    assert message.startswith(f"checkpoint file {str(path / '.metadata')!r} is corrupt (")
    assert message.endswith(FIX)


def test_truncated_shard(tiny_model, saved, tmp_path):
    path = _copy(saved, tmp_path)
    shard = path / "__0_0.distcp"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size // 2])
    assert _load_error(tiny_model, path) == (
        f"checkpoint file {str(shard)!r} is truncated ({size // 2} of {size} bytes); {FIX}"
    )


def test_missing_rank_state_says_how_many_ranks_wrote_it(tiny_model, saved, tmp_path):
    path = _copy(saved, tmp_path)
    extra = path / "extra_state_rank_0.pt"
    extra.unlink()
    assert _load_error(tiny_model, path) == (
        f"checkpoint file {str(extra)!r} is missing (the checkpoint was written by 1 ranks); {FIX}"
    )


def test_corrupt_rank_state(tiny_model, saved, tmp_path):
    path = _copy(saved, tmp_path)
    extra = path / "extra_state_rank_0.pt"
    extra.write_bytes(b"garbage")
    message = _load_error(tiny_model, path)
    assert message.startswith(f"checkpoint file {str(extra)!r} is corrupt (")
    assert message.endswith(FIX)


def test_a_checkpoint_of_another_model_is_refused(tiny_model, saved, tmp_path):
    from tests.plugins.backends.fsdp2.fsdp2_testing import save_tiny_qwen2

    other_model = save_tiny_qwen2(tmp_path / "other")
    import json

    config = json.loads((other_model / "config.json").read_text())
    config["intermediate_size"] = 96
    (other_model / "config.json").write_text(json.dumps(config))
    import transformers

    transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(other_model)
    ).save_pretrained(other_model)
    backend = make_backend(_recipe(other_model))
    with pytest.raises(CheckpointError) as info:
        backend.load_checkpoint(saved[0])
    assert str(info.value) == (
        f"checkpoint {str(saved[0])!r} could not be read into this model (ValueError: Size "
        "mismatch between saved torch.Size([128, 64]) and current: torch.Size([96, 64]) for "
        f"model.model.layers.0.mlp.gate_proj.weight); is it from a different model? {FIX}"
    )


# ------------------------------------------------------------------ crafted checkpoints


def _refused(file, reason=f"it refers to {SYSTEM}"):
    return (
        f"checkpoint file {str(file)!r} holds something other than a checkpoint's data "
        f"({reason}), so the run did not load it; {FIX}"
    )


def test_a_crafted_metadata_file_is_refused_without_running_it(tiny_model, saved, tmp_path):
    path = _copy(saved, tmp_path)
    marker = tmp_path / "ran"
    file = plant_in_dcp_metadata(path, marker)
    # torch's own reader runs it
    dcp.FileSystemReader(path).read_metadata()
    assert marker.exists()
    marker.unlink()
    assert _load_error(tiny_model, path) == _refused(file)
    assert not marker.exists(), "loading the checkpoint ran its command"


def test_a_crafted_entry_in_a_data_file_is_refused_without_running_it(tiny_model, saved, tmp_path):
    path = _copy(saved, tmp_path)
    marker = tmp_path / "ran"
    file = plant_in_dcp_bytes(path, marker)
    assert file.name == "__0_0.distcp"
    # torch's own planner runs it: an optimizer's hyper-parameters are pickles
    backend = make_backend(_recipe(tiny_model))
    with contextlib.suppress(Exception):
        dcp.load(_sharded_state(backend.model, backend.optimizer), checkpoint_id=path)
    assert marker.exists()
    marker.unlink()
    assert _load_error(tiny_model, path) == _refused(file)
    assert not marker.exists(), "loading the checkpoint ran its command"


def test_a_crafted_rank_state_is_refused_without_running_it(tiny_model, saved, tmp_path):
    path = _copy(saved, tmp_path)
    marker = tmp_path / "ran"
    extra = path / "extra_state_rank_0.pt"
    plant_in_torch_file(extra, marker)
    assert runs_when_unpickled(extra, marker)
    assert _load_error(tiny_model, path) == _refused(extra)
    assert not marker.exists(), "loading the checkpoint ran its command"


def test_metadata_of_something_else_is_refused(tiny_model, saved, tmp_path):
    import pickle

    path = _copy(saved, tmp_path)
    (path / ".metadata").write_bytes(pickle.dumps({"not": "metadata"}))
    assert _load_error(tiny_model, path) == (
        f"checkpoint file {str(path / '.metadata')!r} holds a dict, not a checkpoint's metadata; "
        f"{FIX}"
    )


def test_the_plain_data_reader_and_planner_read_back_what_torch_writes(tmp_path):
    """Sizes, dtypes, layouts and plain values round-trip (two ranks' shards: see
    test_fsdp2_ray.py)."""
    state = {"weights": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4), "lr": 0.5}
    dcp.save(state, checkpoint_id=tmp_path)
    metadata = PlainDataReader(tmp_path).read_metadata()
    assert metadata.state_dict_metadata["weights"].size == torch.Size([3, 4])
    assert metadata.state_dict_metadata["weights"].properties.dtype == torch.bfloat16
    loaded = {"weights": torch.zeros(3, 4, dtype=torch.bfloat16), "lr": 0.0}
    dcp.load(
        loaded,
        checkpoint_id=tmp_path,
        storage_reader=PlainDataReader(tmp_path),
        planner=PlainDataLoadPlanner(tmp_path),
    )
    assert torch.equal(loaded["weights"], state["weights"]) and loaded["lr"] == 0.5


@pytest.mark.parametrize("kind", ["raw pickle", "cut zip"])
def test_a_raw_pickle_entry_in_a_data_file_is_refused_in_one_line(
    tiny_model, saved, tmp_path, kind
):
    """A non-tensor entry of a .distcp file that is a raw pickle, not a torch.save file: the
    refusal names the file and the entry, without torch's advice to load it unsafely and
    without guessing at a different model (the fourth drill, on a LoRA checkpoint)."""
    import pickle

    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from tests.crafted import RunsACommand

    path = _copy(saved, tmp_path)
    marker = tmp_path / "ran"
    metadata_file = path / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())  # the test's own checkpoint: trusted
    fqn = next(
        key
        for key, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, BytesStorageMetadata)
    )
    index = next(index for index in metadata.storage_data if index.fqn == fqn)
    info = metadata.storage_data[index]
    data_file = path / info.relative_path
    payload = pickle.dumps(RunsACommand(marker)) if kind == "raw pickle" else b"PK\x03\x04cut"
    offset = data_file.stat().st_size
    with data_file.open("ab") as stream:
        stream.write(payload)
    info.offset, info.length = offset, len(payload)
    metadata_file.write_bytes(pickle.dumps(metadata))

    message = _load_error(tiny_model, path)
    assert message.startswith(
        f"checkpoint file {str(data_file)!r} holds something other than a checkpoint's data "
        f"(its entry {fqn!r} is not a file torch.save wrote: "
    )
    assert message.endswith(f"), so the run did not load it; {FIX}")
    assert "different model" not in message and "weights_only" not in message
    assert "\n" not in message
    assert not marker.exists(), "loading the checkpoint ran its command"
