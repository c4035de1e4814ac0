"""The distributions of this repository as users get them: each builds into a wheel that holds
its packages and registers its plugins, and every command that says how to install one works
from a clone (they are not on a package index: no hint names a distribution to fetch)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from plugrl.plugin.registry import KNOWN_EXTERNAL

ROOT = Path(__file__).resolve().parents[1]
OWN_DISTRIBUTIONS = sorted(path.parent for path in ROOT.glob("plugins/*/*/pyproject.toml"))
BUILT_IN_PLUGINS = sorted(
    package.parent
    for package in ROOT.glob("plugins/*/*/plugrl_*/__init__.py")
    if not (package.parents[1] / "pyproject.toml").exists()
)
# what the core wheel is built from (setup.py finds the packages, pyproject.toml the metadata)
CORE_SOURCES = ("setup.py", "pyproject.toml", "README.md", "core", "tools", "plugins", "recipes")
NOT_SOURCES = shutil.ignore_patterns(".venv*", "build", "*.egg-info", "__pycache__")


def project(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def build_wheel(source: Path, out: Path) -> zipfile.ZipFile:
    """``pip wheel`` of a copy of ``source`` (the build writes into the folder it builds)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def entry_points(wheel: zipfile.ZipFile) -> dict[str, dict[str, str]]:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(wheel.read(name).decode())
    return {group: dict(parser[group]) for group in parser.sections()}


def top_level(wheel: zipfile.ZipFile) -> set[str]:
    return {name.split("/")[0] for name in wheel.namelist() if "/" in name} - {
        name.split("/")[0] for name in wheel.namelist() if ".dist-info/" in name
    }


def source_files(package: Path) -> set[str]:
    """The package's Python files, as wheel paths (``plugrl_vllm/engine.py``)."""
    return {
        path.relative_to(package.parent).as_posix()
        for path in package.rglob("*.py")
        if "__pycache__" not in path.parts
    }


@pytest.mark.parametrize("folder", OWN_DISTRIBUTIONS, ids=lambda folder: folder.name)
def test_a_plugin_distribution_builds_into_a_wheel_of_its_package_and_entry_points(
    folder, tmp_path
):
    source = tmp_path / folder.name
    shutil.copytree(folder, source, ignore=NOT_SOURCES)
    wheel = build_wheel(source, tmp_path / "wheel")
    (package,) = folder.glob("plugrl_*/__init__.py")
    assert top_level(wheel) == {package.parent.name}
    assert source_files(package.parent) <= set(wheel.namelist())
    assert entry_points(wheel) == {"plugrl": project(folder)["entry-points"]["plugrl"]}


def test_the_core_wheel_holds_the_kernel_the_tools_every_built_in_plugin_and_no_tests(tmp_path):
    source = tmp_path / "plugrl"
    source.mkdir()
    for name in CORE_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=NOT_SOURCES)
        else:
            shutil.copy2(ROOT / name, source / name)
    wheel = build_wheel(source, tmp_path / "wheel")
    names = set(wheel.namelist())
    built_in = {package.name for package in BUILT_IN_PLUGINS}
    assert top_level(wheel) == {"plugrl", "plugrl_tools", "plugrl_recipes", *built_in}
    for package in [ROOT / "core" / "plugrl", ROOT / "tools" / "plugrl_tools", *BUILT_IN_PLUGINS]:
        assert source_files(package) <= names, package
    # the shipped recipes, found by name (plugrl run quickstart)
    shipped = {f"plugrl_recipes/{path.name}" for path in (ROOT / "recipes").glob("*.yaml")}
    assert shipped <= names and "plugrl_recipes/quickstart.yaml" in names
    assert not [name for name in names if name.startswith("tests/") or "/tests/" in name]
    assert not [name for name in names if re.search(r"(^|/)(test_[^/]*|conftest)\.py$", name)]
    points = entry_points(wheel)
    assert (
        points["plugrl"]
        == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["plugrl"]
    )
    assert set(points["plugrl"].values()) >= built_in
    assert points["console_scripts"] == {"plugrl": "plugrl_tools.cli:main"}


# ------------------------------------------------------------------------------ install hints

# ``./plugins/rollout/vllm[cpu]``: a folder of this repository, with extras
REPOSITORY_PATH = re.compile(r"(?:\./)?(plugins/[A-Za-z0-9_./-]*[A-Za-z0-9_])(?:\[([a-z,_-]+)\])?")
OWN_EXTRA = re.compile(r"'plugrl\[([a-z,_-]+)\]'")


def registered_hints() -> dict[str, str]:
    """Every ``install`` hint a part of this repository registers, by part."""
    from plugrl.plugin.manager import PluginManager

    plugins = PluginManager()
    plugins.load_entry_points()
    return {
        f"{kind} {entry.name}": entry.install
        for kind, registry in plugins.registries().items()
        for entry in registry
        if entry.install
    }


def all_hints() -> dict[str, str]:
    known = {
        f"{kind} {name} (not installed)": hint for (kind, name), hint in KNOWN_EXTERNAL.items()
    }
    return {**known, **registered_hints()}


def test_the_plugins_of_this_repository_are_all_found():
    hints = registered_hints()
    for part in ("rollout_engines vllm", "rollout_engines sglang", "training_backends megatron"):
        assert part in hints
    assert "devices npu" in hints


@pytest.mark.parametrize("part, hint", sorted(all_hints().items()))
def test_every_install_hint_works_from_a_clone(part, hint):
    """A hint names folders of this repository (with extras they define) or plugrl's own
    extras, never a plugin distribution by name: none is on a package index."""
    assert not re.search(r"plugrl-[a-z]", hint), hint
    paths = REPOSITORY_PATH.findall(hint)
    for path, extras in paths:
        assert (ROOT / path).exists(), f"{part}: {path} is not in the repository"
        for extra in filter(None, extras.split(",")):
            defined = project(ROOT / path).get("optional-dependencies", {})
            assert extra in defined, f"{part}: {path} has no extra {extra!r}"
    for extras in OWN_EXTRA.findall(hint):
        defined = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        for extra in extras.split(","):
            assert extra in defined["optional-dependencies"], f"{part}: no extra {extra!r}"
    if part.endswith("(not installed)") or part.split()[1] in {"vllm", "sglang", "megatron"}:
        # the part's own distribution: its folder is the install command
        assert any(path.startswith("plugins/") for path, _ in paths), hint


DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("plugins/*/*/README.md"),
        *ROOT.glob("plugins/*/*/recipes/*.yaml"),
        *ROOT.glob("recipes/**/*.yaml"),
        *ROOT.glob("recipes/**/*.md"),
    ]
)
# a pip command whose targets include a plugin distribution by name (up to the end of the
# command: a backquote, a comment or the end of the line)
PIP_BY_NAME = re.compile(r"pip install[^`#\n]*?(?<![/\w])['\"]?plugrl-[a-z]+")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_document_installs_a_plugin_distribution_by_name(document):
    text = document.read_text(encoding="utf-8")
    assert not PIP_BY_NAME.findall(text)
    assert not re.findall(r"'plugrl-[a-z]+\[", text)
