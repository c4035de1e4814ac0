"""The start-up check of a run on a Ray cluster of several machines: every node sees the files
the recipe names, at the paths the driver resolved, and the run folder the driver made.

Ranks and engines land on any node of the cluster; each reads the model there and writes its
share of a checkpoint into the run folder there. A node that sees another model, or none, or a
run folder of its own, fails much later (a worker that cannot load, a checkpoint split over
machines that no resume can read). So before any worker starts, one small Ray task per other
node (:func:`check_paths`, pinned to it) looks at every path option of the recipe
(:func:`plugrl.recipe.path_options`) and for a file the driver wrote into the run folder;
the first node that does not see them stops the run with one line naming the node, the key,
the path and the fix. The driver's own node is not asked: the driver checks these paths as it
reads them. A cluster of one node, the driver's (a local Ray), costs nothing.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.errors import PluginError, RecipeError
from plugrl.recipe import path_options

if TYPE_CHECKING:
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

NODE_CHECK_TIMEOUT_S = 120.0
"""How long the nodes have to answer, together (a node starts a Python worker for it)."""

MARKER_PREFIX = ".plugrl-node-check-"
"""The file the driver writes into the run folder for the nodes to find (removed after)."""

SHARED_FIX = (
    "every node must see the run's files at the same paths: put them on storage that every "
    "node mounts at the same path, or copy them to that path on each node"
)


@attrs.frozen
class PathCheck:
    """One path a node must see: the recipe key that names it, what it is
    (:data:`~plugrl.config.PATH_KINDS`) and the absolute path."""

    key: str
    kind: str
    path: str


@attrs.frozen
class Problem:
    """A path a node cannot use, and why, in a few words (``holds no config.json``)."""

    key: str
    path: str
    reason: str


@attrs.frozen
class Marker:
    """The file the driver wrote into the run folder, and what it holds."""

    path: str
    token: str


def _problem_with(check: PathCheck) -> str | None:
    path = Path(check.path)
    if check.kind == "model":
        if not path.is_dir():
            return "is not a folder"
        if not (path / "config.json").is_file():
            return "holds no config.json"
        if not os.access(path, os.R_OK | os.X_OK):
            return "is not readable"
        return None
    if not path.exists():
        return "does not exist"
    if not os.access(path, os.R_OK):
        return "is not readable"
    return None


def check_paths(checks: Sequence[PathCheck], marker: Marker | None) -> list[Problem]:
    """What this machine cannot use of ``checks`` (a model folder without ``config.json``, a
    file that is missing or unreadable), and the run folder when ``marker`` is not the file
    the driver wrote there. Runs on each node as a Ray task, and in the driver first."""
    problems = []
    for check in checks:
        reason = _problem_with(check)
        if reason is not None:
            problems.append(Problem(check.key, check.path, reason))
    if marker is not None:
        try:
            seen = Path(marker.path).read_text(encoding="utf-8")
        except OSError:
            seen = None
        if seen != marker.token:
            problems.append(
                Problem(
                    "trainer.default_local_dir",
                    str(Path(marker.path).parent),
                    "is not the run folder the driver made (a file the driver wrote there is "
                    "missing)",
                )
            )
    return problems


def checks_of(recipe: Recipe, plugins: PluginManager | None = None) -> list[PathCheck]:
    """What every node must see: each path of the recipe's ``model`` and ``input`` path
    options. Folders the run writes are the driver's (samples dumps) or the run folder, which
    the nodes find by the driver's marker instead."""
    return [
        PathCheck(option.key, option.kind, path)
        for option in path_options(recipe, plugins)
        if option.kind in ("model", "input")
        for path in option.paths
    ]


@contextlib.contextmanager
def run_folder_marker(run_dir: Path) -> Iterator[Marker]:
    """A file with a token of its own in ``run_dir``, for the nodes to read; removed after."""
    token = uuid.uuid4().hex
    path = run_dir / f"{MARKER_PREFIX}{token[:12]}"
    path.write_text(token, encoding="utf-8")
    try:
        yield Marker(str(path), token)
    finally:
        path.unlink(missing_ok=True)


