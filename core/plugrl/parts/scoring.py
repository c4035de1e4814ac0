"""Scoring functions as the reward managers use them: found by data source or read from a file,
checked once at start-up, and wrapped so they can be sent to a scoring worker process.

Two call forms, told apart by the function's parameters:

* per sample (verl's): ``compute_score(data_source, solution_str, ground_truth,
  extra_info=None) -> float | dict``;
* batch: ``compute_score(data_sources, solution_strs, ground_truths, extra_infos) ->
  list[float | dict]``, for scorers that vectorise (a function with a ``solution_strs``
  parameter is the batch form).

Either may be ``async def``. Only the parameters a function declares are passed (all of them
when it takes ``**kwargs``), so ``def compute_score(solution_str, ground_truth)`` works too.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import inspect
import math
import pickle
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.config.structuring import describe_value, structure
from plugrl.errors import DataError, PluginError, RecipeError

if TYPE_CHECKING:
    from plugrl.plugin.manager import PluginManager

SAMPLE_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")
BATCH_PARAMS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
HOW_TO_ADD = (
    "score it with reward.custom_function.path=FILE.py (a compute_score function) or "
    "register one with a plugin's register_reward_functions hook (see docs/rewards.md)"
)


class ScoringError(PluginError):
    """A scoring function failed on a sample, or returned something that is not a score."""


# --------------------------------------------------------------------------------------------
# Functions defined in a file
# --------------------------------------------------------------------------------------------

_FILE_MODULES: dict[str, Any] = {}
_FILE_LOCK = threading.Lock()

IMPORT_TIMEOUT_S = 120.0
"""How long importing a reward function's file may take (a first import of SymPy takes
seconds) before the run stops saying the file hangs at import."""


@attrs.frozen
class FileFunction:
    """A function defined in a Python file, referred to by path and name.

    It pickles as the path and the name and imports the file on first use in each process,
    which is how a function from a user's file reaches the scoring worker processes.
    """

    path: str
    name: str

    def load(self) -> Callable[..., Any]:
        """The function (the file is imported once per process); one-line errors otherwise."""
        module = _import_file(self.path)
        if not hasattr(module, self.name):
            defined = sorted(
                n
                for n, v in vars(module).items()
                if inspect.isfunction(v) and v.__module__ == module.__name__
            )
            listed = ", ".join(defined) if defined else "no functions"
            raise RecipeError(
                f"{self.path} has no function {self.name!r} (it defines {listed}); "
                "set reward.custom_function.name",
                key="reward.custom_function.name",
            )
        function = getattr(module, self.name)
        if not callable(function):
            raise RecipeError(
                f"{self.name!r} in {self.path} is a {type(function).__name__}, not a function; "
                "set reward.custom_function.name to a function",
                key="reward.custom_function.name",
            )
        return function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)


def _import_file(path: str) -> Any:
    with _FILE_LOCK:
        if path in _FILE_MODULES:
            return _FILE_MODULES[path]
        file = Path(path)
        if not file.is_file():
            raise RecipeError(
                f"reward function file {path!r} not found; set it to the Python file that "
                "defines your scoring function",
                key="reward.custom_function.path",
            )
        # a name unique to the path, so two files called reward.py do not collide
        digest = hashlib.sha1(str(file).encode()).hexdigest()[:10]
        module_name = f"plugrl_reward_file_{file.stem}_{digest}"
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise RecipeError(
                f"{path} cannot be imported as Python; give a .py file",
                key="reward.custom_function.path",
            )
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            _run_with_deadline(spec.loader.exec_module, module, path)
        except (RecipeError, KeyboardInterrupt):
            # an interruption (Ctrl-C, or SIGTERM as the CLI turns it) stops the run while it
            # waits for the import: it is the user's, not something the file did
            sys.modules.pop(module_name, None)
            raise
        except BaseException as exc:
            sys.modules.pop(module_name, None)
            where = _error_line(exc, str(file))
            raise RecipeError(
                f"{path} failed to import{where}: {type(exc).__name__}: {exc}; fix the file "
                f"(python {path} shows the traceback)",
                key="reward.custom_function.path",
            ) from None
        _FILE_MODULES[path] = module
        return module


def _run_with_deadline(run: Callable[[Any], Any], module: Any, path: str) -> None:
    """``run(module)`` in a daemon thread, so that a file whose import hangs (a download, a
    lock, ``input()``) stops the run with one line instead of hanging it."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            run(module)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, name=f"import {path}", daemon=True)
    thread.start()
    thread.join(IMPORT_TIMEOUT_S)
    if not outcome:
        raise RecipeError(
            f"importing {path} did not finish in {IMPORT_TIMEOUT_S:g} s; check what the file "
            "does at import (a download, a lock, a prompt for input) and move it into the "
            "function",
            key="reward.custom_function.path",
        )
    if outcome[0] is not None:
        raise outcome[0]


