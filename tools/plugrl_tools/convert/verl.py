"""A verl launch script as a plugrl recipe.

The script is read without running it (:mod:`plugrl_tools.convert.shell`), its verl command found
(``python3 -m verl.trainer.main_ppo``, ``recipe.dapo.main_dapo``, the one-step-off-policy
trainer or a ``fully_async_main``), and each of its Hydra overrides mapped to the plugrl key of
the same meaning: through the verl names the options of the core and of the installed plugins
declare
(:func:`plugrl.recipe.verl_names.verl_names`), and through the rules below where verl's layout
differs from plugrl's. Values are converted to the option's type. Every override that cannot
be mapped is kept, with the reason, in :attr:`Conversion.unmapped`.
"""

from __future__ import annotations

import copy
import re
import typing
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import attrs

from plugrl.config import ConfigValueError
from plugrl.config.structuring import converter, describe_value, fields_of
from plugrl.errors import ConvertError, PluginError
from plugrl.parts.rollout import RolloutConfig
from plugrl.plugin.manager import PluginManager
from plugrl.plugin.registry import KNOWN_EXTERNAL, PART_KINDS, section_kind
from plugrl.recipe.sections import Recipe
from plugrl.recipe.verl_names import VerlName, verl_names
from plugrl_tools.convert.overrides import Override, OverrideError, parse_override
from plugrl_tools.convert.shell import Command, Script, Word, read_script

ENTRY_POINTS = {
    "main_ppo": "sync",
    "main_ppo_sync": "sync",
    "main_dapo": "sync",
    "fully_async_main": "fully_async",
}
"""The last part of a verl trainer module -> the plugrl scheduler that runs the same loop."""

TRAINERS = (
    "verl.trainer.main_ppo",
    "verl.trainer.main_ppo_sync",
    "recipe.dapo.main_dapo",
    "fully_async_policy.fully_async_main",
    "one_step_off_policy.main_ppo",
)
"""verl's own trainer modules (or their ends); another module of the same last name (a
recipe's ``recipe.partial_rollout.main_ppo``) is converted as the one it is named after, and
noted."""

ONE_STEP_OFF = "one_step_off_policy"
"""The package of verl's one-step-off-policy trainer (its module is ``...main_ppo``)."""

ONE_STEP_OFF_SETTINGS = {
    ("scheduler", "staleness_threshold"): 0.0,
    ("scheduler", "trigger_parameter_sync_step"): 1,
    ("scheduler", "partial_rollout"): False,
}
"""plugrl's fully_async scheduler run as verl's one-step-off-policy trainer: the engines
generate the next batch with the weights of one step before, and a sync waits for the batch
in flight. ``require_batches`` is set from the script's batch sizes."""

CATEGORIES = {
    "unknown": "unknown to plugrl",
    "unsupported": "known, not supported by plugrl yet",
    "plugin": "keys of parts not installed here or not chosen",
    "dropped": "dropped on purpose: plugrl does it differently",
    "unresolved": "value unresolvable",
    "invalid": "value plugrl does not accept",
}
"""Why an override was not mapped, in the order the report lists them."""

PLACEHOLDER_TITLE = "in the recipe with a placeholder to fill in"

RUN_LABELS = ("trainer.experiment_name", "trainer.project_name")
"""Names that only label a run: built from ``$(date)`` or a variable the script does not set,
they keep the unexpanded part as written (a run names its folder and its logger's run with
them; what it trains does not change)."""

_PATH_KEY = re.compile(r"(^|[._])(path|files|dir)$")
"""verl keys whose value is a path (``model.path``, ``data.train_files``,
``trainer.default_local_dir``): one the script builds from a variable it does not set (a
cluster's ``$RAY_DATA_HOME``) keeps that variable as written, for the user to fill in."""

# --------------------------------------------------------------------------------- rules
# Beyond the verl names the options declare: where verl's layout differs from plugrl's.

_SCHEDULE = "actor_rollout_ref.actor.optim.lr_scheduler_type"

ALIASES = {
    # verl nests the model's config under model_config for Megatron; plugrl has one mapping
    "actor_rollout_ref.model.override_config.model_config.": (
        "actor_rollout_ref.model.override_config."
    ),
    # newer verl passes DAPO's overlong buffer to the reward manager as reward_kwargs
    "reward_model.reward_kwargs.overlong_buffer_cfg.": "reward_model.overlong_buffer.",
    # the Megatron optimizer's and older verl's names of the schedule
    "actor_rollout_ref.actor.optim.lr_decay_style": _SCHEDULE,
    "actor_rollout_ref.actor.optim.warmup_style": _SCHEDULE,
    "ray_init.": "ray_kwargs.ray_init.",
    # newer verl's reward section, and the top-level reward_manager of the verl before it
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward_manager.name": "reward_model.reward_manager",
    "reward.reward_kwargs.overlong_buffer_cfg.": "reward_model.overlong_buffer.",
    "reward.reward_kwargs.": "reward_model.reward_kwargs.",
    "reward.custom_reward_function.": "custom_reward_function.",
    # verl 0.8's reward model, served by an inference engine: its path and engine settings
    "reward.reward_model.model_path": "reward_model.model.path",
    "reward.reward_model.": "reward_model.",
    # the weight sync's settings, under checkpoint_engine since verl 0.8
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": (
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes"
    ),
    # verl 0.8 moved these under the backend's config
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    ),
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size"
    ),
    "actor_rollout_ref.actor.fsdp_config.strategy": "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.ref.fsdp_config.strategy": "actor_rollout_ref.ref.strategy",
    "actor_rollout_ref.actor.megatron.use_remove_padding": (
        "actor_rollout_ref.model.use_remove_padding"
    ),
    "actor_rollout_ref.ref.megatron.use_remove_padding": (
        "actor_rollout_ref.model.use_remove_padding"
    ),
    # VeOmni's settings that plugrl's fsdp2 backend has (the recipe trains VeOmni scripts
    # with fsdp2, see FSDP_LIKE_ENGINES)
    "actor_rollout_ref.actor.veomni.ulysses_parallel_size": (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    ),
    "actor_rollout_ref.actor.veomni.param_offload": (
        "actor_rollout_ref.actor.fsdp_config.param_offload"
    ),
    "actor_rollout_ref.actor.veomni.optimizer_offload": (
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload"
    ),
    "actor_rollout_ref.actor.veomni.fsdp_size": "actor_rollout_ref.actor.fsdp_config.fsdp_size",
    "actor_rollout_ref.ref.veomni.param_offload": "actor_rollout_ref.ref.fsdp_config.param_offload",
    # TorchTitan's offload switches, which mean what FSDP's do
    "actor_rollout_ref.actor.torchtitan.param_offload": (
        "actor_rollout_ref.actor.fsdp_config.param_offload"
    ),
    "actor_rollout_ref.actor.torchtitan.optimizer_offload": (
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload"
    ),
    "actor_rollout_ref.ref.torchtitan.param_offload": (
        "actor_rollout_ref.ref.fsdp_config.param_offload"
    ),
    # the critic's engine config of verl 0.8 (critic.fsdp.*, as the actor's fsdp_config)
    "critic.fsdp.": "critic.model.fsdp_config.",
    # the nested LoRA block of verl 0.8 (model.lora.*), the flat keys' newer names
    "actor_rollout_ref.model.lora.rank": "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora.alpha": "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.model.lora.target_modules": "actor_rollout_ref.model.target_modules",
    "actor_rollout_ref.model.lora.exclude_modules": "actor_rollout_ref.model.exclude_modules",
    "actor_rollout_ref.model.lora.adapter_path": "actor_rollout_ref.model.lora_adapter_path",
    "critic.model.lora.rank": "critic.model.lora_rank",
    "critic.model.lora.alpha": "critic.model.lora_alpha",
    "critic.model.lora.target_modules": "critic.model.target_modules",
    "critic.model.lora.exclude_modules": "critic.model.exclude_modules",
    "critic.model.lora.adapter_path": "critic.model.lora_adapter_path",
    # newer verl's name of the gradient clip, under optim
    "actor_rollout_ref.actor.optim.clip_grad": "actor_rollout_ref.actor.grad_clip",
    "actor_rollout_ref.ref.optim.clip_grad": "actor_rollout_ref.ref.grad_clip",
    "critic.optim.clip_grad": "critic.grad_clip",
    # verl 0.6's names of the rollout correction, before algorithm.rollout_correction
    "algorithm.rollout_is": "algorithm.rollout_correction.rollout_is",
    "algorithm.rollout_is_threshold": "algorithm.rollout_correction.rollout_is_threshold",
    "algorithm.rollout_rs": "algorithm.rollout_correction.rollout_rs",
    "algorithm.rollout_rs_threshold": "algorithm.rollout_correction.rollout_rs_threshold",
    "algorithm.rollout_rs_threshold_lower": (
        "algorithm.rollout_correction.rollout_rs_threshold_lower"
    ),
    "algorithm.rollout_token_veto_threshold": (
        "algorithm.rollout_correction.rollout_token_veto_threshold"
    ),
    "algorithm.rollout_is_batch_normalize": (
        "algorithm.rollout_correction.rollout_is_batch_normalize"
    ),
    # verl 0.7's count of reward-loop workers, reward.num_workers since
    "reward_model.num_workers": "reward.num_workers",
    # older verl's reward model batch size (per step, split over its workers)
    "reward_model.micro_batch_size": "reward_model.micro_batch_size_per_gpu",
}
"""verl key (or prefix, ending in a dot) -> the verl key it means."""

_REFERENCE = "plugrl's reference model takes the actor's settings"
_LOG_PROB = "plugrl's log-prob passes form micro-batches as training does"

SHARED = {
    "actor_rollout_ref.actor.megatron.dtype": (
        "actor_rollout_ref.actor.fsdp_config.model_dtype",
        "plugrl's model.dtype is the parameters' dtype on every backend",
    ),
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": (
        "actor_rollout_ref.actor.fsdp_config.model_dtype",
        "plugrl's fsdp2 backend computes in model.dtype",
    ),
    # verl's fsdp2 strategy with offload_policy wraps the model with FSDP2's CPU-offload
    # policy, which is what plugrl's fsdp2 param_offload does
    "actor_rollout_ref.actor.fsdp_config.offload_policy": (
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "plugrl's fsdp2 param_offload is FSDP2's CPU-offload policy, verl's offload_policy",
    ),
    "actor_rollout_ref.ref.fsdp_config.offload_policy": (
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "plugrl's fsdp2 param_offload is FSDP2's CPU-offload policy, verl's offload_policy",
    ),
    "data.trust_remote_code": (
        "actor_rollout_ref.model.trust_remote_code",
        "plugrl loads the tokenizer with the model's trust_remote_code",
    ),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": (
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "plugrl offloads parameters, gradients and optimizer state together",
    ),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": (
        "actor_rollout_ref.actor.use_dynamic_bsz",
        _LOG_PROB,
    ),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        _LOG_PROB,
    ),
    "trainer.max_critic_ckpt_to_keep": (
        "trainer.max_actor_ckpt_to_keep",
        "plugrl keeps one count of checkpoints for all models",
    ),
    # prefixes: the reference model's and the critic's settings are the actor's in plugrl
    "actor_rollout_ref.ref.log_prob_": ("actor_rollout_ref.rollout.log_prob_", _REFERENCE),
    "actor_rollout_ref.ref.": ("actor_rollout_ref.actor.", _REFERENCE),
    "critic.model.fsdp_config.": (
        "actor_rollout_ref.actor.fsdp_config.",
        "plugrl's backend settings apply to every model it builds, the critic's too",
    ),
    "critic.strategy": (
        "actor_rollout_ref.actor.strategy",
        "plugrl's critic trains with the actor's backend",
    ),
}
"""verl keys (or prefixes, ending in a dot or underscore) whose meaning plugrl covers with the
key of another: (that verl key, why). The value is carried over when it agrees with that key's,
and reported when it does not."""

_REWARD_MODEL_ENGINE = (
    "a setting of the inference engine verl serves its reward model with; plugrl's "
    "reward_model manager scores with a forward pass of the classification model itself"
)
_REWARD_MODEL_LENGTH = (
    "a generation length of the engine verl serves its reward model with; plugrl's reward "
    "model reads up to reward.max_length tokens (unset: the model's max_position_embeddings, "
    "the length verl's server holds too)"
)

