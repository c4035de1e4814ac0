"""What training backends share, so that a key means the same and a metric is computed the
same whichever backend runs (the built-in ``fsdp2`` and plugrl-megatron's ``megatron`` use it):

* the ``actor.optim`` section as an optimizer and a learning-rate schedule: :func:`adamw`,
  :class:`LRSchedule`, :func:`lr_schedule`;
* an update's batch, mini-batches and micro-batches: :func:`backend_config`,
  :func:`policy_update`, :func:`mini_batch_rows`, :func:`mini_batches`,
  :func:`fixed_micro_batches`, :func:`check_single_step`, :func:`all_reduced_loss_scale`;
* log-probs and entropies of responses from a model's logits: :func:`sampling_temperature`,
  :func:`response_log_probs`, :func:`entropy_for_metrics`, :func:`response_sum_pi_squared`,
  :class:`LogProbRows`;
* a Hugging Face folder written whole or not at all: :func:`staged_folder`,
  :func:`copy_tokenizer_files`.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import torch
import torch.distributed as dist
import torch.nn.functional as F

from plugrl.algorithms.token_log_probs import token_log_probs
from plugrl.errors import RecipeError
from plugrl.parts.algorithm import LossScale
from plugrl.state.seeds import mini_batch_order_seed

if TYPE_CHECKING:
    from plugrl.data.batch import Batch
    from plugrl.parts.algorithm import ActorObjective
    from plugrl.parts.backend import ActorConfig, OptimConfig
    from plugrl.parts.rollout import RolloutConfig
    from plugrl.recipe import Recipe

ConfigT = TypeVar("ConfigT", bound="ActorConfig")

SEQUENCE_COLUMNS = ("input_ids", "attention_mask", "position_ids", "responses")
"""The batch columns every forward of a policy reads (verl's names)."""

# ------------------------------------------------------------------------ optimizer, schedule


FUSED_ADAMW_DEVICE_TYPES = ("cpu", "cuda")
"""Device types whose fused AdamW kernel (one kernel over every tensor of a step) is used."""


def adamw(params: Iterable[torch.nn.Parameter], config: OptimConfig) -> torch.optim.AdamW:
    """torch's AdamW over ``params`` with the peak learning rate, betas and weight decay of
    ``config``; a schedule sets the learning rate of each step from there.

    The step runs torch's fused kernel when every parameter is a floating-point tensor on a
    device of :data:`FUSED_ADAMW_DEVICE_TYPES`, and its foreach kernels otherwise. torch's own
    default on a CPU, or on FSDP2's DTensor parameters anywhere but CUDA, is a Python loop
    over the tensors that dispatches a dozen operations per tensor (2-4x the fused step's
    time on the quickstart model's DTensors). The choice is this process's, not its
    checkpoint's: loading optimizer state keeps it (a checkpoint saved with another
    implementation resumes the same, the moments and step counts being laid out alike)."""
    params = list(params)
    implementation = adamw_implementation(params)
    optimizer = torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=tuple(config.betas),
        weight_decay=config.weight_decay,
        **implementation,
    )
    optimizer.register_load_state_dict_post_hook(_keep_implementation(implementation))
    return optimizer


def adamw_implementation(params: Sequence[torch.Tensor]) -> dict[str, bool]:
    """``{"fused": True}`` or ``{"foreach": True}``: the AdamW kernels :func:`adamw` runs
    over ``params``."""
    fused = bool(params) and all(
        param.device.type in FUSED_ADAMW_DEVICE_TYPES and torch.is_floating_point(param)
        for param in params
    )
    return {"fused": True} if fused else {"foreach": True}


def _keep_implementation(
    implementation: dict[str, bool],
) -> Callable[[torch.optim.Optimizer], None]:
    def keep(optimizer: torch.optim.Optimizer) -> None:
        # a loaded state dict brings the saving process's "fused"/"foreach" with its groups
        for group in optimizer.param_groups:
            group["fused"] = implementation.get("fused", False)
            group["foreach"] = implementation.get("foreach", False)

    return keep


