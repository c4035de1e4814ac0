"""The start-up check that every node of a Ray cluster sees the run's files: what one node
checks, and how the driver reads the nodes' answers (with a stand-in for Ray; the check on a
real cluster of two nodes is in tests/e2e/test_multinode.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugrl.cluster.nodes import (
    MARKER_PREFIX,
    Marker,
    PathCheck,
    Problem,
    check_nodes,
    check_paths,
    checks_of,
    gather_answers,
    raise_for_problems,
    run_folder_marker,
)
from plugrl.errors import PluginError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import apply_overrides, build_recipe


def test_a_node_reports_what_it_cannot_use(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "data.parquet").write_bytes(b"")
    checks = [
        PathCheck("model.path", "model", str(model)),
        PathCheck("critic.model_path", "model", str(tmp_path / "data.parquet")),
        PathCheck("data.train_files", "input", str(tmp_path / "data.parquet")),
        PathCheck("data.val_files", "input", str(tmp_path / "val.parquet")),
    ]
    assert check_paths(checks, None) == [
        Problem("model.path", str(model), "holds no config.json"),
        Problem("critic.model_path", str(tmp_path / "data.parquet"), "is not a folder"),
        Problem("data.val_files", str(tmp_path / "val.parquet"), "does not exist"),
    ]
    (model / "config.json").write_text("{}")
    assert check_paths(checks[:1], None) == []


def test_the_run_folder_is_the_one_holding_the_drivers_file(tmp_path):
    with run_folder_marker(tmp_path) as marker:
        assert Path(marker.path).parent == tmp_path
        assert Path(marker.path).name.startswith(MARKER_PREFIX)
        assert check_paths([], marker) == []
        assert check_paths([], Marker(marker.path, "another run's")) == [
            Problem(
                "trainer.default_local_dir",
                str(tmp_path),
                "is not the run folder the driver made (a file the driver wrote there is missing)",
            )
        ]
    assert list(tmp_path.iterdir()) == []


def test_the_nodes_check_the_paths_the_model_and_the_inputs_not_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = build_recipe(
        apply_overrides(
            {},
            [
                "model.path=m",
                "data.train_files=[a.parquet, hdfs://c/b.parquet]",
                "trainer.rollout_data_dir=dumps",
                "reward.custom_function.path=f.py",
            ],
        ),
        get_plugin_manager(),
    )
    assert checks_of(recipe, get_plugin_manager()) == [
        PathCheck("model.path", "model", str(tmp_path / "m")),
        PathCheck("data.train_files", "input", str(tmp_path / "a.parquet")),
        PathCheck("reward.custom_function.path", "input", str(tmp_path / "f.py")),
    ]


class FakeRay:
    """What :mod:`plugrl.cluster.nodes` calls of Ray, answering from ``answers``: a list of
    problems, an exception raised by ``get``, or ``None`` for a node that never answers."""

    def __init__(self, nodes, answers=None):
        self._nodes = nodes
        self.answers = answers or {}
        self.cancelled = []

    def nodes(self):
        return self._nodes

    def get_runtime_context(self):
        class Context:
            def get_node_id(self):
                return "driver-node"

        return Context()

    def wait(self, refs, num_returns, timeout):
        ready = [ref for ref in refs if self.answers[ref] is not None]
        return ready, [ref for ref in refs if ref not in ready]

    def get(self, ref):
        answer = self.answers[ref]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def cancel(self, ref, force):
        self.cancelled.append(ref)


NODE = ("0123456789abcdef0123", "10.0.0.7")


def test_a_node_that_does_not_answer_is_named():
    ray = FakeRay([], {"ref-a": [], "ref-b": None})
    with pytest.raises(PluginError) as error:
        gather_answers(ray, {"ref-a": ("aaaa", "10.0.0.6"), "ref-b": NODE}, timeout_s=5)
    assert str(error.value) == (
        "Ray node 10.0.0.7 (id 0123456789ab) did not answer the start-up check of the run's "
        "paths within 5 s; check that it is healthy (ray status) or take it out of the cluster"
    )
    assert ray.cancelled == ["ref-b"]


def test_a_node_whose_check_fails_is_named():
    ray = FakeRay(
        [], {"ref": RuntimeError("Traceback...\nModuleNotFoundError: No module named 'plugrl'")}
    )
    with pytest.raises(PluginError) as error:
        gather_answers(ray, {"ref": NODE}, timeout_s=5)
    assert str(error.value) == (
        "Ray node 10.0.0.7 (id 0123456789ab) could not run the start-up check of the run's "
        "paths (ModuleNotFoundError: No module named 'plugrl'); check that plugrl is installed "
        "there as on the driver's node"
    )


def test_answers_without_problems_pass():
    raise_for_problems([(NODE, []), (("b", "10.0.0.8"), [])])


def test_one_problem_on_one_node_is_named_alone():
    from plugrl.errors import RecipeError

    with pytest.raises(RecipeError) as error:
        raise_for_problems(
            [(("b", "10.0.0.8"), []), (NODE, [Problem("data.val_files", "/d/v", "does not exist")])]
        )
    assert str(error.value) == (
        "data.val_files: /d/v does not exist on Ray node 10.0.0.7 (id 0123456789ab), though "
        "the driver sees it; every node must see the run's files at the same paths: put them "
        "on storage that every node mounts at the same path, or copy them to that path on "
        "each node"
    )


def test_a_cluster_of_the_drivers_node_alone_asks_no_one(tmp_path):
    ray = FakeRay([{"NodeID": "driver-node", "Alive": True}, {"NodeID": "gone", "Alive": False}])
    recipe = build_recipe({}, get_plugin_manager())
    assert check_nodes(recipe, get_plugin_manager(), tmp_path, ray) == 0
    assert list(tmp_path.iterdir()) == []