DROPPED = {
    "data.image_patch_size": (
        "verl resizes each image to a multiple of this patch size before its processor; "
        "plugrl's processor resizes by the model's own patch size (the model folder's "
        "preprocessor_config.json), the same images when the script gives the model's patch size"
    ),
    "data.return_multi_modal_inputs": (
        "plugrl computes each row's image inputs once when the dataset is built and carries "
        "them with the batch, whatever verl's switch says"
    ),
    "actor_rollout_ref.model.use_fused_kernels": (
        "plugrl has no switch: log-probs always read the model's own logits a chunk of tokens "
        "at a time, in float32, and their backward writes the gradient over the logits (2 "
        "bytes a bfloat16 logit)"
    ),
    "actor_rollout_ref.actor.use_torch_compile": "plugrl does not compile the model",
    "actor_rollout_ref.rollout.mode": (
        "plugrl has one engine interface (requests in, completions out, continuous batching); "
        "verl's sync and async rollout modes have no counterpart"
    ),
    "actor_rollout_ref.rollout.calculate_log_probs": (
        "plugrl's engines return the log-prob of every sampled token with each completion"
    ),
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": (
        "plugrl has no fused-kernel switch: log-probs always read the model's own logits a "
        "chunk of tokens at a time"
    ),
    "actor_rollout_ref.rollout.skip_tokenizer_init": (
        "whether verl's engine loads a tokenizer of its own; plugrl's engines take the prompt's "
        "token ids and return token ids, which plugrl decodes"
    ),
    "actor_rollout_ref.actor.fsdp_config.use_orig_params": (
        "a setting of FSDP1; plugrl's fsdp2 backend shards with FSDP2, whose parameters are "
        "the module's own"
    ),
    "actor_rollout_ref.actor.use_prefix_grouper": (
        "verl computes the prompt a group of responses shares once (speed); plugrl computes "
        "each sequence whole: the same log-probs"
    ),
    "data.filter_overlong_prompts_workers": (
        "processes verl filters over-long prompts with; plugrl filters them in its own process"
    ),
    "data.return_raw_chat": (
        "plugrl's dataset applies the chat template for every engine (data.apply_chat_template)"
    ),
    "actor_rollout_ref.actor.optim.lr_decay_steps": (
        "plugrl's cosine schedule decays over the run's training steps "
        "(actor.optim.lr_scheduler_type)"
    ),
    "trainer.use_legacy_worker_impl": (
        "verl's choice between its own worker implementations; plugrl has one per backend"
    ),
    "reward_model.model.input_tokenizer": (
        "plugrl's reward model always reads responses decoded with the run's tokenizer and "
        "rendered with the reward model's own chat template"
    ),
    "actor_rollout_ref.model.use_shm": (
        "plugrl reads the model from model.path; it does not copy it to shared memory first"
    ),
    "actor_rollout_ref.rollout.load_format": (
        "plugrl's engines start from model.path and get the trainer's whole weights (merged "
        "with its LoRA adapters) before their first generation"
    ),
    "actor_rollout_ref.rollout.layered_summon": (
        "plugrl gathers the trainer's weights one tensor at a time, merging LoRA adapters as "
        "it goes"
    ),
    "ray_kwargs.ray_init.runtime_env.py_executable": (
        "the interpreter Ray starts verl's workers with (a `uv run ...` prefix runs them in "
        "uv's project environment); plugrl's Ray workers run the interpreter plugrl run runs "
        "with, so start it the same way: `uv run ... plugrl run RECIPE`, or from the "
        "environment plugrl is installed in"
    ),
    "trainer.balance_batch": (
        "verl reorders a batch so its data-parallel ranks get similar token counts (speed); "
        "plugrl splits the batch in its own order: the same samples train, grouped into "
        "micro-batches by plugrl's own token budget"
    ),
    "transfer_queue.enable": (
        "verl's data plane between its workers (TransferQueue); plugrl passes batches between "
        "its worker groups itself"
    ),
    "actor_rollout_ref.model.lora.fully_sharded_loras": (
        "a setting of vLLM's serving of adapters across tensor-parallel devices; plugrl's "
        "vllm engine holds each adapter whole (rollout.lora_sync)"
    ),
    "actor_rollout_ref.rollout.checkpoint_engine.backend": (
        "how verl moves weights to its engines; plugrl's weight transport follows from the "
        "engine and the cluster (rollout.update_weights_bucket_megabytes sizes its buckets)"
    ),
    "reward.num_workers": (
        "verl's reward-loop workers, how many processes score in parallel; plugrl scores rule "
        "rewards in the driver (reward.manager parallel: in a process pool) and a reward "
        "model on reward.num_workers actors (reward.placement ray)"
    ),
    "reward_model.rollout.name": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.gpu_memory_utilization": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.free_cache_engine": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.skip_tokenizer_init": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.enforce_eager": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.max_num_seqs": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.max_num_batched_tokens": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.enable_chunked_prefill": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.enable_prefix_caching": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.dtype": _REWARD_MODEL_ENGINE,
    "reward_model.rollout.prompt_length": _REWARD_MODEL_LENGTH,
    "reward_model.rollout.response_length": _REWARD_MODEL_LENGTH,
    "reward_model.enable_resource_pool": (
        "whether verl gives its reward model devices of its own; plugrl's runs in the driver "
        "(reward.placement local) or on reward.num_workers Ray actors (reward.placement ray)"
    ),
    "actor_rollout_ref.actor.calculate_sum_pi_squared": (
        "plugrl's old_log_prob pass returns sum_pi_squared whenever the advantage estimator "
        "reads it (optimal_token_baseline)"
    ),
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": (
        "plugrl computes sum_pi_squared without gradient, a slice of tokens at a time, so "
        "there is nothing to checkpoint"
    ),
}
"""verl keys plugrl covers in its own way, with what it does instead."""

_ENGINE_LAYOUT = (
    "how verl lays out each inference engine over its devices (data and expert parallelism "
    "inside one engine); plugrl's engines split the model by tensor parallelism alone "
    "(rollout.tensor_model_parallel_size): the same samples, from more, smaller engines. A "
    "model that fits only across the larger layout will not load: plugrl says so at start-up"
)
_ENGINE_SPEED = (
    "a speed or memory setting of verl's inference engine; plugrl's engine runs with its own, "
    "and samples the same way"
)

DROPPED.update(
    {
        # the engines' layout and speed settings: what they sample does not change
        "actor_rollout_ref.rollout.data_parallel_size": _ENGINE_LAYOUT,
        "actor_rollout_ref.rollout.expert_parallel_size": _ENGINE_LAYOUT,
        "actor_rollout_ref.rollout.moe_tensor_parallel_size": _ENGINE_LAYOUT,
        "actor_rollout_ref.rollout.cudagraph_capture_sizes": _ENGINE_SPEED,
        "actor_rollout_ref.rollout.multi_stage_wake_up": (
            "verl wakes its engine's weights and cache in two stages to lower peak memory; "
            "plugrl's engines wake as one"
        ),
        "actor_rollout_ref.rollout.disable_log_stats": (
            "whether verl's engine logs its own throughput; plugrl reports generation metrics "
            "itself"
        ),
        "actor_rollout_ref.rollout.agent.num_workers": (
            "how many processes verl runs its agent loops in; plugrl's agent loops run as "
            "tasks of the rollout worker: the same trajectories"
        ),
        "data.dataloader_num_workers": (
            "processes verl's data loader reads with; plugrl reads the data in its driver: "
            "the same batches"
        ),
        # training speed and memory: the same gradients
        "actor_rollout_ref.actor.fsdp_config.forward_prefetch": (
            "whether FSDP gathers the next layer's weights early (speed); plugrl's fsdp2 "
            "backend gathers as FSDP2 does by default: the same gradients"
        ),
        "actor_rollout_ref.ref.fsdp_config.forward_prefetch": (
            "whether FSDP gathers the next layer's weights early (speed): no effect on the "
            "reference log-probs"
        ),
        "actor_rollout_ref.model.enable_activation_offload": (
            "verl moves activations to the CPU between forward and backward to save device "
            "memory; plugrl keeps them (model.enable_gradient_checkpointing recomputes them "
            "instead): the same gradients"
        ),
        "actor_rollout_ref.actor.megatron.use_megatron_fsdp": (
            "Megatron-FSDP shards the weights, gradients and optimizer state over the "
            "data-parallel ranks (memory); plugrl-megatron shards the optimizer state "
            "(Megatron's distributed optimizer): the same update"
        ),
        "actor_rollout_ref.ref.megatron.use_megatron_fsdp": (
            "Megatron-FSDP shards the reference model's weights (memory): the same log-probs"
        ),
        "reward_model.use_reward_loop": (
            "verl 0.7's choice between its reward loop and its older in-trainer scoring, which "
            "call the same reward function; plugrl scores with its reward manager"
        ),
        "actor_rollout_ref.model.use_liger": (
            "Liger's fused kernels (norm, activation, rotary embedding, loss) in place of the "
            "model's own: the same functions; plugrl runs the model's own"
        ),
        # what verl writes into a checkpoint, and how strictly it reads one back
        "actor_rollout_ref.actor.checkpoint.save_contents": (
            "what verl writes into a checkpoint; plugrl's checkpoints always hold all a "
            "resume needs (weights, optimizer, random state, data position)"
        ),
        "actor_rollout_ref.actor.checkpoint.load_contents": (
            "what verl reads back from a checkpoint; plugrl resumes from all of it"
        ),
        "actor_rollout_ref.actor.checkpoint.strict": (
            "whether verl's checkpoint loader refuses missing keys; plugrl resumes only from "
            "its own checkpoints, which have them all"
        ),
    }
)

_PRECISION_AWARE = (
    "actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer"
)
_STATE_DTYPES = (".main_grads_dtype", ".exp_avg_dtype", ".exp_avg_sq_dtype")
"""verl's (and Megatron's) dtypes of the gradients and Adam's moments under the precision-aware
optimizer, under ``actor.optim`` or its ``override_optimizer_config``."""

_PROFILER = (
    "verl's profiler (traces of chosen steps, for speed work): it records and changes nothing "
    "that is trained; profile a plugrl run with the accelerator's own tools (nsys, "
    "torch.profiler, msprof)"
)

DROPPED_PREFIXES = {
    "global_profiler.": _PROFILER,
    "actor_rollout_ref.actor.profiler.": _PROFILER,
    "actor_rollout_ref.ref.profiler.": _PROFILER,
    "actor_rollout_ref.rollout.profiler.": _PROFILER,
    "critic.profiler.": _PROFILER,
    "reward_model.profiler.": _PROFILER,
    "reward.reward_model.profiler.": _PROFILER,
}
"""verl prefixes whose every key is dropped, with why: infrastructure with no effect on what
is trained."""

_NO_REJECTION = (
    "plugrl has no rejection sampling against the rollout policy; its correction "
    "(algorithm.rollout_is) weighs tokens, it does not drop them"
)

NEUTRAL = {
    "algorithm.rollout_correction.rollout_rs": ((None, ""), _NO_REJECTION),
    "algorithm.rollout_correction.rollout_rs_threshold": ((None, ""), _NO_REJECTION),
    "algorithm.rollout_correction.rollout_rs_threshold_lower": ((None, ""), _NO_REJECTION),
    "algorithm.rollout_correction.rollout_token_veto_threshold": ((None, ""), _NO_REJECTION),
    "algorithm.rollout_correction.bypass_mode": (
        False,
        "plugrl has no bypass mode: the trainer recomputes the old log-probs (with scheduler: "
        "fully_async, scheduler.use_rollout_log_probs takes the engines' instead)",
    ),
    "algorithm.rollout_correction.loss_type": (
        "ppo_clip",
        "plugrl's correction weighs the PPO-clip loss; the REINFORCE loss of verl's bypass "
        "mode has no counterpart",
    ),
    "algorithm.rollout_correction.rollout_is_batch_normalize": (
        False,
        "plugrl does not normalise the importance weights over the batch",
    ),
    "trainer.critic_warmup": (0, "plugrl has no critic warm-up"),
    "actor_rollout_ref.actor.optim.min_lr_factor": (
        (1.0, 1),
        "verl's TorchTitan schedule decays the learning rate to min_lr_factor x lr; at 1 it "
        "stays at lr after warm-up, as plugrl's constant schedule (the recipe's) does",
    ),
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype": (
        ("fp32", "float32"),
        "verl's default, a setting of FSDP1's mixed precision; plugrl's fsdp2 backend (as "
        "verl's fsdp2 strategy) leaves the buffers in the dtype the model loads them in",
    ),
    "actor_rollout_ref.actor.optim.optimizer": (
        ("AdamW", "adamw"),
        "plugrl's optimizer is AdamW",
    ),
    "actor_rollout_ref.rollout.ignore_eos": (
        False,
        "plugrl's engines always end a response at the end-of-sequence token",
    ),
    "trainer.balance_batch": (
        False,
        "plugrl does not reorder a batch to balance tokens across ranks",
    ),
    "reward_model.rollout.tensor_model_parallel_size": (
        1,
        "plugrl's reward model is not sharded: each of its workers holds it whole",
    ),
    "actor_rollout_ref.model.lora.dropout": (
        0.0,
        "plugrl's LoRA adapters have no dropout",
    ),
    "actor_rollout_ref.model.lora.type": ("lora", "plugrl trains LoRA adapters only"),
    "reward.reward_manager.source": (
        "register",
        "plugrl's reward managers are the plugins installed (reward.manager names one)",
    ),
    "reward.sandbox_fusion.url": (
        (None, ""),
        "plugrl has no sandbox-fusion client; a remote scorer is reward.manager remote",
    ),
    "trainer.v1.separate_async.hybrid_rollout.enable_switch": (
        False,
        "plugrl does not lend the trainer's devices to generation while it waits",
    ),
    "trainer.v1.sampler.sync_refill_failed_groups": (
        False,
        "plugrl does not replace a prompt whose responses all failed",
    ),
    "trainer.v1.sampler.custom_sampler.path": ((None, ""), "plugrl has no custom samplers"),
    "trainer.v1.sampler.custom_sampler.name": ((None, ""), "plugrl has no custom samplers"),
    "reward_model.nnodes": (
        (0, 1),
        "plugrl's reward model runs on reward.num_workers Ray actors wherever Ray places "
        "them; set that to nnodes x n_gpus_per_node",
    ),
}
"""verl features plugrl lacks: (the value, or a tuple of the values, that turns them off, what
plugrl does). At that value the override is dropped as having no effect; at another it is
unknown to plugrl."""