# LambdaLR checkpoints a callable object's __dict__, so no slots
@attrs.frozen(slots=False)
class LRSchedule:
    """The learning-rate multiplier of each update step (0-based), as a picklable callable.

    Warm-up rises linearly from 0 over ``warmup_steps``; then the multiplier stays at 1
    (``constant``) or follows half a cosine from 1 down to ``min_lr_ratio`` at
    ``total_steps`` (``cosine``).
    """

    kind: str
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        if self.kind == "constant":
            return 1.0
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def lr_schedule(config: OptimConfig, total_steps: int) -> LRSchedule:
    """The schedule ``config`` describes for a run of ``total_steps`` updates: warm-up of
    ``lr_warmup_steps``, or when that is negative ``lr_warmup_steps_ratio`` of the run."""
    warmup = config.lr_warmup_steps
    if warmup < 0:
        warmup = int(config.lr_warmup_steps_ratio * total_steps)
    return LRSchedule(config.lr_scheduler_type, warmup, total_steps, config.min_lr_ratio)


# ------------------------------------------------------------------------------ mini-batches


def backend_config(config: ActorConfig, config_class: type[ConfigT]) -> ConfigT:
    """The ``actor`` section as ``config_class`` (a backend's subclass of ``ActorConfig``):
    itself when it is one, else its values with the backend's own keys at their defaults."""
    if isinstance(config, config_class):
        return config
    values = {field.name: getattr(config, field.name) for field in attrs.fields(type(config))}
    return config_class(**values)


def mini_batch_rows(config: ActorConfig, n: int, dp_size: int, num_rows: int) -> int:
    """Rows of one mini-batch on one of ``dp_size`` data-parallel ranks that got ``num_rows``
    rows: ``ppo_mini_batch_size x n / dp_size``, which must divide ``num_rows``."""
    per_step = config.mini_batch_rows(n)
    if per_step % dp_size:
        raise RecipeError(
            f"ppo_mini_batch_size x rollout.n = {per_step} sequences per optimizer step "
            f"cannot be split evenly over {dp_size} data-parallel ranks; make it a multiple "
            f"of {dp_size}",
            key="actor.ppo_mini_batch_size",
        )
    rows = per_step // dp_size
    if num_rows % rows:
        raise RecipeError(
            f"a rank got {num_rows} sequences, not a multiple of its mini-batch share of "
            f"{rows} (ppo_mini_batch_size {config.ppo_mini_batch_size} x rollout.n "
            f"{n} / {dp_size} ranks); make data.train_batch_size a "
            "multiple of actor.ppo_mini_batch_size",
            key="actor.ppo_mini_batch_size",
        )
    return rows


SEVERAL_ROWS_A_SAMPLE = "sample_last"
"""The column of a batch of agent trajectories, where a sample may be several rows (an agent
whose calls do not extend each other): :func:`update_mini_batch_rows` then counts optimizer
steps, not rows."""


