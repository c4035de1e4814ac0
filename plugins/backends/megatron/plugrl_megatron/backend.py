"""One rank of the megatron training backend: a megatron-core GPTModel built from a Hugging
Face folder, trained with the algorithm plugins' losses.

megatron-core is imported inside the methods, never by importing this module: the driver
loads the backend class to check it before the ``prepare_backend`` hook has run in its
process (``cluster: local`` builds the backend there too), and an early import of megatron
would make the core refuse to prepare it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch
import torch.distributed as dist

from plugrl.api import RecipeError
from plugrl.api.algorithms import LossScale
from plugrl.api.backend import (
    SEQUENCE_COLUMNS,
    LogProbRows,
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
from plugrl.api.data import Batch
from plugrl.api.rollout import WeightMeta
from plugrl_megatron import checkpoint, convert, optim
from plugrl_megatron.batching import pack, token_budget_micro_batches
from plugrl_megatron.config import MegatronActorConfig
from plugrl_megatron.convert import DTYPES
from plugrl_megatron.layout import grid_position
from plugrl_megatron.offload import Offloader, optimizer_tensors
from plugrl_megatron.sharding import partition_dim, unshard

if TYPE_CHECKING:
    from plugrl.api import PartContext
    from plugrl.api.algorithms import ActorObjective
    from plugrl.api.backend import ActorConfig


def _parallel_state() -> Any:
    from megatron.core import parallel_state

    return parallel_state


_HOST = torch.device("cpu")


def _named_parameters(chunks: list[torch.nn.Module]) -> Iterator[tuple[str, torch.nn.Parameter]]:
    from plugrl_megatron.model import named_parameters

    return named_parameters(chunks)


MicroLoss = Callable[[Batch, torch.Tensor, LossScale], tuple[torch.Tensor, dict[str, float]]]


class MegatronBackend(TrainingBackend):
    """A megatron-core GPTModel for one role (``actor`` or ``ref``) over the role's ranks.

    Losses follow the ActorObjective contract as the fsdp2 backend does: the objective's
    return value is this micro-batch's share of the global mini-batch loss, and megatron's
    data-parallel gradient reduction averages over ranks. Log-probs, losses and metrics are
    computed on the last pipeline stage; :attr:`is_output_rank` says which rank the worker
    group reads them from.

    On the cpu device megatron's optimizers and pipeline schedules cannot run (they allocate
    on CUDA by name): there the model trains with torch's AdamW on megatron's gradient
    buffers, and pipeline parallelism is refused.
    """

    derives_on_policy_old_log_probs: ClassVar[bool] = True
    # the logits reach the loss gathered over the whole vocabulary (model.py), so the sum of
    # squared probabilities is the one formula fsdp2 uses
    computes_sum_pi_squared: ClassVar[bool] = True

    def __init__(self, config: ActorConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self.config: MegatronActorConfig = backend_config(config, MegatronActorConfig)
        c = self.config
        self.grid = grid_position(
            self.dist.rank,
            self.dist.world_size,
            c.tensor_model_parallel_size,
            c.pipeline_model_parallel_size,
            c.context_parallel_size,
        )
        self.torch_device = self.device.torch_device(self.dist.local_rank)
        self.on_cpu = self.torch_device.type == "cpu"
        self.compute_dtype = DTYPES[self.recipe.model.dtype]
        self.chunks: list[torch.nn.Module] = []
        self.model: list[torch.nn.Module] = []
        self.optimizer: Any = None
        self.lr_scheduler: Any = None
        self.update_steps = 0
        self.offloader = Offloader({}, model_params=list, device=self.torch_device, host=_HOST)
        self._check_supported_layout()

    def _check_supported_layout(self) -> None:
        c = self.config
        if c.context_parallel_size > 1:
            raise RecipeError(
                "context parallelism is not implemented by the megatron backend yet (inputs "
                "are not split along the sequence); set it to 1",
                key="actor.context_parallel_size",
            )
        if c.expert_model_parallel_size > 1:
            raise RecipeError(
                "expert parallelism needs a mixture-of-experts model, and the megatron backend "
                "converts dense Qwen2/Qwen3 models only; set it to 1",
                key="actor.expert_model_parallel_size",
            )
        if self.on_cpu and c.pipeline_model_parallel_size > 1:
            raise RecipeError(
                "pipeline parallelism needs a CUDA device (megatron's pipeline schedules "
                "allocate on CUDA); set it to 1 on cpu",
                key="actor.pipeline_model_parallel_size",
            )
        if c.use_dist_checkpointing and not c.dist_checkpointing_path:
            # checked here, not when the recipe is read: like model.path, the folder is
            # often an environment variable of the launch script, filled in afterwards
            raise RecipeError(
                "use_dist_checkpointing is true but no folder is named; give the megatron-core "
                "dist_checkpointing folder to load, or set actor.use_dist_checkpointing false "
                "to load model.path",
                key="actor.dist_checkpointing_path",
            )
        if self.role == "critic":
            raise RecipeError(
                "the megatron backend has no critic (value model) yet; use an estimator "
                "without values (grpo) or actor.backend: fsdp2",
                key="actor.backend",
            )

    @property
    def dp_rank(self) -> int:
        return self.grid.dp_rank

    @property
    def dp_size(self) -> int:
        return self.grid.dp_size

    @property
    def is_output_rank(self) -> bool:
        return self.grid.is_output_rank

    # ------------------------------------------------------------------------------ set-up

    def setup(self, total_training_steps: int) -> None:
        ensure_process_group(self.device, self.dist)
        self.device.set_device(self.dist.local_rank)
        self.device.manual_seed(self.recipe.trainer.seed)
        from plugrl_megatron.model import (
            build_chunks,
            hf_config,
            initialize_parallel,
            load_dist_checkpoint,
            load_hf_weights,
            transformer_config,
        )

        initialize_parallel(self.config)
        self._check_grid()
        if not self.on_cpu:
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(self.recipe.trainer.seed)
        self.hf_config = hf_config(self.recipe)
        # on CPU the weights stay float32 and a bfloat16 model computes under autocast; on
        # accelerators megatron's own mixed precision keeps float32 copies in the optimizer
        params_dtype = torch.float32 if self.on_cpu else self.compute_dtype
        self.transformer_config = transformer_config(
            self.hf_config, self.config, self.recipe, params_dtype=params_dtype, on_cpu=self.on_cpu
        )
        chunks = build_chunks(self.transformer_config, self.hf_config)
        for chunk in chunks:
            chunk.to(self.torch_device)
        if self.config.use_dist_checkpointing:
            assert self.config.dist_checkpointing_path  # checked at construction
            load_dist_checkpoint(chunks, self.config.dist_checkpointing_path)
        else:
            load_hf_weights(chunks, self.hf_config, self.recipe.model.path)
        self.chunks = list(chunks)
        if self.role == "ref":
            for chunk in chunks:
                chunk.requires_grad_(False)
            self.model = self._mixed_precision(chunks)
        else:
            self.model = self._data_parallel(self._mixed_precision(chunks))
            self.optimizer, self.lr_scheduler = optim.build(
                self.model,
                self.config,
                self.transformer_config,
                total_training_steps,
                on_cpu=self.on_cpu,
            )
        for module in self.model:
            module.eval()
        self.offloader = self._offloader()
        self.offloader.offload()

    def _offloader(self) -> Offloader:
        """What this role keeps in host memory between phases (see :mod:`offload`)."""
        c = self.config
        sources: dict[str, Callable[[], Any]] = {}
        if c.ref_param_offload if self.role == "ref" else c.param_offload:
            sources["params"] = self._parameters
        if self.role == "actor" and c.grad_offload:
            sources["grads"] = self._gradients
        if self.role == "actor" and c.optimizer_offload:
            sources["optimizer"] = lambda: optimizer_tensors(self.optimizer)
        return Offloader(
            sources,
            model_params=self._parameters,
            device=self.torch_device,
            host=_HOST,
            empty_cache=self.device.empty_cache,
        )

    def _parameters(self) -> Iterator[torch.nn.Parameter]:
        return (param for _, param in _named_parameters(self.chunks))

    def _gradients(self) -> Iterator[torch.Tensor]:
        """megatron's gradient buffers (each parameter's ``main_grad`` is a view into one) and
        any ``.grad`` left on a parameter."""
        for param in self._parameters():
            main_grad = getattr(param, "main_grad", None)
            if main_grad is not None:
                yield main_grad
            if param.grad is not None:
                yield param.grad

    def _check_grid(self) -> None:
        """The rank layout computed at construction must be megatron's."""
        parallel_state = _parallel_state()
        actual = (
            parallel_state.get_data_parallel_rank(),
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_pipeline_model_parallel_rank(),
        )
        expected = (self.grid.dp_rank, self.grid.tp_rank, self.grid.pp_rank)
        if actual != expected:
            raise RuntimeError(
                f"megatron placed rank {self.dist.rank} at (dp, tp, pp) = {actual}, not "
                f"{expected}; the worker group would read its results from the wrong rank"
            )

    def _mixed_precision(self, chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
        if self.on_cpu or self.compute_dtype == torch.float32:
            return list(chunks)
        from megatron.core.transformer.module import Float16Module

        return [Float16Module(self.transformer_config, chunk) for chunk in chunks]

    def _data_parallel(self, chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=optim.uses_distributed_optimizer(self.config, self.on_cpu),
        )
        wrapped = []
        for index, chunk in enumerate(chunks):
            wrapped.append(
                DistributedDataParallel(
                    config=self.transformer_config,
                    ddp_config=ddp_config,
                    module=chunk,
                    # only the first chunk's buckets may be reduced lazily (megatron's rule)
                    disable_bucketing=index > 0,
                )
            )
        return wrapped

    def _require(self, *roles: str, method: str) -> None:
        if not self.model:
            raise RuntimeError(f"call setup() before {method}()")
        if self.role not in roles:
            raise RuntimeError(f"{method}() is for the {' or '.join(roles)} role, not {self.role}")

    # ------------------------------------------------------------------------ batch plans

    def _plan(self, batch: Batch, micro_batch_size: int | None) -> list[list[int]]:
        if self.config.use_dynamic_bsz:
            lengths = batch["attention_mask"].sum(dim=-1).tolist()
            return token_budget_micro_batches(lengths, self.config.ppo_max_token_len_per_gpu)
        return fixed_micro_batches(len(batch), micro_batch_size)

    def _mini_batch_rows(self, batch: Batch) -> int:
        return update_mini_batch_rows(batch, self.config, self.recipe, self.dp_size)

    def _loss_scale(self, mini_batch: Batch) -> LossScale:
        group = _parallel_state().get_data_parallel_group() if self.dp_size > 1 else None
        mask = mini_batch["response_mask"]
        return all_reduced_loss_scale(
            mask, self.config, self.recipe, self.dp_size, self.torch_device, group
        )

    # ------------------------------------------------------------------------ forward

    def _sequence_multiple(self) -> int:
        if self.transformer_config.sequence_parallel:
            return self.config.tensor_model_parallel_size
        return 1

    def _inputs(self, micro_batch: Batch) -> tuple[dict[str, torch.Tensor], Any]:
        """GPTModel's arguments for a micro-batch, and its packed layout."""
        layout = pack(
            micro_batch["attention_mask"],
            micro_batch["responses"].shape[-1],
            self._sequence_multiple(),
        )
        width = layout.width
        device = self.torch_device
        tokens = micro_batch["input_ids"].gather(1, layout.columns).to(device)
        positions = torch.arange(width, device=device).expand(len(tokens), -1)
        # megatron's default causal mask is made on CUDA; an explicit one works anywhere
        causal = torch.triu(torch.ones(width, width, dtype=torch.bool, device=device), 1)
        inputs = {
            "input_ids": tokens,
            "position_ids": positions,
            "attention_mask": causal[None, None],
        }
        return inputs, layout

    def _run_model(self, module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> Any:
        if self.on_cpu and self.compute_dtype != torch.float32:
            with torch.autocast("cpu", dtype=self.compute_dtype):
                return module(**inputs)
        return module(**inputs)

    def _log_probs(
        self,
        logits: torch.Tensor,
        layout: Any,
        micro_batch: Batch,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
        with_sum_pi_squared: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Per-token log-probs [b, R], entropies and ``sum_pi_squared`` [b, R] (the last two
        ``None`` unless asked) from the packed logits [b, W, V]."""
        vocab = logits.shape[-1]
        predict = layout.predict.to(logits.device)
        logits = logits.gather(1, predict[..., None].expand(-1, -1, vocab)).float()
        # these rows are this method's own, made by a gather (and a cast) whose backward does
        # not read them, and each micro-batch runs one backward: the log-probs may write
        # their gradient over them
        log_prob, entropy = response_log_probs(
            logits,
            micro_batch,
            temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            overwrite_logits=True,
        )
        squares = None
        if with_sum_pi_squared:
            squares = response_sum_pi_squared(logits, micro_batch, temperature)
        return log_prob, entropy, squares

    def _micro_batches(
        self,
        batch: Batch,
        plan: list[list[int]],
        loss: Callable[[Batch, torch.Tensor, Any], tuple[torch.Tensor, dict[str, float]]],
        *,
        forward_only: bool,
    ) -> None:
        """Forward (and backward) every micro-batch of ``plan``; ``loss(micro_batch, logits,
        layout)`` runs where the logits are (the last pipeline stage)."""
        if self.config.pipeline_model_parallel_size == 1:
            (module,) = self.model
            for rows in plan:
                micro_batch = batch.select(rows)
                inputs, layout = self._inputs(micro_batch)
                value, _ = loss(micro_batch, self._run_model(module, inputs), layout)
                if not forward_only:
                    value.backward()
            return
        self._pipelined(batch, plan, loss, forward_only=forward_only)

    def _pipelined(
        self,
        batch: Batch,
        plan: list[list[int]],
        loss: Callable[[Batch, torch.Tensor, Any], tuple[torch.Tensor, dict[str, float]]],
        *,
        forward_only: bool,
    ) -> None:
        """Micro-batches through megatron's pipeline schedule (CUDA devices only)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        count = len(plan)
        micro_batches = [batch.select(rows) for rows in plan]

        def forward_step(data_iterator: Iterator[Batch], module: torch.nn.Module) -> Any:
            micro_batch = next(data_iterator)
            inputs, layout = self._inputs(micro_batch)
            output = self._run_model(module, inputs)

            def loss_func(logits: torch.Tensor) -> tuple[torch.Tensor, dict]:
                value, metrics = loss(micro_batch, logits, layout)
                # the schedule divides by the micro-batch count; the objective's value is
                # already this micro-batch's share of the mini-batch loss
                return value * count, metrics

            return output, loss_func

        chunks = len(self.model)
        iterators: Any = iter(micro_batches)
        if chunks > 1:
            iterators = [iter(micro_batches) for _ in range(chunks)]
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iterators,
            model=self.model if chunks > 1 else self.model[0],
            num_microbatches=count,
            seq_length=int(batch["attention_mask"].shape[1]),
            micro_batch_size=max(len(rows) for rows in plan),
            forward_only=forward_only,
        )

    # ------------------------------------------------------------------------ inference

    @torch.no_grad()
    def compute_log_prob(
        self,
        batch: Batch,
        *,
        calculate_entropy: bool = False,
        calculate_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        self._require("actor", "ref", method="compute_log_prob")
        batch.require(*SEQUENCE_COLUMNS, by="megatron compute_log_prob")
        temperature = sampling_temperature(batch, self.recipe.rollout)
        size = self.config.log_prob_micro_batch_size_per_gpu
        plan = self._plan(batch, size or self.config.ppo_micro_batch_size_per_gpu)
        out = LogProbRows(
            batch, with_entropy=calculate_entropy, with_sum_pi_squared=calculate_sum_pi_squared
        )
        results: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []

        def keep(micro_batch: Batch, logits: torch.Tensor, layout: Any) -> tuple:
            log_prob, entropy, squares = self._log_probs(
                logits,
                layout,
                micro_batch,
                temperature=temperature,
                with_entropy=calculate_entropy,
                with_sum_pi_squared=calculate_sum_pi_squared,
            )
            results.append(
                (
                    log_prob.cpu(),
                    None if entropy is None else entropy.cpu(),
                    None if squares is None else squares.cpu(),
                )
            )
            return log_prob.sum() * 0.0, {}

        for module in self.model:
            module.eval()
        with self.offloader.resident("params"):
            self._micro_batches(batch, plan, keep, forward_only=True)
        # only the last pipeline stage computes outputs; the others return zeros, which the
        # worker group does not read (is_output_rank)
        for rows, (log_prob, entropy, squares) in zip(plan, results, strict=False):
            out.put(rows, log_prob, entropy, squares)
        return out.result()

    # ------------------------------------------------------------------------ training

    def update_policy(self, batch: Batch, objective: ActorObjective) -> dict[str, float]:
        self._require("actor", method="update_policy")
        update = policy_update(
            batch, objective, self.config, self.recipe, self.dp_size, by="the megatron actor update"
        )

        def micro_loss(
            micro_batch: Batch, logits: torch.Tensor, layout: Any, scale: LossScale
        ) -> tuple[torch.Tensor, dict]:
            log_prob, entropy, _ = self._log_probs(
                logits,
                layout,
                micro_batch,
                temperature=update.temperature,
                with_entropy=update.with_entropy,
                entropy_grad=update.entropy_in_loss,
            )
            micro_batch = micro_batch.to(self.torch_device)
            update.derive_old_log_probs(micro_batch, log_prob)
            return objective(micro_batch, log_prob, entropy, scale)

        with self.offloader.resident("params", "grads", "optimizer"):
            return self._train(batch, micro_loss, getattr(objective, "rows_without_gradient", None))

    def _train(
        self,
        batch: Batch,
        micro_loss: Any,
        rows_without_gradient: RowsWithoutGradient | None = None,
    ) -> dict[str, float]:
        mini_rows = self._mini_batch_rows(batch)
        lr = self.lr_scheduler.current_lr()
        step_metrics = []
        for module in self.model:
            module.train()
        try:
            for mini_batch in mini_batches(
                batch,
                mini_rows,
                epochs=self.config.ppo_epochs,
                shuffle=self.config.shuffle,
                seed=self.recipe.trainer.seed,
                update_step=self.update_steps,
            ):
                step_metrics.append(
                    self._optimizer_step(mini_batch, micro_loss, rows_without_gradient)
                )
        finally:
            for module in self.model:
                module.eval()
        self.lr_scheduler.step()
        self.update_steps += 1
        return {**mean_metrics(step_metrics), "actor/lr": lr}

    def _optimizer_step(
        self,
        mini_batch: Batch,
        micro_loss: Any,
        rows_without_gradient: RowsWithoutGradient | None = None,
    ) -> dict[str, float]:
        """One mini-batch: every micro-batch's forward and backward, then one step. Metrics
        are the objective's, summed over micro-batches (they are shares of the mini-batch).
        Rows whose loss is zero are left out (``actor.skip_zero_advantage_rows``): the
        tensor-parallel ranks and pipeline stages of a model copy hold the same rows and
        leave out the same ones, and data-parallel copies may run different micro-batch
        counts, as they do with token budgets, since gradients are reduced after the last."""
        scale = self._loss_scale(mini_batch)
        run, skipped = rows_with_gradient(mini_batch, self.config, rows_without_gradient)
        if skipped is not None:
            scale = attrs.evolve(scale, metric_scale=self._loss_scale(run))
        plan = self._plan(run, self.config.ppo_micro_batch_size_per_gpu)
        self._zero_grad()
        metrics: dict[str, float] = defaultdict(float)
        if skipped is not None:
            metrics["actor/skipped_rows"] = skipped

        def loss(micro_batch: Batch, logits: torch.Tensor, layout: Any) -> tuple:
            value, micro_metrics = micro_loss(micro_batch, logits, layout, scale)
            metrics["actor/loss"] += float(value.detach())
            for name, metric in micro_metrics.items():
                metrics[name] += float(metric)
            return value, micro_metrics

        self._micro_batches(run, plan, loss, forward_only=False)
        grad_norm = self._reduce_clip_and_step()
        # only the last pipeline stage saw the losses; the worker group reads that rank
        return {**metrics, "actor/grad_norm": grad_norm}

    def _zero_grad(self) -> None:
        for module in self.model:
            module.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _reduce_clip_and_step(self) -> float:
        """Reduce gradients over data-parallel ranks (and tied embeddings over stages), then
        clip and step; a non-finite norm skips the step."""
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        parallel_state = _parallel_state()
        finalize_model_grads(self.model)
        if not optim.is_torch_optimizer(self.optimizer):
            succeeded, grad_norm, _ = self.optimizer.step()
            return float(grad_norm) if succeeded and grad_norm is not None else float("nan")
        params = [param for _, param in self._trainable()]
        squares = torch.zeros((), dtype=torch.float32, device=self.torch_device)
        for param in params:
            if param_is_not_tensor_parallel_duplicate(param):
                squares += param.main_grad.float().square().sum()
        model_parallel = parallel_state.get_model_parallel_group()
        if dist.get_world_size(group=model_parallel) > 1:
            dist.all_reduce(squares, group=model_parallel)
        grad_norm = float(squares.sqrt())
        if math.isfinite(grad_norm):
            clip = self.config.grad_clip
            coefficient = clip / (grad_norm + 1e-6)
            for param in params:
                if clip > 0 and coefficient < 1.0:
                    param.main_grad.mul_(coefficient)
                param.grad = param.main_grad.to(param.dtype)
            self.optimizer.step()
        for param in params:
            param.grad = None
        return grad_norm

    def _trainable(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        for name, param in _named_parameters(self.chunks):
            if param.requires_grad:
                yield name, param

    # ------------------------------------------------------------------------ weights

    def _whole_weights(self) -> Iterator[tuple[str, torch.Tensor | None]]:
        """Every megatron weight, whole, in :func:`convert.megatron_names` order: the tensor on
        global rank 0, ``None`` elsewhere (collective over the role's ranks)."""
        local = dict(_named_parameters(self.chunks))
        parallel_state = _parallel_state()
        tp_group = parallel_state.get_tensor_model_parallel_group()
        tp_size = parallel_state.get_tensor_model_parallel_world_size()
        pp_size = parallel_state.get_pipeline_model_parallel_world_size()
        # the sender of a weight is the first data-parallel, first tensor-parallel rank of the
        # stage that holds it; with one stage that is rank 0 itself
        for name in convert.megatron_names(self.hf_config):
            whole = None
            param = local.get(name)
            if param is not None:
                tensor = param.detach()
                dim = partition_dim(name)
                if tp_size > 1 and dim is not None:
                    pieces = [torch.empty_like(tensor) for _ in range(tp_size)]
                    dist.all_gather(pieces, tensor.contiguous(), group=tp_group)
                    tensor = unshard(name, pieces, dim)
                whole = tensor
            if pp_size > 1:
                whole = self._to_rank0(whole)
            yield name, (whole if self.dist.rank == 0 else None)

    def _to_rank0(self, whole: torch.Tensor | None) -> torch.Tensor | None:
        """A weight held by one pipeline stage, moved to global rank 0 (collective)."""
        sends = whole is not None and self.grid.dp_rank == 0 and self.grid.tp_rank == 0
        source = torch.tensor([self.dist.rank if sends else -1], device=self.torch_device)
        dist.all_reduce(source, op=dist.ReduceOp.MAX)
        sender = int(source)
        if sender == 0 or self.dist.rank not in (0, sender):
            return whole
        shape = torch.zeros(8, dtype=torch.long, device=self.torch_device)
        if self.dist.rank == sender:
            assert whole is not None
            shape[0] = whole.dim()
            shape[1 : 1 + whole.dim()] = torch.tensor(whole.shape)
            dist.send(shape, dst=0)
            dist.send(whole.contiguous(), dst=0)
            return whole
        dist.recv(shape, src=sender)
        dims = [int(size) for size in shape[1 : 1 + int(shape[0])]]
        received = torch.empty(dims, dtype=self._params_dtype(), device=self.torch_device)
        dist.recv(received, src=sender)
        return received

    def _params_dtype(self) -> torch.dtype:
        return self.transformer_config.params_dtype

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each whole weight in Hugging Face names and the model's dtype (collective; rank 0
        yields, every rank must run the iterator to its end). A tied ``lm_head`` is not sent."""
        self._require("actor", "ref", method="named_weights")
        # a tensor that is already on the cpu in the right dtype may be the parameter itself;
        # once the parameters are parked again its memory is gone, so it is copied then
        copy = "params" in self.offloader.sources
        with self.offloader.resident("params"):
            for name, whole in self._whole_weights():
                if whole is None:
                    continue
                for hf_name, tensor in convert.to_hf(self.hf_config, name, whole):
                    yield hf_name, tensor.to("cpu", self.compute_dtype, copy=copy)

    def weight_metadata(self) -> list[WeightMeta]:
        """What :meth:`named_weights` yields, from the Hugging Face config (no gathering)."""
        self._require("actor", "ref", method="weight_metadata")
        dtype = str(self.compute_dtype).removeprefix("torch.")
        return [WeightMeta(name, shape, dtype) for name, shape in convert.hf_shapes(self.hf_config)]

    def export_hf(self, path: Path) -> None:
        self._require("actor", "ref", method="export_hf")
        from plugrl_megatron.export import write_hf_folder

        weights = list(self.named_weights())
        if self.dist.rank == 0:
            write_hf_folder(
                Path(path),
                config=self.hf_config,
                weights=weights,
                dtype=self.compute_dtype,
                source_folders=[self.recipe.model.tokenizer_path, self.recipe.model.path],
            )
        dist.barrier()

    # ------------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: Path) -> None:
        self._require("actor", "ref", method="save_checkpoint")
        with self.offloader.resident("params", "optimizer"):
            self._save_checkpoint(path)

    def _save_checkpoint(self, path: Path) -> None:
        checkpoint.save(
            Path(path),
            chunks=self.chunks,
            optimizer=self.optimizer,
            extra_state={
                "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None,
                "rng": capture_rng_state(self.device),
                "update_steps": self.update_steps,
            },
            layout=self._layout(),
            rank=self.dist.rank,
            model_shard=f"tp{self.grid.tp_rank}_pp{self.grid.pp_rank}",
        )

    def load_checkpoint(self, path: Path) -> None:
        self._require("actor", "ref", method="load_checkpoint")
        # the optimizer's state is replaced by the file's, and parked again after it
        with self.offloader.resident("params", "optimizer"):
            self._load_checkpoint(path)

    def _load_checkpoint(self, path: Path) -> None:
        extra_state = checkpoint.load(
            Path(path),
            chunks=self.chunks,
            optimizer=self.optimizer,
            layout=self._layout(),
            rank=self.dist.rank,
            model_shard=f"tp{self.grid.tp_rank}_pp{self.grid.pp_rank}",
        )
        if self.lr_scheduler is not None and extra_state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(extra_state["lr_scheduler"])
        restore_rng_state(extra_state["rng"], self.device)
        self.update_steps = int(extra_state["update_steps"])

    def _layout(self) -> dict[str, Any]:
        c = self.config
        return {
            "role": self.role,
            "world_size": self.dist.world_size,
            "tensor_model_parallel_size": c.tensor_model_parallel_size,
            "pipeline_model_parallel_size": c.pipeline_model_parallel_size,
            "virtual_pipeline_model_parallel_size": c.virtual_pipeline_model_parallel_size,
        }

    def close(self) -> None:
        # what is parked goes with the model: nothing is brought back to be dropped
        self.offloader = Offloader({}, model_params=list, device=self.torch_device, host=_HOST)
        self.model = []
        self.chunks = []
        self.optimizer = None
        self.lr_scheduler = None
        # megatron's groups stay: they are the process's, and another role may use them
        self.device.empty_cache()
