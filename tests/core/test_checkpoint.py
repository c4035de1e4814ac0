import errno
import json
import logging
import os
import shutil
import traceback

import pytest
import torch

from plugrl.errors import CheckpointError
from plugrl.state import rng
from plugrl.state.checkpoint import (
    LATEST_FILE,
    MANIFEST_FILE,
    TRAINER_STATE_FORMAT,
    CheckpointManager,
)
from tests.crafted import SYSTEM, plant_in_torch_file, runs_when_unpickled


def writer(value):
    def write(folder):
        (folder / "actor").mkdir()
        torch.save({"w": torch.full((3,), float(value))}, folder / "actor" / "model.pt")

    return write


def trainer_state(step):
    """What the run loop saves besides the step."""
    return {
        "dataloader": {"epoch": 0, "position": step},
        "weight_version": step,
        "rng": rng.capture(),
        "kl_in_reward": None,
        "validation": [{"val/score": 0.5}],
        "wall_clock_s": 12.5,
        "scheduler": {},
    }


def save(manager, step):
    return manager.save(step, writer(step), trainer_state(step))


def test_save_layout_latest_and_trainer_state(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = save(manager, 2)
    assert path == tmp_path / "global_step_2"
    assert (tmp_path / LATEST_FILE).read_text() == "2\n"
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert set(manifest["files"]) == {"actor/model.pt", "trainer_state.pt"}
    assert manager.resolve("auto") == path
    state = manager.load_trainer_state(path)
    assert state["step"] == 2 and state["dataloader"]["position"] == 2
    assert manager.resolve("disable") is None
    assert manager.resolve(str(path)) == path


def test_no_checkpoint_yet_starts_fresh(tmp_path):
    assert CheckpointManager(tmp_path / "new").resolve("auto") is None


def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)

    def dies(folder):
        (folder / "actor").mkdir()
        (folder / "actor" / "model.pt").write_bytes(b"half")
        raise KeyboardInterrupt  # kill during the write

    with pytest.raises(KeyboardInterrupt):
        manager.save(2, dies, {})
    assert manager.resolve("auto") == tmp_path / "global_step_1"
    assert manager.steps() == [1]
    save(manager, 2)  # the next save clears the leftover
    assert not list(tmp_path.glob(".global_step_*"))