VISION = (
    "plugrl's vision-language support is images and videos in verl's data layout "
    "(data.image_key, data.video_key) with fsdp2 and the hf, vllm and sglang engines "
    "(docs/vision.md); this vision setting is not supported yet"
)

UNSUPPORTED = [
    # (verl prefix or key, the one line the report gives the group)
    ("data.limit_images", VISION),
    ("data.mm_", VISION),
    ("actor_rollout_ref.rollout.limit_images", VISION),
    ("actor_rollout_ref.rollout.mm_", VISION),
    ("actor_rollout_ref.model.lora.freeze_vision_", VISION),
    ("actor_rollout_ref.model.freeze_vision_", VISION),
]
"""verl settings of features plugrl knows it lacks: reported as one group each."""

_CRITIC_MODEL = "plugrl builds every model, the critic too, with the settings of model"

CRITIC_SHARES = {
    "megatron.tensor_model_parallel_size": "plugrl's critic is laid out as the actor",
    "megatron.pipeline_model_parallel_size": "plugrl's critic is laid out as the actor",
    "megatron.context_parallel_size": "plugrl's critic is laid out as the actor",
    "megatron.expert_model_parallel_size": "plugrl's critic is laid out as the actor",
    "megatron.param_offload": "plugrl's critic offloads as the actor does",
    "megatron.optimizer_offload": "plugrl's critic offloads as the actor does",
    "megatron.grad_offload": "plugrl's critic offloads as the actor does",
    "use_dynamic_bsz": "plugrl's critic forms micro-batches as the actor does",
    "ppo_max_token_len_per_gpu": "plugrl's critic forms micro-batches as the actor does",
    "ulysses_sequence_parallel_size": (
        "plugrl's critic splits sequences over the actor's sequence-parallel groups"
    ),
}
"""``critic.*`` keys plugrl covers with the actor's key of the same name (besides ``model.*``),
and why."""

_CRITIC_TRAINS_EVERY_WEIGHT = (
    "plugrl's critic trains every weight; LoRA adapters (model.lora_rank) are the actor's"
)

CRITIC_OWN_MODEL_KEYS = {
    f"model.{name}": _CRITIC_TRAINS_EVERY_WEIGHT
    for name in (
        "lora_rank",
        "lora_alpha",
        "target_modules",
        "exclude_modules",
        "lora_adapter_path",
    )
}
"""``critic.model.*`` keys that do not follow the actor's, and why."""

GLOBAL_MICRO_BATCHES = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ulysses_",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.actor.ulysses_",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.actor.ulysses_",
    "critic.ppo_micro_batch_size": "critic.ulysses_",
}
"""Older verl's micro-batch sizes per step, which verl divides by its data-parallel ranks into
the ``..._per_gpu`` key (and the prefix of the sequence-parallel size that divides those)."""

PART_KEYS = [
    # (verl prefix or key, kind, part): keys that belong to one part's own config
    ("actor_rollout_ref.actor.megatron.", "training_backends", "megatron"),
    ("actor_rollout_ref.actor.optim.override_optimizer_config.", "training_backends", "megatron"),
    ("critic.megatron.", "training_backends", "megatron"),
    ("async_training.", "schedulers", "fully_async"),
    ("rollout.total_rollout_steps", "schedulers", "fully_async"),
    ("rollout.total_epochs", "schedulers", "fully_async"),
    ("rollout.test_freq", "schedulers", "fully_async"),
]

ENGINE_KEYS = {
    "enforce_eager",
    "enable_chunked_prefill",
    "max_num_batched_tokens",
    "max_model_len",
    "disable_log_stats",
    "enable_prefix_caching",
    "engine_kwargs",
    "cudagraph_capture_sizes",
}
"""``actor_rollout_ref.rollout.*`` keys of vLLM and SGLang engines, not of plugrl's core."""

PART_PREFIXES = {
    "actor_rollout_ref.actor.": "training_backends",
    "actor_rollout_ref.rollout.": "rollout_engines",
    "reward_model.": "reward_managers",
}
"""Where an unknown key may belong to the chosen part's own config."""

BACKENDS = {"dp": "fsdp2", "megatron": "megatron"}
"""verl's ``model_engine`` (its training engine since 0.8) -> plugrl's actor.backend."""

FSDP_LIKE_ENGINES = {"veomni": "VeOmni", "torchtitan": "TorchTitan", "fsdp_turbo": "FSDP Turbo"}
"""verl training engines plugrl has no backend for, which shard the model with PyTorch's FSDP2
as plugrl's default backend does: the recipe keeps fsdp2, and says so. ``fsdp_turbo`` is a
``strategy`` of verl's FSDP engine (its settings under ``fsdp_config.turbo_config``), the others
are ``model_engine`` values."""

_KERNEL = (
    "which kernel computes {what} in verl's {engine} engine: the same function, another "
    "implementation; plugrl's fsdp2 backend runs the model's own"
)
_EXPERTS = (
    "how verl's {engine} engine spreads the experts over its ranks; plugrl's fsdp2 backend "
    "shards every expert's weights over all ranks instead: the same training, laid out "
    "otherwise"
)

FOREIGN_ENGINE_SETTINGS: dict[str, tuple[tuple[Any, ...] | None, str]] = {
    "attn_implementation": (None, _KERNEL.replace("{what}", "attention")),
    "attn_type": (None, _KERNEL.replace("{what}", "attention")),
    "moe_implementation": (None, _KERNEL.replace("{what}", "the mixture of experts")),
    "cross_entropy_loss_implementation": (None, _KERNEL.replace("{what}", "the token loss")),
    "dsa_indexer_implementation": (None, _KERNEL.replace("{what}", "sparse attention's index")),
    "dsa_attention_implementation": (None, _KERNEL.replace("{what}", "sparse attention")),
    "mhc_implementation": (None, _KERNEL.replace("{what}", "the hyper-connections")),
    "expert_parallel_size": (None, _EXPERTS),
    "enable_full_shard": (
        (True,),
        "{engine} shards every parameter over the ranks, as plugrl's fsdp2 backend does",
    ),
    "data_parallel_shard_size": (
        None,
        "how many ranks {engine} shards the weights over; plugrl's fsdp2 backend shards them "
        "over all its ranks (actor.fsdp_config.fsdp_size sets fewer): the same training",
    ),
    "tensor_parallel_size": ((1,), "{engine} without tensor parallelism, as plugrl's fsdp2"),
    "activation_checkpoint": (
        None,
        "which activations {engine} recomputes in the backward pass to save memory: the same "
        "gradients (model.enable_gradient_checkpointing is plugrl's switch)",
    ),
    "use_torch_compile": (None, "whether {engine} compiles the model (speed); plugrl does not"),
    "spmd_backend": (
        None,
        "how {engine} expresses its sharding to PyTorch: the same training",
    ),
}
"""The settings of a training engine plugrl trains with fsdp2 instead (see FSDP_LIKE_ENGINES),
after ``actor.<engine>.``, that do not change what is trained: (the values at which that is so,
``None``: any; why). The engine's others (router replay) stay unknown."""

STRATEGY_KEYS = (
    "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.ref.strategy",
    "critic.strategy",
)

VERL_DEFAULTS = {
    "algorithm.adv_estimator": "gae",
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "trainer.total_epochs": 30,
    "trainer.n_gpus_per_node": 8,
    "trainer.logger": ["console", "wandb"],
}
"""Defaults of verl's ppo_trainer.yaml that differ from plugrl's. A script that leaves one
unset ran with verl's value; the report says so, and the recipe keeps plugrl's."""

LORA_KEYS = {
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.model.target_modules",
    "actor_rollout_ref.model.exclude_modules",
    "actor_rollout_ref.model.lora_adapter_path",
}
"""verl's LoRA settings of the actor (flat names; the nested model.lora.* are aliases)."""

LORA_MERGE = "actor_rollout_ref.model.lora.merge"
"""verl's choice of merged weights (true) or the adapters alone (false) for its engines:
plugrl's rollout.lora_sync."""

V1_MODES = ("sync", "colocate_async", "separate_async")
"""verl's ``trainer.v1.trainer_mode`` values."""

V1_DEFAULTS = {
    "trainer.v1.separate_async.parameter_sync_step": 4,
    "trainer.v1.separate_async.num_warmup_batches": 1,
    "trainer.v1.sampler.max_off_policy_threshold": 8,
    "trainer.v1.sampler.max_off_policy_strategy": "drop",
}
"""verl's defaults (ppo_trainer.yaml) of the V1 keys that decide the fully_async settings."""

V1_CONSUMED = set(V1_DEFAULTS)
"""V1 keys :meth:`_Converter._separate_async` maps (or reports) under separate_async."""

V1_STEP_KEYS = {
    "trainer.total_training_steps": "trainer.total_training_steps",
    "trainer.test_freq": "trainer.test_freq",
    "trainer.save_freq": "trainer.save_freq",
}
"""Keys counted in verl's steps: one step of separate_async is parameter_sync_step of
plugrl's fully_async steps."""

V1_ROLLOUT_DEVICES = {
    "actor_rollout_ref.rollout.nnodes": "rollout.nnodes",
    "actor_rollout_ref.rollout.n_gpus_per_node": "rollout.n_gpus_per_node",
}
"""The standalone engines' devices of verl's separate_async, as its fully-async recipe's keys."""

_ENTROPY_CHUNKS = (
    "plugrl always computes the entropy a chunk of tokens at a time, with the log-probs "
    "(either value)"
)
_ENTROPY_RECOMPUTE = (
    "plugrl's log-probs keep no softmax for the backward: it recomputes each chunk's, the "
    "entropy's gradient included (either value)"
)
ENTROPY_MEMORY = {
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": _ENTROPY_CHUNKS,
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": _ENTROPY_CHUNKS,
    "actor_rollout_ref.actor.entropy_checkpointing": _ENTROPY_RECOMPUTE,
    "actor_rollout_ref.ref.entropy_checkpointing": _ENTROPY_RECOMPUTE,
    "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing": _ENTROPY_RECOMPUTE,
    "actor_rollout_ref.ref.fsdp_config.entropy_checkpointing": _ENTROPY_RECOMPUTE,
}
"""verl's memory savings of the entropy computation, which change nothing while the entropy
has no bonus (``actor.entropy_coeff`` 0): its value is then a metric without gradient."""

ENGINE_ARGUMENTS = {
    "actor_rollout_ref.rollout.enable_prefix_caching": {
        "vllm": "actor_rollout_ref.rollout.engine_kwargs.vllm.enable_prefix_caching",
    },
}
"""verl rollout keys that are one engine's own argument: with that engine they go into its
``engine_kwargs`` (vLLM's ``enable_prefix_caching``)."""

DISABLE_MM_CACHE = "engine_kwargs.vllm.disable_mm_preprocessor_cache"
"""vLLM's old switch for its multimodal processor cache (a suffix of the engine_kwargs keys of
the rollout and of distillation teachers); vLLM 0.32 spells it ``mm_processor_cache_gb=0``."""

ENGINE_SELECTORS = ("model_engine", "actor_rollout_ref.actor.model_engine")
"""verl 0.8's keys that choose the training engine (``model_engine=megatron``)."""

REWARD_MODEL_ENABLE = "reward_model.enable"
REWARD_MODEL_MANAGER = "reward_model"
"""verl's switch of its reward model, and the plugrl reward manager that runs one."""

REWARD_MODEL_REPLACES = (
    "with reward_model.enable verl's reward is the reward model's score alone: its reward "
    "manager returns the model's scores and never calls the rule or custom function"
)

