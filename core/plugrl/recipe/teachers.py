"""Reading the ``distillation`` section's teachers and checking the section
(:mod:`plugrl.recipe.distillation`); apart from it because a teacher's ``model`` is read into
the recipe's model class."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from plugrl.config.structuring import structure
from plugrl.errors import RecipeError
from plugrl.recipe.distillation import (
    SAMPLED_TOKEN_LOSSES,
    TOP_K_LOSSES,
    DistillationConfig,
    TeacherConfig,
)
from plugrl.recipe.sections import ModelConfig


def teacher_configs(config: DistillationConfig) -> dict[str, TeacherConfig]:
    """Each teacher's section read and checked (``model`` into the recipe's model class, its
    relative paths made absolute against the working folder); a
    :class:`~plugrl.errors.RecipeError` naming the key otherwise."""
    if not config.teachers:
        raise RecipeError(
            "distillation is enabled but no teacher is set; add one as "
            "distillation.teachers.<name>.model.path (a model folder sharing the student's "
            "tokenizer)",
            key="distillation.teachers",
        )
    teachers = {}
    for name, raw in config.teachers.items():
        key = f"distillation.teachers.{name}"
        if not isinstance(raw, Mapping):
            raise RecipeError(f"expected a teacher's section of keys, got {raw!r}", key=key)
        teacher = structure(TeacherConfig, dict(raw), key)
        model = structure(ModelConfig, dict(teacher.model or {}), f"{key}.model")
        if not model.path:
            raise RecipeError(
                "the teacher needs a model folder; set it to a Hugging Face model folder that "
                "shares the student's tokenizer",
                key=f"{key}.model.path",
            )
        model = attrs.evolve(
            model,
            path=_absolute(model.path),
            tokenizer_path=_absolute(model.tokenizer_path),
        )
        if "engine" in teacher.rollout:
            raise RecipeError(
                f"the teacher's engine is chosen by {key}.engine; remove it here",
                key=f"{key}.rollout.engine",
            )
        teachers[name] = attrs.evolve(teacher, model=model)
    if len(teachers) > 1:
        keys: dict[str, str] = {}
        for name, teacher in teachers.items():
            if teacher.key is None:
                raise RecipeError(
                    "with several teachers each needs the value of "
                    f"distillation.teacher_key ({config.teacher_key}) whose rows it takes",
                    key=f"distillation.teachers.{name}.key",
                )
            if teacher.key in keys:
                raise RecipeError(
                    f"teachers {keys[teacher.key]!r} and {name!r} both take the rows whose "
                    f"{config.teacher_key} is {teacher.key!r}; give each teacher its own key",
                    key=f"distillation.teachers.{name}.key",
                )
            keys[teacher.key] = name
    return teachers


def check_distillation(config: DistillationConfig) -> None:
    """The section's settings that cannot work, as a :class:`~plugrl.errors.RecipeError`
    naming the key (checked when a recipe is read)."""
    if not config.enabled:
        return
    teacher_configs(config)
    loss = config.loss
    if loss.loss_mode in TOP_K_LOSSES:
        raise RecipeError(
            f"{loss.loss_mode} needs the teacher's top-k log-probs at every position, which no "
            "engine here returns; choose one of the sampled-token estimators: "
            + ", ".join(SAMPLED_TOKEN_LOSSES),
            key="distillation.loss.loss_mode",
        )
    if loss.loss_mode not in SAMPLED_TOKEN_LOSSES:
        raise RecipeError(
            f"unknown loss mode {loss.loss_mode!r}; choose one of "
            + ", ".join(SAMPLED_TOKEN_LOSSES),
            key="distillation.loss.loss_mode",
        )
    if loss.loss_mode in ("kl", "k1") and not loss.use_policy_gradient:
        raise RecipeError(
            "k1 backpropagated as a loss gives no gradient toward the teacher (its gradient "
            "is that of log pi_student alone); set distillation.loss.use_policy_gradient=true "
            "or choose k3",
            key="distillation.loss.loss_mode",
        )


def _absolute(path: str | None) -> str | None:
    if path is None:
        return None
    return str(Path(path).expanduser().absolute())
