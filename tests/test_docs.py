"""docs/plugins.md is the one reference a plugin author reads: these tests hold it to the code.

Its "Reference" section has one subsection per class, whose heading names the class
(``### Device (`plugrl.parts.device.Device`)``) and whose ``| member | implement | ... |``
tables list the class's members, one per row, in the first cell:

* ``Class(params)``: the constructor;
* ``[async ][classmethod ]name(params)[ -> returns]``: a method (``__call__`` included);
* ``property name[ -> type]``: a property;
* ``name``: an attribute (a class attribute, a field, or one the interface's ``__init__``
  sets).

Checked: every class a plugin implements (the ``interface`` of each kind of
``PART_KINDS``, the call ``function`` of the function kinds) and every class a part reads or
returns has a subsection; every public member of the class is in it, with the same parameter
names, kinds and defaults, ``async`` exactly where it is a coroutine, and ``required`` in the
second column exactly where it is abstract; and every member the page names exists. The hooks
of ``plugrl.plugin.hookspecs`` are checked the same way against "The hooks".
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import attrs
import pytest

from plugrl.parts.scoring import BATCH_PARAMS, SAMPLE_PARAMS
from plugrl.plugin import hookspecs
from plugrl.plugin.registry import PART_KINDS, import_object

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plugins.md"

# What parts read or return, besides the interfaces they implement.
DATA_TYPES = (
    "plugrl.parts.context:PartContext",
    "plugrl.parts.context:DistInfo",
    "plugrl.data.batch:Batch",
    "plugrl.algorithms.functional:LossAggregator",
    "plugrl.parts.algorithm:LossScale",
    "plugrl.parts.algorithm:ActorObjective",
    "plugrl.parts.reward:RewardOutput",
    "plugrl.parts.reward:BatchScoringFunction",
    "plugrl.run.runner:RunContext",
    "plugrl.parts.rollout:GenerationRequest",
    "plugrl.parts.rollout:SamplingParams",
    "plugrl.parts.rollout:Completion",
    "plugrl.parts.rollout:WeightMeta",
    "plugrl.parts.agent:Session",
    "plugrl.parts.agent:ToolResult",
    "plugrl.parts.agent:Trajectory",
    "plugrl.parts.health:Finding",
    "plugrl.parts.health:HealthCheckConfig",
    "plugrl.parts.launcher:LaunchJob",
)
IMPLEMENT = ("required", "optional", "provided", "set", "read")


# ------------------------------------------------------------------------------ the page


def page_section(title: str) -> str:
    """The text of the ``## title...`` section, up to the next ``## `` heading."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/plugins.md has no section '## {title}'"
    return match.group(1)


