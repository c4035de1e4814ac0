"""The run folder: created and checked before anything is written, the model folders checked
before anything starts, a resume of the folder's checkpoint by a recipe of another experiment
stopped before anything starts, and the recipe of each segment of a run kept beside its
checkpoints."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import yaml

from plugrl.errors import RecipeError
from plugrl.recipe import Recipe, path_keys
from plugrl.recipe.paths import resolve_value
from plugrl.state.checkpoint import LATEST_FILE, CheckpointManager, step_dir_name

if TYPE_CHECKING:
    from plugrl.plugin.manager import PluginManager

logger = logging.getLogger("plugrl.run")


RECIPE_FILE = "recipe.yaml"

# What a run may change when it continues the run of its folder, and why that keeps it one
# experiment. Any other key that differs from the recipe the folder recorded last (plugins'
# keys included) makes it another experiment: :func:`check_resume` stops such a run.
NOT_EXPERIMENT_KEYS: dict[str, str] = {
    # how long and where: the steps already taken stay what they were
    "trainer.total_training_steps": "how long the run trains (raise it to train further)",
    "trainer.total_epochs": "how long the run trains (raise it to train further)",
    "scheduler.total_rollout_steps": "how long a fully-async run trains",
    "trainer.default_local_dir": "the run folder itself (a relative or absolute path to it)",
    "trainer.resume_mode": "how the run continues, not what it trains",
    # what is recorded and how often
    "trainer.project_name": "a name for the trackers",
    "trainer.experiment_name": "a name for the trackers",
    "trainer.logger": "where metrics go",
    "trainer.memory_check": "a check before the run starts, not what it trains",
    "trainer.device_memory_gib": "what the memory check judges by, not what the run trains",
    "trainer.test_freq": "how often the run validates",
    "trainer.val_before_train": "whether the run validates before its first step",
    "trainer.log_val_generations": "how many validation responses are logged",
    "trainer.save_freq": "how often the run saves checkpoints",
    "trainer.max_ckpt_to_keep": "how many checkpoints are kept",
    "trainer.checkpoint_checksums": "how checkpoints are checked",
    "trainer.export_hf": "whether the trained model is exported at the end",
    "trainer.rollout_data_dir": "where the scored responses are dumped",
    "trainer.validation_data_dir": "where the scored validation responses are dumped",
    "trainer.health": "which learning-health checks watch the run (every key below it); a "
    "run stopped by one resumes with trainer.health.mode=warn",
    "data.val_batch_size": "how validation prompts are batched, not which",
    # where the run computes: the same updates on other devices or processes
    "cluster.mode": "one process or Ray: the same run, placed differently",
    "cluster.address": "which Ray cluster hosts the run",
    "cluster.num_cpus": "the CPUs of a local Ray",
    "launch": "how plugrl launch puts the run on a cluster (every key below it), not what it "
    "trains",
    "device.name": "the device kind the run moves to",
    "trainer.nnodes": "the ranks the global batch is split over (its loss is the same)",
    "trainer.n_gpus_per_node": "the ranks the global batch is split over (its loss is the same)",
    "rollout.nnodes": "the devices of the engines",
    "rollout.n_gpus_per_node": "the devices of the engines",
    # memory and speed: what lets a run that ran out of memory continue
    "actor.ppo_micro_batch_size_per_gpu": "micro-batches accumulate to the same gradient",
    "actor.log_prob_micro_batch_size_per_gpu": "micro-batches of the log-prob pass",
    "critic.ppo_micro_batch_size_per_gpu": "micro-batches accumulate to the same gradient",
    "actor.use_dynamic_bsz": "micro-batches packed by tokens: the same gradient",
    "actor.ppo_max_token_len_per_gpu": "the size of packed micro-batches",
    "actor.param_offload": "where the weights wait between steps",
    "actor.reshard_after_forward": "memory against speed of the sharded model",
    "actor.use_remove_padding": "packed or padded forwards: the same log-probs",
    "actor.ulysses_sequence_parallel_size": "sequences split over ranks: the same log-probs",
    "model.enable_gradient_checkpointing": "memory against speed of the backward pass",
    "rollout.gpu_memory_utilization": "the engines' memory",
    "rollout.free_cache_engine": "whether colocated engines free memory while training",
    "rollout.weight_transport": "how weights reach the engines, not what they are",
    "rollout.lora_sync": "LoRA adapters sent alone or merged: the same model in the engines",
    "rollout.update_weights_bucket_megabytes": "how weights reach the engines",
    "rollout.update_weights_timeout_s": "how long a weight push may take",
    "rollout.max_engine_restarts": "how often a dead engine is replaced",
    "reward.overlap": "when responses are scored (as they finish or after the batch), not how",
    "reward.components_concurrently": "whether reward components score at once or in turn",
}


SHOWN_CHANGES = 3
"""Differing keys a message names before it says how many more there are."""

_ABSENT = object()
"""The value of a key one of two recipes lacks (a key of a plugin the other did not choose)."""


def _recipe_files(run_dir: Path) -> list[Path]:
    """``recipe.yaml``, then ``recipe.2.yaml``, ``recipe.3.yaml``...: one per segment."""
    files = [run_dir / RECIPE_FILE] if (run_dir / RECIPE_FILE).exists() else []
    numbered = []
    for path in run_dir.glob("recipe.*.yaml"):
        middle = path.name[len("recipe.") : -len(".yaml")]
        if middle.isdigit():
            numbered.append((int(middle), path))
    return files + [path for _, path in sorted(numbered)]


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys of the leaves of a nested mapping (an empty mapping is a leaf)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def recipe_changes(
    before: Mapping[str, Any], after: Mapping[str, Any], paths: Collection[str] | None = None
) -> list[str]:
    """The dotted keys whose values differ between two recipes (as :meth:`Recipe.to_dict`
    gives them), in ``after``'s order, except :data:`NOT_EXPERIMENT_KEYS`. The values of the
    keys ``paths`` (unset: the path options of the core's sections) are compared as absolute
    paths, a relative one resolved against the working folder: a run folder recorded before
    recipes recorded their paths resolved compares with the run that resolves them."""
    if paths is None:
        paths = path_keys(Recipe())
    old, new = _flat(before), _flat(after)
    changed = []
    for key in [*new, *(key for key in old if key not in new)]:
        if not_experiment_key(key) or _named_below(key, old if key in new else new):
            continue
        was, now = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if key in paths:
            was, now = resolve_value(was, os.getcwd()), resolve_value(now, os.getcwd())
        if was != now:
            changed.append(key)
    return changed


def not_experiment_key(key: str) -> bool:
    """Whether ``key``, or a section above it (``trainer.health`` for
    ``trainer.health.mode``), is in :data:`NOT_EXPERIMENT_KEYS`."""
    parts = key.split(".")
    return any(".".join(parts[:end]) in NOT_EXPERIMENT_KEYS for end in range(1, len(parts) + 1))


def _named_below(key: str, flat: Mapping[str, Any]) -> bool:
    """Whether ``flat`` has keys below ``key``: a mapping that was empty on one side and not
    on the other, whose keys below are named instead."""
    return key not in flat and any(other.startswith(f"{key}.") for other in flat)


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(unset)"
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text.removesuffix("\n...").strip()
    return text if len(text) <= 40 else text[:37] + "..."


def describe_changes(
    before: Mapping[str, Any], after: Mapping[str, Any], keys: Sequence[str]
) -> str:
    """``key old -> new`` for the first :data:`SHOWN_CHANGES` keys, then ``and N more``."""
    old, new = _flat(before), _flat(after)
    shown = [
        f"{key} {_shown(old.get(key, _ABSENT))} -> {_shown(new.get(key, _ABSENT))}"
        for key in keys[:SHOWN_CHANGES]
    ]
    more = len(keys) - SHOWN_CHANGES
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def recorded_recipe(run_dir: str | Path) -> dict[str, Any] | None:
    """The recipe ``run_dir`` recorded last (its latest segment's), as a mapping; ``None``
    when it recorded none."""
    files = _recipe_files(Path(run_dir))
    if not files:
        return None
    return yaml.safe_load(files[-1].read_text(encoding="utf-8")) or {}


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint an ``auto`` resume of ``run_dir`` starts from, found without reading it
    (``latest_checkpointed_iteration.txt``, or when that names a missing folder the newest
    one), or ``None`` when the folder holds no checkpoint."""
    latest_file = run_dir / LATEST_FILE
    if not latest_file.exists():
        return None
    text = latest_file.read_text(encoding="utf-8").strip()
    named = run_dir / step_dir_name(int(text)) if text.isdigit() else None
    if named is not None and named.is_dir():
        return named
    steps = CheckpointManager(run_dir).steps()
    # an unreadable latest file is the resume's to report
    return run_dir / step_dir_name(steps[-1]) if steps else named


def _another_folder(run_dir: Path) -> Path:
    run_dir = run_dir if run_dir.name else run_dir.resolve()
    number = 2
    while run_dir.with_name(f"{run_dir.name}-{number}").exists():
        number += 1
    return run_dir.with_name(f"{run_dir.name}-{number}")


def check_resume(recipe: Recipe, run_dir: Path, plugins: PluginManager | None = None) -> None:
    """Stop a run, before anything starts, that would resume (``trainer.resume_mode: auto``)
    the checkpoint of a run of another experiment: one whose recipe differs from the recipe
    ``run_dir`` recorded last in a key that is not in :data:`NOT_EXPERIMENT_KEYS`. The one-line
    :class:`RecipeError` names the differing keys and the ways on: a folder of its own, a fresh
    start in this one, or resuming that checkpoint explicitly, by its path, to continue it with
    the changed recipe. ``disable`` and an explicit checkpoint path are never stopped.
    ``plugins`` tell which keys of reward components hold paths (see
    :func:`~plugrl.recipe.path_options`)."""
    if recipe.trainer.resume_mode != "auto":
        return
    checkpoint = latest_checkpoint(run_dir)
    recorded = recorded_recipe(run_dir) if checkpoint is not None else None
    if checkpoint is None or recorded is None:
        return
    now = recipe.to_dict()
    changed = _experiment_changes(recipe, recorded, now, path_keys(recipe, plugins))
    if not changed:
        return
    raise RecipeError(
        f"{run_dir} holds a checkpoint ({checkpoint.name}) of a run with another recipe: "
        f"{describe_changes(recorded, now, changed)}; give this run a folder of its own "
        f"(trainer.default_local_dir={_another_folder(run_dir)}), start afresh there "
        "(trainer.resume_mode=disable), or continue that run with this recipe "
        f"(trainer.resume_mode={checkpoint})",
        key="trainer.default_local_dir",
    )


def _experiment_changes(
    recipe: Recipe,
    recorded: Mapping[str, Any],
    now: Mapping[str, Any],
    paths: Collection[str],
) -> list[str]:
    """The keys in which ``recipe`` (``now`` as a mapping) changes the experiment
    ``recorded``; ``paths`` are the keys that hold paths (see :func:`recipe_changes`)."""
    recorded_keys = _flat(recorded)
    return [
        key
        for key in recipe_changes(recorded, now, paths)
        # an option added by a newer plugrl, at its default: the run as it was recorded
        if key in recorded_keys or not _at_its_default(recipe, key)
    ]


def _at_its_default(recipe: Recipe, dotted: str) -> bool:
    """Whether option ``dotted`` of ``recipe`` holds its config class's default."""
    owner: Any = recipe
    *sections, name = dotted.split(".")
    for section in sections:
        owner = getattr(owner, section, None)
    if owner is None or not attrs.has(type(owner)):
        return False
    field = attrs.fields_dict(type(owner)).get(name)
    if field is None or field.default is attrs.NOTHING:
        return False
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory(owner) if default.takes_self else default.factory()
    return getattr(owner, name) == default


def record_recipe(recipe: Recipe, run_dir: Path, plugins: PluginManager | None = None) -> Path:
    """Keep the recipe of each segment of a run: the first as ``recipe.yaml``, a resumed run
    whose recipe differs from the last one's as ``recipe.N.yaml`` (nothing is overwritten).
    A segment that continues a checkpoint with a recipe that differs in keys that change the
    experiment (by path: :func:`check_resume` stops ``auto`` resumes) is warned about."""
    run_dir.mkdir(parents=True, exist_ok=True)
    text = recipe.to_yaml()
    files = _recipe_files(run_dir)
    if not files:
        path = run_dir / RECIPE_FILE
        path.write_text(text, encoding="utf-8")
        return path
    last_text = files[-1].read_text(encoding="utf-8")
    if last_text == text:
        return files[-1]
    resume_mode = recipe.trainer.resume_mode
    continues = resume_mode != "disable" and (
        resume_mode != "auto" or latest_checkpoint(run_dir) is not None
    )
    last = yaml.safe_load(last_text) or {}
    now = recipe.to_dict()
    changed = _experiment_changes(recipe, last, now, path_keys(recipe, plugins))
    if continues and changed:
        logger.warning(
            "this run continues %s with a recipe that differs in %s: the steps before and "
            "after are not one experiment",
            run_dir,
            describe_changes(last, now, changed),
        )
    path = run_dir / f"recipe.{len(files) + 1}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first: the folders that
    creating ``path`` makes."""
    missing = []
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing.append(folder)
    return missing


def remove_empty_folders(folders: Sequence[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty; the first that holds anything,
    and every folder after it, stays. A run that fails before writing anything leaves no
    folder behind that it made, and never touches one that holds a file."""
    for folder in folders:
        try:
            folder.rmdir()  # refuses a folder that is not empty
        except OSError:
            return


def prepare_run_dir(recipe: Recipe) -> Path:
    """The run folder as an absolute path (workers elsewhere write into it too), created and
    checked writable, with a one-line error otherwise."""
    run_dir = Path(os.path.abspath(recipe.run_dir))
    key = "trainer.default_local_dir"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecipeError(
            f"cannot create the run folder {run_dir} ({exc.strerror}); choose a folder you can "
            "write to",
            key=key,
        ) from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RecipeError(
            f"the run folder {run_dir} is not writable; choose a folder you can write to", key=key
        )
    return run_dir


MODEL_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def check_model_folders(recipe: Recipe) -> None:
    """``model.path`` holds a Hugging Face model and the tokenizer folder a tokenizer: checked
    before anything is written or started, with the key and the fix in one line."""
    model = recipe.model
    if model.path is None:
        return
    for key, path, needed, what in (
        ("model.path", model.path, MODEL_FILES, "Hugging Face model"),
        (
            "model.tokenizer_path" if model.tokenizer_path else "model.path",
            model.tokenizer_path or model.path,
            TOKENIZER_FILES,
            "tokenizer",
        ),
    ):
        folder = Path(path)
        if not folder.is_dir():
            raise RecipeError(
                f"{folder} is not a folder; set a local Hugging Face model folder", key=key
            )
        if not any((folder / name).is_file() for name in needed):
            raise RecipeError(
                f"{folder} holds no {what} (none of {', '.join(needed)}); point it at a folder "
                "that save_pretrained wrote",
                key=key,
            )