def other_nodes(ray: Any) -> list[tuple[str, str]]:
    """``(node id, address)`` of every live node of the cluster but the driver's."""
    here = ray.get_runtime_context().get_node_id()
    return [
        (node["NodeID"], node.get("NodeManagerAddress", "?"))
        for node in ray.nodes()
        if node.get("Alive") and node["NodeID"] != here
    ]


def describe_node(node_id: str, address: str) -> str:
    return f"Ray node {address} (id {node_id[:12]})"


def check_nodes(
    recipe: Recipe,
    plugins: PluginManager | None,
    run_dir: Path,
    ray: Any,
    timeout_s: float = NODE_CHECK_TIMEOUT_S,
) -> int:
    """Check that every node of the Ray cluster but the driver's sees the recipe's paths and
    the run folder ``run_dir`` (see the module's doc); returns how many nodes were asked.
    Paths the driver itself cannot use are left to the checks that report them as the run
    reads them."""
    nodes = other_nodes(ray)
    if not nodes:
        return 0
    checks = checks_of(recipe, plugins)
    failing_here = {(p.key, p.path) for p in check_paths(checks, None)}
    checks = [c for c in checks if (c.key, c.path) not in failing_here]
    with run_folder_marker(run_dir) as marker:
        answers = ask_nodes(ray, nodes, checks, marker, timeout_s)
    raise_for_problems(answers)
    return len(nodes)


def ask_nodes(
    ray: Any,
    nodes: Sequence[tuple[str, str]],
    checks: Sequence[PathCheck],
    marker: Marker | None,
    timeout_s: float = NODE_CHECK_TIMEOUT_S,
) -> list[tuple[tuple[str, str], list[Problem]]]:
    """Run :func:`check_paths` on each of ``nodes`` (``(node id, address)``), pinned there;
    each node's problems, in order."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # no CPU: the check must run even where the run's workers already hold every CPU
    task = ray.remote(num_cpus=0)(check_paths)
    refs = {
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote(list(checks), marker): (node_id, address)
        for node_id, address in nodes
    }
    return gather_answers(ray, refs, timeout_s)


def gather_answers(
    ray: Any, refs: dict[Any, tuple[str, str]], timeout_s: float
) -> list[tuple[tuple[str, str], list[Problem]]]:
    """Each node's problems, in the order of ``refs``; a node that does not answer within
    ``timeout_s``, or whose check fails, stops the run with a line naming it."""
    _, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    if pending:
        node = describe_node(*refs[pending[0]])
        for ref in pending:
            ray.cancel(ref, force=True)
        raise PluginError(
            f"{node} did not answer the start-up check of the run's paths within "
            f"{timeout_s:.0f} s; check that it is healthy (ray status) or take it out of the "
            "cluster"
        )
    answers = []
    for ref in refs:
        try:
            answers.append((refs[ref], ray.get(ref)))
        except Exception as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            raise PluginError(
                f"{describe_node(*refs[ref])} could not run the start-up check of the run's "
                f"paths ({(lines or [type(exc).__name__])[-1].strip()[:200]}); check that "
                "plugrl is installed there as on the driver's node"
            ) from None
    return answers


def raise_for_problems(answers: Sequence[tuple[tuple[str, str], Sequence[Problem]]]) -> None:
    """One :class:`RecipeError` for the first problem of the first node that has any."""
    failing = [(node, problems) for node, problems in answers if problems]
    if not failing:
        return
    (node_id, address), problems = failing[0]
    first = problems[0]
    others = len(problems) - 1 + sum(len(more) for _, more in failing[1:])
    also = f" (and {others} more on {len(failing)} node{'s' if len(failing) > 1 else ''})"
    raise RecipeError(
        f"{first.path} {first.reason} on {describe_node(node_id, address)}, though the driver "
        f"sees it{also if others else ''}; {SHARED_FIX}",
        key=first.key,
    )
