"""`plugrl convert verl` over verl's own launch scripts: the 2025 corpus (fixtures/verl, listed
with their source in fixtures/verl/SOURCES), where every RL trainer script converts, and verl's
current examples and e2e RL scripts (fixtures/verl-current, verl 0.9 and after), converted as on
a GPU machine (``--env DEVICE=gpu``). The counts of recipes written, of clean conversions and of
recipes that validate do not fall below what was measured.

Each recipe is validated as ``plugrl run --print-config`` does, with the accelerator libraries
(vLLM, SGLang, Megatron, torch-npu, MindSpeed) made importable by empty modules where they are
not installed, and without looking for the scripts' data files. A recipe that fails only for
a layout plugrl does not run yet is counted under "needs <feature>", and validated again with
that setting at what plugrl runs today, so that the table shows what each feature would add.

A clean conversion leaves nothing unmapped but settings dropped on purpose, each with its line
in the report (infrastructure with no effect on what is trained: a profiler, an engine's layout
or kernels); a path the script builds from a variable it does not set, or a run name with
``$(date)``, is in the recipe as a placeholder with its own line, and does not keep it from being
clean (docs/migrating-from-verl.md gives the rule). ``pytest -s
tests/tools/convert/test_verl_corpus.py`` prints the tables.
"""

from __future__ import annotations

import collections
import copy
import importlib
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from plugrl.errors import PlugrlError
from plugrl_tools.convert.output import validate
from plugrl_tools.convert.verl import Conversion, convert_script

CORPUS = Path(__file__).parent / "fixtures" / "verl"
CURRENT = Path(__file__).parent / "fixtures" / "verl-current"

STUBBED = ("vllm", "sglang", "megatron", "torch_npu", "mindspeed")
"""Accelerator libraries the parts of converted recipes need, stood in for by empty modules."""

INHERITED = {"HOME": "/home/user", "USER": "user", "PWD": "/home/user/verl"}
"""The environment the scripts are converted in (plugrl convert reads these from its own)."""

# measured on this corpus; raise them as the converter and plugrl learn more
WRITTEN = 362
CLEAN = 245
VALIDATE = 349
VALIDATE_WITH_FEATURES = 349

# measured on verl's current scripts (100); the targets are 90% validating and 50% clean
# (docs/migrating-from-verl.md says what keeps the rest from clean)
CURRENT_SCRIPTS = 100
CURRENT_WRITTEN = 98
CURRENT_CLEAN = 77
CURRENT_VALIDATE = 96
CURRENT_VALIDATE_TARGET = 0.90
CURRENT_CLEAN_TARGET = 0.50
VISION_KEY = re.compile(r"image|video|vision|visual|multi_modal|(^|\.)mm_|limit_mm")
"""A verl override about images or videos (data keys, engine arguments, the vision tower)."""

CURRENT_ENV = {"DEVICE": "gpu"}
"""The current scripts choose their settings in ``case "${DEVICE}"`` blocks, most with a
default that probes the machine (``$(python3 -c 'import torch_npu' ...)``): converted with
``--env DEVICE=gpu``, as a user on a GPU machine would."""


FEATURE_ERRORS: dict[str, tuple[str, Callable[[dict], None], str | None]] = {}
"""The start of a validation error -> (the feature it needs, how to set the recipe to what
plugrl runs today, the feature of FEATURE_KEYS the script must use for it to count). Empty
since engines larger than a node run: the layouts of these scripts are all runnable."""

FEATURE_KEYS = {
    "LoRA": (r"\.lora[._]rank$", lambda v: v not in (0, None)),
}
"""Features other parts of plugrl are growing: the verl key a script sets when it uses one."""