def _error_line(exc: BaseException, filename: str) -> str:
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f" (line {exc.lineno})"
    line = None
    traceback = exc.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code.co_filename == filename:
            line = traceback.tb_lineno
        traceback = traceback.tb_next
    return f" (line {line})" if line else ""


# --------------------------------------------------------------------------------------------
# The wrapper the managers call
# --------------------------------------------------------------------------------------------


def _unwrap(function: Callable[..., Any]) -> Callable[..., Any]:
    return function.load() if isinstance(function, FileFunction) else function


def _accepted(
    function: Callable[..., Any], names: Sequence[str], kwargs: Mapping[str, Any], label: str
) -> tuple[str, ...]:
    """The ones of ``names`` to pass; errors for parameters that would be left unfilled."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: pass everything
        return tuple(names)
    parameters = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return tuple(names)
    unknown = [k for k in kwargs if k not in parameters]
    if unknown:
        raise RecipeError(
            f"{label} takes no parameter {', '.join(map(repr, unknown))}; remove it from "
            "reward.custom_function.kwargs or add it to the function",
            key="reward.custom_function.kwargs",
        )
    for parameter in parameters.values():
        required = parameter.default is inspect.Parameter.empty and parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        )
        if required and parameter.name not in names and parameter.name not in kwargs:
            raise RecipeError(
                f"{label} needs parameter {parameter.name!r}, which plugrl does not pass; "
                f"name its parameters {', '.join(names)} (or give it a default)",
                key="reward.custom_function.name",
            )
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY and parameter.name in names:
            raise RecipeError(
                f"{label} takes {parameter.name!r} positional-only; scores are passed by "
                "keyword, so drop the '/' from its signature",
                key="reward.custom_function.name",
            )
    return tuple(name for name in names if name in parameters)


def is_batch_form(function: Callable[..., Any]) -> bool:
    """Whether a function takes whole batches (it has a ``solution_strs`` parameter)."""
    try:
        return "solution_strs" in inspect.signature(_unwrap(function)).parameters
    except (TypeError, ValueError):
        return False


@attrs.frozen
class Scorer:
    """A scoring function ready to call in any process: per-sample or batch form, sync or
    async, with the extra keyword arguments of ``reward.custom_function.kwargs``.

    It is itself a verl-style ``ScoreFn`` (call it with the per-sample or the batch
    arguments), and it pickles when its function does (module-level functions, or
    :class:`FileFunction`).
    """

    function: Callable[..., Any]
    label: str
    batch: bool = False
    params: tuple[str, ...] = SAMPLE_PARAMS
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def wrap(
        cls, function: Callable[..., Any], label: str, kwargs: Mapping[str, Any] | None = None
    ) -> Scorer:
        """Check ``function``'s signature and wrap it; errors are one line naming ``label``."""
        kwargs = dict(kwargs or {})
        target = _unwrap(function)
        if not callable(target):
            raise PluginError(f"{label} is a {type(target).__name__}, not a function")
        batch = is_batch_form(target)
        params = _accepted(target, BATCH_PARAMS if batch else SAMPLE_PARAMS, kwargs, label)
        if not batch and "solution_str" not in params:
            raise RecipeError(
                f"{label} has no 'solution_str' parameter; scoring functions take "
                f"({', '.join(SAMPLE_PARAMS)}) or, for whole batches, ({', '.join(BATCH_PARAMS)})",
                key="reward.custom_function.name",
            )
        return cls(function, label, batch, params, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        names = BATCH_PARAMS if self.batch else SAMPLE_PARAMS
        values = dict(zip(names, args, strict=False))
        values.update(kwargs)
        result = _unwrap(self.function)(
            **{k: v for k, v in values.items() if k in self.params}, **self.kwargs
        )
        return run_awaitable(result)

    def check_picklable(self) -> None:
        """Scoring runs in worker processes; a lambda or nested function cannot get there."""
        try:
            pickle.dumps(self)
        except Exception as exc:
            raise PluginError(
                f"{self.label} cannot be sent to a scoring worker process ({exc}); define it "
                "at module level in an importable module, or load it from a file with "
                "reward.custom_function.path"
            ) from None

    def prepare(self) -> None:
        """Import what the function needs (a file function's file), before timing starts."""
        _unwrap(self.function)

    def score_sample(self, **sample: Any) -> tuple[float, dict[str, Any]]:
        """Score one response: ``sample`` holds the keyword arguments ``data_source``,
        ``solution_str`` (the decoded response), ``ground_truth`` and ``extra_info`` (the
        row's ``reward_model.ground_truth`` and ``extra_info``). The function gets those it
        declares, plus its ``reward.function_args`` options (or
        ``reward.custom_function.kwargs``). Returns ``(score, extras)``: a finite float and
        the other fields of a dict result (``{}`` for a bare number); a :class:`ScoringError`
        when the result is no score."""
        return normalize_result(self(**sample), self.label)

    def score_batch(self, **columns: Sequence[Any]) -> list[tuple[float, dict[str, Any]]]:
        """Score a batch: ``columns`` holds the keyword arguments ``data_sources``,
        ``solution_strs``, ``ground_truths`` and ``extra_infos``, one list each. A batch
        function is called once, a per-sample one once per row; one ``(score, extras)`` per
        row, in order."""
        size = len(columns["solution_strs"])
        if not self.batch:
            pairs = list(zip(SAMPLE_PARAMS, BATCH_PARAMS, strict=True))
            return [
                self.score_sample(**{name: columns[column][i] for name, column in pairs})
                for i in range(size)
            ]
        results = self(**columns)
        if isinstance(results, (str, bytes, Mapping)) or not isinstance(results, Iterable):
            raise ScoringError(
                f"{self.label} returned {type(results).__name__} for a batch; return a list "
                "with one score per sample"
            )
        results = list(results)
        if len(results) != size:
            raise ScoringError(
                f"{self.label} returned {len(results)} scores for a batch of {size}; return "
                "one per sample"
            )
        return [normalize_result(result, self.label) for result in results]


_LOOP: asyncio.AbstractEventLoop | None = None


def run_awaitable(result: Any) -> Any:
    """The value of ``result``, running it to completion first if it is awaitable."""
    if not inspect.isawaitable(result):
        return result
    global _LOOP
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise ScoringError(
            "an async scoring function was called from inside a running event loop; "
            "await it yourself there"
        )
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP.run_until_complete(_as_coroutine(result))


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable


def normalize_result(result: Any, label: str) -> tuple[float, dict[str, Any]]:
    """``0.5`` -> (0.5, {}); ``{"score": 1, "acc": True}`` -> (1.0, that dict).

    The score must be a finite number; numpy and torch scalars in a dict become Python
    values so the extra columns are plain.
    """
    extras: dict[str, Any] = {}
    score = result
    if isinstance(result, Mapping):
        if "score" not in result:
            keys = ", ".join(map(str, result)) or "none"
            raise ScoringError(f"{label} returned a dict without 'score' (keys: {keys})")
        extras = {str(k): _plain(v) for k, v in result.items()}
        score = result["score"]
    value = _as_float(score)
    if value is None:
        raise ScoringError(
            f"{label} returned {type(score).__name__} {repr(score)[:40]}; return a number or a "
            "dict with a numeric 'score'"
        )
    if not math.isfinite(value):
        raise ScoringError(f"{label} returned a score of {value}; scores must be finite")
    if extras:
        extras["score"] = value
    return value, extras


def _as_float(value: Any) -> float | None:
    if isinstance(value, Real):
        return float(value)
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item) and getattr(value, "ndim", 0) == 0:
        try:
            return _as_float(item())
        except (TypeError, ValueError):
            return None
    return None


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        try:
            return item()
        except (TypeError, ValueError):
            return value
    return value


