"""Every hook a plugrl plugin can implement. This module is the reference documentation.

A plugin is a module (or any object) with functions marked ``@plugrl.hookimpl`` whose names are
the hook names below, found through the ``plugrl`` entry-point group. A function may take a
subset of a hook's arguments, by name.

Two kinds of hook:

* **Registration hooks** (``register_*``) are called once per process, in the driver and in each
  worker, with a ``register`` callable. They must be cheap: register a class or function, or the
  ``"module:attribute"`` path to one, never an instance, so that only the part a recipe chooses
  imports its heavy libraries. See :class:`plugrl.plugin.registry.Registry.register` for the options
  ``register`` accepts (``config``, ``requires``, ``install``, ``description``, ``aliases``).
  A name registered twice in one kind is an error that names both plugins.
* **Lifecycle hooks** run at fixed points of a run. Each docstring says in which process.
* **Model-family hooks** (``multimodal_model``) answer for the model types a plugin knows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from plugrl import PROJECT_NAME

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from plugrl.data.multimodal import MultimodalModel
    from plugrl.plan.context import PlanContext
    from plugrl.plan.shape import ModelShape
    from plugrl.plan.terms import MemoryTerm
    from plugrl.plugin.registry import RegisterFn
    from plugrl.recipe import Recipe

hookspec = pluggy.HookspecMarker(PROJECT_NAME)


# --------------------------------------------------------------------------------------------
# Registration hooks
# --------------------------------------------------------------------------------------------


@hookspec
def register_devices(register: RegisterFn) -> None:
    """Register device kinds (``cpu``, ``cuda``, ``npu``).

    Process: driver and every worker.
    Target: a subclass of :class:`plugrl.parts.device.Device`.
    Chosen by: ``device.name`` in a recipe (``auto`` asks :func:`detect_device`).

    Example::

        @plugrl.hookimpl
        def register_devices(register):
            register("xpu", "my_pkg.xpu:XpuDevice", requires=["intel_extension_for_pytorch"],
                     install="pip install intel-extension-for-pytorch")
    """


@hookspec
def register_training_backends(register: RegisterFn) -> None:
    """Register training backends (``fsdp2``, ``megatron``).

    Process: driver and every worker.
    Target: a subclass of :class:`plugrl.parts.backend.TrainingBackend`.
    Config: a subclass of :class:`plugrl.parts.backend.ActorConfig`; the whole ``actor``
    section of a recipe is read into it.
    Chosen by: ``actor.backend``.
    """


@hookspec
def register_rollout_engines(register: RegisterFn) -> None:
    """Register rollout (generation) engines (``hf``, ``vllm``, ``sglang``).

    Process: driver and every worker.
    Target: a subclass of :class:`plugrl.parts.rollout.RolloutEngine`.
    Config: a subclass of :class:`plugrl.parts.rollout.RolloutConfig`; the whole ``rollout``
    section of a recipe is read into it.
    Chosen by: ``rollout.engine``.
    """


@hookspec
def register_weight_transports(register: RegisterFn) -> None:
    """Register weight transports: how a training backend's weights reach engine workers
    (``local``, ``object_store``, ``collective``).

    Process: driver and every worker.
    Target: a subclass of :class:`plugrl.parts.transport.WeightTransport`.
    Chosen by: ``rollout.weight_transport`` (``auto`` picks a built-in one). An engine plugin
    whose engine has a faster route of its own (CUDA IPC handles, a NCCL group set up by the
    engine) registers it here.
    """


@hookspec
def register_advantage_estimators(register: RegisterFn) -> None:
    """Register advantage estimators (``gae``, ``grpo``, ``rloo``, ...).

    Process: driver and every worker.
    Target: a subclass of :class:`plugrl.parts.algorithm.AdvantageEstimator`.
    Config (optional): an attrs class read from ``algorithm.adv_estimator_args``.
    Chosen by: ``algorithm.adv_estimator``.
    """


@hookspec
def register_policy_losses(register: RegisterFn) -> None:
    """Register policy losses (``vanilla``, ``gspo``, ``clip_cov``, ...).

    Process: driver and every worker.
    Target: a subclass of :class:`plugrl.parts.algorithm.PolicyLoss`.
    Config (optional): an attrs class read from ``actor.policy_loss_args``.
    Chosen by: ``actor.policy_loss``.
    """


@hookspec
def register_kl_penalties(register: RegisterFn) -> None:
    """Register KL divergence estimators (``kl``, ``abs``, ``mse``, ``low_var_kl``, ...).

    Process: driver and every worker.
    Target: a function ``(log_prob, ref_log_prob) -> Tensor`` of per-token penalties, same
    shape as its inputs.
    Chosen by: ``actor.kl_loss_type`` (KL as a loss) and ``algorithm.kl_penalty`` (KL in reward).
    """


@hookspec
def register_reward_managers(register: RegisterFn) -> None:
    """Register reward managers (``naive``, ``dapo``, ``batch``, ``parallel``).

    Process: driver (and the reward workers of a distributed manager).
    Target: a subclass of :class:`plugrl.parts.reward.RewardManager`.
    Config: a subclass of :class:`plugrl.parts.reward.RewardConfig`; the whole ``reward``
    section of a recipe is read into it.
    Chosen by: ``reward.manager``.
    """


@hookspec
def register_reward_functions(register: RegisterFn) -> None:
    """Register scoring functions by data source.

    Process: driver and reward workers.
    Target: a function with verl's signature
    ``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``;
    a dict carries ``score`` plus extra fields that become metrics.
    Name: the ``data_source`` value of the rows it scores. A name may be a glob pattern
    (``aime*``); an exact name wins over a pattern.
    """


@hookspec
def register_judge_parsers(register: RegisterFn) -> None:
    """Register score parsers of LLM judges (``rating``, ``number``, ``yes_no``, ``boxed``).

    Process: driver.
    Target: a function ``parse(text) -> float | None`` that reads the score out of a judge
    model's answer, ``None`` when the answer holds none (the judge is asked again); see
    :class:`plugrl.parts.judge.JudgeParser`.
    Config (optional): an attrs class read from ``reward.judge.parser_args``; its fields reach
    the function as keyword arguments.
    Chosen by: ``reward.judge.parser`` (``reward.manager: judge``).
    """


@hookspec
def register_schedulers(register: RegisterFn) -> None:
    """Register schedulers, what one training step does (``sync``, ``fully_async``); the core's
    run loop (:func:`plugrl.run.loop.run_loop`) runs the steps.

    Process: driver.
    Target: a subclass of :class:`plugrl.parts.scheduler.Scheduler`.
    Config: a subclass of :class:`plugrl.parts.scheduler.SchedulerConfig`; the whole
    ``scheduler`` section of a recipe is read into it.
    Chosen by: ``scheduler.name``.
    """


@hookspec
def register_agent_loops(register: RegisterFn) -> None:
    """Register agent loops, how one sample's trajectory is produced (``single_turn``,
    ``tool``, ``env``).

    Process: driver (and every engine worker that runs agent loops).
    Target: a subclass of :class:`plugrl.parts.agent.AgentLoop`.
    Config (optional): a subclass of :class:`plugrl.parts.agent.AgentLoopConfig`, read from
    ``rollout.agent.loop_args``.
    Chosen by: ``rollout.agent.loop``, or a row's ``agent_name`` column.
    """


@hookspec
def register_tools(register: RegisterFn) -> None:
    """Register tools the model may call (``calculator``, ``python``).

    Process: driver (and every process that runs agent loops).
    Target: a subclass of :class:`plugrl.parts.agent.Tool`.
    Config (optional): a subclass of :class:`plugrl.parts.agent.ToolConfig`, read from
    ``rollout.agent.tool_args.<name>``.
    Chosen by: the list ``rollout.agent.tools``.
    """


@hookspec
def register_environments(register: RegisterFn) -> None:
    """Register environments that drive a trajectory's turns (the ``env`` agent loop).

    Process: driver (and every process that runs agent loops).
    Target: a subclass of :class:`plugrl.parts.agent.Environment`.
    Config (optional): a subclass of :class:`plugrl.parts.agent.EnvironmentConfig`, read from
    ``rollout.agent.env_args``.
    Chosen by: ``rollout.agent.env``.
    """


@hookspec
def register_tool_parsers(register: RegisterFn) -> None:
    """Register tool-call parsers, which read tool calls out of a model turn (``hermes``,
    ``llama3_json``).

    Process: driver (and every process that runs agent loops).
    Target: a function of the signature :class:`plugrl.parts.agent.ToolCallParser`.
    Chosen by: ``rollout.agent.tool_parser``.
    """


@hookspec
def register_loggers(register: RegisterFn) -> None:
    """Register metric loggers (``console``, ``jsonl``, ``tensorboard``, ``wandb``, ...).

    Process: driver.
    Target: a subclass of :class:`plugrl.parts.logger.MetricLogger`.
    Chosen by: the list ``trainer.logger``.
    """


@hookspec
def register_health_checks(register: RegisterFn) -> None:
    """Register learning-health checks (``response_clipping``, ``zero_variance``,
    ``grad_norm``, ``entropy_collapse``, ``constant_reward``, ``kl_explosion``).

    Process: driver.
    Target: a subclass of :class:`plugrl.parts.health.HealthCheck`.
    Config (optional): a subclass of :class:`plugrl.parts.health.HealthCheckConfig`, read from
    ``trainer.health.check_args.<name>``.
    Chosen by: the list ``trainer.health.checks`` (``trainer.health.mode: off`` runs none).
    """


@hookspec
def register_launchers(register: RegisterFn) -> None:
    """Register launchers: schedulers that bring up a Ray cluster on their machines and run a
    recipe on it (``slurm``, ``kuberay``, ``skypilot``).

    Process: the one that runs ``plugrl launch`` (a login node, a laptop); never a run's.
    Target: a subclass of :class:`plugrl.parts.launcher.Launcher`, which writes the job file
    from a :class:`plugrl.parts.launcher.LaunchJob` and names the command that submits it.
    Config (optional): an attrs class read from ``launch.launcher_args`` (partition, namespace).
    Chosen by: ``launch.launcher``, which ``plugrl launch --launcher NAME`` (or ``--slurm``,
    ``--kuberay``, ``--skypilot``) sets.

    Example::

        @plugrl.hookimpl
        def register_launchers(register):
            register("lsf", "my_pkg.lsf:LsfLauncher", config="my_pkg.lsf:LsfConfig")
    """


# --------------------------------------------------------------------------------------------
# Model families
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def multimodal_model(model_type: str) -> type[MultimodalModel] | None:
    """The vision-language support for Hugging Face model type ``model_type`` (the
    ``model_type`` of a model folder's ``config.json``): a subclass of
    :class:`plugrl.data.multimodal.MultimodalModel`, or ``None`` for a type the plugin does not
    know. The first plugin that answers wins.

    Process: driver, when the run's model folder is a vision-language model (its config has a
    ``vision_config``) and its data has images. The core builds the class as
    ``cls(model_path, hf_config)``; it supplies the model's processor (for the data), the text
    of an image placeholder, the ids of image tokens (never truncated through) and the model's
    own position ids over prompt and response (computed once per batch, after generation).
    A new model family is supported by a plugin implementing this hook, without touching the
    core (``plugrl-qwen2-vl`` answers for ``qwen2_vl`` and ``qwen2_5_vl``).
    """


# --------------------------------------------------------------------------------------------
# Lifecycle hooks
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def detect_device() -> str | None:
    """Return the name of the device to use when a recipe says ``device.name: auto``.

    Process: driver (once, before parts are built).
    Return ``None`` when your device is not present; the first non-``None`` answer wins.
    Mark specific devices ``@hookimpl(tryfirst=True)``; the ``cpu`` plugin answers last
    (``trylast``) as the fallback.
    """


@hookspec
def prepare_backend(device: str, backend: str, recipe: Recipe) -> list[str] | None:
    """Patch or configure a framework before the chosen training backend imports it.

    Process: every worker that hosts a backend rank, and the driver for ``cluster: local``;
    called once per process, before the backend's module is imported.
    ``device`` and ``backend`` are the resolved names (``npu``, ``megatron``). This is where
    MindSpeed patches Megatron for ``npu`` + ``megatron``: patching must happen before any
    ``megatron`` import, which is why it cannot live in the backend's constructor.

    Return what you patched, one short line each (``["mindspeed.megatron_adaptor",
    "repatch(use_flash_attn=True)"]``), or ``None``: every line is logged with your plugin's
    name, so a patch that silently stopped applying shows in the log. The core refuses, with
    one line, to prepare a backend whose framework modules (``register(...,
    framework_modules=[...])``) were already imported in the process: a patch applied after
    the import would not take.
    """


@hookspec
def prepare_rollout(device: str, engine: str, recipe: Recipe) -> list[str] | None:
    """Patch or configure an inference framework before the chosen rollout engine imports it.

    Process: every process that hosts an engine (engine workers on Ray, the driver for
    ``cluster: local``); called once per process, before the engine's module is imported.
    The rollout twin of :func:`prepare_backend`, with the same return value and the same
    refusal when the engine's framework modules were imported first (vllm-ascend and
    vLLM platform plugins patch here).
    """


@hookspec
def estimate_memory(
    recipe: Recipe, role: str, shape: ModelShape, context: PlanContext
) -> list[MemoryTerm] | None:
    """Report the device memory of one role of ``recipe``, for ``plugrl plan`` and the check at
    launch (``trainer.memory_check``). Nothing may be loaded: the estimate comes from
    ``shape`` (:class:`plugrl.api.plan.ModelShape`, read from the policy's ``config.json``)
    and the recipe's settings.

    Process: driver (or wherever ``plugrl plan`` runs), before any model is built.
    ``role`` is one of ``actor``, ``ref``, ``critic`` (asked of the chosen training backend),
    ``rollout`` (the chosen engine), ``reward_model`` and ``judge`` (the chosen reward
    manager). Answer only for a role your plugin owns under ``recipe`` (your backend is
    ``actor.backend``, your engine ``rollout.engine``...); return ``None`` otherwise.
    ``context`` (:class:`plugrl.api.plan.PlanContext`) gives the ranks, whether engines are
    colocated, the device memory when known, and the micro-batch token counts the kernel
    derived from the recipe, so every plugin counts them alike; ``context.shape_of(path)``
    reads another model's shape (a critic's, a reward model's).

    Return a list of :class:`plugrl.api.plan.MemoryTerm`, each the bytes on ONE device, the
    phases (``generate``, ``log_prob``, ``update``) it occupies, and ``instant`` set for
    memory held only at one moment of a phase (the backward, the optimizer step). A role
    nobody answers for is listed as unestimated in the plan, never guessed. The shared
    formulas (parameters, optimizer states, activations, logits, KV cache) are in
    :mod:`plugrl.api.plan`.
    """


@hookspec
def on_run_start(recipe: Recipe, run_dir: Path) -> None:
    """Observe the start of a run, after parts are built and before the first step.

    Process: driver.
    """


@hookspec
def on_step_end(step: int, metrics: Mapping[str, Any]) -> None:
    """Observe a finished training step with its metrics (verl's metric names).

    Process: driver. ``step`` counts from 1. ``metrics`` is read-only.
    """


@hookspec
def on_run_end(status: str, metrics: Mapping[str, Any]) -> None:
    """Observe the end of a run.

    Process: driver. ``status`` is ``"completed"``, ``"failed"`` or ``"interrupted"``;
    ``metrics`` are the last step's (empty if no step finished). Called also when the run
    fails, so observers can flush and close.
    """
