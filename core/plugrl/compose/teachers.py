"""The teachers of on-policy distillation: frozen models that score the student's sampled
tokens.

Each teacher of ``distillation.teachers`` is served by a rollout engine of its own in an
engine group of its own (:meth:`plugrl.parts.context.PartContext.frozen_engine_group`, as an
LLM judge is): it loads its own model, never receives the student's weights, and with
``cluster: ray`` takes devices of its own (its ``rollout`` section's ``nnodes`` x
``n_gpus_per_node``); with ``cluster: local`` it runs in the driver, on the device the trainer
uses. Its engine must declare :data:`~plugrl.parts.rollout.Capability.SCORE`.

:meth:`Teachers.score` gives the batch column ``teacher_log_probs`` [B, R]: for every row, the
log-probability under the row's teacher of each response token, given the prompt and the
response tokens before it (the student's own context), 0 off the response.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import TYPE_CHECKING, Any

import torch

from plugrl.cluster.services import RunServices
from plugrl.errors import DataError, PluginError, RecipeError
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import Capability
from plugrl.recipe.distillation import TeacherConfig
from plugrl.recipe.teachers import teacher_configs

if TYPE_CHECKING:
    from plugrl.cluster.engines import EngineGroup
    from plugrl.data.batch import Batch
    from plugrl.parts.device import Device
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

logger = logging.getLogger("plugrl.run")


def check_same_vocabulary(name: str, teacher_tokenizer: Any, student_tokenizer: Any) -> None:
    """A one-line :class:`RecipeError` when the teacher's tokenizer maps tokens to other ids
    than the student's: the teacher would score other tokens than the student sampled."""
    teacher_vocab = teacher_tokenizer.get_vocab()
    student_vocab = student_tokenizer.get_vocab()
    if teacher_vocab == student_vocab:
        return
    differing = sum(1 for token, i in student_vocab.items() if teacher_vocab.get(token) != i)
    differing += sum(1 for token in teacher_vocab if token not in student_vocab)
    raise RecipeError(
        f"teacher {name!r} has another vocabulary than the student ({len(teacher_vocab)} "
        f"tokens against {len(student_vocab)}, {differing} differing): it would score other "
        "tokens than the student sampled; choose a teacher that shares the student's "
        "tokenizer (the same model family)",
        key=f"distillation.teachers.{name}.model",
    )


class Teachers:
    """The run's teachers, each in its engine group, and the routing of rows to them."""

    def __init__(
        self,
        recipe: Recipe,
        plugins: PluginManager,
        tokenizer: Any,
        device: Device | None = None,
    ) -> None:
        from plugrl.data.dataset import load_tokenizer
        from plugrl.recipe.build import read_section

        self.config = recipe.distillation
        self.teachers: dict[str, TeacherConfig] = teacher_configs(self.config)
        self.groups: dict[str, EngineGroup] = {}
        context = PartContext(
            recipe=recipe,
            plugins=plugins,
            device=device,
            tokenizer=tokenizer,
            services=RunServices(),
        )
        try:
            for name, teacher in self.teachers.items():
                key = f"distillation.teachers.{name}"
                engine_cls = plugins.registry("rollout_engines").get(teacher.engine).load()
                if Capability.SCORE not in getattr(engine_cls, "capabilities", frozenset()):
                    raise RecipeError(
                        f"rollout engine {teacher.engine!r} cannot score given tokens (it does "
                        "not declare Capability.SCORE), which a teacher needs; serve the "
                        "teacher with one that can: hf or vllm",
                        key=f"{key}.engine",
                    )
                rollout = read_section(
                    "rollout",
                    {**teacher.rollout, "engine": teacher.engine},
                    plugins,
                    f"{key}.rollout",
                )
                try:
                    teacher_tokenizer = load_tokenizer(teacher.model)
                except RecipeError as exc:
                    raise RecipeError(exc.bare_message, key=f"{key}.{exc.key}") from None
                check_same_vocabulary(name, teacher_tokenizer, tokenizer)
                self.groups[name] = context.frozen_engine_group(teacher.model, rollout)
        except BaseException:
            self.close()
            raise
        self.by_key = {teacher.key: name for name, teacher in self.teachers.items()}

    def route(self, batch: Batch) -> list[str]:
        """Each row's teacher: the only one, or the one whose ``key`` is the row's
        ``distillation.teacher_key`` value."""
        if len(self.teachers) == 1:
            return [next(iter(self.teachers))] * len(batch)
        column = self.config.teacher_key
        batch.require(column, by="the distillation teachers (distillation.teacher_key)")
        names = []
        for row, value in enumerate(batch[column]):
            name = self.by_key.get(value)
            if name is None:
                raise DataError(
                    f"row {row} has {column}={value!r}, which no teacher takes (their keys: "
                    f"{', '.join(map(repr, self.by_key))}); add a teacher with that key or "
                    "leave such rows out of the data"
                )
            names.append(name)
        return names

    def score(self, batch: Batch) -> torch.Tensor:
        """``teacher_log_probs`` [B, R] of ``batch`` (float32, 0 off the response tokens)."""
        from plugrl.data.batch import response_attention_mask

        responses = batch["responses"]
        width = responses.shape[-1]
        response_valid = response_attention_mask(batch).bool()
        prompt_valid = batch["attention_mask"][:, :-width].bool()
        prompts = batch["input_ids"][:, :-width]
        names = self.route(batch)
        futures: list[tuple[int, int, concurrent.futures.Future]] = []
        for row, name in enumerate(names):
            length = int(response_valid[row].sum())
            if length == 0:
                continue
            prompt_ids = prompts[row][prompt_valid[row]].tolist()
            response_ids = responses[row][:length].tolist()
            futures.append((row, length, self.groups[name].submit_score(prompt_ids, response_ids)))
        scores = torch.zeros(responses.shape, dtype=torch.float32)
        for row, length, future in futures:
            try:
                log_probs = future.result()
            except Exception as exc:
                raise PluginError(
                    f"teacher {names[row]!r} failed to score row {row}: {type(exc).__name__}: {exc}"
                ) from exc
            if len(log_probs) != length:
                raise PluginError(
                    f"teacher {names[row]!r} returned {len(log_probs)} log-probs for the "
                    f"{length} tokens of row {row}; an engine's score_tokens returns one per "
                    "given token"
                )
            scores[row, :length] = torch.tensor(log_probs, dtype=torch.float32)
        return scores * batch["response_mask"].to(torch.float32)

    def close(self) -> None:
        for name, group in list(self.groups.items()):
            try:
                group.close()
            except Exception as exc:
                logger.warning("closing teacher %r failed: %s", name, exc)
        self.groups.clear()