TEACHERS_PREFIX = "distillation.teacher_models."
DEFAULT_TEACHER = "teacher_model"
"""verl's name of its one teacher, dropped when the script names others."""
VERL_TEACHER_TP = 2
"""verl's default ``inference.tensor_model_parallel_size`` of a teacher."""
DISTILLATION_DROPPED = {
    "distillation.distillation_loss.policy_loss_mode": (
        "verl's distillation supports only the vanilla policy loss, which plugrl's uses"
    ),
    "distillation.distillation_loss.clip_ratio": (
        "verl's vanilla loss reads clip_ratio_low and clip_ratio_high, plugrl's too "
        "(distillation.loss.clip_ratio_low/high)"
    ),
}

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

VALUE_RENAMES = {
    "actor.backend": {"fsdp": "fsdp2"},
    "rollout.engine": {"sglang_async": "sglang"},
    "model.dtype": _DTYPES,
    "actor.reduce_dtype": _DTYPES,
}
"""plugrl key -> {verl value: plugrl value} where verl's value names a part plugrl calls
otherwise (verl's FSDP1 strategy runs as fsdp2; older verl's asynchronous SGLang rollout is
plugrl's sglang engine, which takes requests as they come; verl's short dtype names)."""

LOGGER_RENAMES = {"file": "jsonl"}
"""verl logger -> plugrl logger of the same output (verl's file logger writes each step's
metrics as a JSON line, as plugrl's jsonl does, to metrics.jsonl in the run folder)."""


# ---------------------------------------------------------------------------- results


@attrs.frozen
class Unmapped:
    """An override that is not in the recipe, and why."""

    override: str
    """As verl receives it (``actor_rollout_ref.model.use_remove_padding=True``)."""
    line: int
    category: str
    """A key of :data:`CATEGORIES`."""
    reason: str


@attrs.define
class Conversion:
    """A converted script."""

    source: str
    module: str
    line: int
    recipe: dict[str, Any]
    """The recipe's sections in plugrl's order, only keys that differ from the defaults."""
    overrides: int
    unmapped: list[Unmapped]
    notes: list[str]
    comments: list[str] = attrs.field(factory=list)
    """Lines the written recipe carries as comments under its header: what a reader of the
    recipe alone needs to know about how it differs from the script."""
    placeholders: list[Unmapped] = attrs.field(factory=list)
    """Overrides in the recipe with a value the converter cannot know (a path under a variable
    the script does not set, a run name with ``$(date)``), written as the script spells it:
    paths to fill in before the run, names that only label it. Their settings are not lost, so
    they do not keep a conversion from being clean; the report lists each one."""


@attrs.frozen
class _Target:
    name: VerlName
    subpath: tuple[str, ...] = ()
    """Keys inside an option that is a mapping (``model.override_config``)."""
    shared: tuple[str, str] | None = None
    """(verl key, why) when plugrl's key is that verl key's too."""


@attrs.frozen
class _Skip:
    category: str
    reason: str


# ---------------------------------------------------------------------------- convert


INHERITED = ("HOME", "USER", "LOGNAME", "PWD")
"""Variables launch scripts read from the environment they are started in; ``plugrl convert``
takes them from its own environment unless ``--env`` gives them."""


def convert_script(
    text: str,
    source: str = "script.sh",
    env: Mapping[str, str] | None = None,
    *,
    plugins: PluginManager,
    inherited: Mapping[str, str] | None = None,
) -> Conversion:
    """Convert the text of a verl launch script (``source`` names it in messages) to the keys
    of the parts ``plugins`` registers.

    ``env`` gives variables the script reads but does not set; ``inherited`` gives more, of
    lower rank (the converting machine's ``HOME``), and a note names those the script read."""
    script = read_script(text, env, inherited)
    command, index = _verl_command(script, source)
    return _Converter(plugins).convert(script, command, index, source)


def _verl_command(script: Script, source: str) -> tuple[Command, int]:
    """The command that starts verl's trainer, and the index of its module word."""
    found: list[tuple[Command, int]] = []
    for command in script.commands:
        texts = [word.text for word in command.words]
        for i, text in enumerate(texts):
            if not re.fullmatch(r"python[0-9.]*", PurePath(text).name):
                continue
            module_at = i + 1
            while module_at < len(texts) and texts[module_at] in ("-u", "-O", "-B"):
                module_at += 1
            if texts[module_at : module_at + 1] == ["-m"]:
                module_at += 1
            module = texts[module_at] if module_at < len(texts) else ""
            if _entry_point(module):
                found.append((command, module_at))
            break
    if not found:
        raise ConvertError(
            f"{source}: no verl training command found; expected python3 -m "
            "verl.trainer.main_ppo (or recipe.dapo.main_dapo, or a fully_async_main) followed "
            "by its overrides"
        )
    if len(found) > 1:
        lines = ", ".join(str(command.line) for command, _ in found)
        raise ConvertError(
            f"{source}: {len(found)} verl training commands (lines {lines}); convert one at a "
            "time, from a copy of the script that keeps only that one"
        )
    return found[0]


def _entry_point(module: str) -> str | None:
    """The scheduler of a verl trainer module (``verl.trainer.main_ppo`` -> ``sync``)."""
    dotted = module.removesuffix(".py").replace("/", ".")
    name = dotted.rsplit(".", 1)[-1]
    if name in ENTRY_POINTS and ONE_STEP_OFF in dotted.split("."):
        return "fully_async"
    return ENTRY_POINTS.get(name)


