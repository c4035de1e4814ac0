"""No plugin imports another plugin's modules: what plugins share lives in the core.

A built-in plugin is the package its ``plugrl`` entry point names (``plugrl_plugins.rewards``,
``plugrl_plugins.backends.fsdp2``...); its modules may import the core (``plugrl``) and their
own package only. Folders under ``plugins/`` that are distributions of their own (a
``pyproject.toml`` of their own) may not import ``plugrl_plugins`` at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"


def builtin_plugin_packages() -> list[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return sorted(pyproject["project"]["entry-points"]["plugrl"].values())


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PLUGINS).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["plugrl_plugins", *parts])


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in a file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # "from plugrl_plugins.x import y" may name a submodule y
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def owner(module: str, packages: list[str]) -> str | None:
    """The built-in plugin package that ``module`` belongs to, if any."""
    for package in sorted(packages, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    return None


def separate_distributions() -> list[Path]:
    return [path.parent for path in PLUGINS.rglob("pyproject.toml")]


def test_builtin_plugins_import_only_the_core_and_themselves():
    packages = builtin_plugin_packages()
    separate = separate_distributions()
    violations = []
    for path in sorted(PLUGINS.rglob("*.py")):
        if any(folder in path.parents for folder in separate):
            continue
        mine = owner(module_name(path), packages)
        for line, module in imported_modules(path):
            if not module.startswith("plugrl_plugins"):
                continue
            theirs = owner(module, packages)
            if theirs is not None and theirs != mine:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not violations, "plugins import other plugins:\n" + "\n".join(violations)


def test_separate_plugin_distributions_do_not_import_the_builtin_plugins():
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for folder in separate_distributions()
        for path in sorted(folder.rglob("*.py"))
        for line, module in imported_modules(path)
        if module.startswith("plugrl_plugins")
    ]
    assert not violations, "\n".join(violations)


def test_the_check_sees_a_cross_plugin_import(tmp_path):
    """The scan above finds an import of another plugin, relative or absolute."""
    sample = PLUGINS / "schedulers" / "sync" / "scheduler.py"
    assert owner(module_name(sample), builtin_plugin_packages()) == "plugrl_plugins.schedulers.sync"
    modules = [module for _, module in imported_modules(sample)]
    assert "plugrl.compose" in modules
    absolute = ast.parse("from plugrl_plugins.algorithms.kl import kl_k1")
    node = absolute.body[0]
    assert isinstance(node, ast.ImportFrom)
    assert owner(node.module or "", builtin_plugin_packages()) == "plugrl_plugins.algorithms"
