"""Builders for testing plugrl plugins; the fixtures are in :mod:`plugrl.testing.fixtures`, a
pytest plugin loaded automatically once plugrl is installed. Nothing here imports pytest, so
benchmarks and tools use these builders without the test extras.

Builders, for unit tests of parts:

* :func:`part_context`: a :class:`~plugrl.parts.context.PartContext` for building a part in a
  unit test, ``MyLoss(config, part_context(options=MyArgs()))``.
* :func:`make_batch`: a :class:`~plugrl.data.batch.Batch` in verl's layout (prompts and
  responses of given lengths, masks, positions, ``uid`` groups of ``n``), with scores,
  advantages and log-probs when asked, for estimators, losses and reward managers.
* :func:`make_loss_aggregator`: the ``aggregate`` a backend hands a policy loss, counted over a
  whole mini-batch.
* :func:`make_recipe`: a validated :class:`~plugrl.recipe.Recipe` from a mapping of overrides.
* :class:`ScriptedSession`: a :class:`~plugrl.parts.agent.Session` whose model turns are
  scripted and whose tools are real, for testing agent loops, tools and environments without
  engines; :func:`tool_call_text` writes a scripted turn that calls a tool.

A run, for schedulers (:mod:`plugrl.testing.simulated`):

* :func:`run_scheduler`: a scheduler's run of a few steps on the simulated parts, through the
  core's run loop; returns a :class:`~plugrl.testing.simulated.SchedulerRun` (metrics per
  step, checkpoints, the engines' calls).

Builders of a tiny model (:mod:`plugrl.testing.tiny`), for parts that need a real one:

* :func:`save_tiny_model`: a Hugging Face folder with a tokenizer and a Qwen2-architecture
  model of about 4M parameters, written from a seed without touching the network.
* :func:`make_tiny_tokenizer`, :func:`make_tiny_model`: the two, in memory.
* :func:`spread_weights`: the seeded re-draw of a model's weights that ``weight_std`` asks
  for, for a plugin's own tiny model of another architecture.
* :func:`save_tiny_reward_model`, :func:`make_tiny_reward_model`: the same tokenizer with a
  sequence-classification model (one score per text), for reward-model managers.
* :func:`build_once` (:mod:`plugrl.testing.shared`): any of these builders run once for a
  folder and its arguments, whatever the number of tests and processes asking; the
  ``plugrl_build_once`` fixture does it once per test session.

Example::

    def test_my_reward_is_used(plugrl_register_plugin):
        plugrl_register_plugin(my_plugin_module)
        recipe = load_recipe("recipe.yaml")
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.testing.agents import ScriptedSession, tool_call_text
from plugrl.testing.shared import build_once
from plugrl.testing.simulated import run_scheduler
from plugrl.testing.tiny import (
    make_tiny_model,
    make_tiny_reward_model,
    make_tiny_tokenizer,
    save_tiny_model,
    save_tiny_reward_model,
    spread_weights,
)

if TYPE_CHECKING:
    import torch

    from plugrl.algorithms.functional import LossAggregator
    from plugrl.data.batch import Batch
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe

__all__ = [
    "FakeDistribution",
    "FakeEntryPoint",
    "ScriptedSession",
    "build_once",
    "make_batch",
    "make_fake_entry_point",
    "make_loss_aggregator",
    "make_recipe",
    "make_tiny_model",
    "make_tiny_reward_model",
    "make_tiny_tokenizer",
    "part_context",
    "run_scheduler",
    "save_tiny_model",
    "save_tiny_reward_model",
    "spread_weights",
    "tool_call_text",
]


def part_context(recipe: Any = None, **fields: Any) -> Any:
    """A :class:`~plugrl.parts.context.PartContext` around ``recipe`` (a default
    :class:`~plugrl.recipe.Recipe` when ``None``) with ``fields`` set (``options``, ``device``,
    ``tokenizer``, ...), for constructing a part directly in a test. ``plugins`` defaults to
    the process's plugin manager (in a test with the ``plugrl_plugin_manager`` fixture, that
    one): a test is an edge of the program, as the command line is."""
    from plugrl.cluster.services import RunServices
    from plugrl.parts.context import PartContext
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import Recipe

    fields.setdefault("plugins", get_plugin_manager())
    fields.setdefault("services", RunServices())
    return PartContext(recipe=recipe if recipe is not None else Recipe(), **fields)


def make_recipe(
    overrides: Mapping[str, Any] | None = None,
    *,
    base: Mapping[str, Any] | str | Path | None = None,
    plugins: PluginManager | None = None,
) -> Recipe:
    """A validated :class:`~plugrl.recipe.Recipe`, built as ``plugrl run`` builds one:
    ``base`` (a mapping, a recipe file or a shipped recipe's name; nothing: every default)
    with ``overrides`` merged in, then every section read into its config class, every part
    name and option checked against ``plugins`` (the process's plugin manager when ``None``;
    in a test with the ``plugrl_plugin_manager`` fixture, that one).

    ``overrides`` is a nested mapping like a recipe's YAML; its top-level keys may also be
    dotted (``{"actor.policy_loss_args": {"beta": 0.1}, "rollout.n": 4}``). A bad key or value
    raises the :class:`~plugrl.errors.RecipeError` a user would see."""
    from plugrl.recipe import build_recipe, compose_file, deep_merge, find_recipe
    from plugrl.recipe.composition import normalize_shorthand

    if base is None:
        raw: dict[str, Any] = {}
    elif isinstance(base, Mapping):
        raw = normalize_shorthand(base)
    else:
        raw = compose_file(find_recipe(base))
    for key, value in (overrides or {}).items():
        path = str(key).split(".")
        update: Any = value
        for part in reversed(path):
            update = {part: update}
        raw = deep_merge(raw, normalize_shorthand(update))
    from plugrl.plugin.manager import get_plugin_manager

    return build_recipe(raw, plugins or get_plugin_manager())


def make_batch(
    prompt_lengths: Sequence[int] = (3, 5),
    response_lengths: int | Sequence[int] = 4,
    *,
    n: int = 2,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    response_ids: Sequence[Sequence[int]] | None = None,
    scores: Sequence[float] | None = None,
    advantages: Sequence[float] | torch.Tensor | None = None,
    log_probs: bool = False,
    data_source: str = "test",
    ground_truths: Sequence[Any] | None = None,
    response_width: int | None = None,
    pad_token_id: int = 0,
    vocab_size: int = 64,
    seed: int = 0,
) -> Batch:
    """A batch in verl's layout, as a scheduler hands it to parts: ``len(prompt_lengths)``
    prompts, each with ``n`` responses (rows ``n * p`` to ``n * p + n - 1`` belong to prompt
    ``p`` and share its ``uid``, ``"uid-{p}"``), built by the same code as a real rollout
    (:func:`plugrl.data.rollout_batch.build_rollout_batch`).

    Token ids are random (seeded by ``seed``, never ``pad_token_id``) unless ``prompt_ids``
    (one list per prompt) or ``response_ids`` (one list per row) give them.
    ``response_lengths`` is one length for every row or one per row; a response of length 0
    is empty (all padding). The batch holds:

    * tensors ``prompts``, ``prompt_attention_mask`` [B, P] (left-padded), ``responses``,
      ``response_mask``, ``rollout_log_probs`` [B, R] (right-padded; random log-probs < 0 on
      the response tokens), ``input_ids``, ``attention_mask``, ``position_ids`` [B, P+R];
    * columns ``uid``, ``index``, ``data_source``, ``ground_truth`` (``ground_truths``, one
      per prompt, default ``None``), ``extra_info`` (``{}``), ``ability``,
      ``raw_prompt_ids``, ``finish_reason`` (``"length"`` for a response as wide as
      ``response_width``, else ``"stop"``), ``weight_version``, ``min_weight_version``;
    * ``meta`` with the layout (``prompt_width``, ``response_width``, ``pad_token_id``);
    * with ``scores`` (one per row): ``token_level_scores`` and ``token_level_rewards``
      [B, R], each row's score on its last response token, as a reward manager writes it;
    * with ``advantages`` (one per row, broadcast over its response tokens, or a [B, R]
      tensor): ``advantages`` and ``returns`` (equal, as outcome estimators make them), zero
      off the response mask;
    * with ``log_probs=True``: ``old_log_probs`` (equal to ``rollout_log_probs``, an on-policy
      batch) and ``ref_log_prob`` (the same plus noise), zero off the response mask.
    """
    import torch

    from plugrl.data.batch import Batch, left_pad
    from plugrl.data.rollout_batch import build_rollout_batch
    from plugrl.parts.rollout import Completion

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    generator = torch.Generator().manual_seed(seed)

    def random_ids(length: int) -> list[int]:
        ids = torch.randint(0, vocab_size - 1, (length,), generator=generator)
        return (ids + (ids >= pad_token_id).long()).tolist()  # skip the pad token

    if prompt_ids is None:
        prompt_ids = [random_ids(length) for length in prompt_lengths]
    prompt_ids = [list(ids) for ids in prompt_ids]
    num_prompts = len(prompt_ids)
    rows = num_prompts * n
    if response_ids is None:
        lengths = (
            [response_lengths] * rows
            if isinstance(response_lengths, int)
            else list(response_lengths)
        )
        if len(lengths) != rows:
            raise ValueError(
                f"response_lengths has {len(lengths)} entries, expected one per row: "
                f"{num_prompts} prompts x n={n} = {rows}"
            )
        response_ids = [random_ids(length) for length in lengths]
    response_ids = [list(ids) for ids in response_ids]
    if len(response_ids) != rows:
        raise ValueError(
            f"response_ids has {len(response_ids)} entries, expected {num_prompts} prompts x "
            f"n={n} = {rows}"
        )
    if ground_truths is not None and len(ground_truths) != num_prompts:
        raise ValueError(
            f"ground_truths has {len(ground_truths)} entries, expected one per prompt "
            f"({num_prompts})"
        )

    prompts_tensor, prompt_mask = left_pad(prompt_ids, pad_token_id)
    prompt_batch = Batch(
        tensors={"prompts": prompts_tensor, "prompt_attention_mask": prompt_mask},
        columns={
            "uid": [f"uid-{p}" for p in range(num_prompts)],
            "index": list(range(num_prompts)),
            "data_source": [data_source] * num_prompts,
            "ground_truth": list(ground_truths or [None] * num_prompts),
            "extra_info": [{} for _ in range(num_prompts)],
            "ability": ["test"] * num_prompts,
            "raw_prompt_ids": prompt_ids,
        },
    )
    completions = []
    for row, ids in enumerate(response_ids):
        sampled = -torch.rand(len(ids), generator=generator) * 3
        full = response_width is not None and len(ids) == response_width
        completions.append(
            Completion(
                token_ids=ids,
                log_probs=sampled.tolist(),
                finish_reason="length" if full else "stop",
                request_id=f"request-{row // n}",
                sample_index=row % n,
                prompt_index=row // n,
            )
        )
    batch = build_rollout_batch(
        prompt_batch,
        completions,
        n=n,
        pad_token_id=pad_token_id,
        response_width=response_width,
    )
    mask = batch["response_mask"].to(torch.float32)
    if scores is not None:
        if len(scores) != rows:
            raise ValueError(f"scores has {len(scores)} entries, expected one per row ({rows})")
        token_scores = torch.zeros_like(mask)
        last = (batch["response_mask"].sum(dim=-1) - 1).clamp(min=0)
        token_scores[torch.arange(rows), last] = torch.tensor(
            [float(score) for score in scores], dtype=torch.float32
        )
        batch["token_level_scores"] = token_scores
        batch["token_level_rewards"] = token_scores.clone()
    if advantages is not None:
        if isinstance(advantages, torch.Tensor) and advantages.dim() == 2:
            if tuple(advantages.shape) != tuple(mask.shape):
                raise ValueError(
                    f"advantages is {tuple(advantages.shape)}, the batch's responses are "
                    f"{tuple(mask.shape)}"
                )
            token_advantages = torch.where(mask != 0, advantages.to(torch.float32), 0.0)
        else:
            values = torch.as_tensor(advantages, dtype=torch.float32).reshape(-1)
            if len(values) != rows:
                raise ValueError(
                    f"advantages has {len(values)} entries, expected one per row ({rows})"
                )
            token_advantages = torch.where(mask != 0, values.unsqueeze(-1), 0.0)
        batch["advantages"] = token_advantages
        batch["returns"] = token_advantages.clone()
    if log_probs:
        old = batch["rollout_log_probs"].clone()
        noise = torch.randn(old.shape, generator=generator) * 0.1
        batch["old_log_probs"] = old
        batch["ref_log_prob"] = (old + noise) * mask
    return batch


def make_loss_aggregator(
    mini_batch: Batch | torch.Tensor,
    mode: str | None = None,
    *,
    recipe: Recipe | None = None,
    dp_size: int = 1,
) -> LossAggregator:
    """The ``aggregate`` a training backend hands a policy loss (and
    :class:`~plugrl.algorithms.objective.PolicyObjective`) for the micro-batches of
    ``mini_batch``: a :class:`~plugrl.algorithms.functional.LossAggregator` in ``mode`` whose
    :class:`~plugrl.parts.algorithm.LossScale` counts the valid tokens and sequences of the
    whole mini-batch (a :class:`~plugrl.data.batch.Batch` with ``response_mask``, or the
    mask [B, R] itself), so that a loss summed over any split of it into micro-batches equals
    the loss of the whole.

    ``mode`` defaults to the recipe's ``actor.loss_agg_mode`` (``token-mean`` without a
    recipe); ``max_response_length`` and ``loss_scale_factor`` are taken from the recipe, as a
    backend sets them. ``dp_size``: the number of data-parallel ranks ``mini_batch`` is spread
    over (each rank's share is then multiplied by it, and ranks are averaged)."""
    from plugrl.algorithms.functional import LossAggregator, loss_scale_from_mask
    from plugrl.data.batch import Batch

    mask = mini_batch["response_mask"] if isinstance(mini_batch, Batch) else mini_batch
    if mode is None:
        mode = recipe.actor.loss_agg_mode if recipe is not None else "token-mean"
    scale = loss_scale_from_mask(
        mask,
        dp_size=dp_size,
        max_response_length=recipe.data.max_response_length if recipe is not None else None,
        loss_scale_factor=recipe.actor.loss_scale_factor if recipe is not None else None,
    )
    return LossAggregator(mode, scale)


@attrs.frozen
class FakeDistribution:
    name: str
    version: str

    @property
    def metadata(self) -> dict[str, str]:
        return {"Name": self.name, "Version": self.version}


@attrs.frozen
class FakeEntryPoint:
    """Quacks like :class:`importlib.metadata.EntryPoint` for the plugin manager."""

    name: str
    target: Any
    dist: FakeDistribution
    group: str = "plugrl"

    @property
    def value(self) -> str:
        if isinstance(self.target, str):
            return self.target
        return f"{getattr(self.target, '__module__', '?')}:{getattr(self.target, '__name__', '?')}"

    def load(self) -> Any:
        """The target; a ``"module"`` or ``"module:attr"`` path is imported now (a module
        that does not exist fails as a broken plugin's import does)."""
        from plugrl.plugin.registry import import_object

        if not isinstance(self.target, str):
            return self.target
        if ":" not in self.target:
            return importlib.import_module(self.target)
        return import_object(self.target)


def make_fake_entry_point(
    name: str, target: Any, dist: str = "fake-dist", version: str = "0.0.1"
) -> FakeEntryPoint:
    return FakeEntryPoint(name, target, FakeDistribution(dist, version))
