"""One rank of the FSDP2 training backend: a Hugging Face model sharded with ``fully_shard``."""

from __future__ import annotations

import inspect
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from plugrl.api import RecipeError
from plugrl.api.algorithms import LossScale
from plugrl.api.backend import (
    SEQUENCE_COLUMNS,
    LogProbRows,
    OptimConfig,
    RowsWithoutGradient,
    TrainingBackend,
    all_reduced_loss_scale,
    backend_config,
    capture_rng_state,
    ensure_process_group,
    fixed_micro_batches,
    mean_metrics,
    mini_batches,
    policy_update,
    response_log_probs,
    response_sum_pi_squared,
    restore_rng_state,
    rows_with_gradient,
    sampling_temperature,
    update_mini_batch_rows,
)
from plugrl.api.data import MULTIMODAL_COLUMN, Batch, model_inputs, multimodal_family
from plugrl.api.rollout import WeightMeta, lora_sync_mode
from plugrl_fsdp2 import checkpoint, lora, packing, ulysses
from plugrl_fsdp2.batching import (
    left_align,
    packed_micro_batches,
    token_budget_micro_batches,
    valid_lengths,
)
from plugrl_fsdp2.config import FSDP2ActorConfig
from plugrl_fsdp2.export import write_hf_folder
from plugrl_fsdp2.model import (
    device_mesh,
    empty_model,
    enable_checkpointing,
    fill_from_rank0,
    load_model,
    model_path,
    shard_model,
    weight_dtypes,
)
from plugrl_fsdp2.optim import build_optimizer

if TYPE_CHECKING:
    from plugrl.api import PartContext
    from plugrl.api.algorithms import ActorObjective
    from plugrl.api.backend import ActorConfig

logger = logging.getLogger(__name__)

MicroLoss = Callable[[Batch, LossScale], tuple[torch.Tensor, dict[str, float]]]
PerToken = Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]