# --------------------------------------------------------------------------------------------
# Resolving a data source to its scorer
# --------------------------------------------------------------------------------------------


def load_custom_function(config: Any) -> Scorer:
    """The scorer of ``reward.custom_function`` (path, name, kwargs), checked now."""
    path = Path(config.path).expanduser()
    function = FileFunction(str(path.resolve()), config.name)
    function.load()
    label = f"reward function {config.name!r} from {config.path}"
    scorer = Scorer.wrap(function, label, config.kwargs)
    return scorer


def make_resolver(recipe: Any, plugins: PluginManager) -> Callable[[str], Scorer]:
    """``resolve(data_source) -> Scorer`` for a recipe: the custom function when
    ``reward.custom_function.path`` is set, else the registered function whose name (or glob
    pattern) matches the data source. Unknown data sources raise a one-line
    :class:`~plugrl.errors.DataError` listing the registered ones and how to add one.

    The custom function's file is imported and checked here, so a wrong path or name fails
    at start-up.
    """
    custom = recipe.reward.custom_function
    if custom.path:
        scorer = load_custom_function(custom)
        return _FixedResolver(scorer)
    options = {name: function_options(recipe, name, plugins) for name in _function_args(recipe)}
    return _RegistryResolver(plugins.registry("reward_functions"), options)


