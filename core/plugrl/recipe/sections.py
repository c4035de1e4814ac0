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
from plugrl.parts.health import HealthConfig
from plugrl.parts.launcher import LaunchConfig
from plugrl.parts.reward import RewardConfig
from plugrl.parts.rollout import ROLLOUT_DTYPES, RolloutConfig
from plugrl.parts.scheduler import SchedulerConfig
from plugrl.recipe.distillation import DistillationConfig

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
    image_key: str = option(
        "images",
        "Column with each row's images (bytes, paths or {bytes: ...} structs), one per <image> "
        "in its messages; read when the model is a vision-language model.",
        verl="data.image_key",
    )
    video_key: str = option(
        "videos",
        "Column with each row's videos (frame lists, video files, or {video: ..., fps: ...}), "
        "one per <video> in its messages; read when the model is a vision-language model.",
        verl="data.video_key",
    )
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


# Measured on the quickstart's untrained tiny model (Qwen2 architecture) through the hf engine
# on a CPU: GRPO at lr 1e-3, temperature 1, 8 prompts x 4 responses of up to 16 tokens, steps
# 2-4 (each after an update), training/rollout_probs_diff_mean (and _max, pearson):
#   float32 engine, weights synced:         8e-10 to 1e-9   (max 1.3e-8, pearson 1.0)
#   bfloat16 engine, weights synced:        6e-6 to 9e-6    (max 8e-5,   pearson 1.0)
#   float32 engine kept step 0's weights:   1.3e-3 to 2e-3  (max 1.3e-2, pearson 0.2-0.3)
#   bfloat16 engine kept step 0's weights:  1.2e-3 to 1.9e-3 (max 1.4e-2, pearson 0.3-0.4)
# An untrained model spreads its probability thin, so its gaps are small; a trained model's
# confident tokens make both the rounding gap of a correct bfloat16 engine (reported around
# 1e-3 to 1e-2 for vLLM against a float32 trainer) and the gap of stale weights larger. float32
# sits far between the two; bfloat16 and float16 get a threshold above the rounding gap of real
# models, so they catch gross failures only (the tiny model's stale weights pass under it):
# trainer.verify_weight_sync compares the weights themselves and misses nothing.
DEFAULT_WEIGHT_SYNC_THRESHOLDS: dict[str, float] = {
    "float32": 1e-4,
    "bfloat16": 2e-2,
    "float16": 2e-2,
}
"""Default ``trainer.weight_sync_thresholds``: the mean absolute difference of the engine's
and the trainer's token probabilities above which the weights evidently did not arrive."""


def _non_negative_values(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    dtypes = [name for name in ROLLOUT_DTYPES if name != "auto"]
    unknown = sorted(set(value) - set(dtypes))
    if unknown:
        raise ConfigValueError(
            attribute.name, f"keys are engine dtypes ({', '.join(dtypes)}), got {unknown}"
        )
    bad = {key: number for key, number in value.items() if not number >= 0}
    if bad:
        raise ConfigValueError(attribute.name, f"thresholds must be >= 0, got {bad}")


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
    health: HealthConfig = section(
        HealthConfig,
        "Learning-health checks on every step's metrics (docs/recipes.md, Health checks).",
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
    check_weight_sync: str = option(
        "warn",
        "After each weight sync, compare the engine's log-probs of the sampled tokens with the "
        "trainer's (training/rollout_probs_diff_*, logged whenever the engine returns "
        "log-probs): when the mean probability gap passes the threshold of the engine's dtype "
        "(trainer.weight_sync_thresholds) the weights evidently did not arrive; warn logs one "
        "line, error stops the run with it, off does not check. Not checked when sampling "
        "truncates the distribution (top_p < 1, top_k, greedy).",
        choices=("warn", "error", "off"),
    )
    weight_sync_thresholds: dict[str, float] = option(
        factory=lambda: dict(DEFAULT_WEIGHT_SYNC_THRESHOLDS),
        help="Per engine dtype (float32, bfloat16, float16), the mean |p_engine - p_trainer| "
        "over response tokens above which trainer.check_weight_sync acts; a dtype left out is "
        "not checked. float32 (1e-4) sits far between a correct sync (1e-9) and stale weights "
        "(1e-3); bfloat16 and float16 (2e-2) sit above the rounding gap of real models, so "
        "they catch gross failures only (see trainer.verify_weight_sync).",
        validator=_non_negative_values,
    )
    verify_weight_sync: bool = option(
        False,
        "After every weight sync, read back a fingerprint of every weight from each engine "
        "(sum, sum of squares and a hash of a strided sample, in the engine's dtype) and "
        "compare it with the trainer's; a difference stops the run naming the engine and the "
        "weight. Costs a pass over the weights on both sides per sync; the engine must "
        "implement weight_fingerprints.",
    )
    seed: int = option(42, "Seed of model initialisation and sampling.")
    full_determinism: bool = option(
        False,
        "Same seed, same hardware, same run: every process that computes (the driver, the "
        "trainer ranks, the engines, a reward model) runs torch with deterministic algorithms "
        "only (an operation without one stops the run) and the device's deterministic "
        "settings (on cuda: cuBLAS workspace, cuDNN, NCCL algorithms). Slower on GPUs; the "
        "vllm and sglang engines need their own deterministic modes (docs/recipes.md).",
    )
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
    distillation: DistillationConfig = section(
        DistillationConfig, "On-policy distillation from frozen teachers."
    )
    launch: LaunchConfig = section(LaunchConfig, "How plugrl launch puts the run on a cluster.")

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