class FSDP2Backend(TrainingBackend):
    """A Hugging Face model for one role (``actor``, ``ref``, ``critic``), sharded over the
    role's ranks with FSDP2.

    Micro-batches run padded, each row moved to the left edge, so that a micro-batch costs its
    row count times its longest row (``use_dynamic_bsz`` groups rows of similar length); with
    ``use_remove_padding`` they run packed (:mod:`plugrl_fsdp2.packing`): the attended tokens
    of their rows end to end in one row, so a micro-batch costs its real token count
    (``use_dynamic_bsz`` fills micro-batches up to the token budget).
    With ``ulysses_sequence_parallel_size`` > 1 each micro-batch runs split along the sequence
    over a group of ranks (:mod:`plugrl_fsdp2.ulysses`): such a group is one data-parallel rank
    (``dp_rank``, ``dp_size``), whose first rank holds the outputs.
    Losses: the objective's return value is backpropagated as is, so it must be this
    micro-batch's share of the global mini-batch loss (see :class:`LossScale`). Metrics the
    objective returns are shares too: summed over the micro-batches of a mini-batch, then
    averaged over optimizer steps and ranks (the ActorObjective contract). The backend adds
    ``actor/loss`` (the exact mini-batch loss), ``actor/grad_norm`` and ``actor/lr``
    (``critic/vf_loss``, ``critic/grad_norm``, ``critic/lr`` for the critic).
    """

    supports_colocated_rollout: ClassVar[bool] = True
    derives_on_policy_old_log_probs: ClassVar[bool] = True
    computes_sum_pi_squared: ClassVar[bool] = True

    def __init__(self, config: ActorConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self.config: FSDP2ActorConfig = backend_config(config, FSDP2ActorConfig)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.update_steps = 0
        """Completed update calls: the position in the learning-rate schedule."""
        self.torch_device = self.device.torch_device(self.dist.local_rank)
        self.param_dtype, self.compute_dtype = weight_dtypes(self.recipe, self.role)
        self.lora = self.role == "actor" and self.recipe.model.lora_rank > 0
        """The actor trains LoRA adapters (:mod:`plugrl_fsdp2.lora`), not its weights."""
        self.sync_adapters = (
            self.lora and lora_sync_mode(self.recipe, self.device.torch_device_type) == "adapters"
        )
        """Engines get the adapters alone (``rollout.lora_sync``), not merged weights."""
        self._sp = self.config.ulysses_sequence_parallel_size
        # refuses a rank count the groups do not divide, before the worker group dispatches
        self._dp_size = self.config.data_parallel_size(self.dist.world_size)
        self._sp_group: Any = None
        self._dp_group: Any = None
        self._dummy_image: Any = None
        """The dummy inputs of this forward (:meth:`_needs_dummy_image` chooses them)."""
        self._dummy_family: Any = None
        self._dummies: dict[tuple[str, ...], Any] = {}
        self._language_model: torch.nn.Module | None = None
        """A vision-language model's language model, under sequence parallelism: the module
        whose inputs are sliced per rank (:func:`ulysses.sliced_language_model`)."""

    @property
    def dp_rank(self) -> int:
        return self.dist.rank // self._sp

    @property
    def dp_size(self) -> int:
        return self._dp_size

    @property
    def is_output_rank(self) -> bool:
        return self.dist.rank % self._sp == 0

    # ------------------------------------------------------------------------------ set-up

    def setup(self, total_training_steps: int) -> None:
        ensure_process_group(self.device, self.dist)
        self.device.set_device(self.dist.local_rank)
        self.device.manual_seed(self.recipe.trainer.seed)
        # with several ranks only rank 0 reads the weights; the others build the structure on
        # the meta device and receive their shards from it after sharding
        several = self.dist.world_size > 1
        # a LoRA actor's base weights are frozen: held in the dtype forward computes in, not
        # float32; peft makes the adapters float32 (the dtype the optimizer updates)
        dtype = self.compute_dtype if self.lora else self.param_dtype
        source = None
        if not several or self.dist.rank == 0:
            source = load_model(self.recipe, self.role, dtype)
        model = empty_model(self.recipe, self.role, dtype) if several else source
        assert model is not None
        self._hf_class = type(model)
        self._hf_config = model.config
        if self.role == "ref":
            model.requires_grad_(False)
        elif self.recipe.model.enable_gradient_checkpointing:
            enable_checkpointing(model)
        self._dummy_family = self._dummy_image_family(model)
        forward_args = inspect.signature(model.forward).parameters
        self._packed = self._can_pack(model.config)
        self._keep_logits_arg = self.role != "critic" and "logits_to_keep" in forward_args
        if self.lora:
            # before sharding, so that each layer's shards hold its adapters too
            if several and source is not None:
                source = lora.wrap(source, self.recipe, load_adapter=True)
            model = lora.wrap(model, self.recipe, load_adapter=not several)
        if self.role == "actor" and self.config.freeze_vision_tower:
            # after LoRA, so that the vision tower's adapters are frozen too
            self._freeze_vision_tower(model)
        if self._sp > 1:
            ulysses.check_model(model.config.get_text_config(decoder=True), self._sp)
            ulysses.register()
            self._sp_group, self._dp_group = ulysses.groups(
                self.device.torch_device_type, self.dist.world_size, self._sp
            )
            self._language_model = self._split_language_model(model)
        # FSDP shards over every rank, the sequence-parallel ones included (as verl does): the
        # weights, gradients and optimizer state take 1/world of each rank's memory, not
        # 1/dp, for the same gathers per layer; the ranks of a group compute gradients of
        # different tokens, which the reduce-scatter sums as it does those of data-parallel
        # ranks (ulysses.gather_sequence scales them so the result is the dp average)
        mesh = device_mesh(self.device, self.dist.world_size, self.config.fsdp_size)
        self.model = shard_model(
            model,
            mesh,
            config=self.config,
            device=self.device,
            param_dtype=self.param_dtype,
            compute_dtype=self.compute_dtype,
        )
        if several:
            offload = self.config.param_offload and self.device.torch_device_type != "cpu"
            fill_from_rank0(self.model, source, self.torch_device, offload=offload)
        del source
        self.model.eval()
        if self.role != "ref":
            # with LoRA the adapters alone: the frozen weights need no optimizer state
            trainable = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer, self.lr_scheduler = build_optimizer(
                trainable, self._optim_config, total_training_steps
            )

    def _dummy_image_family(self, model: torch.nn.Module) -> Any:
        """The model family of a vision-language model on several ranks, whose dummy image
        and video fill a micro-batch without one (see :meth:`_needs_dummy_image`); ``None``
        otherwise."""
        if self.dist.world_size == 1 or getattr(model.config, "vision_config", None) is None:
            return None
        if self.context.plugins is None:
            raise RuntimeError(
                "a vision-language model on several ranks needs its model family's plugin: "
                "build the backend's context with plugins=..."
            )
        family = multimodal_family(str(self.recipe.model.path), model.config, self.context.plugins)
        assert family is not None
        return family

    def _dummy_inputs(self, missing: tuple[str, ...]) -> Any:
        """``(ids [1, n], inputs, positions [k, 1, n])`` of the family's dummy image and/or
        video (``missing`` names which), on this rank's device, built once each."""
        if missing not in self._dummies:
            family = self._dummy_family
            token_ids: list[int] = []
            dummy_inputs: dict[str, Any] = {}
            for kind in missing:
                ids_of_kind, inputs_of_kind = (
                    family.dummy_image() if kind == "image" else family.dummy_video()
                )
                token_ids += ids_of_kind
                dummy_inputs.update(inputs_of_kind)
            ids = torch.tensor([token_ids], dtype=torch.long)
            positions = family.position_ids(ids, torch.ones_like(ids), [dummy_inputs])
            device = self.torch_device
            self._dummies[missing] = (
                ids.to(device),
                {key: value.to(device) for key, value in dummy_inputs.items()},
                positions.transpose(0, 1).to(device),
            )
        return self._dummies[missing]

    def _split_language_model(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The language model of a vision-language model (None for a text model), whose
        inputs sequence parallelism slices after the vision tower has run on whole images."""
        if getattr(model.config, "vision_config", None) is None:
            return None
        assert self.context.plugins is not None  # _dummy_image_family checked it
        family = multimodal_family(str(self.recipe.model.path), model.config, self.context.plugins)
        assert family is not None
        # a LoRA actor's modules are inside peft's wrapper
        unwrapped = model.get_base_model() if hasattr(model, "get_base_model") else model
        return family.language_model(unwrapped)

    def _freeze_vision_tower(self, model: torch.nn.Module) -> None:
        """``actor.freeze_vision_tower``: the vision tower's weights take no gradient (before
        sharding and the optimizer, so neither holds anything for them)."""
        family = None
        if self.context.plugins is not None:
            family = multimodal_family(
                str(self.recipe.model.path), model.config, self.context.plugins
            )
        if family is None:
            raise RecipeError(
                f"{type(model).__name__} is not a vision-language model (or no plugin supports "
                "its type), so it has no vision tower to freeze; set it to false",
                key="actor.freeze_vision_tower",
            )
        # a LoRA actor's vision tower is inside peft's wrapper
        unwrapped = model.get_base_model() if hasattr(model, "get_base_model") else model
        family.vision_tower(unwrapped).requires_grad_(False)

    def _can_pack(self, hf_config: Any) -> bool:
        if not self.config.use_remove_padding:
            return False
        reason = packing.unpackable_reason(hf_config.get_text_config(decoder=True))
        if reason is not None:
            logger.warning("the %s model runs padded, not packed: %s", self.role, reason)
            return False
        packing.register()
        return True

    def _attention(self) -> AbstractContextManager[None]:
        """While training or scoring: the model's attention is the packed one, or the
        sequence-parallel one (which runs the packed one on whole sequences). Backward runs
        inside too, as it recomputes checkpointed layers; outside, the live model keeps its own
        attention for a colocated engine's generation."""
        assert self.model is not None
        if self._sp_group is not None:
            return _sequence_parallel(self.model, self._sp_group)
        if not self._packed:
            return nullcontext()
        return _attention_implementation(self.model, packing.ATTENTION)

    @property
    def _optim_config(self) -> OptimConfig:
        return self.recipe.critic.optim if self.role == "critic" else self.config.optim

    def _require(self, *roles: str, method: str) -> torch.nn.Module:
        if self.model is None:
            raise RuntimeError(f"call setup() before {method}()")
        if self.role not in roles:
            raise RuntimeError(f"{method}() is for the {' or '.join(roles)} role, not {self.role}")
        return self.model

    # ------------------------------------------------------------------------ batch plans

    def _agreed_count(self, local_count: int) -> tuple[int, int]:
        """(largest, smallest) micro-batch count over the role's ranks: every rank must run as
        many forwards as the others, since each forward gathers weights from all of them."""
        if self.dist.world_size == 1:
            return local_count, local_count
        counts = torch.tensor([local_count, -local_count], device=self.torch_device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        return int(counts[0]), -int(counts[1])

    def _plan(self, batch: Batch, micro_batch_size: int | None) -> list[list[int]]:
        if self.config.use_dynamic_bsz:
            lengths = valid_lengths(batch["attention_mask"])
            # the budget is per rank; a sequence-parallel group shares each micro-batch
            budget = self.config.ppo_max_token_len_per_gpu * self._sp
            cut = packed_micro_batches if self._packs(batch) else token_budget_micro_batches
            plan = cut(lengths, budget, ranks=self._sp)
            while True:
                # a rank may need more micro-batches at the agreed count than it asked for
                count, _ = self._agreed_count(len(plan))
                plan = cut(lengths, budget, count, ranks=self._sp)
                largest, smallest = self._agreed_count(len(plan))
                if largest == smallest:
                    return plan
        plan = fixed_micro_batches(len(batch), micro_batch_size)
        largest, smallest = self._agreed_count(len(plan))
        if largest != smallest:
            raise RuntimeError(
                f"ranks got different row counts ({len(batch)} here); split batches with "
                "plugrl.cluster.base.split_for_dp so every rank gets as many rows"
            )
        return plan

    def _mini_batch_rows(self, batch: Batch) -> int:
        return update_mini_batch_rows(batch, self.config, self.recipe, self.dp_size)

    def _loss_scale(self, mini_batch: Batch) -> LossScale:
        # over data-parallel ranks only: the ranks of a sequence-parallel group hold the same rows
        return all_reduced_loss_scale(
            mini_batch["response_mask"],
            self.config,
            self.recipe,
            self.dp_size,
            self.torch_device,
            group=self._dp_group,
        )

    def _on_device(self, batch: Batch, rows: list[int], columns: tuple[str, ...]) -> Batch:
        """The ``rows`` of the named columns (and the rows' image inputs), on this rank's
        device."""
        names = [*columns, *([MULTIMODAL_COLUMN] if MULTIMODAL_COLUMN in batch else [])]
        return Batch({name: batch[name] for name in names}).select(rows).to(self.torch_device)

    def _image_inputs(self, micro_batch: Batch) -> dict[str, torch.Tensor]:
        """The model's image inputs for the micro-batch's rows, joined in row order (the
        order their image tokens come in, padded or packed); none for a text batch."""
        if MULTIMODAL_COLUMN not in micro_batch:
            return {}
        return model_inputs(list(micro_batch[MULTIMODAL_COLUMN]), self.torch_device)

    # ------------------------------------------------------------------------ dummy image

    def _needs_dummy_image(self, inputs: dict[str, Any]) -> bool:
        """Whether this forward must run the vision tower on a dummy image or video (then
        :attr:`_dummy_image` holds them): a vision-language model sharded over several ranks
        gathers each vision block's weights from every rank when the block runs, so a rank
        whose micro-batch has no image would leave the others waiting (verl's dummy pass).
        The model runs its vision tower once for the images and once more for the videos, so
        a rank whose micro-batch has no video runs a dummy video when another rank's has one;
        the ranks agree on that with one small all-reduce, so that runs without videos never
        pay for a second pass."""
        family = self._dummy_family
        if family is None:
            return False
        missing: tuple[str, ...] = ()
        if not any(key in inputs for key in family.input_keys):
            missing += ("image",)
        if family.video_input_keys:
            mine = any(key in inputs for key in family.video_input_keys)
            anywhere = torch.tensor([int(mine)], device=self.torch_device)
            dist.all_reduce(anywhere, op=dist.ReduceOp.MAX)
            if anywhere.item() and not mine:
                missing += ("video",)
        if not missing:
            return False
        self._dummy_image = self._dummy_inputs(missing)
        return True

    def _dummy_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """``positions`` as ``[k, rows, width]`` (a text micro-batch's ``[rows, width]`` has the
        same position in every section)."""
        assert self._dummy_image is not None
        sections = self._dummy_image[2].shape[0]
        if positions.dim() == 2:
            return positions[None].expand(sections, -1, -1)
        return positions

    def _add_dummy_row(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Padded inputs with the dummy image's row after the others (every row padded on
        the right to the wider of the two); returns them and the columns added."""
        assert self._dummy_image is not None
        ids, image_inputs, dummy_positions = self._dummy_image
        width = inputs["input_ids"].shape[1]
        length = ids.shape[-1]
        added = max(0, length - width)
        total = width + added

        def widen(values: torch.Tensor, fill: int) -> torch.Tensor:
            return F.pad(values, (0, added), value=fill)

        dummy_mask = F.pad(torch.ones_like(ids), (0, total - length))
        positions = widen(self._dummy_positions(inputs["position_ids"]), 0)
        return {
            **inputs,
            "input_ids": torch.cat(
                [widen(inputs["input_ids"], 0), F.pad(ids, (0, total - length))]
            ),
            "attention_mask": torch.cat([widen(inputs["attention_mask"], 0), dummy_mask]),
            "position_ids": torch.cat(
                [positions, F.pad(dummy_positions, (0, total - length))], dim=1
            ),
            **image_inputs,
        }, added

    def _append_dummy_image(
        self, ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Laid-out ``ids`` ``[b, W]`` and positions ``[k, b, W]`` with the dummy image's
        tokens after the last column of the first row (the other rows padded there), and its
        image inputs. Causal attention keeps every earlier output free of it, and outputs past
        column ``W`` are never kept."""
        assert self._dummy_image is not None
        dummy_ids, image_inputs, dummy_positions = self._dummy_image
        rows = ids.shape[0]
        added_ids = F.pad(dummy_ids, (0, 0, 0, rows - 1))
        added_positions = F.pad(dummy_positions, (0, 0, 0, rows - 1))
        if positions.dim() == 2:
            positions = positions[None].expand(added_positions.shape[0], -1, -1)
        return (
            torch.cat([ids, added_ids], dim=-1),
            torch.cat([positions, added_positions], dim=-1),
            dict(image_inputs),
        )

    def _add_dummy_segment(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Packed inputs with the dummy image's tokens as one more packed row: attention keeps
        it to itself and no kept output comes from it."""
        assert self._dummy_image is not None
        ids, image_inputs, dummy_positions = self._dummy_image
        length = ids.shape[-1]
        cu_seq_lens = inputs["cu_seq_lens_q"]
        end = cu_seq_lens[-1:] + length
        cu_seq_lens = torch.cat([cu_seq_lens, end.to(cu_seq_lens.dtype)])
        longest = max(int(inputs["max_length_q"]), length)
        return {
            **inputs,
            "input_ids": torch.cat([inputs["input_ids"], ids], dim=-1),
            "position_ids": torch.cat(
                [self._dummy_positions(inputs["position_ids"]), dummy_positions], dim=-1
            ),
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens,
            "max_length_q": longest,
            "max_length_k": longest,
            **image_inputs,
        }

    # ------------------------------------------------------------------------ forward

    def _packs(self, batch: Batch) -> bool:
        return self._packed

    def _forward(self, micro_batch: Batch) -> tuple[torch.Tensor, int]:
        """Model outputs at the positions that predict each response token: ``[b, R', ...]``
        in the model's compute dtype, with ``R'`` the response columns some row of the
        micro-batch uses."""
        if self._sp_group is not None:
            (outputs,), used = self._split_forward(
                micro_batch, lambda outputs, _: [outputs.float()]
            )
            return outputs, used
        outputs, rows, used = self._head_outputs(micro_batch)
        return outputs[rows], used

    def _head_outputs(self, micro_batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The model's outputs ``[M, ...]`` at the positions it kept, flattened, and the row
        of them ``[b, R']`` that predicts each response token (``R'`` the response columns
        some row of the micro-batch uses): no copy of the rows read, so that the log-probs'
        backward can write its gradient over the model's own output."""
        model = self.model
        assert model is not None
        if self._packs(micro_batch):
            return self._packed_forward(micro_batch)
        layout = left_align(micro_batch["attention_mask"], micro_batch["responses"].shape[-1])
        position_ids = micro_batch["position_ids"]
        position_columns = layout.columns
        if position_ids.dim() == 3:  # one row of positions per rotary section (mrope)
            position_columns = position_columns[:, None, :].expand(-1, position_ids.shape[1], -1)
        positions = position_ids.gather(-1, position_columns)
        if positions.dim() == 3:  # the model takes them as [k, b, W]
            positions = positions.transpose(0, 1)
        inputs: dict[str, Any] = {
            "input_ids": micro_batch["input_ids"].gather(1, layout.columns),
            "attention_mask": layout.attention_mask,
            "position_ids": positions,
            "use_cache": False,
            **self._image_inputs(micro_batch),
        }
        keep = layout.keep
        dummy = self._needs_dummy_image(inputs)
        if dummy:
            # one more row, the dummy image's, after the others; wider rows keep more columns
            inputs, added = self._add_dummy_row(inputs)
            keep += added
        if self._keep_logits_arg:
            inputs["logits_to_keep"] = keep
        outputs = model(**inputs).logits[:, -keep:]
        if dummy:
            outputs = outputs[:-1, : layout.keep]
        width = outputs.shape[1]
        starts = width * torch.arange(outputs.shape[0], device=outputs.device)
        rows = layout.response_index + starts[:, None]
        return outputs.reshape(-1, outputs.shape[-1]), rows, layout.response_len

    def _packed_forward(self, micro_batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        model = self.model
        assert model is not None
        layout = packing.pack(micro_batch["attention_mask"], micro_batch["responses"].shape[-1])
        inputs: dict[str, Any] = {
            "input_ids": layout.gather(micro_batch["input_ids"]),
            "position_ids": layout.gather(micro_batch["position_ids"]),
            "attention_mask": None,
            "use_cache": False,
            **layout.attention_kwargs(),
            **self._image_inputs(micro_batch),
        }
        if self._needs_dummy_image(inputs):
            inputs = self._add_dummy_segment(inputs)
        if self._keep_logits_arg:
            outputs = model(**inputs, logits_to_keep=layout.keep).logits[0]
        else:
            outputs = model(**inputs).logits[0, layout.keep]
        return outputs, layout.response_index, layout.response_len

    def _split_forward(
        self, micro_batch: Batch, per_token: PerToken
    ) -> tuple[list[torch.Tensor], int]:
        """Sequence-parallel forward: ``per_token(outputs, next_ids)`` of this rank's slice of
        each sequence (the model's outputs ``[b, s/sp, ...]`` and the ids they predict
        ``[b, s/sp]``), each result gathered over the group and taken at the positions that
        predict each response token: ``[b, R', ...]``, with ``R'`` the response columns some
        row of the micro-batch uses.

        The rows are laid out as :meth:`_forward` lays them out (left-aligned, or packed), then
        padded on the right to a multiple of ``sp``; the padding is never attended by a real
        token (causal attention, right padding) and its outputs are dropped.
        """
        model = self.model
        assert model is not None
        response_width = micro_batch["responses"].shape[-1]
        packed = None
        if self._packs(micro_batch):
            packed = packing.pack(micro_batch["attention_mask"], response_width)
            ids = packed.gather(micro_batch["input_ids"])
            positions = packed.gather(micro_batch["position_ids"])
            used = packed.response_len
            keep, response_index = packed.keep, packed.response_index

            def select(full: torch.Tensor) -> torch.Tensor:
                return full[0, keep][response_index]

        else:
            layout = left_align(micro_batch["attention_mask"], response_width)
            ids = micro_batch["input_ids"].gather(1, layout.columns)
            position_ids = micro_batch["position_ids"]
            position_columns = layout.columns
            if position_ids.dim() == 3:  # one row of positions per rotary section (mrope)
                position_columns = position_columns[:, None, :].expand(
                    -1, position_ids.shape[1], -1
                )
            positions = position_ids.gather(-1, position_columns)
            used = layout.response_len

            def select(full: torch.Tensor) -> torch.Tensor:
                index = layout.response_index
                if full.dim() == 3:
                    index = index[..., None].expand(-1, -1, full.shape[-1])
                return full[:, -layout.keep :].gather(1, index)

        width = ids.shape[-1]
        cu_seq_lens = packed.cu_seq_lens if packed is not None else None
        max_length = packed.max_length if packed is not None else 0
        image_inputs: dict[str, Any] = {}
        if self._language_model is not None:
            image_inputs = self._image_inputs(micro_batch)
            if positions.dim() == 3 and packed is None:  # the model takes them as [k, b, W]
                positions = positions.transpose(0, 1)
            if self._needs_dummy_image(image_inputs):
                # the dummy stands for a kind the micro-batch lacks: it joins the other kind's
                ids, positions, dummy_inputs = self._append_dummy_image(ids, positions)
                image_inputs = {**image_inputs, **dummy_inputs}
                if cu_seq_lens is not None:
                    # its own packed row, so that attention keeps it to itself
                    end = cu_seq_lens[-1:] + self._dummy_image[0].shape[-1]
                    cu_seq_lens = torch.cat([cu_seq_lens, end.to(cu_seq_lens.dtype)])
                    max_length = max(max_length, int(self._dummy_image[0].shape[-1]))
        filled = ids.shape[-1]
        padding = -filled % self._sp
        # each column's next id; columns past the laid-out width predict nothing kept
        next_ids = F.pad(ids[:, 1:width], (0, filled + padding - width + 1))
        ids = F.pad(ids, (0, padding))
        positions = F.pad(positions, (0, padding))
        extra: dict[str, Any] = {}
        if cu_seq_lens is not None:
            # the padding is one more packed row, so that attention keeps it to itself
            if padding:
                total = torch.tensor([filled + padding], dtype=torch.int32, device=ids.device)
                cu_seq_lens = torch.cat([cu_seq_lens, total])
                max_length = max(max_length, padding)
            extra = {
                "cu_seq_lens_q": cu_seq_lens,
                "cu_seq_lens_k": cu_seq_lens,
                "max_length_q": max_length,
                "max_length_k": max_length,
            }
        part = (filled + padding) // self._sp
        start = dist.get_rank(self._sp_group) * part
        mine = slice(start, start + part)
        if self._language_model is None:
            outputs = model(
                input_ids=ids[:, mine],
                position_ids=positions[..., mine],
                attention_mask=None,
                use_cache=False,
                **extra,
            ).logits
        else:
            # the vision tower needs each image whole: the model embeds the whole sequences
            # and their images on every rank, and its language model takes this rank's slice
            with ulysses.sliced_language_model(self._language_model, mine):
                outputs = model(
                    input_ids=ids,
                    position_ids=positions,
                    attention_mask=None,
                    use_cache=False,
                    **extra,
                    **image_inputs,
                ).logits
        results = per_token(outputs, next_ids[:, mine])
        gathered = [ulysses.gather_sequence(r, self._sp_group)[:, :width] for r in results]
        return [select(full) for full in gathered], used

    def _log_probs(
        self,
        micro_batch: Batch,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs [b, R] (and entropies); ``entropy_grad=False`` computes the
        entropy outside the autograd graph, for a metric only."""
        log_prob, entropy, _ = self._token_columns(
            micro_batch,
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            with_sum_pi_squared=False,
        )
        return log_prob, entropy

    def _token_columns(
        self,
        micro_batch: Batch,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool,
        with_sum_pi_squared: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """:meth:`_log_probs`, plus each position's ``sum_pi_squared`` [b, R] when asked,
        from the same logits (no second forward)."""
        if self._sp_group is not None:
            return self._split_log_probs(
                micro_batch,
                temperature=temperature,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
                with_sum_pi_squared=with_sum_pi_squared,
            )
        logits, rows, _ = self._head_outputs(micro_batch)
        log_prob, entropy = response_log_probs(
            logits,
            micro_batch,
            temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            overwrite_logits=_overwritable(logits),
            rows=rows,
        )
        squares = None
        if with_sum_pi_squared:
            squares = response_sum_pi_squared(logits, micro_batch, temperature, rows)
        return log_prob, entropy, squares

    def _split_log_probs(
        self,
        micro_batch: Batch,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool,
        with_sum_pi_squared: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """:meth:`_token_columns` under sequence parallelism: the log-probs, whose
        vocabulary-sized work is the biggest of a step, run on each rank's slice of the
        logits; only per-token results are gathered. The slice is the lm_head's product,
        which no backward reads, so the log-probs write their gradient over it unless the
        model's last operation keeps its result (a soft-capping tanh, say)."""

        def per_token(logits: torch.Tensor, next_ids: torch.Tensor) -> list[torch.Tensor]:
            # every position of the slice is scored: its next id is its target
            positions = Batch({"responses": next_ids, "attention_mask": torch.ones_like(next_ids)})
            log_prob, entropy = response_log_probs(
                logits,
                positions,
                temperature,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
                overwrite_logits=_overwritable(logits),
            )
            results = [log_prob] if entropy is None else [log_prob, entropy]
            if with_sum_pi_squared:
                results.append(response_sum_pi_squared(logits, positions, temperature))
            return results

        results, used = self._split_forward(micro_batch, per_token)
        responses = micro_batch["responses"]
        attended = micro_batch["attention_mask"][:, -responses.shape[-1] :][:, :used]
        pad = responses.shape[-1] - used
        results = [F.pad(r * attended.to(r.dtype), (0, pad)) for r in results]
        entropy = results[1] if with_entropy else None
        squares = results[-1] if with_sum_pi_squared else None
        return results[0], entropy, squares

    def _values(self, micro_batch: Batch) -> torch.Tensor:
        outputs, used = self._forward(micro_batch)
        values = outputs[..., 0].float()
        pad = micro_batch["responses"].shape[-1] - used
        return F.pad(values, (0, pad)) * micro_batch["response_mask"].to(values.dtype)

    # ------------------------------------------------------------------------ inference

    @torch.no_grad()
    def compute_log_prob(
        self,
        batch: Batch,
        *,
        calculate_entropy: bool = False,
        calculate_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        model = self._require("actor", "ref", method="compute_log_prob")
        batch.require(*SEQUENCE_COLUMNS, by="fsdp2 compute_log_prob")
        temperature = sampling_temperature(batch, self.recipe.rollout)
        size = self.config.log_prob_micro_batch_size_per_gpu
        plan = self._plan(batch, size or self.config.ppo_micro_batch_size_per_gpu)
        out = LogProbRows(
            batch, with_entropy=calculate_entropy, with_sum_pi_squared=calculate_sum_pi_squared
        )
        model.eval()
        with self._attention():
            for rows in plan:
                part = self._on_device(batch, rows, SEQUENCE_COLUMNS)
                log_prob, entropy, squares = self._token_columns(
                    part,
                    temperature=temperature,
                    with_entropy=calculate_entropy,
                    entropy_grad=True,
                    with_sum_pi_squared=calculate_sum_pi_squared,
                )
                out.put(rows, log_prob, entropy, squares)
        return out.result()

    @torch.no_grad()
    def compute_ref_log_prob(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The reference log-probs of a LoRA actor: its own model with the adapters off,
        which is the model it started from."""
        model = self._require("actor", method="compute_ref_log_prob")
        if not self.lora:
            raise RuntimeError(
                "compute_ref_log_prob() needs an actor that trains LoRA adapters "
                "(model.lora_rank > 0); otherwise the ref role computes them"
            )
        with lora.adapters_off(model):
            return {"log_probs": self.compute_log_prob(batch)["log_probs"]}

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        model = self._require("critic", method="compute_values")
        batch.require(*SEQUENCE_COLUMNS, "response_mask", by="fsdp2 compute_values")
        plan = self._plan(batch, self._critic_micro_batch_size)
        values = torch.zeros(batch["responses"].shape, dtype=torch.float32)
        model.eval()
        with self._attention():
            for rows in plan:
                part = self._on_device(batch, rows, (*SEQUENCE_COLUMNS, "response_mask"))
                values[torch.tensor(rows)] = self._values(part).cpu()
        return values

    # ------------------------------------------------------------------------ training

    @property
    def _critic_micro_batch_size(self) -> int | None:
        return self.recipe.critic.ppo_micro_batch_size_per_gpu or (
            self.config.ppo_micro_batch_size_per_gpu
        )

    def update_policy(self, batch: Batch, objective: ActorObjective) -> dict[str, float]:
        self._require("actor", method="update_policy")
        update = policy_update(
            batch, objective, self.config, self.recipe, self.dp_size, by="the fsdp2 actor update"
        )

        def micro_loss(micro_batch: Batch, scale: LossScale) -> tuple[torch.Tensor, dict]:
            log_prob, entropy = self._log_probs(
                micro_batch,
                temperature=update.temperature,
                with_entropy=update.with_entropy,
                entropy_grad=update.entropy_in_loss,
            )
            update.derive_old_log_probs(micro_batch, log_prob)
            return objective(micro_batch, log_prob, entropy, scale)

        return self._train(
            batch,
            micro_loss,
            prefix="actor",
            loss_name="actor/loss",
            epochs=self.config.ppo_epochs,
            micro_batch_size=self.config.ppo_micro_batch_size_per_gpu,
            grad_clip=self.config.grad_clip,
            rows_without_gradient=getattr(objective, "rows_without_gradient", None),
        )

    def update_critic(self, batch: Batch) -> dict[str, float]:
        self._require("critic", method="update_critic")
        batch.require(*SEQUENCE_COLUMNS, "response_mask", "values", "returns", by="fsdp2 critic")
        clip = self.recipe.critic.cliprange_value

        def micro_loss(micro_batch: Batch, scale: LossScale) -> tuple[torch.Tensor, dict]:
            predicted = self._values(micro_batch)
            mask = micro_batch["response_mask"].to(predicted.dtype)
            old = micro_batch["values"].to(predicted.dtype)
            returns = micro_batch["returns"].to(predicted.dtype)
            clipped = old + (predicted - old).clamp(-clip, clip)
            unclipped_error = (predicted - returns) ** 2
            clipped_error = (clipped - returns) ** 2
            per_token = 0.5 * torch.maximum(unclipped_error, clipped_error)
            # token means over the whole mini-batch on every rank, as LossScale describes
            share = scale.dp_size / max(scale.num_tokens, 1)
            loss = (per_token * mask).sum() * share
            clipped_more = (clipped_error > unclipped_error).to(mask.dtype)
            metrics = {
                "critic/vf_clipfrac": float((clipped_more * mask).sum()) * share,
                "critic/vpred_mean": float((predicted.detach() * mask).sum()) * share,
            }
            return loss, metrics

        epochs = self.recipe.critic.ppo_epochs or self.config.ppo_epochs
        return self._train(
            batch,
            micro_loss,
            prefix="critic",
            loss_name="critic/vf_loss",
            epochs=epochs,
            micro_batch_size=self._critic_micro_batch_size,
            grad_clip=self.recipe.critic.grad_clip,
        )

    def _train(
        self,
        batch: Batch,
        micro_loss: MicroLoss,
        *,
        prefix: str,
        loss_name: str,
        epochs: int,
        micro_batch_size: int | None,
        grad_clip: float,
        rows_without_gradient: RowsWithoutGradient | None = None,
    ) -> dict[str, float]:
        model, optimizer, scheduler = self.model, self.optimizer, self.lr_scheduler
        assert model is not None and optimizer is not None and scheduler is not None
        mini_rows = self._mini_batch_rows(batch)
        lr = scheduler.get_last_lr()[0]
        step_metrics: list[dict[str, float]] = []
        model.train()
        try:
            with self._attention():
                for mini_batch in mini_batches(
                    batch,
                    mini_rows,
                    epochs=epochs,
                    shuffle=self.config.shuffle,
                    seed=self.recipe.trainer.seed,
                    update_step=self.update_steps,
                ):
                    scale = self._loss_scale(mini_batch)
                    run, skipped = rows_with_gradient(
                        mini_batch,
                        self.config,
                        rows_without_gradient,
                        # every forward gathers weights from every rank: run as many rows
                        lambda count: self._agreed_count(count)[0],
                    )
                    if skipped is not None:
                        scale = attrs.evolve(scale, metric_scale=self._loss_scale(run))
                    plan = self._plan(run, micro_batch_size)
                    optimizer.zero_grad(set_to_none=True)
                    # micro-batch metrics are shares of the mini-batch value, like the loss
                    mini_metrics: dict[str, float] = defaultdict(float)
                    if skipped is not None:
                        mini_metrics[f"{prefix}/skipped_rows"] = skipped
                    step_loss = 0.0
                    for rows in plan:
                        micro_batch = run.select(rows).to(self.torch_device)
                        loss, metrics = micro_loss(micro_batch, scale)
                        loss.backward()
                        step_loss += float(loss.detach())
                        for name, value in metrics.items():
                            mini_metrics[name] += float(value)
                    grad_norm = self._clip_and_step(grad_clip)
                    step_metrics.append(
                        {**mini_metrics, loss_name: step_loss, f"{prefix}/grad_norm": grad_norm}
                    )
        finally:
            model.eval()
        scheduler.step()
        self.update_steps += 1
        return {**mean_metrics(step_metrics), f"{prefix}/lr": lr}

    def _clip_and_step(self, grad_clip: float) -> float:
        """Clip the gradient norm (or only measure it when ``grad_clip`` is 0) and step; a
        non-finite norm skips the step, as one bad batch must not ruin the weights."""
        model, optimizer = self.model, self.optimizer
        assert model is not None and optimizer is not None
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        if isinstance(norm, DTensor):
            # each rank holds a partial sum; offloaded gradients sit on the CPU, but the
            # reduction has to run where the collective backend works
            norm = norm.to(self.torch_device).full_tensor()
        grad_norm = float(norm)
        if math.isfinite(grad_norm):
            coefficient = grad_clip / (grad_norm + 1e-6)
            if grad_clip > 0 and coefficient < 1.0:
                for grad in grads:
                    grad.mul_(coefficient)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # ------------------------------------------------------------------------ weights

    def _unique_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The state dict without the second name of a tied weight (``lm_head.weight`` when
        it is the embedding): sent once, it ties again where it lands."""
        model = self._reshard()
        names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        tied = names - {name for name, _ in model.named_parameters()}
        for name, tensor in model.state_dict().items():
            if name not in tied:
                yield name, tensor

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each full weight in the model's dtype, gathered one at a time (collective; only
        rank 0 yields, every rank must run the iterator to its end). A tied weight comes once,
        under its first name. With LoRA each adapted weight comes merged with its adapter,
        under the Hugging Face name it had before peft wrapped the model; with
        ``rollout.lora_sync`` adapters, the adapters' factors alone
        (:meth:`_adapter_weights`)."""
        self._require("actor", "ref", "critic", method="named_weights")
        if self.sync_adapters:
            return self._adapter_weights()
        return self._merged_weights()

    def _merged_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight, adapters merged in: what :meth:`named_weights` yields without
        adapter sync, and what an export writes."""
        adapters = lora.adapters(self._reshard()) if self.lora else {}
        for name, tensor in self._unique_state():
            hf_name = lora.hf_name(name) if self.lora else name
            if hf_name is None:
                continue  # an adapter factor: merged into its weight
            full = self._full(tensor)
            adapter = adapters.get(name)
            if adapter is not None:
                lora_a, lora_b = self._full(adapter.lora_a), self._full(adapter.lora_b)
                full = lora.merge(full, lora_a, lora_b, adapter.scaling, adapter.transposed)
            if self.dist.rank == 0:
                yield hf_name, full.detach().to("cpu", self.compute_dtype)

    def _adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each adapter's two factors in the compute dtype, named as a PEFT adapter file names
        them (:func:`lora.factor_names`), the adapter's scaling folded into ``lora_B`` so that
        an engine adds ``lora_B @ lora_A`` whatever rank and alpha made it. Collective, like
        :meth:`named_weights`; rank 0 yields."""
        for name, adapter in lora.adapters(self._reshard()).items():
            name_a, name_b = lora.factor_names(name)
            lora_a, lora_b = self._full(adapter.lora_a), self._full(adapter.lora_b)
            if self.dist.rank == 0:
                scaled_b = lora_b.detach().float() * adapter.scaling
                yield name_a, lora_a.detach().to("cpu", self.compute_dtype)
                yield name_b, scaled_b.to("cpu", self.compute_dtype)

    def _full(self, tensor: torch.Tensor) -> torch.Tensor:
        """The whole tensor of a shard (collective for a DTensor)."""
        if isinstance(tensor, DTensor):
            # offloaded shards live on the CPU, but collectives run on the device
            return tensor.to(self.torch_device).full_tensor()
        return tensor

    def weight_metadata(self) -> list[WeightMeta]:
        """What :meth:`named_weights` yields, from the shards' global shapes (no gathering)."""
        self._require("actor", "ref", "critic", method="weight_metadata")
        dtype = str(self.compute_dtype).removeprefix("torch.")
        if self.sync_adapters:
            described = []
            for name, adapter in lora.adapters(self._reshard()).items():
                name_a, name_b = lora.factor_names(name)
                described.append(WeightMeta(name_a, tuple(adapter.lora_a.shape), dtype))
                described.append(WeightMeta(name_b, tuple(adapter.lora_b.shape), dtype))
            return described
        described = []
        for name, tensor in self._unique_state():
            hf_name = lora.hf_name(name) if self.lora else name
            if hf_name is not None:
                described.append(WeightMeta(hf_name, tuple(tensor.shape), dtype))
        return described

    def rollout_model(self) -> Any:
        """The live module when it is whole on this rank (one rank, actor role), else None.

        Its layers then keep their gathered weights after a forward instead of gathering them
        again for every decoding step (several times faster generation); backward still
        releases them, so each optimizer step is seen by the next forward.

        None with LoRA: an engine needs the merged weights, which :meth:`named_weights` makes.
        """
        if self.role != "actor" or self.dist.world_size != 1 or self.model is None or self.lora:
            return None
        self.model.set_reshard_after_forward(False, recurse=True)
        return self.model

    def _reshard(self) -> torch.nn.Module:
        """Release gathered weights a forward kept, so the state dict holds the shards."""
        model = self.model
        assert model is not None
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        return model

    def export_hf(self, path: Path) -> None:
        """Write the model as a Hugging Face folder at ``path`` (rank 0; collective). With
        LoRA the weights are merged with the adapters, and ``path/lora_adapter`` holds the
        adapters alone as a PEFT folder for the model they started from."""
        model = self._require("actor", "ref", "critic", method="export_hf")
        weights = list(self._merged_weights())
        adapter_weights = [
            (name, self._full(tensor).detach().cpu())
            for name, tensor in self._unique_state()
            if self.lora and lora.hf_name(name) is None
        ]
        if self.dist.rank == 0:
            model_folder, _ = model_path(self.recipe, self.role)
            write_hf_folder(
                Path(path),
                model_class=self._hf_class,
                config=self._hf_config,
                weights=weights,
                dtype=self.compute_dtype,
                source_folders=[self.recipe.model.tokenizer_path, model_folder],
            )
            if self.lora:
                lora.write_adapter_folder(
                    Path(path) / lora.ADAPTER_FOLDER,
                    model=model,
                    weights=adapter_weights,
                    base=model_folder,
                )
        dist.barrier()

    # ------------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: Path) -> None:
        self._require("actor", "ref", "critic", method="save_checkpoint")
        model = self._reshard()
        extra_state = {
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None,
            "rng": capture_rng_state(self.device),
            "update_steps": self.update_steps,
        }
        checkpoint.save(
            Path(path),
            model=model,
            optimizer=self.optimizer,
            extra_state=extra_state,
            trainable_only=self.lora,
            role=self.role,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
        )

    def load_checkpoint(self, path: Path) -> None:
        self._require("actor", "ref", "critic", method="load_checkpoint")
        model = self._reshard()
        extra_state = checkpoint.load(
            Path(path),
            model=model,
            optimizer=self.optimizer,
            rank=self.dist.rank,
            trainable_only=self.lora,
        )
        if self.lr_scheduler is not None and extra_state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(extra_state["lr_scheduler"])
        restore_rng_state(extra_state["rng"], self.device)
        self.update_steps = int(extra_state["update_steps"])

    def close(self) -> None:
        self.model = None
        self.optimizer = None
        self.lr_scheduler = None
        self.device.empty_cache()


@contextmanager
def _sequence_parallel(model: torch.nn.Module, group: Any) -> Iterator[None]:
    """``model``'s forwards inside the block split their attention over ``group``."""
    with _attention_implementation(model, ulysses.ATTENTION), ulysses.sequence_group(group):
        yield


@contextmanager
def _attention_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    """``model``'s decoder runs the attention registered as ``name`` inside the block; its
    layers read the implementation from the config at every call."""
    config = model.config.get_text_config(decoder=True)  # type: ignore[operator, union-attr]
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def _overwritable(logits: torch.Tensor) -> bool:
    """Whether the log-probs' backward may write its gradient over ``logits``, a model's
    output (or a view of it) that the backend holds alone: not when the operation that made
    the output keeps it for its own backward (autograd names a node's saved output
    ``_saved_result``; a soft-capping tanh, say)."""
    made = logits if logits._base is None else logits._base
    return not hasattr(made.grad_fn, "_saved_result")