def update_mini_batch_rows(batch: Batch, config: ActorConfig, recipe: Recipe, dp_size: int) -> int:
    """Rows of one mini-batch of an update of ``batch`` (this rank's share).

    Usually :func:`mini_batch_rows`. A batch of agent trajectories whose samples are not one
    row each has more (or fewer) rows than ``data.train_batch_size x rollout.n``: it is cut
    into as many mini-batches as a usual batch is, ``train_batch_size / ppo_mini_batch_size``
    optimizer steps an epoch, the last one the smaller when the rows do not divide. Every
    data-parallel rank holds as many rows as the others, so they agree on the cut."""
    num_rows = len(batch)
    n = recipe.rollout.n
    if SEVERAL_ROWS_A_SAMPLE not in batch or num_rows * dp_size == recipe.data.train_batch_size * n:
        return mini_batch_rows(config, n, dp_size, num_rows)
    steps = max(recipe.data.train_batch_size // config.ppo_mini_batch_size, 1)
    return max(-(-num_rows // steps), 1)


def fixed_micro_batches(num_rows: int, size: int | None) -> list[list[int]]:
    """Consecutive micro-batches of ``size`` rows (the last may be smaller); ``None``: one."""
    if num_rows == 0:
        return []
    size = num_rows if size is None else size
    return [list(range(start, min(start + size, num_rows))) for start in range(0, num_rows, size)]


DERIVED_OLD_LOG_PROBS = "old_log_probs_derived"
"""``meta`` key of a micro-batch whose ``old_log_probs`` the update derived from its own
forward: the objective then logs how far the engine's log-probs are from them."""


@attrs.frozen
class PolicyUpdate:
    """How an actor update feeds its objective, from :func:`policy_update`.

    ``temperature``: the sampling temperature log-probs are taken at. ``entropy_in_loss``: the
    objective reads the entropy, with its gradient (``objective.needs_entropy``).
    ``derives_old_log_probs``: the batch has no ``old_log_probs``, so each micro-batch gets the
    detached log-probs of the update's own forward (:meth:`derive_old_log_probs`).
    """

    temperature: float
    entropy_in_loss: bool
    derives_old_log_probs: bool

    @property
    def with_entropy(self) -> bool:
        """Whether the forward computes entropies: for the loss, or for the ``actor/entropy``
        metric that the skipped old_log_prob pass would have reported."""
        return self.entropy_in_loss or self.derives_old_log_probs

    def derive_old_log_probs(self, micro_batch: Batch, log_prob: torch.Tensor) -> None:
        """Set ``micro_batch``'s ``old_log_probs`` to ``log_prob`` (detached) when this update
        derives them: the ratio is then exactly 1 in value and carries the gradient."""
        if self.derives_old_log_probs:
            micro_batch["old_log_probs"] = log_prob.detach()
            micro_batch.meta[DERIVED_OLD_LOG_PROBS] = True


def policy_update(
    batch: Batch,
    objective: ActorObjective,
    config: ActorConfig,
    recipe: Recipe,
    dp_size: int,
    *,
    by: str,
) -> PolicyUpdate:
    """Check that ``batch`` holds the columns an actor update with ``objective`` reads (``by``
    names the update in the error), and say how the update feeds the objective. A batch
    without ``old_log_probs`` takes them from the update's own forward, which is allowed for
    one optimizer step only (:func:`check_single_step`; ``dp_size`` data-parallel ranks, see
    :func:`mini_batch_rows`)."""
    needed = [*SEQUENCE_COLUMNS, "response_mask", "advantages"]
    if getattr(objective, "needs_ref", False):
        needed.append("ref_log_prob")
    derives = "old_log_probs" not in batch
    if derives:
        num_rows = len(batch)
        mini_rows = update_mini_batch_rows(batch, config, recipe, dp_size)
        check_single_step(config.ppo_epochs, num_rows, mini_rows)
    else:
        needed.append("old_log_probs")
    batch.require(*needed, by=by)
    return PolicyUpdate(
        temperature=sampling_temperature(batch, recipe.rollout),
        entropy_in_loss=bool(getattr(objective, "needs_entropy", False)),
        derives_old_log_probs=derives,
    )


def rows_to_run(
    without_gradient: torch.Tensor, lengths: Sequence[int] | torch.Tensor, count: int
) -> list[int]:
    """``count`` row indices for an update to run, in batch order: the rows with a gradient
    (``without_gradient`` false), then the shortest of the others (``lengths``: tokens per
    row) up to ``count``, when ranks must run as many rows as each other or a step must run
    at least one (an optimizer step over zero gradients still moves the weights by its
    momentum, so the step is taken as usual)."""
    keep = [int(i) for i in (~without_gradient).nonzero().flatten()]
    if len(keep) < count:
        others = (without_gradient).nonzero().flatten()
        shortest = others[torch.argsort(torch.as_tensor(lengths)[others], stable=True)]
        keep += [int(i) for i in shortest[: count - len(keep)]]
    return sorted(keep)


RowsWithoutGradient = Callable[["Batch"], "torch.Tensor | None"]


def rows_with_gradient(
    mini_batch: Batch,
    config: ActorConfig,
    rows_without_gradient: RowsWithoutGradient | None,
    agree: Callable[[int], int] = lambda count: count,
) -> tuple[Batch, float | None]:
    """The rows of ``mini_batch`` an actor update runs, and the fraction of its rows left out
    (``None`` when the objective cannot leave any out, or ``actor.skip_zero_advantage_rows``
    is off).

    ``rows_without_gradient`` is the objective's :meth:`ActorObjective.rows_without_gradient`
    (``None`` for an objective without it). ``agree(count) -> count`` makes ranks agree on the
    rows each runs (the largest count over them, when each forward has to run on every rank);
    ranks short of it top up with their shortest rows without a gradient. At least one row
    runs, so the optimizer steps as it would have. A backend that uses this passes the loss
    the mini-batch's ``LossScale`` with ``metric_scale`` counted over the rows returned."""
    if rows_without_gradient is None or not getattr(config, "skip_zero_advantage_rows", False):
        return mini_batch, None
    without = rows_without_gradient(mini_batch)
    if without is None:
        return mini_batch, None
    count = agree(max(int((~without).sum()), min(1, len(mini_batch))))
    if count >= len(mini_batch):
        return mini_batch, 0.0
    lengths = mini_batch["attention_mask"].sum(dim=-1)
    rows = rows_to_run(without, lengths, count)
    return mini_batch.select(rows), 1.0 - len(rows) / len(mini_batch)


def check_single_step(epochs: int, num_rows: int, mini_rows: int) -> None:
    """Refuse to take old log-probs from an update's own forward unless that forward is the
    first and only one before the weights change (one epoch of one mini-batch)."""
    if epochs != 1 or mini_rows != num_rows:
        raise RecipeError(
            f"the batch has no old_log_probs, but this update takes more than one optimizer "
            f"step (ppo_epochs {epochs}, {num_rows} sequences on this rank in mini-batches "
            f"of {mini_rows}), so they cannot come from its own forward; the scheduler "
            "must compute them with compute_log_prob first",
            key="actor.reuse_on_policy_log_prob",
        )


def mini_batches(
    batch: Batch, rows: int, *, epochs: int, shuffle: bool, seed: int, update_step: int
) -> Iterator[Batch]:
    """``epochs`` passes over ``batch`` in mini-batches of ``rows`` rows (``actor.shuffle``:
    a new order each epoch). The order depends on the run's ``seed``, the update's index
    ``update_step`` and the epoch only, so a resumed run draws the orders it would have."""
    for epoch in range(epochs):
        if shuffle:
            generator = torch.Generator().manual_seed(
                mini_batch_order_seed(seed, update_step, epoch)
            )
            order = torch.randperm(len(batch), generator=generator)
        else:
            order = torch.arange(len(batch))
        for start in range(0, len(batch), rows):
            yield batch.select(order[start : start + rows])


def all_reduced_loss_scale(
    response_mask: torch.Tensor,
    config: ActorConfig,
    recipe: Recipe,
    dp_size: int,
    device: torch.device,
    group: Any = None,
) -> LossScale:
    """The :class:`LossScale` of a mini-batch split over ``dp_size`` data-parallel ranks
    (collective over ``group``, the default group when None): this rank's response tokens
    and non-empty responses, summed over the ranks.

    ``seq-mean-token-sum-norm`` then divides by ``actor.loss_scale_factor`` or
    ``data.max_response_length``, constants of the run, not by this mini-batch's padded
    width (its longest response).
    """
    per_row = response_mask.sum(dim=-1)
    counts = torch.stack([per_row.sum(), (per_row > 0).sum()]).to(device)
    if dp_size > 1:
        dist.all_reduce(counts, group=group)
    return LossScale(
        num_tokens=int(counts[0]),
        num_seqs=int(counts[1]),
        dp_size=dp_size,
        max_response_length=recipe.data.max_response_length,
        loss_scale_factor=config.loss_scale_factor,
    )


# ------------------------------------------------------------------------------ log-probs


def sampling_temperature(batch: Batch, rollout: RolloutConfig) -> float:
    """The temperature ``batch``'s responses were sampled at (``batch.meta["temperature"]``,
    else ``rollout.temperature`` when sampling); log-probs are of that distribution, as the
    engine's are. Greedy (0) and unset count as 1."""
    temperature = batch.meta.get("temperature")
    if temperature is None:
        temperature = rollout.temperature if rollout.do_sample else 1.0
    return float(temperature) if temperature and temperature > 0 else 1.0


ENTROPY_SLICE_TOKENS = 1024
"""Tokens per slice of :func:`entropy_for_metrics`: the probabilities of a slice are a
transient copy of its logits, about 600 MB per 1024 tokens at a 150k vocabulary."""


@torch.no_grad()
def entropy_for_metrics(logits: torch.Tensor, log_norm: torch.Tensor) -> torch.Tensor:
    """Per-token entropy ``[...]`` of ``logits [..., V]`` (``log_norm`` their logsumexp),
    without gradient, a slice of tokens at a time: it runs while an update's activations are
    held, at the step's peak memory."""
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_norm = log_norm.reshape(-1)
    entropy = torch.empty_like(flat_norm)
    for start in range(0, flat_logits.shape[0], ENTROPY_SLICE_TOKENS):
        piece = flat_logits[start : start + ENTROPY_SLICE_TOKENS]
        expected = (torch.softmax(piece, dim=-1) * piece).sum(dim=-1)
        entropy[start : start + ENTROPY_SLICE_TOKENS] = (
            flat_norm[start : start + ENTROPY_SLICE_TOKENS] - expected
        )
    return entropy.reshape(log_norm.shape)


def response_log_probs(
    logits: torch.Tensor,
    micro_batch: Batch,
    temperature: float,
    *,
    with_entropy: bool,
    entropy_grad: bool = True,
    overwrite_logits: bool = False,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token float32 log-probs ``[b, R]`` of ``micro_batch``'s ``responses`` (and entropies
    when ``with_entropy``) from ``logits [b, R', V]`` of any float dtype, those of the positions
    that predict the first ``R'`` response tokens (the columns some row of the micro-batch
    uses), divided by the sampling ``temperature``. With ``rows [b, R']``, ``logits`` are
    ``[M, V]`` (a model's output, flattened) and ``rows`` the row of each of those positions.

    Its ``attention_mask [b, P+R]`` zeroes padding, so results do not depend on which rows
    shared a micro-batch; columns past ``R'`` are 0. ``entropy_grad=False`` computes the
    entropy outside the autograd graph, for a metric only.

    The vocabulary-sized work runs a chunk of tokens at a time and the graph keeps only
    ``logits`` and a logsumexp per token (:func:`plugrl.algorithms.token_log_probs.
    token_log_probs`); ``overwrite_logits`` lets the backward write the logits' gradient over
    them, for a caller that owns them as that function says.
    """
    used = logits.shape[1] if rows is None else rows.shape[1]
    responses = micro_batch["responses"].to(logits.device)
    attention_mask = micro_batch["attention_mask"]
    targets = responses[:, :used]
    flat_logits = logits.reshape(-1, logits.shape[-1])
    if rows is None:
        rows = torch.arange(flat_logits.shape[0], device=logits.device).reshape(targets.shape)
    attended = attention_mask[:, -responses.shape[-1] :][:, :used].to(logits.device)
    # only attended tokens are scored: the others are 0 and pass no gradient, and each
    # attended token has its own row of logits, as writing a gradient over them needs
    where = attended.reshape(-1).nonzero().squeeze(-1)
    scored, scored_entropy = token_log_probs(
        flat_logits,
        targets.reshape(-1)[where],
        temperature,
        rows=rows.reshape(-1)[where].to(logits.device),
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
        overwrite_logits=overwrite_logits,
    )
    pad = responses.shape[-1] - used

    def laid_out(values: torch.Tensor) -> torch.Tensor:
        full = values.new_zeros(targets.numel()).index_put((where,), values)
        return F.pad(full.reshape(targets.shape), (0, pad))

    entropy = None if scored_entropy is None else laid_out(scored_entropy)
    return laid_out(scored), entropy


@torch.no_grad()
def sum_pi_squared(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``sum_v p_v^2`` per token ``[...]`` (float32 at least) of the distribution
    ``softmax(logits [..., V] / temperature)``, without gradient, a slice of tokens at a time
    (``exp(lse(2 l) - 2 lse(l))``, so no probability is below the float range where a plain
    square would lose it): the temperature is applied per slice too, so a slice's scaled and
    doubled logits are the only full-vocabulary copies, never one of the whole batch."""
    flat = logits.reshape(-1, logits.shape[-1])
    dtype = torch.promote_types(flat.dtype, torch.float32)
    out = torch.empty(flat.shape[0], dtype=dtype, device=flat.device)
    for start in range(0, flat.shape[0], ENTROPY_SLICE_TOKENS):
        piece = flat[start : start + ENTROPY_SLICE_TOKENS].to(dtype)
        if temperature != 1.0:
            piece = piece / temperature
        log_norm = torch.logsumexp(piece, dim=-1)
        out[start : start + ENTROPY_SLICE_TOKENS] = torch.exp(
            torch.logsumexp(piece * 2, dim=-1) - 2 * log_norm
        )
    return out.reshape(logits.shape[:-1])


def response_sum_pi_squared(
    logits: torch.Tensor,
    micro_batch: Batch,
    temperature: float,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`sum_pi_squared` ``[b, R]`` at the positions :func:`response_log_probs` reads
    (``logits [b, R', V]``, or ``[M, V]`` and their ``rows [b, R']`` as there, divided by the
    sampling ``temperature``), 0 on padding and past ``R'``: what the optimal token baseline
    reads as ``sum_pi_squared``."""
    values = sum_pi_squared(logits, temperature)
    if rows is not None:
        values = values[rows.to(values.device)]
    used = values.shape[1]
    responses = micro_batch["responses"]
    attended = micro_batch["attention_mask"][:, -responses.shape[-1] :][:, :used]
    values = values * attended.to(values.device, values.dtype)
    return F.pad(values, (0, responses.shape[-1] - used))


class LogProbRows:
    """The result of ``compute_log_prob`` over a batch, filled a micro-batch at a time:
    float32 ``log_probs`` [B, R] on the CPU and, when asked, ``entropys`` and
    ``sum_pi_squared``."""

    def __init__(
        self, batch: Batch, *, with_entropy: bool, with_sum_pi_squared: bool = False
    ) -> None:
        shape = batch["responses"].shape
        self.log_probs = torch.zeros(shape, dtype=torch.float32)
        self.entropys = torch.zeros(shape, dtype=torch.float32) if with_entropy else None
        self.sum_pi_squared = (
            torch.zeros(shape, dtype=torch.float32) if with_sum_pi_squared else None
        )

    def put(
        self,
        rows: list[int],
        log_prob: torch.Tensor,
        entropy: torch.Tensor | None,
        sum_pi_squared: torch.Tensor | None = None,
    ) -> None:
        """The results of the micro-batch of ``rows``."""
        index = torch.tensor(rows)
        self.log_probs[index] = log_prob.cpu()
        if self.entropys is not None and entropy is not None:
            self.entropys[index] = entropy.cpu()
        if self.sum_pi_squared is not None and sum_pi_squared is not None:
            self.sum_pi_squared[index] = sum_pi_squared.cpu().float()

    def result(self) -> dict[str, torch.Tensor]:
        out = {"log_probs": self.log_probs}
        if self.entropys is not None:
            out["entropys"] = self.entropys
        if self.sum_pi_squared is not None:
            out["sum_pi_squared"] = self.sum_pi_squared
        return out


# ------------------------------------------------------------------------------ export

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
"""Files a tokenizer folder may hold; :func:`copy_tokenizer_files` copies whichever exist."""


def _clear_stale_staging(path: Path) -> None:
    """Remove the hidden folders a killed :func:`staged_folder` for ``path`` left behind: its
    staging folder and its retired old copy (``.<name>.`` or ``.<name>.old.`` then the 8
    letters, digits or ``_`` of ``tempfile.mkdtemp``).

    A process killed between the two renames leaves ``path`` missing and the previous folder
    in the retired copy: that copy is put back first, so a new write that fails does not lose
    the one before.
    """
    names = re.compile(rf"^\.{re.escape(path.name)}\.(old\.)?[a-z0-9_]{{8}}$")
    leftovers: dict[Path, bool] = {}  # folder -> whether it is a retired copy
    for entry in path.parent.iterdir():
        match = names.match(entry.name)
        if match and entry.is_dir():
            leftovers[entry] = match.group(1) is not None
    retired = [entry / path.name for entry, old in leftovers.items() if old]
    if not path.exists() and len(retired) == 1 and retired[0].is_dir():
        retired[0].rename(path)
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)


@contextmanager
def staged_folder(path: Path) -> Iterator[Path]:
    """A new hidden folder beside ``path`` to write a folder's files into, renamed to
    ``path`` when the block ends (an existing folder there is replaced) and deleted when it
    raises: a reader never sees half a folder.

    Hidden folders of an earlier write to the same ``path`` that was killed before it could
    clean up are removed first (one writer per ``path`` at a time is assumed).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale_staging(path)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield staging
        if path.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            path.rename(retired / path.name)
            staging.rename(path)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(path)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def copy_tokenizer_files(folder: Path, source_folders: Iterable[str | Path | None]) -> None:
    """Copy into ``folder`` each of :data:`TOKENIZER_FILES` found in ``source_folders``, the
    first folder that has a file winning (None and empty entries are skipped)."""
    copied: set[str] = set()
    for source_folder in source_folders:
        if not source_folder:
            continue
        for name in TOKENIZER_FILES:
            source = Path(source_folder) / name
            if name not in copied and source.is_file():
                shutil.copy2(source, Path(folder) / name)
                copied.add(name)
