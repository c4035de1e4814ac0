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

import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import attrs
import torch

from plugrl.compose.boundaries import check_reward_output
from plugrl.config import option
from plugrl.errors import PlugrlError, RecipeError
from plugrl.parts.context import PartContext
from plugrl.parts.reward import RewardConfig, RewardManager, RewardOutput
from plugrl.rewards.scoring import function_options
from plugrl.structuring import describe_value, fields_of, structure

if TYPE_CHECKING:
    from plugrl.data.batch import Batch
    from plugrl.parts.device import Device
    from plugrl.plugins import PluginManager
    from plugrl.recipe import Recipe

COMPONENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
"""A component's name: it becomes a metric path segment and a column name."""

RESERVED_NAMES = frozenset({"errors", "timeouts"})
"""Names whose ``reward/<name>`` metrics the combination itself logs."""

NOT_INHERITED = ("components", "components_concurrently")
"""Top-level ``reward`` keys that describe the combination, not each component."""


@attrs.define(kw_only=True)
class ComponentKeys:
    """The keys of a ``reward.components.<name>`` section beside its manager's reward keys."""

    weight: float = option(
        help="Factor of this component's token-level scores in the run's reward (negative "
        "for a penalty, 0 to log it without training on it)."
    )
    manager: str = option(
        "naive",
        "Reward manager of this component; unset: the top-level reward.manager.",
        registry="reward_managers",
    )


@attrs.frozen
class ComponentSpec:
    """One component as the recipe gives it: its name, weight, manager and that manager's
    config."""

    name: str
    weight: float
    manager: str
    config: RewardConfig


@attrs.frozen
class Component:
    """One built component."""

    name: str
    weight: float
    manager_name: str
    manager: RewardManager


# --------------------------------------------------------------------------------------------
# Reading the recipe
# --------------------------------------------------------------------------------------------


def component_sections(reward: Mapping[str, Any], plugins: PluginManager) -> dict[str, Any]:
    """Each component's whole section, from the raw ``reward`` mapping of a recipe: the
    inherited top-level keys overlaid with its own, its ``manager`` and ``weight`` set, all
    checked with one-line errors keyed ``reward.components.<name>.<key>``. Reading a result
    again (a recorded recipe) gives the same sections."""
    components = reward.get("components") or {}
    if not isinstance(components, Mapping):
        raise RecipeError(
            f"expected a mapping of components by name, got {describe_value(components)}",
            key="reward.components",
        )
    if not components:
        if reward.get("components_concurrently"):
            raise RecipeError(
                "has no effect without reward.components; set components or remove it",
                key="reward.components_concurrently",
            )
        return {}
    inherited = {k: v for k, v in reward.items() if k not in NOT_INHERITED}
    default_manager = str(reward.get("manager", fields_of(RewardConfig)["manager"].default))
    sections: dict[str, Any] = {}
    for name, own in components.items():
        key = _check_name(name)
        if not isinstance(own, Mapping):
            raise RecipeError(
                "expected a section of keys (weight, manager and the manager's reward keys), "
                f"got {describe_value(own)}",
                key=key,
            )
        for nested in NOT_INHERITED:
            if nested in own:
                raise RecipeError(
                    "a component cannot hold components; list every component under "
                    "reward.components",
                    key=f"{key}.{nested}",
                )
        if "weight" not in own:
            raise RecipeError(
                "missing; every component needs a weight (1.0 adds its score as it is)",
                key=f"{key}.weight",
            )
        manager = own.get("manager", default_manager)
        config_cls = _config_class(manager, plugins, f"{key}.manager")
        known = fields_of(config_cls)
        section = {k: v for k, v in inherited.items() if k in known}
        section.update({k: v for k, v in own.items() if k != "weight"})
        section["manager"] = manager
        section = {"weight": own["weight"], **section}
        read_component(name, section, plugins, default_manager)
        sections[str(name)] = section
    return sections


