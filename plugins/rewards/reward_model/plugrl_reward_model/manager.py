"""``reward.manager: reward_model``: a discriminative reward model scores each response.

The model is a sequence classifier (what ``AutoModelForSequenceClassification`` loads:
Skywork-Reward, ArmoRM-style models, any ``*ForSequenceClassification`` with one output per
sequence). For every row the manager

1. takes the row's chat messages (the ``raw_prompt`` column the dataset adds; without it, the
   prompt's token ids decoded with the run's tokenizer, as one user message) and the response
   decoded with the run's tokenizer, special tokens skipped;
2. renders ``[*messages, {"role": "assistant", "content": response}]`` with the reward model's
   own tokenizer and chat template (no generation prompt), or, when that tokenizer has no
   template, joins the contents with newlines (logged once);
3. tokenizes that text with the reward model's tokenizer and cuts it to ``reward.max_length``
   tokens (``reward.truncation`` says which end goes; counted in
   ``reward/reward_model/truncated``);
4. scores micro-batches of ``reward.micro_batch_size`` sequences, padded, in eval mode without
   gradients: the model's own pooled logit at the last token, column ``reward.score_index``;
5. puts each score on the response's last valid token.

``reward.placement: local`` keeps the model in the driver process; ``ray`` starts
``reward.num_workers`` Ray actors that each hold it, on a device of the run's device kind, and
spreads the micro-batches over them.

Failures: a scoring call that raises (out of device memory, an actor that died) stops the run
(``reward.on_error: raise``), or scores its samples as ``reward.on_error`` says (0, or
``reward.fallback_score``) and counts them in ``reward/errors``. ``reward.timeout_s`` does not
apply: a forward pass is not cut short.

Metrics: ``reward/reward_model/{mean,std}`` of the raw scores, ``reward/reward_model/truncated``,
``timing_s/reward_model`` (seconds to template, tokenize and score the batch),
``critic/score/{mean,max,min}`` and ``reward/errors``. The raw scores are the ``rm_score``
column of the extra output.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from plugrl.api import PluginError, RecipeError, non_negative, option, positive, section
from plugrl.api.data import response_attention_mask
from plugrl.api.rewards import (
    RewardConfig,
    RewardManager,
    RewardOutput,
    ScoringError,
    expect_config,
)
from plugrl_reward_model.runner import RewardModelRunner

if TYPE_CHECKING:
    import torch

    from plugrl.api import PartContext
    from plugrl.api.data import Batch
    from plugrl.api.devices import Device

logger = logging.getLogger("plugrl.rewards")

DTYPES = ("auto", "float32", "bfloat16", "float16")


@attrs.define(kw_only=True)
class RewardModelPathConfig:
    """``reward.model``: the reward model to load."""

    path: str | None = option(
        None,
        "Local Hugging Face folder of a sequence-classification reward model (one score per "
        "sequence), with its tokenizer.",
        verl="reward_model.model.path",
        path="model",
    )
    trust_remote_code: bool = option(
        False,
        "Let transformers run the model folder's own code (models with a custom class).",
        verl="reward_model.model.trust_remote_code",
    )
    dtype: str = option(
        "auto",
        "Weights' dtype; 'auto': bfloat16 on an accelerator, float32 on the CPU.",
        choices=DTYPES,
    )


@attrs.define(kw_only=True)
class RewardModelConfig(RewardConfig):
    """The ``reward`` section for ``manager: reward_model``."""

    model: RewardModelPathConfig = section(
        RewardModelPathConfig, "The reward model.", verl="reward_model.model"
    )
    score_index: int | None = option(
        None,
        "Which of the model's outputs is the score, for a model with several (num_labels > "
        "1, multi-objective heads); unset: the only one.",
        validator=non_negative,
    )
    micro_batch_size: int = option(
        8,
        "Sequences per forward pass of the reward model.",
        verl="reward_model.micro_batch_size_per_gpu",
        validator=positive,
    )
    max_length: int | None = option(
        None,
        "Most tokens the reward model sees of one templated prompt and response; unset: the "
        "model's max_position_embeddings.",
        verl="reward_model.max_length",
        validator=positive,
    )
    truncation: str = option(
        "right",
        "Which end of a text longer than max_length is cut: 'right' keeps the start (as "
        "verl), 'left' keeps the end of the response.",
        choices=["right", "left"],
    )
    placement: str = option(
        "local",
        "'local': the model lives in the driver process; 'ray': in reward.num_workers Ray "
        "actors, each on a device of the run's kind.",
        choices=["local", "ray"],
    )
    num_workers: int = option(
        1,
        "Ray actors holding the model, with placement 'ray'; micro-batches are spread over them.",
        verl="reward_model.n_gpus_per_node",
        validator=positive,
    )
    offload: bool = option(
        False,
        "Keep the weights in CPU memory between batches, on the device only while scoring "
        "(no effect on a CPU device).",
        verl="reward_model.model.fsdp_config.param_offload",
    )


class RewardModelManager(RewardManager):
    """Scores responses with a sequence-classification reward model (see the module's
    docstring for what the model sees, placement, failures and metrics).

    ``context.device`` is the process's device (the driver's, in a run); without one the
    device of ``device.name`` is built here. The model loads, and Ray actors start, when the
    manager is built, so a bad model stops a run before any generation.
    """

    def __init__(self, config: RewardConfig, context: PartContext) -> None:
        super().__init__(config, context)
        expect_config(config, RewardModelConfig, "reward_model")
        self.config: RewardModelConfig = config
        self.path = check_reward_model_folder(config)
        model_config = load_model_config(config)
        self.score_index = check_score_index(config, model_config)
        self.rm_tokenizer = _load_tokenizer(config)
        self.pad_token_id = _pad_token_id(self.rm_tokenizer, model_config)
        self.max_length = config.max_length or getattr(
            model_config, "max_position_embeddings", None
        )
        self.templated = bool(getattr(self.rm_tokenizer, "chat_template", None))
        self._said_no_template = False
        self._said_no_messages = False
        device = context.device or _device_of(context)
        self.device_type = device.torch_device_type if device is not None else "cpu"
        self.ray_resource = device.ray_resource if device is not None else None
        self.dtype = _dtype(config.model.dtype, self.device_type)
        # as a component of a weighted reward the section inherits the run's custom
        # function, which another component scores with
        if config.custom_function.path and config is self.recipe.reward:
            logger.warning(
                "reward: reward.custom_function is not used by the reward_model manager: the "
                "reward model's score is the reward (as in verl with reward_model.enable); "
                "weigh the two with reward.components to use both"
            )
        self._runner: RewardModelRunner | None = None
        self._actors: list[Any] = []
        self._ray: Any = None
        if config.placement == "ray":
            self._start_actors()
        else:
            self._runner = RewardModelRunner(**self._runner_options())

    # ------------------------------------------------------------------ start-up

    def _runner_options(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "dtype": self.dtype,
            "device_type": self.device_type,
            "pad_token_id": self.pad_token_id,
            "score_index": self.score_index,
            "offload": self.config.offload,
            "trust_remote_code": self.config.model.trust_remote_code,
        }

    def _start_actors(self) -> None:
        from plugrl.api.cluster import ensure_ray, import_ray

        import_ray("reward.placement=ray")
        self._ray = ray = ensure_ray(self.recipe.cluster)
        # no CPU reservation: the training actors hold the cluster's CPUs, and a reward
        # model on the CPU shares the cores with them
        resources: dict[str, Any] = {"num_cpus": 0}
        if self.ray_resource == "GPU":
            resources["num_gpus"] = 1
        elif self.ray_resource:
            resources["resources"] = {self.ray_resource: 1}
        actor_class = ray.remote(max_restarts=0, **resources)(RewardModelRunner)
        options = self._runner_options()
        self._actors = [actor_class.remote(**options) for _ in range(self.config.num_workers)]
        try:
            ray.get([actor.ready.remote() for actor in self._actors])
        except Exception as exc:
            self.close()
            raise PluginError(
                f"a Ray actor could not load the reward model {self.path}: {_one_line(exc)}"
            ) from None

    def check_data_sources(self, data_sources: Any) -> None:
        """Nothing to check: the reward model scores rows of any data source."""

    # ------------------------------------------------------------------ scoring

    def __call__(self, batch: Batch) -> RewardOutput:
        import torch

        started = time.monotonic()
        batch.require("responses", "response_mask", by="reward manager 'reward_model'")
        responses: torch.Tensor = batch["responses"]
        mask: torch.Tensor = response_attention_mask(batch)
        size = responses.shape[0]
        sequences, truncated = self.encode(batch)
        scores, errors = self.score(sequences)
        lengths = mask.sum(dim=-1).to(torch.long)
        token_level = torch.zeros(responses.shape, dtype=torch.float32)
        if size:
            last = (lengths - 1).clamp(min=0)  # an empty response keeps its score on token 0
            token_level[torch.arange(size), last] = torch.tensor(scores, dtype=torch.float32)
        totals = token_level.sum(dim=-1)
        scored = [s for s, failed in zip(scores, errors, strict=True) if not failed]
        metrics: dict[str, float] = {
            "reward/errors": float(sum(errors)),
            "reward/reward_model/truncated": float(truncated),
        }
        if scored:
            mean = sum(scored) / len(scored)
            metrics["reward/reward_model/mean"] = mean
            metrics["reward/reward_model/std"] = math.sqrt(
                sum((s - mean) ** 2 for s in scored) / len(scored)
            )
        if size:
            metrics["critic/score/mean"] = float(totals.mean())
            metrics["critic/score/max"] = float(totals.max())
            metrics["critic/score/min"] = float(totals.min())
        metrics["timing_s/reward_model"] = time.monotonic() - started
        extra = {"rm_score": [None if f else s for s, f in zip(scores, errors, strict=True)]}
        return RewardOutput(token_level_scores=token_level, extra=extra, metrics=metrics)

    def encode(self, batch: Batch) -> tuple[list[list[int]], int]:
        """The reward model's token ids of every row (its template applied to the row's
        messages and response, cut to ``max_length``), and how many rows were cut."""
        from plugrl.api.data import truncate

        responses, mask = batch["responses"], response_attention_mask(batch)
        chats = self.prompt_messages(batch)
        sequences: list[list[int]] = []
        truncated = 0
        for chat, ids, valid in zip(chats, responses, mask, strict=True):
            response = self.tokenizer.decode(ids[valid.bool()].tolist(), skip_special_tokens=True)
            text = self.render([*chat, {"role": "assistant", "content": response}])
            tokens = self.rm_tokenizer(text, add_special_tokens=not self.templated)["input_ids"]
            if self.max_length is not None and len(tokens) > self.max_length:
                tokens = truncate(tokens, self.max_length, self.config.truncation)
                truncated += 1
            sequences.append(list(tokens))
        return sequences, truncated

    def prompt_messages(self, batch: Batch) -> list[list[dict[str, str]]]:
        """Each row's chat messages: the ``raw_prompt`` column, else the decoded prompt ids as
        one user message (the run's template markup stripped of its special tokens only)."""
        if "raw_prompt" in batch:
            return [[dict(m) for m in chat] for chat in batch["raw_prompt"]]
        batch.require("raw_prompt_ids", by="reward manager 'reward_model'")
        if not self._said_no_messages:
            self._said_no_messages = True
            logger.warning(
                "reward: the batch has no raw_prompt column (chat messages); the reward model "
                "sees each prompt decoded from its token ids, the run's template included"
            )
        return [
            [{"role": "user", "content": self.tokenizer.decode(ids, skip_special_tokens=True)}]
            for ids in batch["raw_prompt_ids"]
        ]

    def render(self, chat: list[dict[str, str]]) -> str:
        """The text the reward model reads for one conversation ending in the response."""
        if self.templated:
            return self.rm_tokenizer.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=False
            )
        if not self._said_no_template:
            self._said_no_template = True
            logger.warning(
                "reward: the reward model's tokenizer (%s) has no chat template; it reads the "
                "prompt and the response joined by newlines",
                self.path,
            )
        return "\n".join(message["content"] for message in chat)

    def score(self, sequences: Sequence[Sequence[int]]) -> tuple[list[float], list[bool]]:
        """Each sequence's score, and whether its scoring failed (then it has the failure
        score of ``reward.on_error``)."""
        size = self.config.micro_batch_size
        micro_batches = [list(sequences[i : i + size]) for i in range(0, len(sequences), size)]
        if not micro_batches:
            return [], []
        workers = max(1, len(self._actors))
        # micro-batch i goes to worker i mod workers, one call per worker
        shares = [micro_batches[w::workers] for w in range(workers)]
        results: list[list[list[float]] | BaseException] = []
        if self._actors:
            # a batch of fewer micro-batches than actors leaves some idle
            pending = [
                actor.score.remote(share) if share else None
                for actor, share in zip(self._actors, shares, strict=True)
            ]
            for ref in pending:
                try:
                    results.append(self._ray.get(ref) if ref is not None else [])
                except Exception as exc:
                    results.append(exc)
        else:
            assert self._runner is not None
            try:
                results.append(self._runner.score(shares[0]))
            except Exception as exc:
                results.append(exc)
        by_micro_batch: list[list[float] | None] = [None] * len(micro_batches)
        failures = []
        for worker, result in enumerate(results):
            indices = range(worker, len(micro_batches), workers)
            if isinstance(result, BaseException):
                failures.append(result)
                continue
            for index, values in zip(indices, result, strict=True):
                by_micro_batch[index] = values
        if failures and self.config.on_error == "raise":
            failed = sum(len(micro_batches[i]) for i, v in enumerate(by_micro_batch) if v is None)
            raise ScoringError(
                f"the reward model {self.path} failed on {failed} of {len(sequences)} samples: "
                f"{_one_line(failures[0])}; fix the cause, or set reward.on_error=score_zero "
                "to score such samples 0 and count them in reward/errors"
            )
        scores: list[float] = []
        errors: list[bool] = []
        for micro_batch, values in zip(micro_batches, by_micro_batch, strict=True):
            if values is None:
                scores += [self.config.failure_score()] * len(micro_batch)
                errors += [True] * len(micro_batch)
            else:
                scores += values
                errors += [False] * len(values)
        if failures:
            logger.warning(
                "reward: the reward model failed on %d of %d samples, scored %g: %s",
                sum(errors),
                len(errors),
                self.config.failure_score(),
                _one_line(failures[0]),
            )
        return scores, errors

    def close(self) -> None:
        """Stop the Ray actors; a local model is freed with the manager."""
        for actor in self._actors:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception as exc:  # an actor that died already
                logger.debug("killing a reward model actor failed: %s", exc)
        self._actors = []


