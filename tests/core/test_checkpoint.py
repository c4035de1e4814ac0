import json
import os
import shutil
import traceback

import pytest
import torch

from plugrl import rng
from plugrl.checkpoint import LATEST_FILE, MANIFEST_FILE, CheckpointManager
from plugrl.errors import CheckpointError


def writer(value):
    def write(folder):
        (folder / "actor").mkdir()
        torch.save({"w": torch.full((3,), float(value))}, folder / "actor" / "model.pt")

    return write


def save(manager, step):
    return manager.save(
        step,
        writer(step),
        {"dataloader": {"epoch": 0, "position": step}, "rng": rng.capture()},
    )


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


def test_saving_the_same_step_again_replaces_it(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 3)
    manager.save(3, writer(30), {})
    assert torch.load(tmp_path / "global_step_3" / "actor" / "model.pt")["w"][0] == 30


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


class RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_trainer_state_is_refused_without_running_it(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = save(manager, 1)
    marker = tmp_path / "ran"
    torch.save({"step": 1, "payload": RunsACommand(marker)}, path / "trainer_state.pt")
    quiet = CheckpointManager(tmp_path, checksums=False)
    with pytest.raises(CheckpointError) as info:
        quiet.load_trainer_state(path)
    assert str(info.value).startswith(
        f"checkpoint {path}: cannot read trainer_state.pt as plain data (UnpicklingError: "
    )
    assert "\n" not in str(info.value)
    assert not marker.exists(), "loading the checkpoint ran its command"
