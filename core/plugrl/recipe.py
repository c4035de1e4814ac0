"""Recipes: YAML files (plus ``a.b.c=value`` overrides) read into attrs config classes.

A recipe has one section per part. Sections whose part is chosen by a plugin (``device``,
``actor``, ``rollout``, ``reward``, ``scheduler``) are read into the chosen plugin's config
class, which extends the core's base class for that section; the core owns the others.

Composition: a file's ``defaults: [base.yaml, ...]`` are read first (paths relative to the
file), then the file, then the command-line overrides; mappings merge key by key, anything
else replaces. Every error is a :class:`~plugrl.errors.RecipeError` with a one-line message
that names the key and the fix.
"""

from __future__ import annotations

import copy
import difflib
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import cattrs
import yaml

from plugrl.config import ConfigValueError, non_negative, option, positive, section
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.algorithm import AlgorithmConfig
from plugrl.parts.backend import ActorConfig, CriticConfig
from plugrl.parts.device import DeviceConfig
from plugrl.parts.reward import RewardConfig
from plugrl.parts.rollout import RolloutConfig
from plugrl.parts.scheduler import SchedulerConfig
from plugrl.plugins import PluginManager, get_plugin_manager

# --------------------------------------------------------------------------------------------
# Sections the core owns
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class ModelConfig:
    """The ``model`` section: the policy to train."""

    path: str | None = option(
        None, "Hugging Face model folder (local path).", verl="actor_rollout_ref.model.path"
    )
    tokenizer_path: str | None = option(
        None, "Tokenizer folder; unset: model.path.", verl="data.tokenizer"
    )
    trust_remote_code: bool = option(
        False,
        "Allow model code shipped with the weights.",
        verl="actor_rollout_ref.model.trust_remote_code",
    )
    dtype: str = option(
        "bfloat16",
        "Parameter dtype for compute (float32 on CPU is safest).",
        choices=["float32", "bfloat16", "float16"],
        verl="actor_rollout_ref.actor.fsdp_config.model_dtype",
    )
    enable_gradient_checkpointing: bool = option(
        False,
        "Recompute activations in backward to save memory.",
        verl="actor_rollout_ref.model.enable_gradient_checkpointing",
    )
    override_config: dict[str, Any] = option(
        factory=dict,
        help="Fields set on the model's config at load (attention_dropout: 0.0).",
        verl="actor_rollout_ref.model.override_config",
    )


@attrs.define(kw_only=True)
class DataConfig:
    """The ``data`` section: parquet files in verl's schema."""

    train_files: list[str] = option(
        factory=list, help="Training parquet files.", verl="data.train_files"
    )
    val_files: list[str] = option(
        factory=list, help="Validation parquet files.", verl="data.val_files"
    )
    prompt_key: str = option("prompt", "Column with the chat messages.", verl="data.prompt_key")
    max_prompt_length: int = option(
        512,
        "Prompt tokens allowed (after the chat template).",
        verl="data.max_prompt_length",
        validator=positive,
    )
    max_response_length: int = option(
        512,
        "Response tokens generated at most.",
        verl="data.max_response_length",
        validator=positive,
    )
    train_batch_size: int = option(
        1024, "Prompts per training step.", verl="data.train_batch_size", validator=positive
    )
    gen_batch_size: int | None = option(
        None,
        "Prompts per generation round when DAPO dynamic sampling (algorithm.filter_groups) "
        "may need several rounds per step; unset: train_batch_size.",
        verl="data.gen_batch_size",
        validator=positive,
    )
    val_batch_size: int | None = option(
        None,
        "Prompts per validation batch; unset: all.",
        verl="data.val_batch_size",
        validator=positive,
    )
    truncation: str = option(
        "error",
        "Over-long prompts: stop with the row named, or cut from the left, right or middle.",
        choices=["error", "left", "right", "middle"],
        verl="data.truncation",
    )
    filter_overlong_prompts: bool = option(
        False,
        "Drop over-long prompts at load instead of applying truncation.",
        verl="data.filter_overlong_prompts",
    )
    shuffle: bool = option(True, "Shuffle the training data every epoch.", verl="data.shuffle")
    seed: int = option(1, "Seed of the data order.", verl="data.seed")
    apply_chat_template: bool = option(
        True, "Render prompts with the tokenizer's chat template; false joins the messages."
    )