def test_a_resumed_run_removes_what_a_killed_save_half_wrote(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    # what kill -9 during the save of step 2 leaves: no in-process cleanup ran
    (tmp_path / ".global_step_2.tmp" / "actor").mkdir(parents=True)
    (tmp_path / ".global_step_2.tmp" / "actor" / "model.pt").write_bytes(b"half")
    with caplog.at_level(logging.INFO, logger="plugrl.checkpoint"):
        assert CheckpointManager(tmp_path).resolve("auto") == tmp_path / "global_step_1"
    assert not list(tmp_path.glob(".global_step_*"))
    assert ".global_step_2.tmp" in caplog.text and "killed" in caplog.text


def test_saving_the_same_step_again_replaces_it(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 3)
    manager.save(3, writer(30), {})
    assert (
        torch.load(tmp_path / "global_step_3" / "actor" / "model.pt", weights_only=True)["w"][0]
        == 30
    )


def test_max_to_keep_prunes_the_oldest(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (1, 2, 3, 4):
        save(manager, step)
    assert manager.steps() == [3, 4]


def test_corrupt_checkpoints_are_named_with_the_fix(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = save(manager, 5)
    model = path / "actor" / "model.pt"
    model.write_bytes(model.read_bytes()[:10])
    with pytest.raises(
        CheckpointError,
        match=r"global_step_5 is corrupt: actor/model.pt has 10 "
        r"bytes, the manifest says \d+; delete that folder to resume from an "
        r"earlier checkpoint, or set trainer.resume_mode=disable",
    ):
        manager.resolve("auto")
    os.remove(model)
    with pytest.raises(CheckpointError, match=r"actor/model.pt is missing"):
        manager.resolve("auto")
    (path / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"has a corrupt plugrl_checkpoint.json"):
        manager.resolve(str(path))
    os.remove(path / MANIFEST_FILE)
    with pytest.raises(CheckpointError, match=r"is incomplete \(no plugrl_checkpoint.json\)"):
        manager.resolve(str(path))


def test_bad_latest_file_and_resume_path(tmp_path):
    manager = CheckpointManager(tmp_path)
    (tmp_path / LATEST_FILE).write_text("garbage")
    with pytest.raises(CheckpointError, match="should hold a step number, holds 'garbage'"):
        manager.resolve("auto")
    (tmp_path / LATEST_FILE).write_text("9")
    with pytest.raises(CheckpointError, match="global_step_9 does not exist"):
        manager.resolve("auto")
    with pytest.raises(
        CheckpointError,
        match=r"trainer.resume_mode: checkpoint folder "
        r"'.*nowhere' does not exist",
    ):
        manager.resolve(str(tmp_path / "nowhere"))


def test_deleting_a_corrupt_latest_checkpoint_resumes_from_the_one_before(tmp_path):
    manager = CheckpointManager(tmp_path)
    for step in (1, 2, 3):
        save(manager, step)
    model = tmp_path / "global_step_3" / "actor" / "model.pt"
    model.write_bytes(b"cut")
    with pytest.raises(CheckpointError, match="delete that folder to resume from an earlier"):
        manager.resolve("auto")
    shutil.rmtree(tmp_path / "global_step_3")
    assert manager.resolve("auto") == tmp_path / "global_step_2"
    shutil.rmtree(tmp_path / "global_step_2")
    shutil.rmtree(tmp_path / "global_step_1")
    with pytest.raises(
        CheckpointError,
        match=r"latest_checkpointed_iteration.txt names step 3 but global_step_3 does not exist "
        r"and no earlier checkpoint is in .*; set trainer.resume_mode=disable to start fresh",
    ):
        manager.resolve("auto")


def test_unreadable_trainer_state(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = save(manager, 1)
    (path / "trainer_state.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"cannot read trainer_state.pt"):
        manager.load_trainer_state(path)


def _flip_a_byte(file):
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def test_a_file_changed_in_place_is_caught_by_its_checksum(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = save(manager, 4)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert set(manifest["files"]["actor/model.pt"]) == {"size", "crc32"}
    _flip_a_byte(path / "actor" / "model.pt")  # same size, different bytes
    with pytest.raises(
        CheckpointError,
        match=r"global_step_4 is corrupt: actor/model.pt has changed since it was saved \(its "
        r"CRC32 differs from the manifest's\); delete that folder to resume from an earlier",
    ):
        manager.resolve("auto")
    # sizes only, when checksums are off
    assert CheckpointManager(tmp_path, checksums=False).resolve("auto") == path


def test_without_checksums_the_manifest_holds_sizes_and_still_catches_cut_files(tmp_path):
    manager = CheckpointManager(tmp_path, checksums=False)
    path = save(manager, 1)
    entry = json.loads((path / MANIFEST_FILE).read_text())["files"]["actor/model.pt"]
    assert set(entry) == {"size"}
    # a checkpoint saved without checksums resumes with them on: nothing to compare
    assert CheckpointManager(tmp_path).resolve("auto") == path
    model = path / "actor" / "model.pt"
    model.write_bytes(model.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match=r"actor/model\.pt has"):
        CheckpointManager(tmp_path).resolve("auto")


def test_manifests_of_sizes_alone_still_verify(tmp_path):
    path = save(CheckpointManager(tmp_path), 2)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    manifest["files"] = {name: entry["size"] for name, entry in manifest["files"].items()}
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert CheckpointManager(tmp_path).resolve("auto") == path
    (path / "trainer_state.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"trainer_state\.pt has 1 bytes"):
        CheckpointManager(tmp_path).resolve("auto")


def distributed_checkpoint_failure(error):
    """What torch.distributed.checkpoint raises when a rank fails: a CheckpointException (not
    an Exception) whose ``failures`` map each rank to its error and the error's stack."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException("rank failures", {0: (error, traceback.extract_stack())})


def test_a_full_disk_keeps_the_previous_checkpoint_and_removes_the_half_written_one(tmp_path):
    import errno

    manager = CheckpointManager(tmp_path)
    save(manager, 1)

    def fill_the_disk(folder):
        writer(2)(folder)
        full = OSError(errno.ENOSPC, "No space left on device")
        raise distributed_checkpoint_failure(full)

    with pytest.raises(CheckpointError) as info:
        manager.save(2, fill_the_disk, {"dataloader": {}})
    assert str(info.value) == (
        f"no space left on the device while writing checkpoint 2 under {tmp_path}; the "
        "checkpoint of step 1 is kept and the half-written one removed; free space, or keep "
        "fewer checkpoints with trainer.max_ckpt_to_keep"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LATEST_FILE, "global_step_1"])
    assert manager.resolve("auto") == tmp_path / "global_step_1"


def test_an_interrupted_save_leaves_no_half_written_folder(tmp_path):
    manager = CheckpointManager(tmp_path)

    def interrupted(folder):
        writer(1)(folder)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        manager.save(1, interrupted, {"dataloader": {}})
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_a_distributed_save_wraps_is_still_an_interrupt(tmp_path):
    manager = CheckpointManager(tmp_path)

    def interrupted(folder):
        writer(1)(folder)
        raise distributed_checkpoint_failure(KeyboardInterrupt())

    with pytest.raises(KeyboardInterrupt):
        manager.save(1, interrupted, {"dataloader": {}})
    assert list(tmp_path.iterdir()) == []


def test_a_crafted_trainer_state_is_refused_without_running_it(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = save(manager, 1)
    marker = tmp_path / "ran"
    plant_in_torch_file(path / "trainer_state.pt", marker)
    assert runs_when_unpickled(path / "trainer_state.pt", marker)
    quiet = CheckpointManager(tmp_path, checksums=False)
    with pytest.raises(CheckpointError) as info:
        quiet.load_trainer_state(path)
    assert str(info.value) == (
        f"checkpoint file '{path / 'trainer_state.pt'}' holds something other than a "
        f"checkpoint's data (it refers to {SYSTEM}), so the run did not "
        "load it; delete that folder to resume from an earlier checkpoint, or set "
        "trainer.resume_mode=disable"
    )
    assert not marker.exists(), "loading the checkpoint ran its command"


# ------------------------------------------------------------------ trainer state format


def test_the_trainer_state_carries_its_format_and_loads_as_saved(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = save(manager, 3)
    raw = torch.load(path / "trainer_state.pt", weights_only=True)
    assert raw["format"] == TRAINER_STATE_FORMAT == 1
    state = manager.load_trainer_state(path)
    expected = {"step": 3, **trainer_state(3)}
    assert set(state) == set(expected)  # the format number is the manager's, not the run's
    for key in ("step", "dataloader", "weight_version", "validation", "wall_clock_s"):
        assert state[key] == expected[key]
    assert torch.equal(state["rng"]["torch"], expected["rng"]["torch"])


def test_a_trainer_state_written_before_format_numbers_loads(tmp_path):
    manager = CheckpointManager(tmp_path, checksums=False)
    path = save(manager, 2)
    raw = torch.load(path / "trainer_state.pt", weights_only=True)
    del raw["format"]
    torch.save(raw, path / "trainer_state.pt")
    assert manager.load_trainer_state(path)["weight_version"] == 2


def _rewritten(change):
    def rewrite(state):
        change(state)
        return state

    return rewrite


OTHER_VERSIONS = {
    "newer format": (_rewritten(lambda s: s.update(format=2)), "is in format 2"),
    "format not a number": (
        _rewritten(lambda s: s.update(format="1.0")),
        "has format '1.0', not a format number",
    ),
    "format zero": (
        _rewritten(lambda s: s.update(format=0)),
        "has format 0, not a format number",
    ),
    "no step": (_rewritten(lambda s: s.pop("step")), "has no 'step'"),
    "no weight version": (_rewritten(lambda s: s.pop("weight_version")), "has no 'weight_version'"),
    "step as text": (
        _rewritten(lambda s: s.update(step="3")),
        "holds 'step' as a str, not a number",
    ),
    "dataloader as a list": (
        _rewritten(lambda s: s.update(dataloader=[0, 3])),
        "holds 'dataloader' as a list, not a dict",
    ),
    "weight version as a bool": (
        _rewritten(lambda s: s.update(weight_version=True)),
        "holds 'weight_version' as a bool, not a number",
    ),
    "rng as a list": (
        _rewritten(lambda s: s.update(rng=[1, 2])),
        "holds 'rng' as a list, not a dict",
    ),
    "rng without numpy": (
        _rewritten(lambda s: s["rng"].pop("numpy")),
        "holds an 'rng' that has no 'numpy'",
    ),
    "rng of floats": (
        _rewritten(lambda s: s["rng"].update(torch=torch.zeros(3))),
        "holds an 'rng' that has a 'torch' that is not a byte tensor",
    ),
    "rng python state cut": (
        _rewritten(lambda s: s["rng"].update(python=[3])),
        "holds an 'rng' that has a 'python' that is not [version, internal state, gauss]",
    ),
    "rng numpy state as a tuple": (
        _rewritten(lambda s: s["rng"].update(numpy=("MT19937", [1, 2]))),
        "holds an 'rng' that has a 'numpy' that is not a dict",
    ),
    "rng numpy state without keys": (
        _rewritten(lambda s: s["rng"]["numpy"].pop("keys")),
        "holds an 'rng' that has a 'numpy' without 'keys'",
    ),
    "rng numpy keys as a list": (
        _rewritten(lambda s: s["rng"]["numpy"].update(keys=[1, 2])),
        "holds an 'rng' that has a 'numpy' whose 'keys' is not a tensor",
    ),
    "rng device state as a list": (
        _rewritten(lambda s: s["rng"].update(device=[0])),
        "holds an 'rng' that has a 'device' that is not a dict",
    ),
    "a list, not a state": (lambda state: [state], "holds a list, not a dict"),
}


@pytest.mark.parametrize("rewrite, problem", OTHER_VERSIONS.values(), ids=OTHER_VERSIONS)
def test_a_trainer_state_of_another_version_is_named_with_the_fix(tmp_path, rewrite, problem):
    manager = CheckpointManager(tmp_path, checksums=False)
    path = save(manager, 3)
    file = path / "trainer_state.pt"
    torch.save(rewrite(torch.load(file, weights_only=True)), file)
    with pytest.raises(CheckpointError) as info:
        manager.load_trainer_state(path)
    assert str(info.value) == (
        f"checkpoint {path}: trainer_state.pt {problem}, so another plugrl version wrote it "
        "(this one reads trainer state format 1); resume with the plugrl version that wrote "
        "it, or start fresh with trainer.resume_mode=disable or another "
        "trainer.default_local_dir"
    )


def test_a_trainer_state_its_resume_would_refuse_is_not_saved(tmp_path):
    import datetime

    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    state = trainer_state(2) | {"scheduler": {"started": datetime.date(2025, 1, 1)}}
    with pytest.raises(CheckpointError) as info:
        manager.save(2, writer(2), state)
    assert str(info.value) == (
        "the trainer state of checkpoint 2 holds datetime.date, which a resume would refuse to "
        "load: keep it to tensors, numbers, strings, lists, tuples and dicts (a scheduler's "
        "saved state included)"
    )
    assert manager.steps() == [1] and not list(tmp_path.glob(".global_step_*"))


def test_a_run_s_own_format_key_does_not_replace_the_format_number(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = manager.save(1, writer(1), trainer_state(1) | {"format": 99})
    assert torch.load(path / "trainer_state.pt", weights_only=True)["format"] == 1
    assert "format" not in manager.load_trainer_state(path)


def test_the_rng_state_a_capture_gives_passes_its_check_and_restores():
    state = rng.capture()
    assert rng.state_problem(state) is None
    first = torch.rand(2)
    rng.restore(state)
    assert torch.equal(torch.rand(2), first)


# ------------------------------------------------------------------------- full disk


def _disk_with(free):
    real = shutil.disk_usage

    def disk_usage(path):
        return real(path)._replace(free=free)

    return disk_usage


def _size_of(folder):
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_save_is_refused_when_less_is_free_than_the_last_checkpoint_took(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", _disk_with(0))
    first = save(manager, 1)  # no checkpoint yet: nothing to measure against
    taken = _size_of(first)
    monkeypatch.setattr(shutil, "disk_usage", _disk_with(taken - 1))
    called = []
    with pytest.raises(CheckpointError) as info:
        manager.save(2, lambda folder: called.append(folder), trainer_state(2))
    assert str(info.value) == (
        f"only {taken - 1} B free under {tmp_path}, and the last checkpoint (step 1) took "
        f"{taken} B: checkpoint 2 was not written, that of step 1 is kept; free space, or keep "
        "fewer checkpoints with trainer.max_ckpt_to_keep"
    )
    assert called == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LATEST_FILE, "global_step_1"])
    assert manager.resolve("auto") == first
    monkeypatch.setattr(shutil, "disk_usage", _disk_with(taken))
    assert save(manager, 2) == tmp_path / "global_step_2"


def test_the_free_space_is_told_in_units_people_read(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    big = tmp_path / "global_step_1" / "actor" / "shard.bin"
    with big.open("wb") as file:
        file.truncate(3 * (1 << 30) // 2)  # 1.5 GiB that take no room (a sparse file)
    monkeypatch.setattr(shutil, "disk_usage", _disk_with(200 * (1 << 20)))
    with pytest.raises(
        CheckpointError,
        match=r"^only 200\.0 MiB free under .*, and the last "
        r"checkpoint \(step 1\) took 1\.5 GiB: checkpoint 2 was not written",
    ):
        save(manager, 2)


def test_without_a_free_space_figure_the_save_goes_on(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)

    def unavailable(path):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(shutil, "disk_usage", unavailable)
    assert save(manager, 2) == tmp_path / "global_step_2"


TORCH_WRITE_FAILURES = {
    "unexpected pos": (
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
        "unexpected pos 704 vs 598",
    ),
    "stream writer": (
        RuntimeError(
            "[enforce fail at inline_container.cc:859] . PytorchStreamWriter failed writing "
            "file data/3: file write failed"
        ),
        "PytorchStreamWriter failed writing file data/3: file write failed",
    ),
    "iostream": (
        RuntimeError("basic_ios::clear: iostream error"),
        "basic_ios::clear: iostream error",
    ),
}


@pytest.mark.parametrize("error, words", TORCH_WRITE_FAILURES.values(), ids=TORCH_WRITE_FAILURES)
@pytest.mark.parametrize("wrapped", [False, True], ids=["raised", "rank failure"])
def test_torch_write_failures_read_as_a_full_disk(tmp_path, error, words, wrapped):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)

    def fails(folder):
        writer(2)(folder)
        raise distributed_checkpoint_failure(error) if wrapped else error

    with pytest.raises(CheckpointError) as info:
        manager.save(2, fails, trainer_state(2))
    assert str(info.value) == (
        f"writing checkpoint 2 under {tmp_path} failed as it does on a full device (torch: "
        f"{words}); the checkpoint of step 1 is kept and the half-written one removed; free "
        "space, or keep fewer checkpoints with trainer.max_ckpt_to_keep"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LATEST_FILE, "global_step_1"])
    assert manager.resolve("auto") == tmp_path / "global_step_1"


@pytest.mark.parametrize(
    "message",
    [
        "worker 1 failed: OSError: [Errno 28] No space left on device",
        "rank 0: write failed (ENOSPC)",
    ],
)
def test_a_full_disk_told_as_text_reads_as_one(tmp_path, message):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)

    def fails(folder):
        raise RuntimeError(message)

    with pytest.raises(CheckpointError, match=r"^no space left on the device while writing "):
        manager.save(2, fails, trainer_state(2))
    assert manager.resolve("auto") == tmp_path / "global_step_1"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_torch_writing_to_a_full_device_for_real(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)

    def fills_the_device(folder):
        (folder / "actor").mkdir()
        # every write to /dev/full fails with ENOSPC, which torch's C++ writer does not pass on
        (folder / "actor" / "model.pt").symlink_to("/dev/full")
        torch.save({"w": torch.zeros(100_000)}, folder / "actor" / "model.pt")

    with pytest.raises(CheckpointError) as info:
        manager.save(2, fills_the_device, trainer_state(2))
    assert str(info.value).startswith(
        f"writing checkpoint 2 under {tmp_path} failed as it does on a full device (torch: "
    )
    assert str(info.value).endswith(
        "the checkpoint of step 1 is kept and the half-written one removed; free space, or "
        "keep fewer checkpoints with trainer.max_ckpt_to_keep"
    )
    assert manager.resolve("auto") == tmp_path / "global_step_1"
    assert not list(tmp_path.glob(".global_step_*"))