def _function_args(recipe: Any) -> dict[str, Any]:
    return getattr(recipe.reward, "function_args", None) or {}


@attrs.define
class _FixedResolver:
    scorer: Scorer

    def __call__(self, data_source: str) -> Scorer:
        return self.scorer


@attrs.define
class _RegistryResolver:
    registry: Any
    options: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    """``reward.function_args``, checked: keyword arguments by registered name."""
    cache: dict[str, Scorer] = attrs.field(factory=dict)

    def __call__(self, data_source: str) -> Scorer:
        if data_source in self.cache:
            return self.cache[data_source]
        entry = self.registry.match(str(data_source))
        if entry is None:
            names = ", ".join(self.registry.names()) or "none"
            raise DataError(
                f"no reward function for data_source {data_source!r} (registered: {names}); "
                f"{HOW_TO_ADD}"
            )
        label = f"reward function {entry.name!r} (plugin {entry.plugin!r})"
        scorer = Scorer.wrap(entry.load(), label, self.options.get(entry.name) or None)
        self.cache[data_source] = scorer
        return scorer


def function_options(recipe: Any, name: str, plugins: PluginManager) -> dict[str, Any]:
    """The options ``reward.function_args`` gives the scoring function registered as ``name``,
    checked by its config class, as keyword arguments (``{}`` when it has none)."""
    key = f"reward.function_args.{name}"
    args = recipe.reward.function_args.get(name)
    registry = plugins.registry("reward_functions")
    if name not in registry:
        raise RecipeError(registry.unknown(name).bare_message, key=key)
    entry = registry.get(name)
    config_cls = entry.load_config()
    if args is None:
        return {}
    if config_cls is None:
        raise RecipeError(
            f"reward function {name!r} (plugin {entry.plugin!r}) takes no options, got "
            f"{', '.join(map(str, args)) if isinstance(args, Mapping) else describe_value(args)}",
            key=key,
        )
    return attrs.asdict(structure(config_cls, args, key))