def subsections(text: str) -> list[tuple[str, str]]:
    """``(heading, body)`` of every ``### `` subsection."""
    parts = re.split(r"^### (.*)$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


@attrs.frozen
class Row:
    """One member row: the member cell parsed, and the implement cell."""

    text: str
    prefixes: tuple[str, ...]
    name: str
    params: str | None
    implement: str


MEMBER = re.compile(r"^((?:(?:async|classmethod|staticmethod|property) )*)(\w+)")


def member_rows(body: str) -> list[Row]:
    """The rows of the ``| member | implement | ... |`` tables of a subsection."""
    rows = []
    in_table = False
    for line in body.splitlines():
        if re.match(r"^\|\s*member\s*\|\s*implement\s*\|", line):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table or re.match(r"^\|\s*-", line):
            continue
        cells = re.match(r"^\|\s*`([^`]+)`\s*\|\s*([^|]*?)\s*\|", line)
        assert cells, f"a member row must start with the member in backticks: {line}"
        text, implement = cells.groups()
        match = MEMBER.match(text)
        assert match, f"cannot read member {text!r}"
        prefixes = tuple(match.group(1).split())
        rest = text[match.end() :]
        params = None
        if rest.startswith("("):
            params = _balanced(rest)
            rest = rest[len(params) + 2 :]
        assert rest == "" or re.match(r"^\s*(->|:)\s*\S", rest), f"cannot read member {text!r}"
        rows.append(Row(text, prefixes, match.group(2), params, implement))
    return rows


def _balanced(text: str) -> str:
    """What is inside the parentheses that ``text`` starts with."""
    depth = 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return text[1:index]
    raise AssertionError(f"unbalanced parentheses in {text!r}")


def documented_classes() -> dict[str, tuple[str, str]]:
    """``"module:Class"`` (where the class is defined) -> (heading, body) of its reference
    subsection. A heading names the class by its plugin-API name (``plugrl.api...``), the one
    plugins import."""
    found = {}
    for heading, body in subsections(page_section("Reference")):
        paths = re.findall(r"`(plugrl[\w.]*)\.(\w+)`", heading)
        if not paths:  # prose (metric names)
            continue
        module, name = paths[-1]
        assert module == "plugrl.api" or module.startswith("plugrl.api."), (
            f"the reference heading {heading!r} names {module}.{name}; name it by its "
            "plugrl.api path, the one plugins import"
        )
        cls = import_object(f"{module}:{name}")
        found[f"{cls.__module__}:{cls.__qualname__}"] = (heading, body)
    return found


# ------------------------------------------------------------------------------ the code


@attrs.frozen
class Member:
    kind: str  # "method", "classmethod", "staticmethod", "property", "attribute"
    function: Any = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)

    @property
    def is_abstract(self) -> bool:
        return bool(getattr(self.function, "__isabstractmethod__", False))


def is_protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False))


def public_members(cls: type) -> dict[str, Member]:
    """Every public method, property and attribute of ``cls`` and its plugrl bases."""
    members: dict[str, Member] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("plugrl"):
            continue
        own = vars(klass)
        for name, value in own.items():
            if name.startswith("_") and name != "__call__":
                continue
            if isinstance(value, classmethod | staticmethod):
                members[name] = Member(type(value).__name__, value.__func__)
            elif inspect.isfunction(value):
                members[name] = Member("method", value)
            elif isinstance(value, property):
                members[name] = Member("property", value.fget)
            else:
                members.setdefault(name, Member("attribute"))
        names = [*own.get("__annotations__", {}), *own.get("__slots__", ())]
        init = own.get("__init__")
        if inspect.isfunction(init) and not is_protocol(klass):
            try:
                source = inspect.getsource(init)
            except (OSError, TypeError):  # made by attrs
                source = ""
            names += re.findall(r"self\.(\w+)(?:\s*:[^=\n]+)?\s*=(?!=)", source)
        for name in names:
            if not name.startswith("_"):
                members.setdefault(name, Member("attribute"))
    return members


def actual_parameters(signature: inspect.Signature, drop_first: bool) -> list[inspect.Parameter]:
    parameters = list(signature.parameters.values())
    return parameters[1:] if drop_first else parameters


def documented_parameters(params: str) -> list[tuple[str, Any, ast.expr | None]]:
    """``(name, kind, default node)`` of a documented parameter list."""
    try:
        tree = ast.parse(f"def f({params}): pass")
    except SyntaxError as exc:
        raise AssertionError(f"cannot read parameters ({params}): {exc}") from None
    arguments = tree.body[0].args  # type: ignore[attr-defined]
    P = inspect.Parameter
    out: list[tuple[str, Any, ast.expr | None]] = []
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
    defaults += arguments.defaults
    for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = P.POSITIONAL_ONLY if index < len(arguments.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        out.append((arg.arg, kind, default))
    if arguments.vararg:
        out.append((arguments.vararg.arg, P.VAR_POSITIONAL, None))
    for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
        out.append((arg.arg, P.KEYWORD_ONLY, default))
    if arguments.kwarg:
        out.append((arguments.kwarg.arg, P.VAR_KEYWORD, None))
    return out


def default_value(cls: type, parameter: inspect.Parameter) -> Any:
    """A parameter's default; an attrs field's factory is called."""
    if parameter.default is attrs.NOTHING and attrs.has(cls):
        default = attrs.fields_dict(cls)[parameter.name].default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            return default.factory()  # type: ignore[call-arg]
    return parameter.default


def same_default(node: ast.expr, actual: Any) -> bool:
    if isinstance(node, ast.Call):  # DistInfo(): a default object, by its class
        return type(actual).__name__ == ast.unparse(node.func)
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node) == repr(actual)
    return type(value) is type(actual) and value == actual


