"""Weighted reward components: several reward managers scoring the same batch, the run's reward
their weighted sum (``reward.components``).

A component is any registered reward manager, read from its own section: the top-level
``reward`` keys that its manager's config class has (``components`` and
``components_concurrently`` excepted), overlaid with the component's own keys (a key the
component sets replaces the top-level value whole, ``custom_function`` included). Its
``manager`` defaults to the top-level ``reward.manager``; its ``weight`` is required.

The sum is taken token by token, so a component's token-level shaping (DAPO's overlong
penalty) stays where it put it. What the combination reports:

* metrics: ``reward/<name>/mean`` and ``reward/<name>/std`` of each component's per-response
  score before weighting, ``reward/<name>/latency_s`` (seconds it took on the batch), every
  metric of the component under ``reward/<name>/`` (``reward/x`` as ``reward/<name>/x``, any
  other key ``k`` as ``reward/<name>/k``), ``reward/errors`` and ``reward/timeouts`` summed
  over the components, and ``critic/score/{mean,max,min}`` of the weighted sum;
* extra columns: ``<name>_score`` (the component's per-response score), each of its columns as
  ``<name>/<column>``, and, unprefixed, every column but ``score`` from the first component in
  recipe order that gives it (so validation's ``acc`` keeps working).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import attrs
import torch

from plugrl.cluster.services import RunServices
from plugrl.errors import PlugrlError
from plugrl.parts.context import PartContext
from plugrl.parts.reward import RewardConfig, RewardManager, RewardOutput
from plugrl.plugin.boundaries import check_reward_output
from plugrl.recipe.reward_components import component_error, read_components

if TYPE_CHECKING:
    from plugrl.data.batch import Batch
    from plugrl.parts.device import Device
    from plugrl.plugin.manager import PluginManager
    from plugrl.recipe import Recipe


@attrs.frozen
class Component:
    """One built component."""

    name: str
    weight: float
    manager_name: str
    manager: RewardManager


# --------------------------------------------------------------------------------------------
# The combined manager
# --------------------------------------------------------------------------------------------

ManagerBuilder = Callable[[str, RewardConfig, PartContext], RewardManager]
"""``build(manager_name, config, context)``: a built, checked reward manager."""


class WeightedRewardComponents(RewardManager):
    """The run's reward manager when ``reward.components`` is set: every component scores the
    batch (one after another, or at once in threads with ``reward.components_concurrently``)
    and the run's token-level scores are their weighted sum."""

    def __init__(
        self, config: RewardConfig, context: PartContext, components: Iterable[Component]
    ) -> None:
        # no resolver of its own: each component resolves its data sources itself
        self.config = config
        self.context = context
        self.recipe = context.recipe
        self.tokenizer = context.tokenizer
        self.components = list(components)
        self._threads: ThreadPoolExecutor | None = None

    @classmethod
    def build(
        cls,
        recipe: Recipe,
        tokenizer: Any,
        plugins: PluginManager,
        build_manager: ManagerBuilder,
        device: Device | None = None,
    ) -> WeightedRewardComponents:
        """Build every component of ``recipe.reward.components``; each manager sees a recipe
        whose ``reward`` is its own section (its custom function, its function args)."""
        built: list[Component] = []
        try:
            for spec in read_components(recipe.reward, plugins):
                context = PartContext(
                    recipe=attrs.evolve(recipe, reward=spec.config),
                    plugins=plugins,
                    tokenizer=tokenizer,
                    device=device,
                    services=RunServices(),
                )
                try:
                    manager = build_manager(spec.manager, spec.config, context)
                except PlugrlError as exc:
                    raise component_error(exc, spec.name) from None
                built.append(Component(spec.name, spec.weight, spec.manager, manager))
        except BaseException:
            for component in built:  # no scoring worker outlives a failed start
                component.manager.close()
            raise
        context = PartContext(
            recipe=recipe,
            plugins=plugins,
            tokenizer=tokenizer,
            device=device,
            services=RunServices(),
        )
        return cls(recipe.reward, context, built)

    def check_data_sources(self, data_sources: Iterable[str]) -> None:
        """Every component can score every data source."""
        data_sources = list(data_sources)
        for component in self.components:
            try:
                component.manager.check_data_sources(data_sources)
            except PlugrlError as exc:
                raise component_error(exc, component.name) from None

    def prefetch(self, batch: Batch) -> None:
        """Every component starts on the finished rows."""
        for component in self.components:
            component.manager.prefetch(batch)

    def __call__(self, batch: Batch) -> RewardOutput:
        if self.config.components_concurrently and len(self.components) > 1:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(
                    len(self.components), thread_name_prefix="reward-component"
                )
            futures = [self._threads.submit(self._score, c, batch) for c in self.components]
            wait(futures)  # every component done before the first error is raised
            outcomes = [future.result() for future in futures]
        else:
            outcomes = [self._score(component, batch) for component in self.components]
        return self._combine(batch, outcomes)

    def _score(self, component: Component, batch: Batch) -> tuple[RewardOutput, float]:
        started = time.monotonic()
        try:
            output = check_reward_output(
                component.manager(batch), batch, component.manager_name, self.context.plugins
            )
        except PlugrlError as exc:
            raise component_error(exc, component.name) from None
        except Exception as exc:
            exc.add_note(f"in reward component {component.name!r}")
            raise
        return output, time.monotonic() - started

    def _combine(self, batch: Batch, outcomes: list[tuple[RewardOutput, float]]) -> RewardOutput:
        total = torch.zeros(tuple(batch["response_mask"].shape), dtype=torch.float32)
        metrics: dict[str, float] = {"reward/errors": 0.0, "reward/timeouts": 0.0}
        unprefixed: dict[str, list[Any]] = {}
        prefixed: dict[str, list[Any]] = {}
        for component, (output, seconds) in zip(self.components, outcomes, strict=True):
            name = component.name
            # on the CPU, where the batch's mask and every built-in manager's scores are: a
            # manager that scores on a device must not make the sum fail
            scores = output.token_level_scores.detach().to("cpu", torch.float32)
            total += component.weight * scores
            per_response = scores.sum(dim=-1)
            for key, value in output.metrics.items():
                if key in ("reward/errors", "reward/timeouts"):
                    metrics[key] += float(value)
                metrics[f"reward/{name}/{key.removeprefix('reward/')}"] = value
            if len(per_response):
                metrics[f"reward/{name}/mean"] = float(per_response.mean())
                metrics[f"reward/{name}/std"] = float(per_response.std(correction=0))
            metrics[f"reward/{name}/latency_s"] = seconds
            prefixed[f"{name}_score"] = per_response.tolist()
            for column, values in output.extra.items():
                prefixed[f"{name}/{column}"] = list(values)
                if column != "score":
                    unprefixed.setdefault(column, list(values))
        totals = total.sum(dim=-1)
        if len(totals):
            metrics["critic/score/mean"] = float(totals.mean())
            metrics["critic/score/max"] = float(totals.max())
            metrics["critic/score/min"] = float(totals.min())
        return RewardOutput(
            token_level_scores=total, extra={**unprefixed, **prefixed}, metrics=metrics
        )

    def close(self) -> None:
        """Stop every component's workers (all of them, even when one fails to stop)."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        failure: BaseException | None = None
        for component in self.components:
            try:
                component.manager.close()
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