class _Converter:
    def __init__(self, plugins: PluginManager) -> None:
        self.plugins = plugins
        self.config_name: str | None = None
        self.index = verl_names(plugins)
        self.chosen: dict[str, Any] = {}
        self.defaults: dict[tuple[str, ...], Any] = {}
        self.unmapped: list[Unmapped] = []
        self.placeholders: list[Unmapped] = []
        self.notes: list[str] = []
        self.comments: list[str] = []
        self.reward_model = False
        """Whether the script enables verl's reward model."""
        self.foreign_engine: str | None = None
        """verl's training engine when plugrl has no backend of that name (veomni)."""
        self._engine_reports: dict[str, _Skip | None] = {}
        self.given: dict[str, Any] = {}
        """The script's overrides, by the verl key they mean (aliases resolved)."""

    # ------------------------------------------------------------ the command

    def convert(self, script: Script, command: Command, index: int, source: str) -> Conversion:
        module = command.words[index].text
        overrides = self._arguments(command.words[index + 1 :])
        self._describe_command(script, command, module)
        parsed = self._parse(overrides)
        values: dict[tuple[str, ...], tuple[Any, str]] = {}
        scheduler = _entry_point(module) or "sync"
        one_step_off = ONE_STEP_OFF in module.replace("/", ".").split(".")
        dotted = module.removesuffix(".py").replace("/", ".")
        if not dotted.endswith(TRAINERS):
            self.notes.append(
                f"{module} is not one of verl's own trainers; its overrides are converted as "
                f"those of verl's {dotted.rsplit('.', 1)[-1]}, and what it does differently is "
                "not"
            )
        if scheduler != "sync":
            values[("scheduler", "name")] = (scheduler, module)
            if not one_step_off:
                self.notes.append(f"{module} runs as plugrl's {scheduler} scheduler")
        self.given = {_alias(override.key): override.value for _, override in parsed}
        parsed = self._v1_trainer(parsed, values)
        self._choose_parts(parsed, values)
        parsed = self._global_micro_batches(parsed)
        parsed = self._min_lr(parsed)
        if self.chosen["schedulers"] == "fully_async":
            parsed = self._fully_async_keys(parsed)
        parsed = self._distillation_keys(parsed)
        shared: list[tuple[Word, Override, _Target]] = []
        for word, override in parsed:
            self._map(word, override, values, shared)
        for word, override, target in shared:
            self._map_shared(word, override, target, values)
        if one_step_off:
            self._one_step_off(module, values)
        # verl runs on Ray always; so does the recipe
        values[("cluster", "mode")] = ("ray", "")
        self._note_verl_defaults({_alias(override.key) for _, override in parsed})
        written = {
            path: value
            for path, value in values.items()
            if path not in self.defaults or value[0] != self.defaults[path]
        }
        recipe = _assemble(written, self._section_classes())
        total = len(overrides)
        lost = {unmapped.override for unmapped in self.unmapped}
        placeholders = [p for p in self.placeholders if p.override not in lost]
        paths = [p.override.partition("=")[0].lstrip("+") for p in placeholders]
        paths = [key for key in paths if key not in RUN_LABELS]
        if paths:
            self.comments.append(
                f"Fill in before running: {', '.join(paths)} (paths the script builds from "
                "variables it does not set, kept as it spells them)."
            )
        return Conversion(
            source,
            module,
            command.line,
            recipe,
            total,
            self.unmapped,
            self.notes,
            self.comments,
            placeholders,
        )

    def _arguments(self, words: tuple[Word, ...]) -> list[Word]:
        """The Hydra overrides among the arguments; Hydra's own options are noted."""
        overrides: list[Word] = []
        pending: str | None = None
        for word in words:
            text = word.text
            if pending:
                if pending in ("--config-name", "-cn"):
                    self.config_name = text
                pending = None
            elif text in ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"):
                pending = text
            elif re.match(r"--config-(path|name|dir)=", text):
                if text.startswith("--config-name="):
                    self.config_name = text.partition("=")[2]
            elif text.startswith("-"):
                self.notes.append(f"line {word.line}: option {word.source!r} is not converted")
            else:  # Hydra reads every other argument as an override
                overrides.append(word)
        return overrides

    def _describe_command(self, script: Script, command: Command, module: str) -> None:
        if self.config_name:
            name = PurePath(self.config_name).stem
            if not re.fullmatch(
                r"(fully_async_|one_step_off_)?(ppo|dapo)(_megatron)?_trainer", name
            ):
                self.notes.append(
                    f"--config-name {self.config_name}: only the command line is converted; "
                    f"what {name}.yaml changes from verl's defaults is not"
                )
        for line in command.comment_lines:
            self.notes.append(
                f"line {line}: a comment line inside the command; bash ends the command there, "
                "so the overrides after it never reached verl (converted here as if they had)"
            )
        if command.passes_arguments:
            self.notes.append(
                "the command passes on the script's arguments ($@): give them to plugrl run as "
                "KEY=VALUE overrides in plugrl's names"
            )
        if command.conditional:
            self.notes.append(
                f"line {command.line}: the command runs under a condition or in a loop that "
                "cannot be decided here"
            )
        if script.inherited:
            read = ", ".join(f"{name}={value}" for name, value in script.inherited.items())
            names = " ".join(f"--env {name}=..." for name in script.inherited)
            self.notes.append(
                f"read from this machine's environment: {read}; where the run happens they may "
                f"differ: give them with {names}"
            )
        environment = [*dict.fromkeys([*script.exported, *(n for n, _ in command.environment)])]
        if environment:
            self.notes.append(
                f"environment of the run, not part of a recipe: {', '.join(environment)}; "
                "export what plugrl's run needs before plugrl run"
            )
        self.notes.extend(script.notes)

    def _min_lr(self, parsed: list[tuple[Word, Override]]) -> list[tuple[Word, Override]]:
        """Megatron's learning-rate floor (``optim.min_lr``, in units of the learning rate) as
        plugrl's ``min_lr_ratio`` (a fraction of it), where the script gives both ``lr`` and
        ``min_lr`` and not the ratio itself."""
        optim = "actor_rollout_ref.actor.optim."
        given = {override.key: override.value for _, override in parsed}
        lr = given.get(optim + "lr")
        out: list[tuple[Word, Override]] = []
        for word, override in parsed:
            value = override.value
            if (
                override.key == optim + "min_lr"
                and optim + "min_lr_ratio" not in given
                and isinstance(value, (int, float))
                and isinstance(lr, (int, float))
                and lr > 0
            ):
                ratio = value / lr
                self.notes.append(
                    f"line {word.line}: {override.key}={value} is a learning rate; as a fraction "
                    f"of lr={lr} it is min_lr_ratio={ratio:g}"
                )
                override = attrs.evolve(override, key=optim + "min_lr_ratio", value=ratio)
            out.append((word, override))
        return out

    def _global_micro_batches(
        self, parsed: list[tuple[Word, Override]]
    ) -> list[tuple[Word, Override]]:
        """Older verl's per-step micro-batch sizes as the per-device ones verl made of them."""
        given = {override.key: override.value for _, override in parsed}
        nnodes = given.get("trainer.nnodes", 1)
        devices = given.get("trainer.n_gpus_per_node", VERL_DEFAULTS["trainer.n_gpus_per_node"])
        out: list[tuple[Word, Override]] = []
        for word, override in parsed:
            prefix = GLOBAL_MICRO_BATCHES.get(override.key)
            if prefix is None or not isinstance(override.value, int):
                out.append((word, override))
                continue
            per_gpu = override.key + "_per_gpu"
            if per_gpu in given:
                self._skip(word, "dropped", f"the script also sets {per_gpu}, which verl uses")
                continue
            sp = given.get(prefix + "sequence_parallel_size", 1)
            if not all(isinstance(n, int) and n > 0 for n in (nnodes, devices, sp)):
                self._skip(
                    word,
                    "unresolved",
                    "verl divides it by the data-parallel ranks, which are not known here",
                )
                continue
            ranks = max(nnodes * devices // sp, 1)
            value = override.value // ranks
            if value < 1:
                self._skip(
                    word,
                    "invalid",
                    f"verl divides it by the {ranks} data-parallel ranks, which leaves none",
                )
                continue
            self.notes.append(
                f"line {word.line}: {override.key}={override.value} is per step; over "
                f"{ranks} data-parallel ranks verl made it {per_gpu}={value}"
            )
            out.append((word, attrs.evolve(override, key=per_gpu, value=value)))
        return out

    def _fully_async_keys(self, parsed: list[tuple[Word, Override]]) -> list[tuple[Word, Override]]:
        """verl's fully-async keys where plugrl has the same meaning under another key: the
        rollouter's epochs are the run's, its validation counts weight syncs where plugrl's
        counts trainer steps, and its one-prompt generation batch is how it streams."""
        given = {override.key: (word, override) for word, override in parsed}
        trigger = given.get("async_training.trigger_parameter_sync_step")
        sync_step = trigger[1].value if trigger else 1
        out: list[tuple[Word, Override]] = []
        for word, override in parsed:
            key, value = override.key, override.value
            if key == "trainer.total_epochs" and "rollout.total_epochs" in given:
                if given["rollout.total_epochs"][1].value == value:
                    continue  # the same run length, converted once
                self._skip(
                    word,
                    "dropped",
                    "verl's fully-async run lasts the rollouter's rollout.total_epochs, which "
                    "the script also sets; that is trainer.total_epochs here",
                )
                continue
            if key == "rollout.total_epochs":
                override = attrs.evolve(override, key="trainer.total_epochs")
            elif key == "rollout.test_freq":
                if isinstance(value, int) and value > 0 and isinstance(sync_step, int):
                    value = value * sync_step
                    if sync_step != 1:
                        self.notes.append(
                            f"line {word.line}: rollout.test_freq={override.value} counts weight "
                            f"syncs, {sync_step} trainer steps each: trainer.test_freq {value}"
                        )
                if "trainer.test_freq" in given:
                    self._skip(
                        given["trainer.test_freq"][0],
                        "dropped",
                        "verl's fully-async trainer validates every rollout.test_freq weight "
                        "syncs, which the script also sets; that is trainer.test_freq here",
                    )
                override = attrs.evolve(override, key="trainer.test_freq", value=value)
            elif key == "trainer.test_freq" and "rollout.test_freq" in given:
                continue  # reported above
            elif key == "data.gen_batch_size":
                self._skip(
                    word,
                    "dropped",
                    "in verl's fully-async trainer the rollouter's unit of streaming (one "
                    "prompt), not dynamic sampling; plugrl's fully_async scheduler streams each "
                    "prompt as an engine has room (scheduler.max_in_flight_per_engine)",
                )
                continue
            out.append((word, override))
        return out

    def _v1_trainer(
        self,
        parsed: list[tuple[Word, Override]],
        values: dict[tuple[str, ...], tuple[Any, str]],
    ) -> list[tuple[Word, Override]]:
        """verl's V1 trainer (``trainer.use_v1``, its default since 0.8) as plugrl's schedulers:
        ``sync`` is the sync scheduler; ``separate_async`` (engines on devices of their own,
        a weight sync every ``parameter_sync_step`` mini-batches) is the fully_async scheduler
        with the same sync period, run ahead and staleness bound; ``colocate_async`` has no
        counterpart and runs as sync, reported. The V1 keys are consumed here."""
        given = {override.key: (word, override) for word, override in parsed}
        mode_override = given.get("trainer.v1.trainer_mode")
        mode = mode_override[1].value if mode_override else "sync"
        out: list[tuple[Word, Override]] = []
        separate = mode == "separate_async"
        sync_step = 1
        if separate:
            sync_step = self._separate_async(given, values)
        for word, override in parsed:
            key, value = override.key, override.value
            if key == "trainer.use_v1":
                self._skip(
                    word,
                    "dropped",
                    "verl's choice between its two implementations of the trainer loop (V1 on "
                    "TransferQueue, its default, or the legacy one); plugrl has one per "
                    "scheduler, which trainer.v1.trainer_mode decides",
                )
            elif key == "trainer.v1.trainer_mode":
                self._v1_mode(word, value)
            elif key.startswith("trainer.v1."):
                self._v1_key(word, key, value, mode)
            elif separate and key in V1_STEP_KEYS and _positive(value) and sync_step > 1:
                scaled = value * sync_step
                self.notes.append(
                    f"line {word.line}: {key}={value} counts verl's steps of "
                    f"parameter_sync_step {sync_step} mini-batches each; plugrl's fully_async "
                    f"steps are one mini-batch each: {V1_STEP_KEYS[key]} {scaled}"
                )
                out.append((word, attrs.evolve(override, value=scaled)))
            elif separate and key == "data.train_batch_size":
                self._v1_batch(word, value, given, sync_step)
            elif separate and key in V1_ROLLOUT_DEVICES:
                out.append((word, attrs.evolve(override, key=V1_ROLLOUT_DEVICES[key])))
            elif separate and key == "algorithm.rollout_correction.bypass_mode" and _is_true(value):
                out.append(
                    (word, attrs.evolve(override, key="async_training.use_rollout_log_probs"))
                )
            else:
                out.append((word, override))
        return out

    def _v1_mode(self, word: Word, mode: Any) -> None:
        if mode == "sync":
            self._skip(word, "dropped", "verl's synchronous trainer is plugrl's sync scheduler")
        elif mode == "separate_async":
            self._skip(
                word,
                "dropped",
                "runs as plugrl's fully_async scheduler (engines on devices of their own); "
                "the notes say how its keys map",
            )
        elif mode == "colocate_async":
            self._skip(
                word,
                "unknown",
                "plugrl has no asynchronous mode on shared devices: verl's colocate_async "
                "trains once a batch's worth of prompts has finished, aborts the rest and "
                "continues them after the weight sync (partial rollout, samples up to "
                "max_off_policy_threshold steps old); the recipe runs the sync scheduler, which "
                "waits for every response of a step and trains on-policy. plugrl's "
                "asynchronous scheduler, fully_async, needs engines on devices of their own "
                "(rollout.colocate false, rollout.n_gpus_per_node)",
            )
        else:
            self._skip(word, "invalid", f"verl's trainer modes are {', '.join(V1_MODES)}")

    def _v1_key(self, word: Word, key: str, value: Any, mode: str) -> None:
        """A key under ``trainer.v1.`` other than the mode."""
        section = key.split(".")[2]
        if section in V1_MODES and section != mode:
            self._skip(
                word,
                "dropped",
                f"a setting of verl's {section} trainer; the script runs {mode}",
            )
            return
        if key in V1_CONSUMED and mode == "separate_async":
            return  # mapped by _separate_async, which reports it
        if key.startswith("trainer.v1.separate_async.hybrid_rollout.") and not key.endswith(
            ".enable_switch"
        ):
            switch = self.given.get("trainer.v1.separate_async.hybrid_rollout.enable_switch")
            if not _is_true(switch):
                self._skip(word, "dropped", "tunes hybrid_rollout.enable_switch, which is off")
                return
        if mode == "sync" and key.startswith("trainer.v1.sampler.max_off_policy_"):
            self._skip(
                word,
                "dropped",
                "verl's sync trainer is on-policy and ignores it; so is plugrl's sync scheduler",
            )
            return
        if mode == "colocate_async":
            neutral = NEUTRAL.get(key)
            if neutral is None or value not in (
                neutral[0] if isinstance(neutral[0], tuple) else (neutral[0],)
            ):
                self._skip(
                    word,
                    "unknown",
                    "a setting of verl's colocate_async trainer, which the recipe runs as sync "
                    "(see trainer.v1.trainer_mode)",
                )
                return
        resolved = self._resolve(key, value)
        if isinstance(resolved, _Skip):
            self._skip(word, resolved.category, resolved.reason)
        else:  # no option declares a trainer.v1 key
            self._skip(word, "unknown", "no plugrl key has this meaning")

    def _v1_batch(
        self, word: Word, value: Any, given: dict[str, tuple[Word, Override]], sync_step: int
    ) -> None:
        mini = given.get("actor_rollout_ref.actor.ppo_mini_batch_size")
        mini_value = mini[1].value if mini else None
        if isinstance(mini_value, int) and value == sync_step * mini_value:
            self._skip(
                word,
                "dropped",
                f"verl's separate_async step trains parameter_sync_step {sync_step} mini-batches "
                f"of {mini_value} prompts, {value} in all; plugrl's fully_async trains one "
                f"mini-batch per step (scheduler.require_batches 1) and syncs every "
                f"trigger_parameter_sync_step {sync_step} steps: the same updates per sync",
            )
        else:
            self._skip(
                word,
                "invalid",
                f"verl's separate_async requires data.train_batch_size = parameter_sync_step "
                f"{sync_step} x actor.ppo_mini_batch_size {mini_value}",
            )

    def _separate_async(
        self,
        given: dict[str, tuple[Word, Override]],
        values: dict[tuple[str, ...], tuple[Any, str]],
    ) -> int:
        """Set the fully_async scheduler's keys from verl's separate_async ones (or verl's
        defaults of them); returns the sync period in plugrl steps."""
        origin = "trainer.v1.trainer_mode"
        values[("scheduler", "name")] = ("fully_async", origin)
        values[("rollout", "colocate")] = (False, origin)  # the standalone engines

        def setting(key: str) -> tuple[Any, Word | None]:
            found = given.get(key)
            return (found[1].value, found[0]) if found else (V1_DEFAULTS[key], None)

        sync_step, sync_word = setting("trainer.v1.separate_async.parameter_sync_step")
        warmup, warmup_word = setting("trainer.v1.separate_async.num_warmup_batches")
        threshold, threshold_word = setting("trainer.v1.sampler.max_off_policy_threshold")
        strategy, strategy_word = setting("trainer.v1.sampler.max_off_policy_strategy")
        lines: list[str] = []
        if _positive(sync_step) and isinstance(sync_step, int):
            values[("scheduler", "trigger_parameter_sync_step")] = (sync_step, origin)
            lines.append(
                f"parameter_sync_step {sync_step}: a weight sync every {sync_step} mini-batch "
                f"updates is trigger_parameter_sync_step {sync_step} with require_batches 1"
            )
        else:
            self._report_v1(sync_word, "invalid", "must be a whole number of 1 or more")
            sync_step = 1
        if isinstance(warmup, int) and warmup >= 1:
            values[("scheduler", "staleness_threshold")] = (float(warmup - 1), origin)
            lines.append(
                f"num_warmup_batches {warmup}: verl keeps {warmup} batch(es) generating beyond "
                f"the one a step trains, which is staleness_threshold {warmup - 1} "
                f"(max_required_samples = {warmup} x the prompts of a sync period)"
            )
        else:
            self._report_v1(
                warmup_word,
                "unknown",
                "with no warm-up batch verl generates each step's batch after the step starts; "
                "plugrl's rollouter always runs at least one sync period ahead "
                "(staleness_threshold 0)",
            )
        if strategy == "drop" and isinstance(threshold, int) and threshold >= 2:
            values[("scheduler", "max_version_lag")] = (threshold - 1, origin)
            lines.append(
                f"max_off_policy_threshold {threshold} with strategy drop: verl drops a finished "
                f"sample whose prompt was sent more than {threshold} steps (weight versions) "
                f"before the step that would train it, so no trained sample lags more than "
                f"{threshold - 1} versions: scheduler.max_version_lag {threshold - 1}, the strict "
                "bound (plugrl counts a sample's lag from its oldest token, not from when its "
                "prompt was sent, and ends a response as soon as it can no longer train)"
            )
        elif strategy == "drop":
            self._report_v1(
                threshold_word,
                "unknown",
                "a bound of 1 keeps only samples sent in the step that trains them (lag 0); "
                "plugrl's strict bound is at least 1 version (scheduler.max_version_lag)",
            )
        elif strategy == "wait":
            bound = max(threshold - 1, 1) if isinstance(threshold, int) else "N"
            self._report_v1(
                strategy_word,
                "unknown",
                f"verl's wait never drops: it holds the trainer while a sample in flight has "
                f"reached max_off_policy_threshold {threshold} steps and trains it once it "
                "finishes, so samples train about that many versions after their prompt was "
                "sent at most, and none is lost. plugrl has no such dropless bound: the recipe "
                "keeps its default rule (scheduler.max_version_lag null), which drops nothing "
                "either but does not hold the trainer, so a long response can train with a "
                f"larger lag (fully_async/monitor/max_version_lag); scheduler.max_version_lag "
                f"{bound} bounds it by dropping instead",
            )
        else:
            self._report_v1(strategy_word, "invalid", "verl's strategies are drop and wait")
        defaults = [
            f"{key.rsplit('.', 1)[1]} {V1_DEFAULTS[key]}" for key in V1_DEFAULTS if key not in given
        ]
        message = (
            "verl's separate_async trainer runs as plugrl's fully_async scheduler: "
            + "; ".join(lines)
            + (
                f" (verl's defaults, not set by the script: {', '.join(defaults)})"
                if defaults
                else ""
            )
            + ". Old log-probs: verl computes them once per sync period with the weights of its "
            "start (decoupled PPO) unless algorithm.rollout_correction.bypass_mode takes the "
            "engines' (scheduler.use_rollout_log_probs here); plugrl recomputes them with the "
            "current weights at every step."
        )
        self.notes.append(message)
        self.comments.append(message)
        return sync_step

    def _report_v1(self, word: Word | None, category: str, reason: str) -> None:
        """Report a V1 key the script sets; one left at verl's default becomes a note."""
        if word is not None:
            self._skip(word, category, reason)
        else:
            self.notes.append(f"verl's default of the V1 trainer, not set by the script: {reason}")

    def _distillation_keys(
        self, parsed: list[tuple[Word, Override]]
    ) -> list[tuple[Word, Override]]:
        """verl's teachers (``distillation.teacher_models.<name>.*``) in plugrl's layout
        (``distillation.teachers.<name>.{key,model,engine,rollout}``), and verl's one teacher
        pool (``distillation.n_gpus_per_node`` x ``nnodes``) as each teacher's own devices."""
        teachers: dict[str, dict[str, tuple[Word, Override]]] = {}
        pool: dict[str, tuple[Word, Override]] = {}
        out: list[tuple[Word, Override]] = []
        for word, override in parsed:
            key = override.key
            if key in ("distillation.n_gpus_per_node", "distillation.nnodes"):
                pool[key.rpartition(".")[2]] = (word, override)
                continue
            if key in DISTILLATION_DROPPED:
                self._skip(word, "dropped", DISTILLATION_DROPPED[key])
                continue
            if not key.startswith(TEACHERS_PREFIX):
                out.append((word, override))
                continue
            name, _, rest = key.removeprefix(TEACHERS_PREFIX).partition(".")
            teachers.setdefault(name, {})[rest] = (word, override)
        if len(teachers) > 1 and DEFAULT_TEACHER in teachers:
            for word, _ in teachers.pop(DEFAULT_TEACHER).values():
                self._skip(
                    word,
                    "dropped",
                    f"verl drops its default teacher, {DEFAULT_TEACHER}, when other teachers "
                    "are named",
                )
        for name, keys in teachers.items():
            out.extend(self._teacher_keys(name, keys, pool, single=len(teachers) == 1))
        for word, _ in pool.values():
            if not teachers:
                self._skip(word, "dropped", "the teachers' devices, and the script names none")
        return out

    def _teacher_keys(
        self,
        name: str,
        keys: dict[str, tuple[Word, Override]],
        pool: dict[str, tuple[Word, Override]],
        *,
        single: bool,
    ) -> list[tuple[Word, Override]]:
        prefix = f"{TEACHERS_PREFIX}{name}."
        engine_word = keys.get("inference.name")
        engine = engine_word[1].value if engine_word else self.chosen["rollout_engines"]
        engine = VALUE_RENAMES["rollout.engine"].get(engine, engine)
        registry = self.plugins.registry("rollout_engines")
        engine_fields = set(fields_of(RolloutConfig))
        if engine in registry:
            config_cls = registry.get(engine).load_config()
            if isinstance(config_cls, type) and attrs.has(config_cls):
                engine_fields |= set(fields_of(config_cls))
        out: list[tuple[Word, Override]] = []

        def put(word: Word, override: Override, rest: str, value: Any) -> None:
            out.append((word, attrs.evolve(override, key=prefix + rest, value=value)))

        for rest, (word, override) in keys.items():
            if rest == "model_path":
                put(word, override, "model.path", override.value)
            elif rest == "key":
                put(word, override, "key", override.value)
            elif rest == "inference.name":
                put(word, override, "engine", engine)
            elif rest == "num_replicas":
                continue  # with the engine's tensor parallel size, the teacher's devices
            elif rest.startswith(f"inference.engine_kwargs.{engine}.") and (
                "engine_kwargs" in engine_fields or engine not in registry
            ):
                # verl nests the engine's own arguments under its name; plugrl's are flat
                argument = rest.removeprefix(f"inference.engine_kwargs.{engine}.")
                put(word, override, f"rollout.engine_kwargs.{argument}", override.value)
            elif rest.startswith("inference.") and rest.count(".") == 1:
                field = rest.partition(".")[2]
                if field in engine_fields:
                    put(word, override, f"rollout.{field}", override.value)
                elif engine not in registry:
                    self._skip(
                        word,
                        "plugin",
                        "a key the teacher's engine may have: "
                        + self._part("rollout_engines", engine),
                    )
                else:
                    self._skip(
                        word,
                        "unknown",
                        f"the teacher's engine, {engine}, has no rollout key {field}",
                    )
            else:
                self._skip(word, "unknown", "no key of a plugrl teacher has this meaning")
        tp_word = keys.get("inference.tensor_model_parallel_size")
        tp = tp_word[1].value if tp_word else VERL_TEACHER_TP
        replicas_word = keys.get("num_replicas")
        replicas = replicas_word[1].value if replicas_word else 0
        nnodes = pool["nnodes"][1].value if "nnodes" in pool else None
        per_node = pool["n_gpus_per_node"][1].value if "n_gpus_per_node" in pool else None
        anchor = (
            replicas_word or tp_word or pool.get("n_gpus_per_node") or next(iter(keys.values()))
        )
        word, override = anchor
        if tp_word is None and "tensor_model_parallel_size" in engine_fields:
            put(word, override, "rollout.tensor_model_parallel_size", tp)
            self.notes.append(
                f"teacher {name}: verl serves a teacher with tensor_model_parallel_size "
                f"{VERL_TEACHER_TP} unless told otherwise; so does the recipe"
            )
        if single and isinstance(nnodes, int) and isinstance(per_node, int):
            # verl's whole teacher pool is this teacher's, num_replicas filled from it
            put(word, override, "rollout.nnodes", nnodes)
            put(word, override, "rollout.n_gpus_per_node", per_node)
        elif isinstance(replicas, int) and replicas > 0 and isinstance(tp, int):
            # one node per teacher here; verl packs the replicas of all teachers in one pool
            put(word, override, "rollout.nnodes", 1)
            put(word, override, "rollout.n_gpus_per_node", replicas * tp)
            self.notes.append(
                f"teacher {name}: {replicas} replicas of {tp} devices in verl's shared teacher "
                f"pool are {replicas * tp} devices of its own on one node here"
            )
        elif pool:
            for word, _ in pool.values():
                self._skip(
                    word,
                    "unresolved",
                    f"verl splits its teacher pool by each teacher's num_replicas, which the "
                    f"script does not give for {name}; set "
                    f"distillation.teachers.{name}.rollout.n_gpus_per_node",
                )
        return out

    def _one_step_off(self, module: str, values: dict[tuple[str, ...], tuple[Any, str]]) -> None:
        """verl's one-step-off-policy trainer as plugrl's fully_async scheduler: a step trains
        one whole batch, generated with the weights of the step before."""
        for path, value in ONE_STEP_OFF_SETTINGS.items():
            values.setdefault(path, (value, module))
        defaults = Recipe()
        batch = values.get(("data", "train_batch_size"), (defaults.data.train_batch_size, ""))[0]
        mini = values.get(
            ("actor", "ppo_mini_batch_size"), (defaults.actor.ppo_mini_batch_size, "")
        )[0]
        settings = ", ".join(
            f"{path[-1]} {describe_value(v)}" for path, v in ONE_STEP_OFF_SETTINGS.items()
        )
        if ("scheduler", "require_batches") not in values:
            if isinstance(batch, int) and isinstance(mini, int) and mini > 0 and batch % mini == 0:
                values[("scheduler", "require_batches")] = (batch // mini, module)
                settings += (
                    f", require_batches {batch // mini} (data.train_batch_size / "
                    "actor.ppo_mini_batch_size)"
                )
            else:
                self.notes.append(
                    f"data.train_batch_size {batch} is not a multiple of "
                    f"actor.ppo_mini_batch_size {mini}: set scheduler.require_batches to the "
                    "mini-batches a step trains"
                )
        message = (
            f"{module} (verl's one-step-off-policy trainer) runs as plugrl's fully_async "
            f"scheduler with {settings}: the engines generate the next batch with the weights "
            "of one step before while the trainer trains the current one."
        )
        self.notes.append(message)
        self.comments.append(message)

    def _note_verl_defaults(self, given: set[str]) -> None:
        differ = [
            f"{(self.index[verl][0].key)} (verl {describe_value(value)}, plugrl "
            f"{describe_value(self.index[verl][0].default)})"
            for verl, value in VERL_DEFAULTS.items()
            if verl not in given and verl in self.index
        ]
        if differ:
            self.notes.append(
                f"not set by the script, so verl used its defaults, which plugrl's differ from: "
                f"{', '.join(differ)}; set them where the run relied on verl's"
            )

    def _parse(self, words: list[Word]) -> list[tuple[Word, Override]]:
        parsed: dict[str, tuple[Word, Override]] = {}
        for word in words:
            if word.unresolved:
                placeholder = self._placeholder(word)
                if placeholder is None:
                    self._skip(word, "unresolved", "; ".join(word.unresolved))
                    continue
                word = placeholder
            try:
                override = parse_override(word.text)
            except OverrideError as exc:
                category = "unresolved" if "interpolation" in str(exc) else "invalid"
                self._skip(word, category, str(exc))
                continue
            if override.prefix == "~":
                self._skip(word, "dropped", "deletes a key of verl's config; plugrl has none")
                continue
            earlier = parsed.pop(override.key, None)
            if earlier and earlier[1].value != override.value:
                self.notes.append(
                    f"line {word.line}: {override.key} is given twice; the last value, "
                    f"{describe_value(override.value)}, counts (as in Hydra)"
                )
            parsed[override.key] = (word, override)
        return list(parsed.values())

    def _placeholder(self, word: Word) -> Word | None:
        """An override the script cannot give a value to, as it goes into the recipe: a path
        to fill in, or a run's label, with each variable that is not set as ``<NAME>`` (not
        ``${NAME}``, which reads as an interpolation); noted as such. ``None``: another key,
        which stays unresolved."""
        key, _, value = word.text.partition("=")
        key = key.lstrip("+")
        why = "; ".join(word.unresolved)
        if key in RUN_LABELS:
            reason = f"only labels the run; kept as written ({why})"
        elif _PATH_KEY.search(key):
            reason = f"a path to fill in ({why})"
        else:
            return None
        value = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}", r"<\1>", value)
        value = re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*)", r"<\1>", value)
        shown = attrs.evolve(word, text=f"{word.text.partition('=')[0]}={value}")
        self.placeholders.append(Unmapped(shown.text, word.line, "placeholder", reason))
        return shown

    # ----------------------------------------------------------- choosing parts

    def _choose_parts(
        self,
        parsed: list[tuple[Word, Override]],
        values: dict[tuple[str, ...], tuple[Any, str]],
    ) -> None:
        """The parts the script chooses (backend, engine, manager, ...), which decide whose
        keys the other overrides may set."""
        selectors = {kind.recipe_key: kind.name for kind in PART_KINDS.values()}
        defaults = Recipe()
        for kind in PART_KINDS.values():
            section = getattr(defaults, kind.section, None)
            if section is not None and hasattr(section, kind.selector):
                self.chosen[kind.name] = getattr(section, kind.selector)
        if ("scheduler", "name") in values:
            self.chosen["schedulers"] = values[("scheduler", "name")][0]
        if self.config_name and "megatron" in self.config_name:
            self.chosen["training_backends"] = "megatron"
            values[("actor", "backend")] = ("megatron", f"--config-name {self.config_name}")
            self.notes.append(
                f"--config-name {self.config_name} trains with actor.backend megatron"
            )
        self._choose_engine(parsed, values)
        for _word, override in parsed:
            target = self._declared(_alias(override.key))
            value = override.value
            if (
                isinstance(target, _Target)
                and target.name.key in selectors
                and isinstance(value, str)
            ):
                renamed = VALUE_RENAMES.get(target.name.key, {})
                self.chosen[selectors[target.name.key]] = renamed.get(value, value)
        self._choose_reward_model(parsed, values)

    def _choose_engine(
        self,
        parsed: list[tuple[Word, Override]],
        values: dict[tuple[str, ...], tuple[Any, str]],
    ) -> None:
        """verl 0.8's ``model_engine=megatron`` (and the actor's own ``model_engine``) choose
        the training backend, as ``--config-name ppo_megatron_trainer`` did before."""
        for _word, override in parsed:
            key = _alias(override.key)
            if key in STRATEGY_KEYS and override.value in FSDP_LIKE_ENGINES:
                self._engine_reports[override.key] = self._foreign(str(override.value))
                continue
            if override.key not in ENGINE_SELECTORS:
                continue
            engine = override.value
            backend = BACKENDS.get(engine) if isinstance(engine, str) else None
            if backend is not None:
                self.chosen["training_backends"] = backend
                values[("actor", "backend")] = (backend, override.key)
                self._engine_reports[override.key] = None
            elif engine in FSDP_LIKE_ENGINES:
                self._engine_reports[override.key] = self._foreign(str(engine))
            else:
                self._engine_reports[override.key] = _Skip(
                    "unknown", f"verl's training engine {engine!r} has no plugrl backend"
                )

    def _foreign(self, engine: str) -> _Skip:
        """Choose fsdp2 for a verl engine plugrl has no backend for (see FSDP_LIKE_ENGINES)."""
        self.chosen["training_backends"] = "fsdp2"
        self.foreign_engine = engine
        name = FSDP_LIKE_ENGINES[engine]
        # the choice of engine is reported, not lost: what the engine trains, fsdp2 trains;
        # each of its own settings is decided on its own (FOREIGN_ENGINE_SETTINGS)
        return _Skip(
            "dropped",
            f"plugrl has no {name} backend; the recipe trains with actor.backend fsdp2, which "
            f"shards the model with PyTorch's FSDP2 as {name} does (its own settings are "
            "reported one by one)",
        )

    def _choose_reward_model(
        self,
        parsed: list[tuple[Word, Override]],
        values: dict[tuple[str, ...], tuple[Any, str]],
    ) -> None:
        """``reward_model.enable=True`` chooses the reward_model manager, whatever
        ``reward_model.reward_manager`` says: verl's managers return the model's scores."""
        given = {_alias(override.key): override.value for _, override in parsed}
        if not _is_true(given.get(REWARD_MODEL_ENABLE)):
            return
        self.reward_model = True
        self.chosen["reward_managers"] = REWARD_MODEL_MANAGER
        values[("reward", "manager")] = (REWARD_MODEL_MANAGER, REWARD_MODEL_ENABLE)
        self.comments.append(
            "reward_model.enable=True: the reward model's score is the reward "
            "(reward.manager: reward_model), as in verl."
        )
        if any(key.startswith("custom_reward_function.") for key in given):
            self.comments.append(
                "The script's custom_reward_function is left out: verl never calls it while "
                "the reward model is on (its reward manager returns the model's scores). To "
                "add it to the model's score, weigh both with reward.components."
            )
        self.comments.append(
            "The reward model runs in the driver process (reward.placement: local); "
            "reward.placement=ray runs reward.num_workers copies on Ray actors, a device each."
        )

    def _part(self, kind: str, name: str) -> str:
        """``rollout engine 'vllm', which is not installed here (pip install ...)``."""
        human = PART_KINDS[kind].human_name
        if name in self.plugins.registry(kind):
            return f"{human} {name!r}"
        install = KNOWN_EXTERNAL.get((kind, name))
        if install:
            return f"{human} {name!r}, which is not installed here ({install})"
        return f"{human} {name!r}, which no installed plugin registers"

    # ----------------------------------------------------------------- mapping

    def _map(
        self,
        word: Word,
        override: Override,
        values: dict[tuple[str, ...], tuple[Any, str]],
        shared: list[tuple[Word, Override, _Target]],
    ) -> None:
        if override.key in self._engine_reports:
            report = self._engine_reports[override.key]
            if report is not None:
                self._skip(word, report.category, report.reason)
            return
        foreign = self.foreign_engine
        if (
            foreign
            and _alias(override.key) == override.key
            and (
                any(
                    override.key.startswith(f"{role}.{foreign}.")
                    for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
                )
                or ".fsdp_config.turbo_config." in override.key
            )
        ):
            name = FSDP_LIKE_ENGINES[foreign]
            setting = FOREIGN_ENGINE_SETTINGS.get(override.key.split(f".{foreign}.", 1)[-1])
            if setting is not None and (setting[0] is None or override.value in setting[0]):
                self._skip(word, "dropped", setting[1].replace("{engine}", name))
            else:
                self._skip(
                    word,
                    "plugin",
                    f"a key of verl's {name} engine, which plugrl does not have (see its "
                    "model_engine or strategy)",
                )
            return
        if _alias(override.key) == REWARD_MODEL_ENABLE:
            if not self.reward_model:  # enabled: reward.manager says so already
                self._skip(
                    word,
                    "dropped",
                    "the reward model is off, as in plugrl unless reward.manager is reward_model",
                )
            return
        if _alias(override.key) == LORA_MERGE:
            self._lora_merge(word, override.value, values)
            return
        if override.key.endswith(DISABLE_MM_CACHE):
            if override.value is not True:
                self._skip(word, "dropped", "vLLM's multimodal processor cache stays on")
                return
            override = attrs.evolve(
                override,
                key=override.key.removesuffix(DISABLE_MM_CACHE)
                + "engine_kwargs.vllm.mm_processor_cache_gb",
                value=0,
            )
            self.notes.append(
                f"line {word.line}: {word.text} is vLLM 0.32's mm_processor_cache_gb=0 "
                "(no multimodal processor cache)"
            )
        resolved = self._resolve(override.key, override.value)
        if isinstance(resolved, _Skip):
            self._skip(word, resolved.category, resolved.reason)
            return
        if resolved.shared:
            shared.append((word, override, resolved))
            return
        typed = self._typed(word, override, resolved)
        if typed is _INVALID:
            return
        path = (*resolved.name.key.split("."), *resolved.subpath)
        values[path] = (typed, override.key)
        if not resolved.subpath:
            self.defaults[path] = resolved.name.default

    def _lora_merge(
        self, word: Word, value: Any, values: dict[tuple[str, ...], tuple[Any, str]]
    ) -> None:
        """verl's ``lora.merge`` as ``rollout.lora_sync``: true syncs the weights with the
        adapters merged in, false loads the adapters alone into the engine."""
        if not _positive(self.given.get("actor_rollout_ref.model.lora_rank")):
            self._skip(word, "dropped", "no LoRA adapters to merge (lora_rank is 0)")
            return
        if _is_true(value):
            sync = "merged"
        elif value is False or (isinstance(value, str) and value.lower() == "false"):
            sync = "adapters"
            classes = self._section_classes()
            rollout, actor = classes.get("rollout"), classes.get("actor")
            engine = self.chosen.get("rollout_engines")
            # an engine not installed here is judged by the recipe check where it is
            installed = engine in self.plugins.registry("rollout_engines")
            if installed and not getattr(rollout, "supports_lora_adapters", False):
                self._skip(
                    word,
                    "dropped",
                    f"the {engine} engine takes no LoRA adapters apart from its weights, so "
                    "rollout.lora_sync stays auto: merged weights (rollout.engine=vllm takes "
                    "the adapters alone)",
                )
                return
            if not getattr(actor, "sends_lora_adapters", False):
                backend = self.chosen.get("training_backends")
                self._skip(
                    word,
                    "dropped",
                    f"the {backend} backend sends no LoRA adapters apart from its weights, so "
                    "rollout.lora_sync stays auto: merged weights",
                )
                return
        else:
            self._skip(word, "invalid", f"rollout.lora_sync: {value!r} is not True or False")
            return
        values[("rollout", "lora_sync")] = (sync, LORA_MERGE)
        self.defaults[("rollout", "lora_sync")] = "auto"
        self.notes.append(f"line {word.line}: {word.text} is rollout.lora_sync: {sync}")

    def _map_shared(
        self,
        word: Word,
        override: Override,
        target: _Target,
        values: dict[tuple[str, ...], tuple[Any, str]],
    ) -> None:
        typed = self._typed(word, override, target)
        if typed is _INVALID:
            return
        path = tuple(target.name.key.split("."))
        current, origin = values.get(path, (target.name.default, ""))
        if typed != current:
            assert target.shared is not None
            set_by = f"from {origin}" if origin else "the default"
            self._skip(
                word,
                "dropped",
                f"{target.shared[1]}: {target.name.key} is {describe_value(current)} ({set_by})",
            )

    def _typed(self, word: Word, override: Override, target: _Target) -> Any:
        """The value as the option's type, or ``_INVALID`` (reported)."""
        if target.subpath:
            return override.value
        field = target.name.field
        key = target.name.key
        value = override.value
        if key in VALUE_RENAMES and value in VALUE_RENAMES[key]:
            renamed = VALUE_RENAMES[key][value]
            self.notes.append(f"line {word.line}: {override.key}={value} becomes {key}: {renamed}")
            value = renamed
        if key == "trainer.logger":
            value = self._loggers(word, value)
        if key == "data.train_batch_size" and value == 0 and self.chosen["schedulers"] != "sync":
            self._skip(
                word,
                "dropped",
                "0 tells verl's fully-async trainer to ignore it (a step trains on "
                "async_training.require_batches x ppo_mini_batch_size prompts); plugrl's "
                "fully_async scheduler has its own keys",
            )
            return _INVALID
        try:
            typed = converter().structure(value, field.type)
        except Exception as exc:
            message = str(exc.args[0]) if isinstance(exc, TypeError) and exc.args else str(exc)
            self._skip(word, "invalid", f"{key}: {message}")
            return _INVALID
        choices = field.metadata.get("choices")
        try:
            if choices is not None and typed not in choices:
                listed = ", ".join("null" if c is None else str(c) for c in choices)
                raise ConfigValueError(field.name, f"must be one of {listed}, got {typed!r}")
            if field.validator is not None:
                field.validator(None, field, typed)
        except ConfigValueError as exc:
            self._skip(word, "invalid", f"{key}: {exc.message}")
            return _INVALID
        except Exception:  # a validator that reads other options: the recipe check runs it
            pass
        return typed

    def _loggers(self, word: Word, value: Any) -> Any:
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list):
            return value
        for name in names:
            if name in LOGGER_RENAMES:
                self.notes.append(
                    f"line {word.line}: logger {name!r} is plugrl's {LOGGER_RENAMES[name]!r} "
                    "(each step's metrics as a JSON line, in metrics.jsonl of the run folder)"
                )
        names = [LOGGER_RENAMES.get(name, name) for name in names]
        registry = self.plugins.registry("loggers")
        missing = [name for name in names if name not in registry]
        if missing:
            kept = [name for name in names if name in registry]
            self._skip(
                word,
                "plugin",
                f"logger {', '.join(map(repr, missing))}: no installed plugin registers it "
                f"(installed: {', '.join(registry.names())}); kept: {', '.join(kept) or 'none'}",
            )
        return [name for name in names if name in registry]

    def _resolve(self, key: str, value: Any) -> _Target | _Skip:
        key = _alias(key)
        engine_argument = ENGINE_ARGUMENTS.get(key, {}).get(self.chosen.get("rollout_engines"))
        if engine_argument:
            key = engine_argument
        if key in DROPPED:
            return _Skip("dropped", DROPPED[key])
        by_prefix = _match(DROPPED_PREFIXES, key)
        if by_prefix:
            return _Skip("dropped", by_prefix[0])
        if key in NEUTRAL:
            neutral, what = NEUTRAL[key]
            if value in (neutral if isinstance(neutral, tuple) else (neutral,)):
                shown = "null" if value is None else "an empty value" if value == "" else None
                return _Skip("dropped", f"{what}, as {shown or describe_value(value)} asks")
            return _Skip("unknown", what)
        if key.startswith("hydra."):
            return _Skip("dropped", "a setting of Hydra itself, which plugrl does not use")
        contextual = self._contextual(key, value)
        if contextual is not None:
            return contextual
        unsupported = _match(dict(UNSUPPORTED), key)
        if unsupported:
            return _Skip("unsupported", unsupported[0])
        if key.startswith("reward_model.rollout."):
            return _Skip("dropped", _REWARD_MODEL_ENGINE)
        if self.reward_model and (
            key == "reward_model.reward_manager" or key.startswith("custom_reward_function.")
        ):
            return _Skip("dropped", REWARD_MODEL_REPLACES)
        if key in self.index:
            # an option that declares this very key beats a rule for a whole prefix (the
            # reference model's own offload switch, under actor_rollout_ref.ref.)
            declared = self._declared(key)
            assert declared is not None
            return declared
        shared = _match(SHARED, key)
        if shared:
            (primary, why), rest = shared
            return self._via(primary + rest, value, why)
        declared = self._declared(key)
        if declared is not None:
            return declared
        if key.startswith("critic."):
            return self._critic(key, value)
        for prefix, kind, part in PART_KEYS:
            if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
                return self._elsewhere(kind, part)
        engine_key = key.removeprefix("actor_rollout_ref.rollout.").split(".")[0]
        if key.startswith("actor_rollout_ref.rollout.") and engine_key in ENGINE_KEYS:
            engine = self.chosen["rollout_engines"]
            if engine in ("vllm", "sglang"):
                return self._elsewhere("rollout_engines", engine)
            return _Skip(
                "plugin",
                f"a key of the vllm and sglang engines; the script's engine, {engine}, has none",
            )
        for prefix, kind in PART_PREFIXES.items():
            chosen = self.chosen[kind]
            if key.startswith(prefix) and chosen not in self.plugins.registry(kind):
                return _Skip(
                    "plugin",
                    f"not a key of plugrl's core; it may be one of {self._part(kind, chosen)}",
                )
        section = _section_of(key)
        return _Skip(
            "unknown",
            "no plugrl key has this meaning"
            + (f" (plugrl explain {section} lists that section's keys)" if section else ""),
        )

    def _contextual(self, key: str, value: Any) -> _Skip | None:
        """Keys whose effect depends on the script's other settings."""
        given = self.given
        if (
            key.endswith(".megatron.vanilla_mbridge")
            and value is False
            and not _positive(given.get("actor_rollout_ref.model.lora_rank"))
        ):
            # which library builds the Megatron model from the Hugging Face weights: the same
            # weights either way. With LoRA it is Megatron-Bridge's adapters, so it stays invalid
            return _Skip(
                "dropped",
                "verl's choice of the library that builds the Megatron model from the Hugging "
                "Face weights (NVIDIA's Megatron-Bridge); plugrl-megatron builds it with its own "
                "conversion, the same weights, for the model types it converts (it stops at "
                "start-up, naming the model type, for another)",
            )
        if key == _PRECISION_AWARE:
            # it only lets Megatron keep gradients and Adam's moments below fp32; at fp32 (verl's
            # default, and Megatron's) the update is the same
            lower = [
                f"{name}={given[name]}"
                for name in given
                if name.endswith(_STATE_DTYPES) and given[name] not in ("fp32", "float32")
            ]
            if not lower:
                return _Skip(
                    "dropped",
                    "Megatron's precision-aware optimizer with fp32 gradients and Adam moments "
                    "(verl's default dtypes; the script sets no others): TransformerEngine's "
                    "fused Adam, the same update; plugrl-megatron runs Megatron's own",
                )
            return _Skip(
                "unknown",
                f"Megatron's precision-aware optimizer keeping optimizer state below fp32 "
                f"({', '.join(lower)}); plugrl-megatron keeps it in fp32",
            )
        if key == "actor_rollout_ref.model.use_remove_padding" and (
            self.chosen.get("training_backends") == "megatron"
        ):
            return _Skip(
                "dropped",
                "plugrl's megatron backend always runs the packed layout, where no token "
                "attends to padding: the same log-probs either way",
            )
        if key in LORA_KEYS and _positive(given.get("actor_rollout_ref.model.lora_rank")):
            backend = self.chosen.get("training_backends")
            actor_class = self._section_classes().get("actor")
            if not getattr(actor_class, "supports_lora", True):
                return _Skip(
                    "unknown",
                    f"the {backend} backend trains no LoRA adapters, so the recipe trains every "
                    "weight (actor.backend fsdp2 trains adapters)",
                )
        if key == "actor_rollout_ref.nccl_timeout" and isinstance(value, (int, float)):
            plugrl_seconds = 30 * 60
            if value <= plugrl_seconds:
                return _Skip(
                    "dropped",
                    f"plugrl's process groups wait {plugrl_seconds} s for a collective, at least "
                    f"the {value} s asked",
                )
            # how long a rank waits before it gives up: a run that needs longer stops with a
            # timeout error, it does not train anything else
            return _Skip(
                "dropped",
                f"plugrl's process groups wait {plugrl_seconds} s for a collective (not "
                f"settable), less than the {value} s asked: a collective slower than that stops "
                "the run with a timeout error",
            )
        if key in ENTROPY_MEMORY:
            return _Skip("dropped", ENTROPY_MEMORY[key])
        lengths = {
            "actor_rollout_ref.rollout.prompt_length": "data.max_prompt_length",
            "actor_rollout_ref.rollout.response_length": "data.max_response_length",
        }
        if key in lengths:
            data_key = lengths[key]
            if data_key in given and given[data_key] == value:
                return _Skip(
                    "dropped",
                    f"the engines' length, as {data_key} sets it (verl's default is that value "
                    "too); plugrl's engines take data's lengths",
                )
            return _Skip(
                "unknown",
                f"plugrl's engines take {data_key}"
                + (f" ({describe_value(given[data_key])} here)" if data_key in given else "")
                + "; a different engine length has no counterpart",
            )
        if key == "trainer.resume_from_path" and given.get("trainer.resume_mode") != "resume_path":
            return _Skip(
                "dropped", "verl reads it only with trainer.resume_mode=resume_path, not set here"
            )
        if key == "custom_reward_function.name" and value is None:
            path = given.get("custom_reward_function.path")
            if path in (None, ""):
                return _Skip("dropped", "no custom reward function: path and name are null")
        if (
            key == "actor_rollout_ref.actor.checkpoint.save_contents"
            and isinstance(value, list)
            and {"model", "optimizer", "extra"} <= set(value)
        ):
            return _Skip(
                "dropped",
                "plugrl's checkpoints always hold the model, the optimizer and the rest of the "
                "run's state",
            )
        if key.startswith("ray_kwargs.ray_init.runtime_env.env_vars."):
            name = key.rsplit(".", 1)[1]
            return _Skip(
                "dropped",
                f"{name} is an environment variable of verl's Ray workers; export what "
                "plugrl's run needs before plugrl run",
            )
        return None

    def _critic(self, key: str, value: Any) -> _Target | _Skip:
        """A key of verl's critic that no option declares: the actor's key of the same name
        (``critic.model.use_remove_padding`` is ``actor_rollout_ref.model.use_remove_padding``)
        decides it. What plugrl shares between the models is carried over as the actor's; a
        feature plugrl lacks is reported for the same reason as the actor's."""
        rest = key.removeprefix("critic.")
        if rest in CRITIC_OWN_MODEL_KEYS:
            # adapters on the critic are asked for by a rank above 0 alone
            off = rest != "model.lora_rank" or value in (0, None)
            return _Skip("dropped" if off else "unknown", CRITIC_OWN_MODEL_KEYS[rest])
        actor = (
            "actor_rollout_ref." + rest
            if rest.startswith("model.")
            else "actor_rollout_ref.actor." + rest
        )
        resolved = self._resolve(actor, value)
        if isinstance(resolved, _Skip):
            return resolved
        if rest.startswith("model.") or rest in CRITIC_SHARES:
            return self._via(actor, value, CRITIC_SHARES.get(rest, _CRITIC_MODEL))
        return _Skip(
            "unknown",
            f"plugrl's critic has no key of its own for it; {resolved.name.key} is the actor's",
        )

    def _via(self, key: str, value: Any, why: str) -> _Target | _Skip:
        """A key plugrl covers with the plugrl key of verl ``key``."""
        resolved = self._resolve(key, value)
        if isinstance(resolved, _Target) and not resolved.subpath:
            return attrs.evolve(resolved, shared=(key, why))
        return resolved

    def _declared(self, key: str) -> _Target | _Skip | None:
        """The option that declares ``key`` as its verl name (or a mapping option above it)."""
        names = self.index.get(key)
        if names:
            return self._owned(names)
        parts = key.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            for name in self.index.get(".".join(parts[:cut]), []):
                if typing.get_origin(name.field.type) is dict:
                    owned = self._owned([name])
                    if isinstance(owned, _Skip):
                        return owned
                    return _Target(name, tuple(parts[cut:]))
        return None

    def _owned(self, names: list[VerlName]) -> _Target | _Skip:
        """Of the options declaring a verl name, the core's or the chosen part's."""
        for name in names:
            if name.kind is None or self.chosen.get(name.kind) == name.part:
                return _Target(name)
        name = names[0]
        assert name.kind is not None and name.part is not None
        chosen = self.chosen.get(name.kind, "?")
        return _Skip(
            "plugin",
            f"a key of {self._part(name.kind, name.part)}, but the script chooses {chosen!r}",
        )

    def _elsewhere(self, kind: str, part: str) -> _Skip:
        """A key that belongs to ``part``'s own config (which did not declare it)."""
        chosen = self.chosen.get(kind)
        if chosen == part and part in self.plugins.registry(kind):
            section = PART_KINDS[kind].section
            return _Skip(
                "unknown",
                f"{self._part(kind, part)} has no such key (plugrl explain {section} lists "
                "the keys)",
            )
        but = f", but the script chooses {chosen!r}" if chosen != part else ""
        return _Skip("plugin", f"a key of {self._part(kind, part)}{but}")

    def _skip(self, word: Word, category: str, reason: str) -> None:
        self.unmapped.append(Unmapped(word.text, word.line, category, reason))

    def _section_classes(self) -> dict[str, type]:
        """Each section's config class: the chosen part's where it is installed."""
        classes: dict[str, type] = {}
        for name, field in fields_of(Recipe).items():
            kind = section_kind(name)
            cls = field.type
            if kind is not None:
                chosen = self.chosen.get(kind.name)
                registry = self.plugins.registry(kind.name)
                if chosen in registry:
                    try:
                        loaded = registry.get(chosen).load_config()
                    except PluginError:
                        loaded = None
                    cls = loaded if isinstance(loaded, type) and attrs.has(loaded) else cls
            classes[name] = cls
        return classes


