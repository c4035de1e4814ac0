"""The ``judge`` reward manager: a frozen LLM reads each prompt, response and reference answer
and its text answer is parsed into the score.

The judge model is served by any rollout engine (``reward.judge.engine``) in an engine group of
its own (:meth:`plugrl.api.PartContext.frozen_engine_group`), with its own ``rollout``
section, its own tokenizer, and no weight updates. Each sample's judge prompt is
``reward.judge.template`` filled in and wrapped in the judge tokenizer's chat template as one
user message. Requests are seeded from ``trainer.seed`` and the judge prompt itself, so the same
sample gets the same answer whether it was sent early (:meth:`JudgeRewardManager.prefetch`) or
with its batch, and identical samples are judged once.

An answer the parser (``reward.judge.parser``) cannot read is asked again with a new seed, at
``reward.judge.retry_temperature``, up to ``reward.judge.max_retries`` times; a sample still
without a score, or whose request failed in the engine, is a failure under ``reward.on_error``.

Columns: ``judge_text`` (the judge's last answer), ``judge_score`` (the raw parsed score,
``None`` when there is none). Metrics: ``reward/judge/{mean,std}`` (of the scores parsed,
normalised when ``reward.judge.score_range`` is set), ``reward/judge/unparsable`` (first
answers that could not be parsed), ``reward/judge/retries`` (requests sent again),
``reward/judge/latency_s`` (seconds waiting for the judge), ``reward/errors`` and
``critic/score/{mean,max,min}``.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import math
import string
import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from plugrl.api import (
    ModelConfig,
    PluginError,
    RecipeError,
    non_negative,
    option,
    positive,
    read_section,
    section,
    structure,
)
from plugrl.api.data import response_attention_mask
from plugrl.api.rewards import (
    RewardConfig,
    RewardManager,
    RewardOutput,
    ScoringError,
    expect_config,
)
from plugrl.api.rollout import GenerationRequest, SamplingParams, Stream, sampling_seed

if TYPE_CHECKING:
    from plugrl.api import PartContext
    from plugrl.api.cluster import EngineGroup
    from plugrl.api.data import Batch

logger = logging.getLogger("plugrl.rewards.judge")

DEFAULT_TEMPLATE = """\
You are grading an answer to a question. Read the question, the answer and, when one is \
given, the reference answer. Explain briefly what is right and wrong in the answer, then give \
it a score from 0 (useless or wrong) to 10 (correct and complete), written exactly as \
Rating: [[N]] on the last line, for example Rating: [[6]].

[Question]
{prompt}

[Answer]
{response}

