"""Every file or folder of this repository that a README or a page of docs/ names exists: the
paths in backquotes (``plugins/rollout/vllm/test-env.sh``, from the repository root; in an
example plugin's README, from its own folder) and the targets of relative links."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted(
    {
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("plugins/*/*/README.md"),
        *ROOT.glob("recipes/**/README.md"),
        *ROOT.glob("bench/README.md"),
        *ROOT.glob("examples/plugins/*/README.md"),
    }
)
# paths in other projects that a document names, by the project they are in
ELSEWHERE = {
    "docs/advanced_features/sglang_for_rl.md": "SGLang's repository",
}
# Top-level names that .gitignore ignores (``runs/``, ``outputs/``, ``.venv/``): a run or a
# build makes them, so their presence in a checkout says nothing about the documents.
GENERATED = [
    line.strip().strip("/")
    for line in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    if line.strip() and not line.startswith(("#", "!"))
]
CODE = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def base_of(document: Path) -> Path:
    """Where the document's paths start: an example plugin's own folder (it is a package of
    its own), otherwise the repository root."""
    return document.parent if document.is_relative_to(ROOT / "examples") else ROOT


def is_generated(name: str) -> bool:
    """Whether a top-level name is one that git ignores, made by runs and builds."""
    return any(fnmatch(name, pattern) for pattern in GENERATED)


def named_paths(document: Path) -> list[str]:
    """Backquoted words whose first part is a file or folder of the repository at the
    document's base (``tests/...``, ``plugins/...``; ``plugrl_vllm/...`` is a module, and
    ``runs/...`` a run's output, not a path here)."""
    base = base_of(document)
    names = []
    for word in CODE.findall(document.read_text(encoding="utf-8")):
        path = word.split("[")[0].rstrip(".,:;")
        first = path.split("/")[0]
        if (
            "/" in path
            and first not in ("", ".", "..")
            and not is_generated(first)
            and (base / first).exists()
        ):
            names.append(path)
    return names


def ids(document: Path) -> str:
    return str(document.relative_to(ROOT))


@pytest.mark.parametrize("document", DOCUMENTS, ids=ids)
def test_the_paths_a_document_names_exist(document):
    base = base_of(document)
    missing = [
        path
        for path in named_paths(document)
        if path not in ELSEWHERE and not (base / path).exists()
    ]
    assert not missing, f"{ids(document)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=ids)
def test_the_relative_links_of_a_document_lead_to_files(document):
    targets = [
        target.split("#")[0]
        for target in LINK.findall(document.read_text(encoding="utf-8"))
        if not re.match(r"[a-z]+:|#", target)
    ]
    missing = [target for target in targets if not (document.parent / target).exists()]
    assert not missing, f"{ids(document)} links to files that do not exist: {missing}"


def test_the_check_finds_a_path_that_is_not_there(tmp_path):
    """A README naming ``recipes/...`` for a recipe that lives in a plugin's folder is caught."""
    readme = ROOT / "plugins" / "rollout" / "vllm" / "README.md"
    assert "plugins/rollout/vllm/recipes/gsm8k-grpo-qwen2.5-0.5b-vllm.yaml" in named_paths(readme)
    stale = tmp_path / "README.md"
    stale.write_text("`recipes/gsm8k-grpo-qwen2.5-0.5b-vllm.yaml` and `plugrl_vllm/engine.py`\n")
    assert named_paths(stale) == ["recipes/gsm8k-grpo-qwen2.5-0.5b-vllm.yaml"]
    assert not (ROOT / "recipes/gsm8k-grpo-qwen2.5-0.5b-vllm.yaml").exists()


def test_a_generated_folder_in_the_checkout_is_not_a_path_to_check(tmp_path, monkeypatch):
    """A ``runs/`` folder left by a quickstart does not turn ``runs/<name>/...`` in a document
    into a path that must exist; a folder of the repository still does."""
    checkout = tmp_path / "examples"  # an example plugin's README: paths from its own folder
    (checkout / "runs").mkdir(parents=True)
    (checkout / "recipes").mkdir()
    readme = checkout / "README.md"
    readme.write_text("`runs/quickstart/metrics.jsonl` and `recipes/nowhere.yaml`\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert is_generated("runs") and is_generated("outputs") and not is_generated("recipes")
    assert named_paths(readme) == ["recipes/nowhere.yaml"]