# ------------------------------------------------------------------------ checks and loading


def check_reward_model_folder(config: RewardModelConfig) -> Path:
    """``reward.model.path`` as a folder that holds a model config; one line when not."""
    key = "reward.model.path"
    if not config.model.path:
        raise RecipeError(
            "not set; point it at the Hugging Face folder of a sequence-classification reward "
            "model",
            key=key,
        )
    folder = Path(config.model.path)
    if not folder.is_dir():
        raise RecipeError(
            f"{folder} is not a folder; point it at the local Hugging Face folder of a "
            "sequence-classification reward model",
            key=key,
        )
    if not (folder / "config.json").is_file():
        raise RecipeError(
            f"{folder} is not a model folder (no config.json); point it at a folder that "
            "save_pretrained wrote",
            key=key,
        )
    return folder


def load_model_config(config: RewardModelConfig) -> Any:
    """The model's config, checked to be a sequence classifier; one line naming the
    architecture when it is not."""
    from transformers import AutoConfig

    path = config.model.path
    model_config = AutoConfig.from_pretrained(
        path, trust_remote_code=config.model.trust_remote_code
    )
    architectures = list(getattr(model_config, "architectures", None) or [])
    auto_map = getattr(model_config, "auto_map", None) or {}
    if "AutoModelForSequenceClassification" in auto_map or any(
        name.endswith("ForSequenceClassification") for name in architectures
    ):
        return model_config
    what = ", ".join(architectures) or f"model of type {model_config.model_type!r}"
    raise RecipeError(
        f"{path} holds a {what}, not a sequence classifier; a reward model must be one "
        "(an architecture ending in ForSequenceClassification, as "
        "AutoModelForSequenceClassification loads, scoring a whole sequence)",
        key="reward.model.path",
    )


