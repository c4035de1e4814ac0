"""The core's own recipe sections (``model``, ``data``, ``trainer``, ``cluster``) and
:class:`Recipe`, the whole run.

The sections whose part a plugin chooses (``device``, ``actor``, ``rollout``, ``reward``,
``scheduler``) are typed here by their base classes; :func:`plugrl.recipe.build_recipe` reads
each into the chosen plugin's class.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import attrs
import cattrs
import yaml

from plugrl.config import ConfigValueError, non_negative, option, positive, section
from plugrl.config.structuring import fields_of
from plugrl.parts.algorithm import AlgorithmConfig
from plugrl.parts.backend import ActorConfig, CriticConfig
from plugrl.parts.device import DeviceConfig
from plugrl.parts.reward import RewardConfig
from plugrl.parts.rollout import RolloutConfig
from plugrl.parts.scheduler import SchedulerConfig

# a recipe written out (to_dict, to_yaml): the structure hooks of plugrl.config.structuring
# read user input and play no part here
_UNSTRUCTURE = cattrs.Converter()


def _names_or_pattern(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ConfigValueError(
            attribute.name, f"must be a string or a list of module names, got {value!r}"
        )


@attrs.define(kw_only=True)
class ModelConfig:
    """The ``model`` section: the policy to train."""

    path: str | None = option(
        None,
        "Hugging Face model folder (local path).",
        verl="actor_rollout_ref.model.path",
        path="model",
    )
    tokenizer_path: str | None = option(
        None, "Tokenizer folder; unset: model.path.", verl="data.tokenizer", path="input"
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
    lora_rank: int = option(
        0,
        "Rank of the LoRA adapters trained in place of the actor's weights; 0 trains every "
        "weight. The reference log-probs then come from the actor with its adapters off, so "
        "no reference model is built. The critic always trains every weight.",
        verl="actor_rollout_ref.model.lora_rank",
        validator=non_negative,
    )
    lora_alpha: float = option(
        16,
        "LoRA scaling numerator: an adapter adds (lora_alpha / lora_rank) x B A to its weight.",
        verl="actor_rollout_ref.model.lora_alpha",
        validator=non_negative,
    )
    target_modules: str | list[str] = option(
        "all-linear",
        "Modules that get an adapter: all-linear (every linear layer but the output head), "
        "a list of module names (q_proj, v_proj) or a regular expression matched against "
        "whole module paths.",
        verl="actor_rollout_ref.model.target_modules",
        validator=_names_or_pattern,
    )
    exclude_modules: str | list[str] | None = option(
        None,
        "Modules left without an adapter among target_modules: a list of module names or a "
        "regular expression matched against whole module paths.",
        verl="actor_rollout_ref.model.exclude_modules",
        validator=_names_or_pattern,
    )
    lora_adapter_path: str | None = option(
        None,
        "A PEFT adapter folder (adapter_config.json, adapter_model.safetensors) to start "
        "from instead of fresh adapters; its rank, alpha and target modules are used.",
        verl="actor_rollout_ref.model.lora_adapter_path",
        path="input",
    )


@attrs.define(kw_only=True)
class DataConfig:
    """The ``data`` section: parquet files in verl's schema."""

    train_files: list[str] = option(
        factory=list, help="Training parquet files.", verl="data.train_files", path="input"
    )
    val_files: list[str] = option(
        factory=list, help="Validation parquet files.", verl="data.val_files", path="input"
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
        path="output",
    )
    resume_mode: str = option(
        "auto",
        "'auto' resumes from the run folder's latest checkpoint, 'disable' starts "
        "fresh, or a path to a global_step_N folder.",
        verl="trainer.resume_mode",
        path="input",
        path_words=("auto", "disable"),
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
    rollout_data_dir: str | None = option(
        None,
        "Folder for each training step's scored responses, one JSON line each in "
        "<step>.jsonl (prompt, response, score, ground truth, data source, the reward's extra "
        "columns); unset: none.",
        verl="trainer.rollout_data_dir",
        path="output",
    )
    validation_data_dir: str | None = option(
        None,
        "Folder for each validation's scored responses, as rollout_data_dir, in "
        "val_<step>.jsonl; unset: none.",
        verl="trainer.validation_data_dir",
        path="output",
    )
    seed: int = option(42, "Seed of model initialisation and sampling.")
    nnodes: int = option(1, "Nodes in the cluster.", verl="trainer.nnodes", validator=positive)
    n_gpus_per_node: int = option(
        1,
        "Ranks per node (devices, or CPU processes on cpu).",
        verl="trainer.n_gpus_per_node",
        validator=positive,
    )
    # YAML reads a bare `off` as false, so false means off too
    memory_check: Any = option(
        "warn",
        "Estimate each phase's device memory before any model loads (what plugrl plan "
        "shows): warn logs one line naming the phase and the term that does not fit, error "
        "stops the run with it, off (or false) skips it. Runs on accelerators; on cpu only "
        "when trainer.device_memory_gib is set.",
        choices=["warn", "error", "off", False],
    )
    device_memory_gib: float | None = option(
        None,
        "Memory of one device, in GiB, for trainer.memory_check; unset: what the device "
        "reports (none on cpu).",
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
        None,
        "CPUs of a locally started Ray; unset: all.",
        verl="ray_kwargs.ray_init.num_cpus",
        validator=positive,
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
    scheduler: SchedulerConfig = section(SchedulerConfig, "What one training step does.")
    trainer: TrainerConfig = section(TrainerConfig, "Length, validation, checkpoints, logs.")
    cluster: ClusterConfig = section(ClusterConfig, "One process or Ray.")

    def to_dict(self) -> dict[str, Any]:
        # each section by its runtime class: a plugin's config class adds keys to the base
        return {
            field.name: _UNSTRUCTURE.unstructure(
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


@functools.cache
def verl_index() -> dict[str, str]:
    """verl key -> plugrl key, for the core's classes (plugin classes are not indexed here)."""
    index: dict[str, str] = {}

    def walk(cls: type, prefix: str) -> None:
        for field in attrs.fields(cls):
            ftype = fields_of(cls)[field.name].type
            verl = field.metadata.get("verl")
            if verl and verl not in index:
                index[verl] = prefix + field.name
            if isinstance(ftype, type) and attrs.has(ftype):
                walk(ftype, prefix + field.name + ".")

    walk(Recipe, "")
    return index
