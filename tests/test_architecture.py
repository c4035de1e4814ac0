"""The shape of the code: the kernel has no import circle, between its modules or between its
packages, and never imports the tools or a plugin; a plugin imports from the kernel only its
plugin API (``plugrl.api``, and ``plugrl.testing`` for test helpers), never the tools, and no
other plugin; every package lives in a folder of its own name.

Imports are read from the source (every ``import`` and ``from ... import``, those inside
functions included); only imports under ``if TYPE_CHECKING:`` are left out, since they never
run. Packages are found the way Python finds them: a folder with an ``__init__.py`` inside a
source root is a subpackage, and a module's name is its path from the root. Importing
``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so a module that imports
``a.b.c`` depends on those too: a package whose ``__init__`` imports its own modules closes a
circle with any of them that a module it imports reaches.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
KERNEL, TOOLS = "plugrl", "plugrl_tools"
PLUGIN_API = ("plugrl.api", "plugrl.testing")
"""What a plugin may import from the kernel: the plugin API and the test kit."""
PROGRAMS = "smoke"
"""A plugin module of this name is a program, not plugin code: the accelerator smoke script
run as ``python -m plugrl_<name>.smoke``. Like the command line it starts the process's
plugin manager and runs whole recipes with the tools' smoke harness, so it is held to neither
the plugin API nor the no-tools rule."""
SOURCE_ROOTS = {KERNEL: ROOT / "core" / KERNEL, TOOLS: ROOT / "tools" / TOOLS}


def plugin_packages() -> dict[str, Path]:
    """Every plugin package, built-in or a distribution of its own: ``plugins/<kind>/<name>/``
    holds the package ``plugrl_<name>`` (plus, for a distribution, its ``pyproject.toml``)."""
    return {
        init.parent.name: init.parent
        for init in sorted((ROOT / "plugins").glob("*/*/plugrl_*/__init__.py"))
    }


def modules_of(package: str, folder: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(folder.rglob("*.py")):
        if "build" in path.relative_to(folder).parts:
            continue
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def all_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in {**SOURCE_ROOTS, **plugin_packages()}.items():
        found.update(modules_of(package, folder))
    return found


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """``(line, absolute name)`` of every import that runs, relative ones resolved; for
    ``from a import b`` both ``a`` and ``a.b`` (``b`` may be a submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(inner) for inner in ast.walk(node))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def owner(name: str, packages: Iterable[str]) -> str | None:
    top = name.partition(".")[0]
    return top if top in packages else None