def read_component(
    name: str, section: Mapping[str, Any], plugins: PluginManager, default_manager: str = "naive"
) -> ComponentSpec:
    """One component's section (``weight``, ``manager`` and the manager's reward keys) read
    into its manager's config class, with one-line errors keyed
    ``reward.components.<name>.<key>``."""
    key = _check_name(name)
    own = {k: section[k] for k in ("weight", "manager") if k in section}
    own.setdefault("manager", default_manager)
    if "weight" not in own:
        raise RecipeError(
            "missing; every component needs a weight (1.0 adds its score as it is)",
            key=f"{key}.weight",
        )
    keys = structure(ComponentKeys, own, key)
    config_cls = _config_class(keys.manager, plugins, f"{key}.manager")
    rest = {k: v for k, v in section.items() if k != "weight"}
    rest["manager"] = keys.manager
    config = structure(config_cls, rest, key)
    for nested in NOT_INHERITED:
        if getattr(config, nested):
            raise RecipeError(
                "a component cannot hold components; list every component under reward.components",
                key=f"{key}.{nested}",
            )
    holder = _RecipeOfComponent(config)
    for function in config.function_args:
        try:
            function_options(holder, function, plugins)
        except RecipeError as exc:
            raise component_error(exc, str(name)) from None
    return ComponentSpec(str(name), keys.weight, keys.manager, config)


def read_components(reward: RewardConfig, plugins: PluginManager) -> list[ComponentSpec]:
    """Every component of a ``reward`` section, in recipe order."""
    return [
        read_component(name, section, plugins, reward.manager)
        for name, section in reward.components.items()
    ]


@attrs.frozen
class _RecipeOfComponent:
    """What :func:`~plugrl.rewards.scoring.function_options` reads of a recipe: its reward."""

    reward: RewardConfig


def _check_name(name: Any) -> str:
    key = f"reward.components.{name}"
    if not isinstance(name, str) or not COMPONENT_NAME.fullmatch(name):
        raise RecipeError(
            f"{describe_value(name)} cannot name a component: its metrics are "
            "reward/NAME/*; use letters, digits, '_' and '-', starting with a letter",
            key=key,
        )
    if name in RESERVED_NAMES:
        raise RecipeError(
            f"{name!r} cannot name a component: reward/{name} counts the samples of all "
            "components; choose another name",
            key=key,
        )
    return key


def _config_class(manager: Any, plugins: PluginManager, key: str) -> type:
    if not isinstance(manager, str):
        raise RecipeError(f"expected a name, got {describe_value(manager)}", key=key)
    registry = plugins.registry("reward_managers")
    if manager not in registry:
        raise RecipeError(registry.unknown(manager).bare_message, key=key)
    entry = registry.get(manager)
    if entry.unavailable_reason:
        raise RecipeError(
            f"{registry.human_name} {manager!r} (plugin {entry.plugin!r}) is installed but "
            f"cannot run here: it {entry.unavailable_reason}",
            key=key,
        )
    config_cls = entry.load_config() or RewardConfig
    if not (isinstance(config_cls, type) and issubclass(config_cls, RewardConfig)):
        raise RecipeError(
            f"plugin {entry.plugin!r} registered {manager!r} with config {config_cls!r}, "
            "which must subclass plugrl.parts.reward.RewardConfig",
            key=key,
        )
    return config_cls


def component_error(exc: PlugrlError, name: str) -> PlugrlError:
    """``exc``, raised by component ``name`` or about it, as the same kind of one-line error
    naming the component: a recipe key ``reward.X`` becomes ``reward.components.<name>.X``."""
    if isinstance(exc, RecipeError) and exc.key and exc.key.startswith("reward."):
        rekeyed = f"reward.components.{name}.{exc.key.removeprefix('reward.')}"
        return RecipeError(exc.bare_message, key=rekeyed)
    message = f"reward component {name!r}: {exc}"
    try:
        return type(exc)(message)
    except TypeError:  # an error class with a constructor of its own
        return PlugrlError(message)


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
        context = PartContext(recipe=recipe, plugins=plugins, tokenizer=tokenizer, device=device)
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