@attrs.define(kw_only=True)
class TrainerConfig:
    """The ``trainer`` section: length of the run, validation, checkpoints, logging."""

    project_name: str = option(
        "plugrl", "Project name (run folder, loggers).", verl="trainer.project_name"
    )
    experiment_name: str = option(
        "run", "Experiment name (run folder, loggers).", verl="trainer.experiment_name"
    )
    total_epochs: int = option(
        1, "Passes over the training data.", verl="trainer.total_epochs", validator=positive
    )
    total_training_steps: int | None = option(
        None,
        "Stop after this many steps; unset: total_epochs decides.",
        verl="trainer.total_training_steps",
        validator=positive,
    )
    test_freq: int = option(
        -1, "Validate every N steps; -1 never (except at the end).", verl="trainer.test_freq"
    )
    val_before_train: bool = option(
        True, "Validate once before the first step.", verl="trainer.val_before_train"
    )
    save_freq: int = option(
        -1, "Checkpoint every N steps; -1 only at the end.", verl="trainer.save_freq"
    )
    default_local_dir: str | None = option(
        None,
        "Run folder (checkpoints, metrics); unset: runs/<project_name>/<experiment_name>.",
        verl="trainer.default_local_dir",
    )
    resume_mode: str = option(
        "auto",
        "'auto' resumes from the run folder's latest checkpoint, 'disable' starts "
        "fresh, or a path to a global_step_N folder.",
        verl="trainer.resume_mode",
    )
    max_ckpt_to_keep: int | None = option(
        None,
        "Checkpoints kept; unset keeps all.",
        verl="trainer.max_actor_ckpt_to_keep",
        validator=positive,
    )
    checkpoint_checksums: bool = option(
        True,
        "Record a CRC32 of every checkpoint file and check it on resume, so a file corrupted "
        "in place is refused; costs one read of the checkpoint per save and per resume (turn "
        "off for checkpoints of hundreds of GB on slow storage).",
    )
    logger: list[str] = option(
        factory=lambda: ["console", "jsonl"],
        help="Metric loggers.",
        verl="trainer.logger",
        registry="loggers",
    )
    export_hf: bool = option(
        False,
        "After the last step, write the actor as a Hugging Face folder (<run folder>/hf_model) "
        "that transformers and vLLM load.",
    )
    log_val_generations: int = option(
        0,
        "Validation samples printed per validation.",
        verl="trainer.log_val_generations",
        validator=non_negative,
    )
    seed: int = option(42, "Seed of model initialisation and sampling.")
    nnodes: int = option(1, "Nodes in the cluster.", verl="trainer.nnodes", validator=positive)
    n_gpus_per_node: int = option(
        1,
        "Ranks per node (devices, or CPU processes on cpu).",
        verl="trainer.n_gpus_per_node",
        validator=positive,
    )


@attrs.define(kw_only=True)
class ClusterConfig:
    """The ``cluster`` section. ``cluster: ray`` is short for ``cluster: {mode: ray}``."""

    mode: str = option(
        "local",
        "'local': one process; 'ray': Ray actors, on the cluster at "
        "address or on a local Ray started for the run.",
        choices=["local", "ray"],
    )
    address: str | None = option(
        None, "Ray address to join (ray://host:10001 or auto); unset starts a local Ray."
    )
    num_cpus: int | None = option(
        None, "CPUs of a locally started Ray; unset: all.", validator=positive
    )