def known(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` is, or lies in (``a.b.C`` -> ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules importing it runs: each one it imports, and the packages above
    each of those (their ``__init__`` runs first)."""
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        for _, name in imports_of(module, path):
            target = known(name, modules)
            while target:
                if target in modules and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
                target = target.rpartition(".")[0]
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                part.append(other)
                if other == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_of(module: str) -> str:
    """The node of ``module`` in the package graph: its first-level subpackage of the kernel
    (``plugrl.run.loop`` -> ``plugrl.run``); a top-level module is a node of its own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with each module replaced by its package (:func:`package_of`)."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        node = packages.setdefault(package_of(module), set())
        node.update(package_of(t) for t in targets if package_of(t) != package_of(module))
    return packages


def plugin_api_violations(plugins: dict[str, Path], root: Path = ROOT) -> list[str]:
    """``path:line imports name`` for each import of a plugin module (programs aside) that
    reaches into the kernel outside its plugin API, or into the tools."""
    violations = []
    for package, folder in plugins.items():
        for module, path in modules_of(package, folder).items():
            if module.rpartition(".")[2] == PROGRAMS:
                continue
            for line, name in imports_of(module, path):
                top = name.partition(".")[0]
                private = top == KERNEL and not any(
                    name == api or name.startswith(api + ".") for api in PLUGIN_API
                )
                if private or top == TOOLS:
                    violations.append(f"{path.relative_to(root)}:{line} imports {name}")
    return violations


def test_the_kernel_has_no_import_circle():
    kernel = modules_of(KERNEL, SOURCE_ROOTS[KERNEL])
    assert circles(import_graph(kernel)) == []


def test_the_kernel_packages_have_no_import_circle():
    """Each first-level package of the kernel (``plugrl.plugin``, ``plugrl.parts``,
    ``plugrl.run``, ...) and each top-level module is one node: the layers import downwards
    only, so a package can be read, and moved, without the ones above it."""
    kernel = modules_of(KERNEL, SOURCE_ROOTS[KERNEL])
    assert circles(package_graph(import_graph(kernel))) == []


def test_the_package_check_finds_a_circle_no_module_circle_shows(tmp_path):
    """``a.one`` imports ``b.two`` and ``b.three`` imports ``a.four``: no module circle, but
    packages ``a`` and ``b`` import each other."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    files = {
        "a/one.py": "from x.b.two import value\n",
        "a/four.py": "value = 4\n",
        "b/two.py": "value = 2\n",
        "b/three.py": "from x.a.four import value\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    graph = import_graph(modules_of("x", tmp_path))
    assert circles(graph) == []
    assert circles(package_graph(graph)) == [["x.a", "x.b"]]


def test_plugins_import_only_the_plugin_api_and_never_the_tools():
    assert plugin_api_violations(plugin_packages()) == []


def test_the_plugin_api_check_finds_private_and_tool_imports(tmp_path):
    """A plugin that reaches into the kernel, with ``import plugrl`` or a function-local
    import, or into the tools, is caught; the API, the test kit and a smoke program are not."""
    folder = tmp_path / "plugins" / "rewards" / "planted" / "plugrl_planted"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("import plugrl\nfrom plugrl.api import hookimpl\n")
    (folder / "manager.py").write_text(
        "from plugrl.api.rewards import RewardManager\n"
        "from plugrl.testing import part_context\n"
        "def later():\n"
        "    from plugrl.cluster.engines import EngineGroup\n"
        "    from plugrl_tools.quickstart.arithmetic import parse_answer\n"
    )
    (folder / "smoke.py").write_text("from plugrl_tools.smoke import check\n")
    violations = plugin_api_violations({"plugrl_planted": folder}, root=folder)
    assert sorted(violations) == [
        "__init__.py:1 imports plugrl",
        "manager.py:4 imports plugrl.cluster.engines",
        "manager.py:4 imports plugrl.cluster.engines.EngineGroup",
        "manager.py:5 imports plugrl_tools.quickstart.arithmetic",
        "manager.py:5 imports plugrl_tools.quickstart.arithmetic.parse_answer",
    ]


def test_the_plugin_api_modules_declare_what_they_export():
    """Every public module of ``plugrl.api`` lists its names in ``__all__``, and each name is
    there (the modules resolve them on first use: reading each one here imports its home)."""
    import importlib

    for module in modules_of(KERNEL, SOURCE_ROOTS[KERNEL]):
        if module.rpartition(".")[2].startswith("_"):
            continue
        if module == "plugrl.api" or module.startswith("plugrl.api."):
            imported = importlib.import_module(module)
            assert imported.__all__, module
            missing = [name for name in imported.__all__ if not hasattr(imported, name)]
            assert missing == [], module


def test_the_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_a_package_init_that_imports_its_modules_is_in_the_graph(tmp_path):
    """``low`` imports ``pkg.leaf``, which runs ``pkg/__init__``, which imports ``pkg.top``,
    which imports ``low``: a circle, though no module imports another in a ring."""
    (tmp_path / "pkg").mkdir()
    files = {
        "low.py": "from x.pkg.leaf import value\n",
        "pkg/__init__.py": "from x.pkg.top import top\n",
        "pkg/leaf.py": "value = 1\n",
        "pkg/top.py": "from x.low import value\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert circles(import_graph(modules_of("x", tmp_path))) == [["x.low", "x.pkg", "x.pkg.top"]]


def test_the_kernel_imports_neither_the_tools_nor_a_plugin():
    plugins = set(plugin_packages())
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for module, path in modules_of(KERNEL, SOURCE_ROOTS[KERNEL]).items()
        for line, name in imports_of(module, path)
        if name.partition(".")[0] == TOOLS or owner(name, plugins)
    ]
    assert violations == []


def test_no_plugin_imports_another():
    plugins = plugin_packages()
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for package, folder in plugins.items()
        for module, path in modules_of(package, folder).items()
        for line, name in imports_of(module, path)
        if owner(name, plugins) not in (None, package)
    ]
    assert violations == []


def test_the_checks_see_relative_and_absolute_imports(tmp_path):
    module = tmp_path / "plugrl_x" / "part.py"
    module.parent.mkdir()
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from plugrl_y.loss import Loss\n"
        "if TYPE_CHECKING:\n"
        "    from plugrl_z import Z\n"
        "def later():\n"
        "    import plugrl_tools.cli\n"
    )
    names = [name for _, name in imports_of("plugrl_x.part", module)]
    assert "plugrl_x.sibling" in names
    assert owner("plugrl_y.loss.Loss", ["plugrl_x", "plugrl_y"]) == "plugrl_y"
    assert "plugrl_tools.cli" in names
    assert not any(name.startswith("plugrl_z") for name in names)


def test_every_plugin_folder_holds_one_package_of_its_name():
    """``plugins/<kind>/<name>/`` holds ``plugrl_<name>/`` and nothing else that imports; a
    kind's folder holds plugin folders only."""
    assert sorted((ROOT / "plugins").glob("*.py")) + sorted((ROOT / "plugins").glob("*/*.py")) == []
    for folder in sorted((ROOT / "plugins").glob("*/*")):
        if not folder.is_dir():
            continue
        packages = sorted(p.parent.name for p in folder.glob("*/__init__.py"))
        assert packages == [f"plugrl_{folder.name}"], folder.relative_to(ROOT)
        assert not list(folder.glob("*.py")), folder.relative_to(ROOT)


def test_the_builtin_plugins_are_the_entry_points_of_the_core_distribution():
    """Each built-in plugin package (one without a pyproject.toml of its own) is an entry
    point of the ``plugrl`` distribution, and nothing else is, except the cluster's weight
    transports."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    entry_points = pyproject["project"]["entry-points"]["plugrl"]
    builtin = {
        name: path
        for name, path in plugin_packages().items()
        if not (path.parent / "pyproject.toml").exists()
    }
    assert {name: f"plugrl_{name}" for name in entry_points if name != "transports"} == {
        name.removeprefix("plugrl_"): name for name in builtin
    }
    assert entry_points["transports"] == "plugrl.cluster.transports"


def test_the_kernel_reaches_the_plugin_manager_only_through_the_run():
    """The process's plugin manager (``get_plugin_manager``) is taken only where a program
    starts: the command line (a tool), a worker process starting, a test (``plugrl.testing``).
    Everything else receives it from the run (``RunContext.plugins``, ``RunParts.plugins``,
    ``PartContext.plugins``) or from its caller."""
    allowed = {
        "plugrl.plugin.manager",
        "plugrl.cluster.worker",
        "plugrl.testing",
        "plugrl.testing.fixtures",
        "plugrl.testing.simulated",
    }
    callers = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for module, path in modules_of(KERNEL, SOURCE_ROOTS[KERNEL]).items()
        if module not in allowed
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("get_plugin_manager")
    )
    assert callers == []
