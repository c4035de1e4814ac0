"""The ``hf`` rollout engine.

Colocated (``rollout.colocate: true``) it generates with the trainer's live module, handed over
with :meth:`HFRolloutEngine.bind_model`: no copy and no weight sync. Otherwise it builds its own
model from ``model.path`` (dtype ``model.dtype``) and receives new weights with
:meth:`HFRolloutEngine.update_weights`.

Sampling is seeded: a call with ``SamplingParams.seed`` uses a generator seeded with it; other
calls draw from the engine's generator, seeded once from ``trainer.seed``, so a run repeats
exactly. See :mod:`plugrl_plugins.rollout.hf.sampler` for which log-probs are returned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from plugrl.errors import PluginError, RecipeError
from plugrl.parts.rollout import Completion, RolloutEngine, SamplingParams
from plugrl_plugins.rollout.hf.config import HFRolloutConfig
from plugrl_plugins.rollout.hf.sampler import SamplingSetup, default_stop_token_ids, sample

if TYPE_CHECKING:
    from plugrl.parts.device import Device
    from plugrl.recipe import Recipe

logger = logging.getLogger("plugrl.rollout.hf")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(recipe: Recipe, device: torch.device, attn_implementation: str = "sdpa") -> Any:
    """The model of ``model.path`` in ``model.dtype`` on ``device``, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = recipe.model.path
    if not path:
        raise RecipeError(
            "the hf rollout engine needs a model folder when rollout.colocate is false; "
            "set model.path",
            key="model.path",
        )
    if not Path(path).is_dir():
        raise RecipeError(
            f"{path} is not a folder; set a local Hugging Face model folder", "model.path"
        )
    trust = recipe.model.trust_remote_code
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
    for name, value in recipe.model.override_config.items():
        setattr(config, name, value)
    model = AutoModelForCausalLM.from_pretrained(
        path,
        config=config,
        dtype=DTYPES[recipe.model.dtype],
        attn_implementation=attn_implementation,
        trust_remote_code=trust,
    )
    return model.to(device).eval()