@attrs.define(kw_only=True)
class Recipe:
    """A whole run."""

    model: ModelConfig = section(ModelConfig, "The policy model.")
    data: DataConfig = section(DataConfig, "Training and validation data.")
    device: DeviceConfig = section(DeviceConfig, "Device kind.")
    actor: ActorConfig = section(ActorConfig, "Actor training (backend-specific keys too).")
    critic: CriticConfig = section(CriticConfig, "Value model, for estimators that need it.")
    rollout: RolloutConfig = section(RolloutConfig, "Generation (engine-specific keys too).")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "Advantages, KL, dynamic sampling.")
    reward: RewardConfig = section(RewardConfig, "Scoring (manager-specific keys too).")
    scheduler: SchedulerConfig = section(SchedulerConfig, "The training loop.")
    trainer: TrainerConfig = section(TrainerConfig, "Length, validation, checkpoints, logs.")
    cluster: ClusterConfig = section(ClusterConfig, "One process or Ray.")

    def to_dict(self) -> dict[str, Any]:
        # each section by its runtime class: a plugin's config class adds keys to the base
        return {
            field.name: converter().unstructure(
                getattr(self, field.name), unstructure_as=type(getattr(self, field.name))
            )
            for field in attrs.fields(type(self))
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    @property
    def run_dir(self) -> Path:
        t = self.trainer
        return Path(t.default_local_dir or Path("runs") / t.project_name / t.experiment_name)


@attrs.frozen
class PluginSection:
    """A section whose config class is chosen by one of its keys (the selector)."""

    base: type
    selector: str
    kind: str


PLUGIN_SECTIONS: dict[str, PluginSection] = {
    "device": PluginSection(DeviceConfig, "name", "devices"),
    "actor": PluginSection(ActorConfig, "backend", "training_backends"),
    "rollout": PluginSection(RolloutConfig, "engine", "rollout_engines"),
    "reward": PluginSection(RewardConfig, "manager", "reward_managers"),
    "scheduler": PluginSection(SchedulerConfig, "name", "schedulers"),
}
# Sections that accept a bare string as short for {selector: string}.
SHORTHAND: dict[str, str] = {
    **{name: spec.selector for name, spec in PLUGIN_SECTIONS.items()},
    "cluster": "mode",
}
# Options that name a registered part or say "auto" (chosen at start-up).
AUTO_KEYS = frozenset({"device.name", "rollout.weight_transport"})
# Options whose value is a part's args: (section, key) -> (kind, the key naming the part).
PART_ARGS: dict[tuple[str, str], tuple[str, str]] = {
    ("algorithm", "adv_estimator_args"): ("advantage_estimators", "adv_estimator"),
    ("actor", "policy_loss_args"): ("policy_losses", "policy_loss"),
}


# --------------------------------------------------------------------------------------------
# Loading and composing YAML
# --------------------------------------------------------------------------------------------


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"recipe file {str(path)!r} not found; check the path") from None
    except OSError as exc:
        raise RecipeError(f"cannot read recipe file {str(path)!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(f"{path}:{where} is not valid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path} must be a mapping of sections, not a {type(data).__name__}")
    return data