def signature_problems(
    label: str, params: str, signature: inspect.Signature, cls: type, drop_first: bool
) -> list[str]:
    documented = documented_parameters(params)
    actual = actual_parameters(signature, drop_first)
    shape = [(name, kind) for name, kind, _ in documented]
    real = [(p.name, p.kind) for p in actual]
    if shape != real:
        text = ", ".join(str(p) for p in actual)
        return [f"{label}: the page says ({params}), the code has ({text})"]
    problems = []
    for (name, _, node), parameter in zip(documented, actual, strict=True):
        has_default = parameter.default is not inspect.Parameter.empty
        if (node is not None) != has_default:
            problems.append(f"{label}: {name} has a default in one of page and code only")
        elif node is not None and not same_default(node, default_value(cls, parameter)):
            problems.append(
                f"{label}: default of {name} is {ast.unparse(node)} on the page, "
                f"{default_value(cls, parameter)!r} in the code"
            )
    return problems


def check_class(path: str, body: str) -> list[str]:
    """Every difference between a class and its reference subsection."""
    cls = import_object(path)
    label = path.replace(":", ".")
    members = public_members(cls)
    rows = member_rows(body)
    problems = []
    seen: set[str] = set()
    constructor_seen = False
    for row in rows:
        where = f"{label}: `{row.text}`"
        if row.implement.split()[0:1] and row.implement.split()[0] not in IMPLEMENT:
            problems.append(f"{where}: implement column must be one of {', '.join(IMPLEMENT)}")
        if row.name == cls.__name__ and row.params is not None:
            constructor_seen = True
            problems += signature_problems(
                f"{label} constructor", row.params, inspect.signature(cls), cls, False
            )
            continue
        member = members.get(row.name)
        if member is None:
            problems.append(f"{where}: {cls.__name__} has no public member {row.name!r}")
            continue
        seen.add(row.name)
        if member.kind == "attribute" or member.kind == "property":
            if row.params is not None:
                problems.append(f"{where}: {row.name} is an attribute, not a method")
            if ("property" in row.prefixes) != (member.kind == "property"):
                problems.append(f"{where}: say `property` exactly for properties")
            continue
        if row.params is None:
            problems.append(f"{where}: {row.name} is a method: give its parameters")
            continue
        for prefix, present in (
            ("async", member.is_async),
            ("classmethod", member.kind == "classmethod"),
            ("staticmethod", member.kind == "staticmethod"),
        ):
            if (prefix in row.prefixes) != present:
                state = "is" if present else "is not"
                problems.append(f"{where}: {row.name} {state} {prefix}")
        required = member.is_abstract or (is_protocol(cls) and row.name == "__call__")
        if (row.implement.startswith("required")) != required:
            state = "must say" if required else "must not say"
            problems.append(f"{where}: the implement column {state} required")
        problems += signature_problems(
            where,
            row.params,
            inspect.signature(member.function),
            cls,
            drop_first=member.kind != "staticmethod",
        )
    for name in sorted(set(members) - seen):
        problems.append(f"{label}: member {name!r} is not on the page")
    if not constructor_seen and not is_protocol(cls):
        problems.append(f"{label}: the constructor `{cls.__name__}(...)` is not on the page")
    return problems


# ------------------------------------------------------------------------------ the tests


