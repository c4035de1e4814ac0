"""plugrl.testing.build_once: a test asset built once per folder and arguments, whichever
caller, thread or process asks first."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from plugrl.testing import build_once

BUILDS: list[tuple[Path, str]] = []


def write_words(folder: Path, word: str, *, times: int = 1, slow_s: float = 0.0) -> Path:
    BUILDS.append((folder, word))
    folder.mkdir()
    time.sleep(slow_s)
    (folder / "words.txt").write_text(" ".join([word] * times))
    return folder / "words.txt"


def fail_half_way(folder: Path, marker: Path) -> Path:
    folder.mkdir()
    (folder / "half.txt").write_text("half")
    if not marker.exists():
        marker.write_text("failed once")
        raise RuntimeError("the build failed")
    (folder / "whole.txt").write_text("whole")
    return folder


@pytest.fixture(autouse=True)
def no_builds():
    BUILDS.clear()
    yield
    BUILDS.clear()


def test_the_same_builder_and_arguments_build_once(tmp_path):
    first = build_once(tmp_path, write_words, "ab", times=2)
    again = build_once(tmp_path, write_words, "ab", times=2)
    assert again == first and first.read_text() == "ab ab"
    assert len(BUILDS) == 1

    other = build_once(tmp_path, write_words, "ab", times=3)
    assert other.parent != first.parent and other.read_text() == "ab ab ab"
    assert first.read_text() == "ab ab"
    assert len(BUILDS) == 2


def test_callers_at_the_same_time_wait_for_the_one_build(tmp_path):
    results = []

    def ask():
        results.append(build_once(tmp_path, write_words, "cd", slow_s=0.3))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(BUILDS) == 1
    assert len(set(results)) == 1 and results[0].read_text() == "cd"


def test_a_failed_build_leaves_nothing_and_the_next_call_builds_again(tmp_path):
    marker = tmp_path / "marker"
    with pytest.raises(RuntimeError, match="the build failed"):
        build_once(tmp_path / "root", fail_half_way, marker)
    folder = build_once(tmp_path / "root", fail_half_way, marker)
    assert sorted(path.name for path in folder.iterdir()) == ["half.txt", "whole.txt"]


def test_the_session_fixture_shares_its_folder_between_fixtures(plugrl_build_once):
    first = plugrl_build_once(write_words, "shared")
    assert plugrl_build_once(write_words, "shared") == first
    assert first.read_text() == "shared"