@pytest.fixture
def accelerator_stubs(tmp_path, monkeypatch):
    """Empty modules for the accelerator libraries that are not installed."""
    for name in STUBBED:
        if importlib.util.find_spec(name) is None:
            (tmp_path / name).mkdir()
            (tmp_path / name / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()


def _uses(conversion: Conversion) -> set[str]:
    """The features of FEATURE_KEYS the script sets and the recipe leaves out."""
    used = set()
    for unmapped in conversion.unmapped:
        key, _, text = unmapped.override.lstrip("+").partition("=")
        value = int(text) if re.fullmatch(r"-?[0-9]+", text) else {"True": True}.get(text, text)
        for feature, (pattern, on) in FEATURE_KEYS.items():
            if re.search(pattern, key) and on(value):
                used.add(feature)
    return used


def _reason(error: str) -> str:
    """A validation error without its numbers, to count alike ones together."""
    return re.sub(r"[0-9]+", "N", error)[:110]


def _measure(
    corpus: Path,
    plugins,
    env: dict[str, str] | None = None,
    check: Callable[[Path, Conversion, str], None] | None = None,
) -> collections.Counter[str]:
    """Convert and validate every script of ``corpus``; print the table and return the counts
    (written, clean, validate, validate with features). ``check(path, conversion, error)``
    sees each converted script with its recipe's first validation error ("" for none)."""
    scripts = sorted(corpus.rglob("*.sh"))
    counts: collections.Counter[str] = collections.Counter()
    table: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    left_out: collections.Counter[str] = collections.Counter()
    for path in scripts:
        try:
            conversion = convert_script(
                path.read_text(encoding="utf-8"),
                path.name,
                env,
                plugins=plugins,
                inherited=INHERITED,
            )
        except PlugrlError as exc:
            table[f"not converted: {_reason(str(exc).partition(': ')[2])}"] += 1
            continue
        counts["written"] += 1
        if all(u.category == "dropped" for u in conversion.unmapped):
            counts["clean"] += 1
        for feature in _uses(conversion):
            left_out[feature] += 1
        recipe = copy.deepcopy(conversion.recipe)
        needs: list[str] = []
        seen: set[str] = set()
        while True:
            result = validate(recipe, plugins, check_files=False)
            error = result.error or "; ".join(message for _, message, _ in result.missing)
            if check is not None and not seen:
                check(path, conversion, error)
            feature = next(
                (
                    f
                    for start, f in FEATURE_ERRORS.items()
                    if error.startswith(start) and (f[2] is None or f[2] in _uses(conversion))
                ),
                None,
            )
            if not error or feature is None or error in seen:
                break
            seen.add(error)
            if feature[0] not in needs:
                needs.append(feature[0])
            feature[1](recipe)
        prefix = f"needs {', '.join(needs)}: " if needs else ""
        if not error:
            counts["validate with features" if needs else "validate"] += 1
            table[f"{prefix}validates" if needs else "validates"] += 1
        else:
            table[f"{prefix}fails: {_reason(error)}"] += 1
            examples[f"{prefix}fails: {_reason(error)}"].append(str(path.relative_to(corpus)))
    counts["validate with features"] += counts["validate"]

    counts["scripts"] = len(scripts)
    print(f"\n{len(scripts)} RL trainer scripts of verl ({corpus.name}): {dict(counts)}")
    for reason, number in table.most_common():
        print(f"{number:5d}  {reason}")
        print("".join(f"         {example}\n" for example in examples[reason][:12]), end="")
    for feature, number in left_out.most_common():
        print(f"{number:5d}  scripts set keys of {feature}, which the recipe leaves out")
    return counts


def test_verl_scripts_convert_and_validate(plugrl_make_plugin_manager, accelerator_stubs):
    counts = _measure(CORPUS, plugrl_make_plugin_manager())
    assert counts["written"] == counts["scripts"]  # every script of this corpus converts
    assert counts["written"] >= WRITTEN
    assert counts["clean"] >= CLEAN
    assert counts["validate"] >= VALIDATE
    assert counts["validate with features"] >= VALIDATE_WITH_FEATURES


def test_current_verl_scripts(plugrl_make_plugin_manager, accelerator_stubs):
    """verl's current scripts (V1 trainer, case blocks, model_engine, uv, the reward block):
    the shares that validate and that convert clean meet their targets; recipes written and
    clean conversions do not fall below what was measured; every script that trains on images
    validates with its vision settings mapped (``check_vision``)."""
    vision: list[str] = []

    def check_vision(path: Path, conversion: Conversion, error: str) -> None:
        """A script that trains on images (sets data.image_key) validates, with every vision
        setting mapped or dropped with its reason: only videos and per-prompt image limits
        are left over, which plugrl does not read yet."""
        if "data.image_key" not in path.read_text(encoding="utf-8"):
            return
        name = str(path.relative_to(CURRENT))
        vision.append(name)
        left = [
            u.override
            for u in conversion.unmapped
            if u.category != "dropped"
            and VISION_KEY.search(u.override.partition("=")[0])
            and not re.search(r"video|limit_images|limit_mm", u.override)
        ]
        assert (name, error, left) == (name, "", [])

    counts = _measure(CURRENT, plugrl_make_plugin_manager(), CURRENT_ENV, check_vision)
    assert len(vision) == 22, vision
    scripts = counts["scripts"]
    assert scripts == CURRENT_SCRIPTS, "fixtures/verl-current/SOURCES lists 100 scripts"
    print(
        f"recipes {counts['written'] / scripts:.0%}, validate {counts['validate'] / scripts:.0%}, "
        f"clean {counts['clean'] / scripts:.0%} of {scripts}"
    )
    assert counts["validate"] / scripts >= CURRENT_VALIDATE_TARGET
    assert counts["clean"] / scripts >= CURRENT_CLEAN_TARGET
    assert counts["written"] >= CURRENT_WRITTEN
    assert counts["clean"] >= CURRENT_CLEAN
    assert counts["validate"] >= CURRENT_VALIDATE