def interface_paths() -> list[str]:
    paths = []
    for kind in PART_KINDS.values():
        path = kind.interface or kind.function
        assert path, f"kind {kind.name} names neither an interface class nor a function protocol"
        paths.append(path)
    return paths


@pytest.mark.parametrize("path", [*interface_paths(), *DATA_TYPES])
def test_the_reference_documents_every_member_as_the_code_has_it(path):
    documented = documented_classes()
    assert path in documented, f"docs/plugins.md has no reference subsection for {path}"
    problems = check_class(path, documented[path][1])
    assert not problems, "\n".join(problems)


def test_the_reference_names_only_classes_that_are_checked():
    extra = set(documented_classes()) - {*interface_paths(), *DATA_TYPES}
    assert not extra, f"add these to DATA_TYPES so they are checked: {sorted(extra)}"


@pytest.mark.parametrize("kind", list(PART_KINDS.values()), ids=lambda kind: kind.name)
def test_each_kind_says_how_it_is_registered_and_chosen(kind):
    _, body = documented_classes()[kind.interface or kind.function]
    assert f"`{kind.hook}`" in body
    assert f"`{kind.recipe_key}`" in body


def test_the_reward_function_protocols_are_what_the_core_calls():
    sample = import_object(PART_KINDS["reward_functions"].function)
    batch = import_object("plugrl.parts.reward:BatchScoringFunction")
    for protocol, names in ((sample, SAMPLE_PARAMS), (batch, BATCH_PARAMS)):
        parameters = list(inspect.signature(protocol.__call__).parameters)[1:]
        assert tuple(parameters) == names


def test_the_hooks_are_documented_with_their_parameters():
    hooks = {
        name: function
        for name, function in vars(hookspecs).items()
        if inspect.isfunction(function) and hasattr(function, "plugrl_spec")
    }
    documented = dict(subsections(page_section("The hooks")))
    assert set(documented) == set(hooks)
    for name, body in documented.items():
        match = re.match(rf"\s*`{name}\((.*?)\)", body)
        assert match, f"hook {name}: its subsection must start with `{name}(...)`"
        problems = signature_problems(
            f"hook {name}", match.group(1), inspect.signature(hooks[name]), object, False
        )
        assert not problems, "\n".join(problems)


def table_rows(text: str, header: str) -> dict[str, str]:
    """First cell (inside backticks) -> the row, for the tables whose first header is
    ``header``."""
    rows = {}
    in_table = False
    for line in text.splitlines():
        if re.match(rf"^\|\s*{header}\s*\|", line):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not re.match(r"^\|\s*-", line):
            cell = re.match(r"^\|\s*`([^`]+)`", line)
            assert cell, line
            rows[cell.group(1)] = line
    return rows


def test_the_test_kit_is_documented_as_it_is():
    from plugrl import testing
    from plugrl.testing import fixtures as testing_fixtures

    text = page_section("Testing a plugin")
    fixtures = set(table_rows(text, "fixture"))
    assert fixtures == {name for name in vars(testing_fixtures) if name.startswith("plugrl_")}
    builders = table_rows(text, "builder")
    documented = {cell.partition("(")[0] for cell in builders}
    assert documented == set(testing.__all__) - {
        "FakeDistribution",
        "FakeEntryPoint",
        "make_fake_entry_point",  # behind the plugrl_fake_entry_point fixture
    }
    for cell in builders:
        name, _, rest = cell.partition("(")
        problems = signature_problems(
            f"plugrl.testing.{name}",
            _balanced("(" + rest),
            inspect.signature(getattr(testing, name)),
            object,
            False,
        )
        assert not problems, "\n".join(problems)