class HFRolloutEngine(RolloutEngine):
    """Samples with a Hugging Face causal LM's forward and a KV cache; finished sequences leave
    the running batch at once."""

    supports_interrupt: ClassVar[bool] = True

    def __init__(self, recipe: Recipe, *, device: Device, tokenizer: Any) -> None:
        super().__init__(recipe, device=device, tokenizer=tokenizer)
        self.config: HFRolloutConfig = recipe.rollout  # type: ignore[assignment]
        self.torch_device = device.torch_device()
        self.model: Any = None
        self.owns_model = False
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = pad if pad is not None else tokenizer.eos_token_id
        self._generator = torch.Generator(device=self.torch_device)
        self._generator.manual_seed(recipe.trainer.seed)
        # generation holds the model lock, so new weights never land mid-sequence
        self._model_lock = threading.RLock()
        self._abort = threading.Event()
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        if not self.config.colocate:
            self.model = load_model(recipe, self.torch_device, self.config.attn_implementation)
            self.owns_model = True

    # ---------------------------------------------------------------------------- generation

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        _check_params(params)
        with self._in_flight_lock:
            self._in_flight += 1
        try:
            with self._model_lock:
                if self.model is None:
                    raise RuntimeError(
                        "the hf rollout engine has no model yet: with rollout.colocate true, call "
                        "bind_model(model, version) first"
                    )
                return self._generate(self.model, prompts, params)
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._abort.clear()

    def _generate(
        self, model: Any, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        version = self.weight_version
        stop_ids = default_stop_token_ids(model, self.tokenizer) | set(params.stop_token_ids)
        setup = SamplingSetup(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=params.max_tokens,
            stop_token_ids=frozenset(stop_ids),
            stop_strings=tuple(params.stop),
        )
        generator = self._generator
        if params.seed is not None:
            generator = torch.Generator(device=self.torch_device)
            generator.manual_seed(params.seed)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                sequences = sample(
                    model,
                    prompts,
                    setup,
                    pad_token_id=self.pad_token_id,
                    device=self.torch_device,
                    generator=generator,
                    max_num_seqs=self.config.max_num_seqs,
                    decode=self._decode,
                    should_abort=self._abort.is_set,
                )
        finally:
            if was_training:
                model.train()
        return [
            Completion(
                prompt_index=index // params.n,
                token_ids=seq.token_ids,
                log_probs=seq.log_probs,
                finish_reason=seq.finish_reason,  # type: ignore[arg-type]
                weight_version=version,
                min_weight_version=version,
            )
            for index, seq in enumerate(sequences)
        ]

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def interrupt(self) -> None:
        with self._in_flight_lock:
            if self._in_flight:
                self._abort.set()

    # ------------------------------------------------------------------------------- weights

    def bind_model(self, model: Any, version: int) -> None:
        with self._model_lock:
            device = _device_of(model)
            if device is not None and device != self.torch_device:
                # sample where the trainer's model lives (its rank's device)
                self.torch_device = device
                self._generator = torch.Generator(device=device)
                self._generator.manual_seed(self.recipe.trainer.seed)
            self.model = model
            self.owns_model = False
            self.weight_version = version

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        with self._model_lock:
            if not self.owns_model:
                raise RuntimeError(
                    "this hf rollout engine generates with the trainer's own model "
                    "(bind_model); there are no weights to push, call bind_model(model, version)"
                )
            targets = self.model.state_dict()
            # tied weights (lm_head and the embedding) share storage: loading either loads both
            received_storage: set[int] = set()
            for name, tensor in weights:
                target = targets.get(name)
                if target is None:
                    raise PluginError(
                        f"update_weights got {name!r}, which the rollout model of "
                        f"{self.recipe.model.path} does not have; push weights under Hugging Face "
                        "names of the same architecture"
                    )
                if tuple(target.shape) != tuple(tensor.shape):
                    raise PluginError(
                        f"update_weights got {name!r} of shape {tuple(tensor.shape)}, the rollout "
                        f"model's is {tuple(target.shape)}; push full (unsharded) weights"
                    )
                target.copy_(tensor.detach())
                received_storage.add(target.untyped_storage().data_ptr())
            missing = [
                name
                for name, target in targets.items()
                if target.untyped_storage().data_ptr() not in received_storage
            ]
            if missing:
                raise PluginError(
                    f"update_weights got {len(targets) - len(missing)} of {len(targets)} "
                    f"weights; missing {', '.join(missing[:3])}"
                    + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                    + "; push every weight with each version"
                )
            self.weight_version = version

    # ------------------------------------------------------------------------- checkpointing

    def rng_state(self) -> torch.Tensor:
        """The state of the generator unseeded calls draw from (for a checkpoint)."""
        return self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore :meth:`rng_state`, so a resumed run samples what the original would have."""
        self._generator.set_state(state)

    # ----------------------------------------------------------------------------- lifecycle

    def sleep(self) -> None:
        with self._model_lock:
            if self.owns_model and self.torch_device.type != "cpu":
                self.model.to("cpu")
                self.device.empty_cache()

    def wake_up(self) -> None:
        with self._model_lock:
            if self.owns_model and self.torch_device.type != "cpu":
                self.model.to(self.torch_device)

    def close(self) -> None:
        with self._model_lock:
            self.model = None
            self.owns_model = False


def _device_of(model: Any) -> torch.device | None:
    parameter = next(iter(model.parameters()), None)
    return None if parameter is None else parameter.device


def _check_params(params: SamplingParams) -> None:
    problems = []
    if params.n < 1:
        problems.append(f"n must be >= 1, got {params.n}")
    if params.temperature < 0:
        problems.append(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        problems.append(f"top_p must be in (0, 1], got {params.top_p}")
    if params.max_tokens < 0:
        problems.append(f"max_tokens must be >= 0, got {params.max_tokens}")
    if problems:
        raise ValueError("bad sampling parameters: " + "; ".join(problems))