def check_score_index(config: RewardModelConfig, model_config: Any) -> int:
    """The output column that is the score: ``reward.score_index``, or 0 for a model with one
    output; one line when a model with several has no index, or the index is past them."""
    labels = int(getattr(model_config, "num_labels", 1))
    index = config.score_index
    if index is None:
        if labels != 1:
            raise RecipeError(
                f"the reward model {config.model.path} has {labels} outputs per sequence "
                f"(num_labels {labels}); set reward.score_index to the one that is the score "
                f"(0 to {labels - 1})",
                key="reward.score_index",
            )
        return 0
    if index >= labels:
        raise RecipeError(
            f"{index} is past the reward model's {labels} outputs (0 to {labels - 1})",
            key="reward.score_index",
        )
    return index


def _load_tokenizer(config: RewardModelConfig) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        config.model.path, trust_remote_code=config.model.trust_remote_code
    )


def _pad_token_id(tokenizer: Any, model_config: Any) -> int:
    """The id that pads a micro-batch: the tokenizer's pad token, else the model's, else the
    end-of-sequence token (the model reads the last token before the padding)."""
    for candidate in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(model_config, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if candidate is not None:
            return int(candidate)
    raise RecipeError(
        f"the reward model {tokenizer.name_or_path} defines no pad or end-of-sequence token to "
        "pad a micro-batch with; set one in its tokenizer",
        key="reward.model.path",
    )


def _device_of(context: PartContext) -> Device | None:
    """The device ``device.name`` names, for a manager built without the run's device."""
    if context.plugins is None:
        return None
    return context.build_device()


def _dtype(dtype: str, device_type: str) -> str:
    if dtype != "auto":
        return dtype
    return "float32" if device_type == "cpu" else "bfloat16"


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__