def test_the_documented_unit_tests_of_parts_pass(tmp_path):
    """The examples under "Builders" run as a plugin author would run them."""
    text = page_section("Testing a plugin")
    builders = text[text.index("### Builders") :]
    blocks = re.findall(r"```python\n(.*?)```", builders, re.S)
    # unit tests of parts; a tool called by a scripted policy; a test with a tiny model; a
    # scheduler's run on the simulated parts
    assert len(blocks) == 4
    for index, block in enumerate(blocks):
        (tmp_path / f"test_documented_{index}.py").write_text(block, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    count = sum(len(re.findall(r"^def test_", block, re.M)) for block in blocks)
    assert f"{count} passed" in result.stdout


def run_documented_files(text: str, tmp_path: Path) -> None:
    """Write every ``python`` block of ``text`` whose first line names a file (``# name.py``)
    into ``tmp_path`` and run the test files among them, as their reader would."""
    files = {}
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        first = block.splitlines()[0]
        if re.fullmatch(r"# \w+\.py", first):
            files[first[2:]] = block
    tests = sorted(name for name in files if name.startswith("test_"))
    assert tests, "no block names a test file (# test_....py)"
    for name, block in files.items():
        (tmp_path / name).write_text(block, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    count = sum(len(re.findall(r"^def test_", files[name], re.M)) for name in tests)
    assert f"{count} passed" in result.stdout


def doc_section(path: Path, title: str) -> str:
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{path.name} has no section '## {title}'"
    return match.group(1)


def test_the_documented_part_options_test_passes(tmp_path):
    """The ``part_args`` example of "Config classes" runs as its reader would run it."""
    run_documented_files(page_section("Registering parts"), tmp_path)


def test_the_documented_reward_manager_and_its_test_pass(tmp_path):
    run_documented_files(
        doc_section(ROOT / "docs" / "rewards.md", "Writing a reward manager"), tmp_path
    )


def test_the_documented_end_to_end_test_passes(tmp_path):
    run_documented_files(page_section("Testing a plugin"), tmp_path)


@pytest.mark.parametrize(
    "kind",
    [kind for kind in PART_KINDS.values() if kind.section_config],
    ids=lambda kind: kind.name,
)
def test_every_section_base_config_is_named_with_its_import_path(kind):
    module, _, name = kind.section_config.partition(":")
    assert f"`{module}.{name}`" in page_section("Registering parts"), (
        f"docs/plugins.md does not name {module}.{name}, the base of a {kind.human_name}'s "
        "config, with its import path"
    )


# ------------------------------------------------------------------------------ imports

# Top-level packages of this repository besides plugrl: plugins, tools and example plugins, and
# the name the plugins had before each became a package of its own.
REPOSITORY_PACKAGES = frozenset(
    {path.parent.name for path in ROOT.glob("plugins/**/plugrl_*/__init__.py")}
    | {path.parent.name for path in ROOT.glob("examples/plugins/*/src/*/__init__.py")}
    | {path.parent.name for path in ROOT.glob("tools/*/__init__.py")}
    | {"plugrl_plugins"}
)
DOCUMENTS = sorted(
    {
        *ROOT.glob("*.md"),
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("plugins/**/README.md"),
        *ROOT.glob("examples/plugins/*/README.md"),
        *ROOT.glob("recipes/**/README.md"),
    }
)


def documented_packages(document: Path) -> set[str]:
    """The repository packages a document documents: those in the folder of a plugin's own
    README (``plugins/rollout/vllm/README.md`` documents ``plugrl_vllm``)."""
    folder = document.parent
    if document.name != "README.md" or folder in (ROOT, ROOT / "docs", ROOT / "plugins"):
        return set()
    return {path.parent.name for path in folder.glob("**/__init__.py")} & REPOSITORY_PACKAGES


def code_imports(document: Path) -> list[tuple[str, str, str]]:
    """``(heading, block start, module)`` for every import of every ``python`` block."""
    found = []
    heading = ""
    text = document.read_text(encoding="utf-8")
    for match in re.finditer(r"^(#+ [^\n]*)$|^```python\n(.*?)^```", text, re.M | re.S):
        if match.group(1):
            heading = match.group(1)
            continue
        block = match.group(2)
        first_line = block.splitlines()[0]
        found += [(heading, first_line, name.split(".")[0]) for name in imported(block)]
    return found


def imported(block: str) -> list[str]:
    """The modules a block imports; a block that is not valid Python (a signature) is read
    line by line."""
    try:
        tree = ast.parse(block)
    except SyntaxError:
        return re.findall(r"^\s*(?:from|import)\s+([\w.]+)", block, re.M)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def foreign_imports(document: Path) -> list[str]:
    """The imports of repository packages that ``document`` does not document."""
    allowed = documented_packages(document)
    return [
        f"{heading!r}: a block ({first!r}) imports {module}"
        for heading, first, module in code_imports(document)
        if module in REPOSITORY_PACKAGES and module not in allowed and f"`{module}`" not in heading
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_code_in_the_docs_imports_plugrl_not_another_plugin(document):
    """A reader copies these blocks: they import ``plugrl`` (and the standard library or
    third-party libraries), never a plugin's or a tool's modules, whose layout is not an API;
    only a section about a package (its name in the heading, or the package's own README)
    imports that package."""
    problems = foreign_imports(document)
    assert not problems, "\n".join(problems)


def test_the_import_check_finds_a_plugin_import(tmp_path):
    document = tmp_path / "page.md"
    document.write_text(
        "## Scoring\n\n```python\nimport json\nfrom plugrl.plugin.manager import load_part\n"
        "from plugrl_scorers.gsm8k import compute_score\n```\n\n"
        "## The simulator (`plugrl_sim`)\n\n```python\nfrom plugrl_sim.parts import "
        "sim_recipe\n```\n",
        encoding="utf-8",
    )
    assert foreign_imports(document) == [
        "'## Scoring': a block ('import json') imports plugrl_scorers"
    ]


def test_the_import_check_sees_every_package_kind():
    assert {
        "plugrl_scorers",
        "plugrl_sim",
        "plugrl_tools",
        "plugrl_countdown",
    } <= REPOSITORY_PACKAGES
    assert "plugrl" not in REPOSITORY_PACKAGES


# ------------------------------------------------------------------------------ the checker


class _Sample:
    """A class for testing the checker itself."""

    flag: bool = False

    def __init__(self, config, context) -> None:
        self.config = config

    def run(self, batch, *, steps=2):
        return batch

    async def wait(self):
        return None


SAMPLE_PAGE = """
| member | implement | what it is |
| --- | --- | --- |
| `_Sample(config, context)` | provided | built |
| `flag` | set | a flag |
| `config` | read | the config |
| `run(batch, *, steps=2) -> Batch` | optional | runs |
| `async wait()` | optional | waits |
"""


@pytest.fixture
def sample_class(monkeypatch):
    """``_Sample`` importable by path, in a module the checker treats as plugrl's."""
    module = types.ModuleType("plugrl_docs_sample")
    module._Sample = _Sample  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "plugrl_docs_sample", module)
    monkeypatch.setattr(_Sample, "__module__", "plugrl_docs_sample")
    return "plugrl_docs_sample:_Sample"


def test_the_checker_accepts_a_true_page(sample_class):
    assert check_class(sample_class, SAMPLE_PAGE) == []


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("| `flag` | set | a flag |\n", ""), "member 'flag' is not on the page"),
        (("run(batch, *, steps=2)", "run(batch, steps=2)"), "the page says (batch, steps=2)"),
        (("run(batch, *, steps=2)", "run(batch, *, steps=3)"), "default of steps is 3"),
        (("async wait()", "wait()"), "wait is async"),
        (("| optional | waits", "| required | waits"), "must not say required"),
        (("`config` | read", "`settings` | read"), "has no public member 'settings'"),
        (("_Sample(config, context)", "_Sample(config)"), "constructor"),
    ],
)
def test_the_checker_finds_what_the_page_gets_wrong(sample_class, edit, problem):
    page = SAMPLE_PAGE.replace(*edit)
    assert page != SAMPLE_PAGE
    problems = check_class(sample_class, page)
    assert any(problem in line for line in problems), problems