def compose_file(path: str | Path, _stack: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a recipe file with its ``defaults`` merged in (recursively)."""
    path = Path(path)
    resolved = path.resolve()
    if resolved in _stack:
        cycle = " -> ".join(str(p.name) for p in (*_stack, resolved))
        raise RecipeError(f"recipe defaults form a cycle: {cycle}")
    data = read_yaml(path)
    defaults = data.pop("defaults", []) or []
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise RecipeError("must be a list of recipe file paths", key=f"{path}: defaults")
    merged: dict[str, Any] = {}
    for default in defaults:
        base = compose_file(path.parent / default, (*_stack, resolved))
        merged = deep_merge(merged, base)
    return deep_merge(merged, normalize_shorthand(data))


def normalize_shorthand(data: Mapping[str, Any]) -> dict[str, Any]:
    """``device: cuda`` -> ``device: {name: cuda}`` (and the like for other sections)."""
    out = dict(data)
    for name, selector in SHORTHAND.items():
        if isinstance(out.get(name), str):
            out[name] = {selector: out[name]}
    return out


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``update`` into a copy of ``base``: mappings key by key, anything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"actor.optim.lr=1e-6"`` -> (["actor", "optim", "lr"], 1e-06).

    The value is read as YAML (``[a, b]``, ``null``, ``true``, numbers); the field's type
    decides the rest (``1e-6`` becomes a float where a float is expected).
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")) or " " in key:
        raise RecipeError(f"override {text!r} is not KEY=VALUE (for example actor.optim.lr=1e-6)")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.split("."), parsed


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    out = copy.deepcopy(dict(data))
    for text in overrides:
        path, value = parse_override(text)
        update: Any = value
        for part in reversed(path):
            update = {part: update}
        normalized = normalize_shorthand(update)
        if len(path) > 1 and path[0] in SHORTHAND and isinstance(out.get(path[0]), str):
            out[path[0]] = {SHORTHAND[path[0]]: out[path[0]]}
        out = deep_merge(out, normalized)
    return out


# --------------------------------------------------------------------------------------------
# Structuring into attrs classes
# --------------------------------------------------------------------------------------------


def _structure_float(value: Any, _: Any) -> float:
    if isinstance(value, bool):
        raise TypeError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise TypeError(f"expected a number, got {value!r}")


def _structure_int(value: Any, _: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise TypeError(f"expected an integer, got {value!r}")


def _structure_bool(value: Any, _: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise TypeError(f"expected true or false, got {value!r}")


def _structure_str(value: Any, _: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise TypeError(f"expected a string, got {value!r}")


def _structure_str_list(value: Any, _: Any) -> list[str]:
    # `train_files: one.parquet` is common enough to accept a single string
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [_structure_str(item, str) for item in value]
    raise TypeError(f"expected a list of strings, got {value!r}")


@functools.cache
def converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(float, _structure_float)
    conv.register_structure_hook(int, _structure_int)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook(str, _structure_str)
    conv.register_structure_hook_func(lambda tp: tp == list[str], _structure_str_list)
    return conv


def _fields(cls: type) -> dict[str, attrs.Attribute]:
    attrs.resolve_types(cls)
    return {f.name: f for f in attrs.fields(cls)}


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def structure(cls: type, raw: Any, key: str) -> Any:
    """Read ``raw`` (a mapping) into ``cls``: unknown keys, wrong types and invalid values give
    a :class:`RecipeError` naming the dotted key."""
    check_keys(cls, raw, key)
    try:
        return converter().structure(raw, cls)
    except Exception as exc:
        raise _type_error(cls, raw, key, exc) from None


def check_keys(cls: type, raw: Any, key: str) -> None:
    """Reject keys ``cls`` does not have, suggesting the closest (or the plugrl name of a verl
    key)."""
    fields = _fields(cls)
    if not isinstance(raw, Mapping):
        raise RecipeError(
            f"expected a section of keys ({', '.join(fields)}), got {_describe(raw)}", key=key
        )
    for name, value in raw.items():
        dotted = f"{key}.{name}" if key else str(name)
        if name not in fields:
            raise unknown_key_error(cls, str(name), key, value)
        ftype = fields[name].type
        if isinstance(ftype, type) and attrs.has(ftype) and value is not None:
            check_keys(ftype, value, dotted)


def _leaf_keys(prefix: str, value: Any) -> Iterator[str]:
    if isinstance(value, Mapping) and value:
        for name, sub in value.items():
            yield from _leaf_keys(f"{prefix}.{name}", sub)
    else:
        yield prefix


def unknown_key_error(cls: type, name: str, parent: str, value: Any = None) -> RecipeError:
    fields = list(_fields(cls))
    dotted = f"{parent}.{name}" if parent else name
    for leaf in _leaf_keys(dotted, value):
        verl_hit = _verl_index().get(leaf)
        if verl_hit:
            return RecipeError(
                f"unknown key; {leaf!r} is verl's name, plugrl's is {verl_hit!r}", key=leaf
            )
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    if close:
        fix = f"did you mean {(parent + '.' if parent else '') + close[0]!r}?"
    else:
        fix = f"valid keys: {', '.join(fields)}"
    return RecipeError(f"unknown key; {fix}", key=dotted)


def _error_path(exc: BaseException) -> tuple[list[str], BaseException]:
    """Follow a cattrs error group down to its first leaf, collecting attribute names."""
    path: list[str] = []
    # exception groups (cattrs uses the exceptiongroup backport on Python 3.10)
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
        for note in getattr(exc, "__notes__", None) or []:
            if "@ attribute " in note:
                path.append(note.rsplit("@ attribute ", 1)[1].strip())
    if isinstance(exc, ConfigValueError):
        path.append(exc.attribute)
    return path, exc


def _type_error(cls: type, raw: Mapping[str, Any], key: str, exc: Exception) -> RecipeError:
    """Turn a cattrs/attrs failure into one line that names the dotted key."""
    path, leaf = _error_path(exc)
    value: Any = raw
    for name in path:
        value = value.get(name) if isinstance(value, Mapping) else None
    dotted = ".".join([key, *path]) if key else ".".join(path)
    message = (
        leaf.message
        if isinstance(leaf, ConfigValueError)
        else (str(leaf.args[0]) if leaf.args else type(leaf).__name__)
    )
    if "got" not in message:
        message += f" (got {_describe(value)})"
    return RecipeError(message, key=dotted or None)


# --------------------------------------------------------------------------------------------
# Building a Recipe
# --------------------------------------------------------------------------------------------


def section_class(name: str, raw: Mapping[str, Any], plugins: PluginManager) -> type:
    """The config class for a recipe section: the chosen plugin's for plugin sections."""
    spec = PLUGIN_SECTIONS.get(name)
    if spec is None:
        return _fields(Recipe)[name].type
    chosen = raw.get(spec.selector, _fields(spec.base)[spec.selector].default)
    if not isinstance(chosen, str):
        raise RecipeError(
            f"expected a name, got {_describe(chosen)}", key=f"{name}.{spec.selector}"
        )
    if name == "device" and chosen == "auto":
        return spec.base
    entry = plugins.registry(spec.kind).get(chosen)
    config_cls = entry.load_config() or spec.base
    if not (isinstance(config_cls, type) and issubclass(config_cls, spec.base)):
        raise PluginError(
            f"plugin {entry.plugin!r} registered {chosen!r} with config "
            f"{config_cls!r}, which must subclass {spec.base.__module__}.{spec.base.__name__}"
        )
    return config_cls


def build_recipe(raw: Mapping[str, Any], plugins: PluginManager | None = None) -> Recipe:
    """Validate a composed recipe mapping into a :class:`Recipe`, resolving plugin sections."""
    plugins = plugins or get_plugin_manager()
    raw = normalize_shorthand(raw)
    recipe_fields = _fields(Recipe)
    for name, value in raw.items():
        if name not in recipe_fields:
            raise unknown_key_error(Recipe, str(name), "", value)
    values: dict[str, Any] = {}
    for name in recipe_fields:
        section_raw = raw.get(name) or {}
        if not isinstance(section_raw, Mapping):
            raise RecipeError(f"expected a section of keys, got {_describe(section_raw)}", key=name)
        cls = section_class(name, section_raw, plugins)
        values[name] = structure(cls, dict(section_raw), name)
    recipe = Recipe(**values)
    validate_names(recipe, plugins)
    return recipe


def iter_options(obj: Any, prefix: str = "") -> Iterator[tuple[str, attrs.Attribute, Any]]:
    """Every leaf option of a config object: (dotted key, attribute, value)."""
    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        key = f"{prefix}{field.name}"
        if attrs.has(type(value)):
            yield from iter_options(value, key + ".")
        else:
            yield key, field, value


def validate_names(recipe: Recipe, plugins: PluginManager) -> None:
    """Check every option that names a registered part, and the args of chosen parts."""
    for key, field, value in iter_options(recipe):
        kind = field.metadata.get("registry")
        if not kind or (key in AUTO_KEYS and value == "auto"):
            continue
        registry = plugins.registry(kind)
        for name in value if isinstance(value, list) else [value]:
            if name not in registry:
                raise RecipeError(registry.unknown(name).bare_message, key=key)
            registry.get(name).check_available()
    for (section_name, args_key), (kind, name_key) in PART_ARGS.items():
        owner = getattr(recipe, section_name)
        entry = plugins.registry(kind).get(getattr(owner, name_key))
        args = getattr(owner, args_key)
        config_cls = entry.load_config()
        if config_cls is None:
            if args:
                raise RecipeError(
                    f"{entry.name!r} takes no options, got {', '.join(map(str, args))}",
                    key=f"{section_name}.{args_key}",
                )
            continue
        structure(config_cls, dict(args), f"{section_name}.{args_key}")


def part_args(
    recipe: Recipe, section_name: str, args_key: str, plugins: PluginManager | None = None
) -> Any:
    """The chosen part's args (``algorithm.adv_estimator_args``) as its config object, or
    ``None`` when the part registered no config class."""
    plugins = plugins or get_plugin_manager()
    kind, name_key = PART_ARGS[(section_name, args_key)]
    owner = getattr(recipe, section_name)
    config_cls = plugins.registry(kind).get(getattr(owner, name_key)).load_config()
    if config_cls is None:
        return None
    return structure(config_cls, dict(getattr(owner, args_key)), f"{section_name}.{args_key}")


def shipped_recipes() -> dict[str, Path]:
    """The recipes installed with plugrl, by name (``quickstart`` -> its YAML file)."""
    from importlib import resources

    try:
        folder = resources.files("plugrl_recipes")
    except ModuleNotFoundError:
        return {}
    return {
        entry.name.removesuffix(".yaml"): Path(str(entry))
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    }


def find_recipe(name: str | Path) -> Path:
    """A recipe file: the path itself, or for a bare name (``quickstart``) the shipped recipe."""
    path = Path(name)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    shipped = shipped_recipes()
    if str(name) in shipped:
        return shipped[str(name)]
    raise RecipeError(
        f"recipe {str(name)!r} is neither a file here nor a shipped recipe; shipped: "
        f"{', '.join(sorted(shipped)) or 'none'}"
    )


def load_recipe(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    plugins: PluginManager | None = None,
) -> Recipe:
    """Read a recipe file (or none: all defaults), apply overrides, validate."""
    raw = compose_file(find_recipe(path)) if path is not None else {}
    return build_recipe(apply_overrides(raw, overrides), plugins)


# --------------------------------------------------------------------------------------------
# Explaining keys
# --------------------------------------------------------------------------------------------


@attrs.frozen
class KeyInfo:
    key: str
    help: str
    type: str
    default: Any
    verl: str | None
    choices: list[Any] | None
    owner: str  # "core" or "plugin NAME"
    is_section: bool = False
    children: tuple[str, ...] = ()


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not getattr(tp, "__args__", None):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _default_of(field: attrs.Attribute) -> Any:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()
    return None if default is attrs.NOTHING else default


def _config_classes(section_name: str, plugins: PluginManager) -> list[tuple[type, str]]:
    """The base class of a section, then each registered plugin config class extending it."""
    spec = PLUGIN_SECTIONS.get(section_name)
    if spec is None:
        return [(_fields(Recipe)[section_name].type, "core")]
    classes: list[tuple[type, str]] = [(spec.base, "core")]
    for entry in plugins.registry(spec.kind):
        try:
            cls = entry.load_config()
        except PluginError:
            continue
        extends_base = isinstance(cls, type) and issubclass(cls, spec.base)
        if extends_base and cls is not spec.base and all(cls is not c for c, _ in classes):
            classes.append((cls, f"{entry.name} ({entry.plugin})"))
    return classes


def explain(key: str, plugins: PluginManager | None = None) -> KeyInfo:
    """Describe a dotted recipe key (or a section): meaning, type, default, verl name."""
    plugins = plugins or get_plugin_manager()
    parts = key.split(".")
    recipe_fields = _fields(Recipe)
    if parts[0] not in recipe_fields:
        raise unknown_key_error(Recipe, parts[0], "")
    if len(parts) == 1:
        children: list[str] = []
        for cls, _owner in _config_classes(parts[0], plugins):
            children += [n for n in _fields(cls) if n not in children]
        field = recipe_fields[parts[0]]
        return KeyInfo(
            key,
            field.metadata.get("help", ""),
            "section",
            None,
            None,
            None,
            "core",
            True,
            tuple(children),
        )
    last_error: RecipeError | None = None
    for cls, owner in _config_classes(parts[0], plugins):
        try:
            return _explain_in(cls, parts, owner, plugins)
        except RecipeError as exc:
            last_error = last_error or exc
    assert last_error is not None
    raise last_error


def _explain_in(cls: type, parts: list[str], owner: str, plugins: PluginManager) -> KeyInfo:
    current = cls
    for depth, name in enumerate(parts[1:], start=1):
        fields = _fields(current)
        if name not in fields:
            raise unknown_key_error(current, name, ".".join(parts[:depth]))
        field = fields[name]
        ftype = field.type
        if depth == len(parts) - 1:
            key = ".".join(parts)
            if isinstance(ftype, type) and attrs.has(ftype):
                return KeyInfo(
                    key,
                    field.metadata.get("help", ""),
                    "section",
                    None,
                    field.metadata.get("verl"),
                    None,
                    owner,
                    True,
                    tuple(_fields(ftype)),
                )
            choices = field.metadata.get("choices")
            kind = field.metadata.get("registry")
            if kind:
                choices = plugins.registry(kind).names()
            return KeyInfo(
                key,
                field.metadata.get("help", ""),
                _type_name(ftype),
                _default_of(field),
                field.metadata.get("verl"),
                list(choices) if choices is not None else None,
                owner,
            )
        if not (isinstance(ftype, type) and attrs.has(ftype)):
            raise RecipeError(
                f"{field.name!r} is an option, not a section", key=".".join(parts[: depth + 1])
            )
        current = ftype
    raise RecipeError("not found", key=".".join(parts))


@functools.cache
def _verl_index() -> dict[str, str]:
    """verl key -> plugrl key, for the core's classes (plugin classes are not indexed here)."""
    index: dict[str, str] = {}

    def walk(cls: type, prefix: str) -> None:
        for field in attrs.fields(cls):
            ftype = _fields(cls)[field.name].type
            verl = field.metadata.get("verl")
            if verl and verl not in index:
                index[verl] = prefix + field.name
            if isinstance(ftype, type) and attrs.has(ftype):
                walk(ftype, prefix + field.name + ".")

    walk(Recipe, "")
    return index
