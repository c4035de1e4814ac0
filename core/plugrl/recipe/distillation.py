"""The ``distillation`` section: on-policy distillation from frozen teachers.

The student (the policy) samples its responses as usual; each teacher, a model served by a
rollout engine of its own (any engine that can score given tokens), gives the log-probability
of every sampled token, and the actor's loss pulls the student toward the teacher with a
per-token estimate of the reverse KL, ``log pi_student(y_t) - log pi_teacher(y_t)``, as verl's
``distillation`` section defines it. Several teachers split the rows between them by a
per-row key (``teacher_key``, the ``data_source`` by default).

The section reads verl's keys with shorter paths: ``distillation.teacher_models.<name>`` is
``distillation.teachers.<name>`` and ``distillation.distillation_loss.<key>`` is
``distillation.loss.<key>``.
"""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.config import non_negative, option, section

SAMPLED_TOKEN_LOSSES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""verl's single-sample estimators of the reverse KL, by their ``kl_penalties`` names: what
``distillation.loss.loss_mode`` accepts."""
TOP_K_LOSSES = ("forward_kl_topk",)
"""verl's losses over the teacher's top-k tokens: they need the teacher's top-k log-probs at
every position, which no engine here returns yet."""


@attrs.define(kw_only=True)
class DistillationLossConfig:
    """``distillation.loss``: how the teacher's log-probs become the actor's loss."""

    loss_mode: str = option(
        "k3",
        "Per-token estimator of KL(student || teacher) on the sampled token, d = log "
        "pi_student - log pi_teacher: k1/kl (d), abs (|d|), k2/mse (d^2/2), k3/low_var_kl "
        "(exp(-d) + d - 1, clamped). forward_kl_topk is verl's too but is refused here.",
        verl="distillation.distillation_loss.loss_mode",
    )
    use_policy_gradient: bool = option(
        False,
        "true: the negative estimate is each token's advantage in a clipped policy-gradient "
        "term (policy-gradient distillation, with k1: the reverse KL's own gradient); false: "
        "the estimate is a loss backpropagated through the student's log-probs (GKD-style).",
        verl="distillation.distillation_loss.use_policy_gradient",
    )
    use_task_rewards: bool = option(
        True,
        "Keep the policy loss of the task's advantages beside the distillation term; false: "
        "the distillation term alone trains the actor (the reward is still computed and "
        "logged).",
        verl="distillation.distillation_loss.use_task_rewards",
    )
    distillation_loss_coef: float = option(
        1.0,
        "Weight of the distillation term when use_task_rewards is true (1 otherwise).",
        verl="distillation.distillation_loss.distillation_loss_coef",
        validator=non_negative,
    )
    loss_max_clamp: float | None = option(
        None,
        "Clamp each token's estimate to [-clamp, clamp] before use; null: no clamp.",
        verl="distillation.distillation_loss.loss_max_clamp",
        validator=attrs.validators.optional(non_negative),
    )
    log_prob_min_clamp: float | None = option(
        None,
        "Floor of the student's and the teacher's log-probs before they are compared (a "
        "token one of them finds nearly impossible); null: no floor.",
        verl="distillation.distillation_loss.log_prob_min_clamp",
    )
    topk: int = option(
        32,
        "k of the top-k losses (verl's key; those losses are refused here).",
        verl="distillation.distillation_loss.topk",
    )
    clip_ratio_low: float = option(
        0.2,
        "Lower clip range of the policy-gradient term (use_policy_gradient).",
        verl="distillation.distillation_loss.clip_ratio_low",
        validator=non_negative,
    )
    clip_ratio_high: float = option(
        0.2,
        "Upper clip range of the policy-gradient term (use_policy_gradient).",
        verl="distillation.distillation_loss.clip_ratio_high",
        validator=non_negative,
    )


@attrs.define(kw_only=True)
class DistillationConfig:
    """The ``distillation`` section."""

    enabled: bool = option(False, "Distil from the teachers below.", verl="distillation.enabled")
    teacher_key: str = option(
        "data_source",
        "Column of each row that picks its teacher when there are several (each teacher's "
        "key); one teacher takes every row.",
        verl="distillation.teacher_key",
    )
    teachers: dict[str, Any] = option(
        factory=dict,
        help="The frozen teachers, by name: {NAME: {key: K, model: {path: ...}, engine: hf, "
        "rollout: {...}}}. model is the teacher's own model section, engine the rollout "
        "engine that serves it (one that can score given tokens: hf, vllm), rollout that "
        "engine's section (nnodes, n_gpus_per_node and tensor_model_parallel_size place it "
        "on devices of its own on Ray).",
        verl="distillation.teacher_models",
    )
    loss: DistillationLossConfig = section(
        DistillationLossConfig,
        "How the teacher's log-probs become the actor's loss.",
        verl="distillation.distillation_loss",
    )


@attrs.define(kw_only=True)
class TeacherConfig:
    """``distillation.teachers.<name>``: one teacher."""

    key: str | None = option(
        None,
        "Value of the row's distillation.teacher_key column that this teacher takes; needed "
        "when there are several teachers.",
        verl="distillation.teacher_models.<name>.key",
    )
    model: Any = option(
        factory=dict,
        help="The teacher's own model section (path, tokenizer_path, dtype, ...); its "
        "tokenizer must be the student's.",
        verl="distillation.teacher_models.<name>.model_path",
    )
    engine: str = option(
        "hf",
        "Rollout engine that serves the teacher; it must score given tokens.",
        verl="distillation.teacher_models.<name>.inference.name",
    )
    rollout: dict[str, Any] = option(
        factory=dict,
        help="The teacher engine's own rollout section, read into its engine's config class.",
        verl="distillation.teacher_models.<name>.inference",
    )