[Reference answer]
{ground_truth}
"""
"""The template used when neither ``reward.judge.template`` nor ``template_path`` is set; it
asks for the form the ``rating`` parser reads, on the scale of the default ``score_range``."""

PLACEHOLDERS = ("prompt", "response", "ground_truth", "data_source", "extra_info")
"""What a template may use: ``{prompt}`` (the policy's prompt, decoded without special tokens),
``{response}``, ``{ground_truth}`` (empty when the row has none), ``{data_source}`` and
``{extra_info}`` (the row's dict: ``{extra_info[question]}``)."""


@attrs.define(kw_only=True)
class JudgeConfig:
    """``reward.judge``: the judge model, how it is served, asked and read."""

    model: ModelConfig = section(
        ModelConfig, "The judge model: its own folder (path), tokenizer and dtype."
    )
    engine: str = option(
        "hf", "Rollout engine that serves the judge model.", registry="rollout_engines"
    )
    rollout: dict[str, Any] = option(
        factory=dict,
        help="The judge engine's own rollout section (the common rollout keys and the engine's "
        "own, gpu_memory_utilization, tensor_model_parallel_size, nnodes and n_gpus_per_node "
        "on Ray, ...), read into reward.judge.engine's config class. temperature defaults to "
        "0 (greedy) here; the engine never shares the trainer's devices or weights.",
    )
    template: str | None = option(
        None,
        "Prompt template, sent through the judge tokenizer's chat template as one user "
        "message: placeholders {prompt}, {response}, {ground_truth}, {data_source}, "
        "{extra_info} ({extra_info[key]} for one field); a literal brace is written {{ or "
        "}}. Unset: a template asking for a score 0-10 as 'Rating: [[N]]'.",
    )
    template_path: str | None = option(
        None, "File holding the prompt template (instead of reward.judge.template).", path="input"
    )
    parser: str = option(
        "rating",
        "Score parser: rating ('Rating: [[7]]', 'Score: 7'), number (the last number), "
        "yes_no (1/0), boxed (\\boxed{7}), or one a plugin registers.",
        registry="judge_parsers",
    )
    parser_args: dict[str, Any] = option(
        factory=dict, help="Options of the chosen parser, checked by its config class."
    )
    max_retries: int = option(
        2,
        "Times an answer the parser cannot read is asked again with a new seed before the "
        "sample counts as failed (reward.on_error).",
        validator=non_negative,
    )
    retry_temperature: float = option(
        1.0,
        "Sampling temperature of the retries when the judge samples greedily (a greedy "
        "retry would repeat the same answer).",
        validator=non_negative,
    )
    max_tokens: int = option(512, "Tokens the judge may write per answer.", validator=positive)
    score_range: list[float] | None = option(
        factory=lambda: [0.0, 10.0],
        help="[low, high] of the judge's scale: scores are mapped to [0, 1] as "
        "(score - low) / (high - low), clipped. null keeps the raw parsed score.",
    )


@attrs.define(kw_only=True)
class JudgeRewardConfig(RewardConfig):
    """The ``reward`` section for ``manager: judge``."""

    judge: JudgeConfig = section(JudgeConfig, "The LLM judge.")


@attrs.define
class _Verdict:
    """How one judge prompt was answered."""

    text: str = ""
    raw: float | None = None
    unparsable_first: bool = False
    retries: int = 0
    error: str | None = None


class JudgeRewardManager(RewardManager):
    """Scores each response by asking a frozen LLM judge; the parsed score on the response's
    last valid token."""

    name = "judge"

    def __init__(self, config: RewardConfig, context: PartContext) -> None:
        super().__init__(config, context)
        expect_config(config, JudgeRewardConfig, "judge")
        self.plugins = context.plugins
        self.judge = config.judge
        self.template = read_template(self.judge)
        self.score_range = _check_range(self.judge.score_range)
        self.parse = judge_parser(self.judge, self.plugins)
        self.rollout = judge_rollout(self.judge, self.plugins)
        self.label = f"judge {self.judge.model.path!r}"
        if not self.judge.model.path:
            raise RecipeError(
                "the judge needs a model folder; set it to a Hugging Face model folder",
                key="reward.judge.model.path",
            )
        from plugrl.api.data import load_tokenizer

        try:
            self.judge_tokenizer = load_tokenizer(self.judge.model)
        except RecipeError as exc:
            raise RecipeError(exc.bare_message, key=f"reward.judge.{exc.key}") from None
        if not getattr(self.judge_tokenizer, "chat_template", None):
            raise RecipeError(
                f"the judge's tokenizer ({self.judge.model.tokenizer_path or self.judge.model.path}"
                ") has no chat template; set reward.judge.model.tokenizer_path to one that has",
                key="reward.judge.model",
            )
        self._request_ids = itertools.count()
        self._lock = threading.Lock()
        self._prefetched: dict[tuple[int, ...], tuple[int, concurrent.futures.Future]] = {}
        self._calls = 0
        self.engines = self._start_engines()

    def _start_engines(self) -> EngineGroup:
        return self.context.frozen_engine_group(self.judge.model, self.rollout)

    def check_data_sources(self, data_sources: Iterable[str]) -> None:
        """The judge scores rows of any data source."""

    # ------------------------------------------------------------------ prompts

    def judge_prompts(self, batch: Batch) -> list[tuple[int, ...]]:
        """Each row's judge prompt as the judge tokenizer's ids."""
        batch.require(
            "responses",
            "response_mask",
            "raw_prompt_ids",
            "data_source",
            "ground_truth",
            by="reward manager 'judge'",
        )
        size = len(batch["responses"])
        extra_infos = list(batch.get("extra_info", [None] * size))
        response_mask = response_attention_mask(batch)
        prompts = []
        for row in range(size):
            valid = response_mask[row].bool()
            response_ids = batch["responses"][row][valid].tolist()
            ground_truth = batch["ground_truth"][row]
            text = self.template.format(
                prompt=self.tokenizer.decode(
                    list(batch["raw_prompt_ids"][row]), skip_special_tokens=True
                ),
                response=self.tokenizer.decode(response_ids, skip_special_tokens=True),
                ground_truth="" if ground_truth is None else str(ground_truth),
                data_source=str(batch["data_source"][row]),
                extra_info=_FieldsOrEmpty(extra_infos[row] or {}),
            )
            rendered = self.judge_tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            prompts.append(tuple(self.judge_tokenizer.encode(rendered, add_special_tokens=False)))
        return prompts

    # ------------------------------------------------------------------ requests

    def _params(self, prompt: tuple[int, ...], attempt: int) -> SamplingParams:
        base = self.rollout.sampling_params(self.judge.max_tokens)
        temperature = base.temperature
        if attempt > 0 and temperature == 0:
            temperature = self.judge.retry_temperature
        # seeded by the prompt, not its row: a prefetched request samples what the batch's would
        checksum = zlib.crc32(repr(prompt).encode())
        seed = sampling_seed(self.recipe.trainer.seed, Stream.JUDGE, checksum, attempt)
        return attrs.evolve(base, n=1, temperature=temperature, seed=seed)

    def _submit(self, prompt: tuple[int, ...], attempt: int) -> concurrent.futures.Future:
        request = GenerationRequest(
            request_id=f"judge-{next(self._request_ids)}",
            prompt_ids=prompt,
            params=self._params(prompt, attempt),
        )
        return self.engines.submit(request)

    def prefetch(self, batch: Batch) -> None:
        """Send the judge requests of these finished rows now; :meth:`__call__` uses their
        answers."""
        prompts = self.judge_prompts(batch)
        with self._lock:
            for prompt in dict.fromkeys(prompts):
                if prompt not in self._prefetched:
                    self._prefetched[prompt] = (self._calls, self._submit(prompt, 0))

    def _first_requests(
        self, prompts: list[tuple[int, ...]]
    ) -> dict[tuple[int, ...], concurrent.futures.Future]:
        futures = {}
        with self._lock:
            for prompt in dict.fromkeys(prompts):
                held = self._prefetched.pop(prompt, None)
                futures[prompt] = held[1] if held is not None else self._submit(prompt, 0)
        return futures

    def _answer(self, future: concurrent.futures.Future) -> tuple[str, str | None]:
        """The judge's text, or the error that stopped its request."""
        try:
            completions = future.result()
        except Exception as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return "", f"{type(exc).__name__}: {reason}" if reason else type(exc).__name__
        ids = completions[0].token_ids
        return self.judge_tokenizer.decode(ids, skip_special_tokens=True), None

    def _read(self, text: str) -> float | None:
        value = self.parse(text)
        if value is None:
            return None
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise PluginError(
                f"judge score parser {self.judge.parser!r} returned {value!r}; a parser "
                "returns a number or None"
            ) from None
        return value if math.isfinite(value) else None

    def judge_all(self, prompts: list[tuple[int, ...]]) -> dict[tuple[int, ...], _Verdict]:
        """Every distinct prompt's verdict: asked (or taken from :meth:`prefetch`), read, and
        asked again while unreadable."""
        futures = self._first_requests(prompts)
        verdicts = {prompt: _Verdict() for prompt in futures}
        for attempt in range(self.judge.max_retries + 1):
            for prompt, future in futures.items():
                verdict = verdicts[prompt]
                verdict.text, verdict.error = self._answer(future)
                if verdict.error is None:
                    verdict.raw = self._read(verdict.text)
                    if verdict.raw is None and attempt == 0:
                        verdict.unparsable_first = True
            again = [p for p, v in verdicts.items() if v.raw is None and v.error is None]
            if not again or attempt == self.judge.max_retries:
                break
            futures = {}
            for prompt in again:
                verdicts[prompt].retries += 1
                futures[prompt] = self._submit(prompt, attempt + 1)
        return verdicts

    # ------------------------------------------------------------------ scoring

    def normalise(self, raw: float) -> float:
        if self.score_range is None:
            return raw
        low, high = self.score_range
        return min(max((raw - low) / (high - low), 0.0), 1.0)

    def __call__(self, batch: Batch) -> RewardOutput:
        prompts = self.judge_prompts(batch)
        started = time.monotonic()
        verdicts = self.judge_all(prompts)
        latency = time.monotonic() - started
        self._forget_stale()
        rows = [verdicts[prompt] for prompt in prompts]
        failed = [i for i, v in enumerate(rows) if v.raw is None]
        if failed and self.config.on_error == "raise":
            raise ScoringError(self._failure_line(rows, failed))
        if failed:
            logger.warning(
                "reward: %d of %d samples got no score from the %s and were scored %g; first: %s",
                len(failed),
                len(rows),
                self.label,
                self.config.failure_score(),
                self._failure_line(rows, failed[:1]),
            )
        scores = [
            self.config.failure_score() if v.raw is None else self.normalise(v.raw) for v in rows
        ]
        mask = response_attention_mask(batch)
        token_scores = torch.zeros(mask.shape, dtype=torch.float32)
        if rows:
            last = (mask.sum(dim=-1).to(torch.long) - 1).clamp(min=0)
            token_scores[torch.arange(len(rows)), last] = torch.tensor(scores)
        judged = torch.tensor([s for s, v in zip(scores, rows, strict=True) if v.raw is not None])
        distinct = verdicts.values()
        metrics = {
            "reward/errors": float(len(failed)),
            "reward/judge/unparsable": float(sum(v.unparsable_first for v in distinct)),
            "reward/judge/retries": float(sum(v.retries for v in distinct)),
            "reward/judge/latency_s": latency,
            "reward/judge/mean": float(judged.mean()) if len(judged) else 0.0,
            "reward/judge/std": float(judged.std(unbiased=False)) if len(judged) else 0.0,
        }
        if rows:
            totals = token_scores.sum(dim=-1)
            metrics["critic/score/mean"] = float(totals.mean())
            metrics["critic/score/max"] = float(totals.max())
            metrics["critic/score/min"] = float(totals.min())
        extra = {
            "judge_text": [v.text for v in rows],
            "judge_score": [v.raw for v in rows],
        }
        return RewardOutput(token_level_scores=token_scores, extra=extra, metrics=metrics)

    def _failure_line(self, rows: list[_Verdict], failed: list[int]) -> str:
        first = failed[0]
        verdict = rows[first]
        more = f" ({len(failed) - 1} more samples failed)" if len(failed) > 1 else ""
        if verdict.error is not None:
            return (
                f"{self.label} failed on sample {first}: {verdict.error}{more}; fix the judge's "
                "engine, or set reward.on_error=fallback to score such samples "
                "reward.fallback_score"
            )
        start = verdict.text[:80] + ("..." if len(verdict.text) > 80 else "")
        return (
            f"{self.label}: the {self.judge.parser!r} parser found no score in its answer for "
            f"sample {first} after {verdict.retries} retries: {start!r}{more}; make the "
            "template ask for the parser's form, raise reward.judge.max_retries, or set "
            "reward.on_error=fallback"
        )

    def _forget_stale(self) -> None:
        """Drop prefetched answers no call has used since the one before this: rows sent
        early and then left out of their batch."""
        with self._lock:
            self._calls += 1
            for prompt, (call, _) in list(self._prefetched.items()):
                if call < self._calls - 1:
                    del self._prefetched[prompt]

    def close(self) -> None:
        engines = getattr(self, "engines", None)
        if engines is not None:
            engines.close()
            self.engines = None  # type: ignore[assignment]


# --------------------------------------------------------------------------------------------
# Reading the section
# --------------------------------------------------------------------------------------------


class _FieldsOrEmpty(dict):
    """A row's ``extra_info`` in a template: a field the row lacks reads as empty."""

    def __missing__(self, key: str) -> str:
        return ""


def read_template(judge: JudgeConfig) -> str:
    """The prompt template the section gives, its placeholders checked."""
    key = "reward.judge.template"
    if judge.template is not None and judge.template_path is not None:
        raise RecipeError(
            "set reward.judge.template or reward.judge.template_path, not both", key=key
        )
    template = judge.template
    if judge.template_path is not None:
        key = "reward.judge.template_path"
        path = Path(judge.template_path)
        if not path.is_file():
            raise RecipeError(f"{path} is not a file; give the template's file", key=key)
        template = path.read_text(encoding="utf-8")
    if template is None:
        return DEFAULT_TEMPLATE
    try:
        fields = [
            field for _, field, _, _ in string.Formatter().parse(template) if field is not None
        ]
    except ValueError as exc:
        raise RecipeError(
            f"the template is not a format string ({exc}); write a literal brace as {{{{ or }}}}",
            key=key,
        ) from None
    for field in fields:
        root = field.split(".")[0].split("[")[0]
        if root not in PLACEHOLDERS:
            named = "{" + field + "}" if field else "{}"
            raise RecipeError(
                f"unknown placeholder {named}; the template may use "
                + ", ".join("{" + p + "}" for p in PLACEHOLDERS),
                key=key,
            )
    if not any(field.split(".")[0].split("[")[0] == "response" for field in fields):
        raise RecipeError(
            "the template has no {response}: the judge would never see what it scores",
            key=key,
        )
    return template


def _check_range(score_range: list[float] | None) -> tuple[float, float] | None:
    if score_range is None:
        return None
    if len(score_range) != 2 or not score_range[0] < score_range[1]:
        raise RecipeError(
            f"expected [low, high] with low < high, got {score_range}; or null to keep the "
            "raw score",
            key="reward.judge.score_range",
        )
    return float(score_range[0]), float(score_range[1])


def judge_rollout(judge: JudgeConfig, plugins: Any) -> Any:
    """The judge engine's rollout section, read into its engine's config class: greedy unless
    it says otherwise."""
    raw: Mapping[str, Any] = judge.rollout
    if "engine" in raw:
        raise RecipeError(
            "the judge's engine is chosen by reward.judge.engine; remove it here",
            key="reward.judge.rollout.engine",
        )
    return read_section(
        "rollout",
        {"temperature": 0.0, **raw, "engine": judge.engine},
        plugins,
        "reward.judge.rollout",
    )


def judge_parser(judge: JudgeConfig, plugins: Any) -> Any:
    """The chosen parser, its ``parser_args`` bound."""
    import functools

    key = "reward.judge.parser_args"
    entry = plugins.registry("judge_parsers").get(judge.parser)
    function = entry.load()
    config_cls = entry.load_config()
    if config_cls is None:
        if judge.parser_args:
            raise RecipeError(
                f"judge score parser {judge.parser!r} takes no options, got "
                f"{', '.join(map(str, judge.parser_args))}",
                key=key,
            )
        return function
    options = attrs.asdict(structure(config_cls, dict(judge.parser_args), key))
    return functools.partial(function, **options)
