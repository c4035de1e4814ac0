"""Every hook is documented and tested; the lifecycle hooks are called where they say."""

import inspect
import re
from pathlib import Path

from plugrl.plugin import hookspecs
from plugrl.plugin.registry import PART_KINDS

ROOT = Path(__file__).resolve().parents[2]
HOOKS = sorted(
    name
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
    if hasattr(fn, "plugrl_spec")
)


def test_the_hook_list():
    registration = sorted(kind.hook for kind in PART_KINDS.values())
    lifecycle = [
        "detect_device",
        "estimate_memory",
        "multimodal_model",
        "on_run_end",
        "on_run_start",
        "on_step_end",
        "prepare_backend",
        "prepare_rollout",
    ]
    assert sorted(registration + lifecycle) == HOOKS


def test_every_hook_has_a_docstring_and_a_doc_entry():
    doc = (ROOT / "docs" / "plugins.md").read_text()
    for hook in HOOKS:
        assert (getattr(hookspecs, hook).__doc__ or "").strip(), f"{hook} has no docstring"
        assert re.search(rf"^### {hook}$", doc, re.MULTILINE), f"docs/plugins.md lacks {hook}"
        assert f"`{hook}(" in doc, f"docs/plugins.md gives no signature for {hook}"


def test_every_hook_is_exercised_by_a_test():
    this = Path(__file__).resolve()
    # tests and the plugin modules they register
    sources = [p.read_text() for p in (ROOT / "tests").rglob("*.py") if p.resolve() != this]
    for hook in HOOKS:
        assert any(re.search(rf"\bdef {hook}\b|\b{hook}=", src) for src in sources), (
            f"no test implements or calls the hook {hook}"
        )
