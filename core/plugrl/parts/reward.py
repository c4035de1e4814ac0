"""Rewards: scoring functions chosen by data source, and managers that score batches."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs

from plugrl.config import option, positive, section
from plugrl.errors import PluginError

if TYPE_CHECKING:
    import torch

    from plugrl.data.batch import Batch
    from plugrl.parts.context import PartContext

ScoreFn = Callable[..., "float | dict[str, Any]"]
"""verl's signature: ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``
returning a float, or a dict with ``score`` and extra fields that become metrics."""


class ScoringFunction(Protocol):
    """A reward function, what ``register_reward_functions`` registers: a plain function (or
    ``async def``) of verl's signature. The core passes these four by keyword (only those the
    function declares) and, when the recipe sets ``reward.function_args.<name>``, the options
    its config class read, as more keyword arguments."""

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> float | dict[str, Any]:
        """The score of one response: a float, or a dict with ``score`` and extra fields
        (per-response columns and ``reward/`` metrics)."""
        ...


class BatchScoringFunction(Protocol):
    """The batch form of a reward function, for scorers that vectorise: told apart by its
    ``solution_strs`` parameter, used by ``reward.manager: batch``."""

    def __call__(
        self,
        data_sources: list[str],
        solution_strs: list[str],
        ground_truths: list[Any],
        extra_infos: list[Any],
    ) -> list[float | dict[str, Any]]:
        """One score (float or dict, as :class:`ScoringFunction`) per response, in order."""
        ...


@attrs.define(kw_only=True)
class CustomFunctionConfig:
    """``reward.custom_function``: a scoring function from a Python file."""

    path: str | None = option(
        None,
        "Python file that defines the function.",
        verl="custom_reward_function.path",
        path="input",
    )
    name: str = option(
        "compute_score", "Function name in that file.", verl="custom_reward_function.name"
    )
    kwargs: dict[str, Any] = option(
        factory=dict,
        help="Extra keyword arguments for each call.",
        verl="custom_reward_function.reward_kwargs",
    )


@attrs.define(kw_only=True)
class RewardConfig:
    """The ``reward`` section. The chosen manager's config class extends this one."""

    manager: str = option(
        "naive", "Reward manager.", verl="reward_model.reward_manager", registry="reward_managers"
    )
    custom_function: CustomFunctionConfig = section(
        CustomFunctionConfig,
        "Scoring function from a file; overrides the data-source lookup.",
        verl="custom_reward_function",
    )
    function_args: dict[str, dict[str, Any]] = option(
        factory=dict,
        help="Options of registered scoring functions, by the name each was registered under "
        "('openai/gsm8k': {lenient: true}); the config class a function registered checks "
        "them, and they reach it as keyword arguments.",
    )
    timeout_s: float = option(
        30.0,
        "Seconds one sample may take to score before it counts as a failure.",
        validator=positive,
    )
    on_error: str = option(
        "raise",
        "A scorer that raises: stop the run with the sample named "
        "('raise'), or score it 0 and count it in reward/errors "
        "('score_zero'), or score it reward.fallback_score and count it ('fallback'). "
        "Timed-out samples score 0, or reward.fallback_score under 'fallback'.",
        choices=["raise", "score_zero", "fallback"],
    )
    fallback_score: float = option(
        0.0,
        "The score of a sample whose scoring failed or timed out, when reward.on_error is "
        "'fallback' (a neutral score for a flaky remote reward, say).",
    )

    components: dict[str, Any] = option(
        factory=dict,
        help="Weighted reward components, by name: {NAME: {weight: W, manager: M, <M's reward "
        "keys>}}. Each is a reward manager read from the top-level reward keys overlaid with "
        "its own; the run's reward is the weighted sum of their token-level scores, each "
        "logged as reward/NAME/*. Empty: reward.manager alone scores.",
    )
    components_concurrently: bool = option(
        False,
        "Score the reward.components at once, one thread each, instead of one after another.",
    )
    overlap: bool = option(
        True,
        "Score each prompt's responses as soon as they finish, while the others still "
        "generate (in the sync and fully_async schedulers), instead of after the whole batch; "
        "scores and metrics are the same either way. Needs a manager that implements prefetch "
        "(the built-in ones do).",
    )

    def failure_score(self) -> float:
        """What a failed or timed-out sample scores under this section's ``on_error``."""
        return self.fallback_score if self.on_error == "fallback" else 0.0


@attrs.define(kw_only=True)
class RewardOutput:
    """What a manager returns for a batch of B responses."""

    token_level_scores: torch.Tensor
    """[B, R]: each response's score on its last valid token (zeros elsewhere), plus any
    token-level shaping the manager adds."""
    extra: dict[str, list[Any]] = attrs.field(factory=dict)
    """verl's ``reward_extra_info``: per-response columns (``acc``, ``pred``, ...)."""
    metrics: dict[str, float] = attrs.field(factory=dict)


ConfigT = TypeVar("ConfigT", bound=RewardConfig)


def expect_config(config: RewardConfig, config_cls: type[ConfigT], manager: str) -> ConfigT:
    """``config`` as the config class ``manager`` registered; a one-line error when the manager
    is built with another (a ``reward`` section not read through
    :func:`plugrl.recipe.build_recipe`, which reads it into the chosen manager's class)."""
    if not isinstance(config, config_cls):
        raise PluginError(
            f"the {manager} manager got a {type(config).__name__} reward section; build the "
            f"recipe with plugrl.recipe.build_recipe so it is read into {config_cls.__name__}"
        )
    return config


class RewardManager(ABC):
    """Scores a batch of responses. Lives in the driver (or its own workers).

    Built as ``Manager(config, context)``: ``config`` is the ``reward`` section read into the
    manager's config class, ``context.tokenizer`` decodes responses, ``context.recipe`` is the
    whole run (``data.max_response_length``).
    """

    def __init__(self, config: RewardConfig, context: PartContext) -> None:
        from plugrl.parts.scoring import make_resolver

        self.config = config
        self.context = context
        self.recipe = context.recipe
        self.tokenizer = context.tokenizer
        self.resolve: Callable[[str], ScoreFn] = make_resolver(context.recipe, context.plugins)
        """``resolve(data_source)``: the scoring function for a data source (the custom
        function when one is configured); a one-line error for unknown ones."""

    def check_data_sources(self, data_sources: Iterable[str]) -> None:
        """Fail at start-up, before any generation, if a data source has no scorer."""
        for data_source in sorted(set(data_sources)):
            self.resolve(data_source)

    @abstractmethod
    def __call__(self, batch: Batch) -> RewardOutput:
        """Score every response. Reads ``responses``, ``response_mask`` and the non-tensor
        columns ``data_source``, ``ground_truth``, ``extra_info``."""

    def prefetch(self, batch: Batch) -> None:
        """Start scoring some responses early, without waiting: ``batch`` holds rows (the
        same columns as :meth:`__call__` gets) of responses that have finished while others
        still generate. A later :meth:`__call__` on the whole batch uses what was started
        here instead of scoring those rows again, and returns exactly what it would have
        returned without it. Optional: the default starts nothing."""

    def close(self) -> None:
        """Stop worker pools."""