_INVALID = object()

SHORT_FORMS = ("device", "scheduler", "cluster")
"""Sections written as their short form (``device: npu``) when they hold only that choice."""


def _positive(value: Any) -> bool:
    """Whether an override's value is a number above 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _is_true(value: Any) -> bool:
    """Whether an override's value is Hydra's true (``True``, ``true``)."""
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _match(table: Mapping[str, Any], key: str) -> tuple[Any, str] | None:
    """The entry of ``table`` for ``key`` (an entry ending in a dot or underscore is a prefix),
    and the rest of the key after it."""
    for entry, value in table.items():
        if key == entry or (entry[-1] in "._" and key.startswith(entry)):
            return value, key[len(entry) :]
    return None


def _alias(key: str) -> str:
    """The verl key that ``key`` is another name of (itself when none)."""
    found = _match(ALIASES, key)
    return found[0] + found[1] if found else key


def _section_of(key: str) -> str | None:
    """The plugrl section a verl key's first part suggests, for the hint of an unknown key."""
    head = key.split(".")[0]
    if key.startswith("actor_rollout_ref."):
        head = key.split(".")[1] if key.count(".") > 1 else head
    head = {"ref": "actor", "reward_model": "reward", "custom_reward_function": "reward"}.get(
        head, head
    )
    return head if head in fields_of(Recipe) else None


def _assemble(values: dict[tuple[str, ...], tuple[Any, str]], classes: dict[str, type]) -> dict:
    """Nested sections in the recipe's order, keys in their class's order; a section that
    holds only the key choosing its part becomes the short form (``device: npu``)."""
    nested: dict[str, Any] = {}
    for path, (value, _origin) in values.items():
        node = nested
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = copy.deepcopy(value)
    recipe: dict[str, Any] = {}
    for section, cls in classes.items():
        if section not in nested:
            continue
        kind = section_kind(section)
        selector = "mode" if section == "cluster" else kind.selector if kind else None
        body = _ordered(nested[section], cls, selector)
        short = section in SHORT_FORMS and list(body) == [selector]
        recipe[section] = body[selector] if short else body
    return recipe


def _ordered(body: dict[str, Any], cls: type | None, first: str | None = None) -> dict[str, Any]:
    """``body`` in the order of ``cls``'s options, ``first`` (the key that chooses the
    section's part) at the top."""
    if cls is None or not attrs.has(cls):
        return body
    fields = fields_of(cls)
    order = {name: i for i, name in enumerate(fields)}
    if first in order:
        order[first] = -1
    out: dict[str, Any] = {}
    for name in sorted(body, key=lambda n: order.get(n, len(order))):
        field_type = fields[name].type if name in fields else None
        value = body[name]
        if isinstance(value, dict) and isinstance(field_type, type) and attrs.has(field_type):
            value = _ordered(value, field_type)
        out[name] = value
    return out
