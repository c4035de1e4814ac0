"""Per-token log-probs (and entropies) of a policy's logits that never hold a float32 copy of
them whole: the vocabulary-sized work runs a chunk of tokens at a time, the autograd graph
keeps only the logits themselves and one logsumexp per token, and the backward writes the
logits' gradient chunk by chunk, into the logits' own storage when the caller allows it.

The plain autograd formula (``log_softmax`` of the logits cast to float32) keeps the float32
copy for its backward and then builds ``grad * exp(logits - lse)`` from three more float32
buffers of the same size: about 20 bytes a logit at the update's peak for bfloat16 logits.
Here the peak is the logits (2 bytes a logit in bfloat16), their gradient (none more when
written over them) and one float32 buffer of one chunk, two with the entropy.

With ``z = logits / T`` (``T`` the sampling temperature), ``p = softmax(z)`` and ``y`` the
target id, each token's results and their gradients with respect to the logits are::

    log_prob = z_y - lse(z)            d/dlogits = (onehot(y) - p) / T
    entropy  = -sum(p log p)           d/dlogits = -p (log p + entropy) / T

Within a chunk everything is computed in float32 (float64 for float64 logits), so the results
are those of the float32 formula whatever the logits' dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from plugrl.algorithms import log_prob_chunks


class _TokenLogProbs(torch.autograd.Function):
    """``(log_prob [N], entropy [N] or None)`` of the rows ``rows [N]`` of ``logits [M, V]``;
    see :func:`token_log_probs`."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        rows: torch.Tensor | None,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool,
        overwrite_logits: bool,
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        count = targets.shape[0]
        log_prob = torch.empty(count, dtype=_accumulation(logits), device=logits.device)
        log_norm = torch.empty_like(log_prob)
        entropy = torch.empty_like(log_prob) if with_entropy else None
        for start in range(0, count, chunk):
            part = slice(start, start + chunk)
            scaled = _chunk(logits, rows, part, temperature)
            picked = scaled.gather(-1, targets[part, None]).squeeze(-1)
            # logsumexp in the chunk's own buffer: s = z - max, then exp(s) over it
            top = scaled.amax(dim=-1, keepdim=True)
            shifted = scaled.sub_(top)
            if entropy is None:
                total = shifted.exp_().sum(dim=-1)
            else:
                # entropy = log S - sum(e^s s) / S with S = sum(e^s): two small terms when one
                # token takes nearly all the probability, so no digits cancel
                weights = torch.exp(shifted)
                total = weights.sum(dim=-1)
                entropy[part] = total.log() - weights.mul_(shifted).sum(dim=-1) / total
                del weights
            norm = total.log_() + top.squeeze(-1)
            log_norm[part] = norm
            log_prob[part] = picked - norm
            del scaled, shifted
        saved_entropy = entropy if (entropy is not None and entropy_grad) else None
        ctx.save_for_backward(logits, targets, rows, log_norm, saved_entropy)
        ctx.temperature = temperature
        ctx.overwrite_logits = overwrite_logits
        ctx.chunk = chunk
        ctx.overwritten = False
        if entropy is not None and not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return log_prob, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_log_prob: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        if ctx.overwritten:
            raise RuntimeError(
                "token_log_probs wrote its gradient over the logits in an earlier backward, so "
                "it cannot run a second one; pass overwrite_logits=False to backward twice "
                "(retain_graph)"
            )
        logits, targets, rows, log_norm, entropy = ctx.saved_tensors
        nothing: tuple[None, ...] = (None,) * 7
        if not ctx.needs_input_grad[0]:
            return (None, *nothing)
        if entropy is None:
            grad_entropy = None
        temperature, chunk = ctx.temperature, ctx.chunk
        if ctx.overwrite_logits and not torch.is_grad_enabled():
            out = logits
            ctx.overwritten = True
        elif rows is None:
            out = torch.empty_like(logits)
        else:
            out = torch.zeros_like(logits)
        for start in range(0, targets.shape[0], chunk):
            part = slice(start, start + chunk)
            scaled = _chunk(logits, rows, part, temperature)
            log_p = scaled.sub_(log_norm[part, None])
            # the gradient is built in the chunk's own buffer, or with the entropy's term in
            # a second one, beside the log-probabilities that term reads
            grad = torch.exp(log_p) if grad_entropy is not None else log_p.exp_()
            if grad_entropy is not None:
                # d entropy / dz = -p (log p + entropy)
                log_p.add_(entropy[part, None]).mul_(grad)
                log_p.mul_(grad_entropy[part, None].to(grad.dtype).neg())
            if grad_log_prob is not None:
                weight = grad_log_prob[part, None].to(grad.dtype)
                grad.mul_(weight.neg()).scatter_add_(-1, targets[part, None], weight)
            else:
                grad.zero_()
            if grad_entropy is not None:
                grad.add_(log_p)
            del scaled, log_p
            if temperature != 1.0:
                grad.div_(temperature)
            # every read of these rows is done (each is read once when overwriting): writing
            # over them is safe now
            if rows is None:
                out[part] = grad
            elif out is logits:
                out[rows[part]] = grad.to(out.dtype)
            else:
                out.index_add_(0, rows[part], grad.to(out.dtype))
            del grad
        if out is logits and rows is not None:
            # rows no target reads have no gradient
            unread = torch.ones(out.shape[0], dtype=torch.bool, device=out.device)
            unread[rows] = False
            out[unread] = 0
        return (out, *nothing)


def _chunk(
    logits: torch.Tensor, rows: torch.Tensor | None, part: slice, temperature: float
) -> torch.Tensor:
    """The logits of the targets ``part`` (rows ``part`` of ``logits``, or the rows ``rows[part]``
    names) divided by ``temperature``: a new tensor of :func:`_accumulation`'s dtype, never
    a view of ``logits``, so that it can be changed in place."""
    dtype = _accumulation(logits)
    # indexing by rows copies already; a slice is a view, to be copied
    picked = logits[part] if rows is None else logits[rows[part]]
    scaled = picked.to(dtype, copy=rows is None)
    return scaled.div_(temperature) if temperature != 1.0 else scaled


def _accumulation(logits: torch.Tensor) -> torch.dtype:
    """float32, or float64 for float64 logits."""
    return torch.promote_types(logits.dtype, torch.float32)


def token_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    rows: torch.Tensor | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    overwrite_logits: bool = False,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[N]`` of ``targets [N]`` under ``softmax(logits [M, V] / temperature)``,
    float32 (float64 for float64 logits) whatever the logits' float dtype, and their
    entropies ``[N]`` when ``with_entropy``: with their gradient, or (``entropy_grad=False``)
    outside the autograd graph, for a metric.

    ``rows [N]``: the row of ``logits`` each target is of (None: row ``i`` for target ``i``,
    ``M == N``), so that a caller can hand over a model's output whole instead of a copy of
    the rows it scores; rows no target reads get a zero gradient.

    ``chunk`` targets at a time (default
    :func:`plugrl.algorithms.log_prob_chunks.chunk_tokens`). The graph keeps ``logits`` and
    a logsumexp per target; the backward makes the logits' gradient in their dtype.

    ``overwrite_logits``: the backward writes that gradient into ``logits``' own storage
    instead of a new tensor. Only for a caller that owns ``logits``: it made them with an
    operation whose backward does not read them (indexing, a cast, a matrix product), keeps
    no other reference it reads after the backward, and runs one backward (a second one
    raises). ``rows`` must then name each row once. A backward that builds a graph
    (``create_graph``) never overwrites.
    """
    if logits.dim() != 2 or targets.dim() != 1:
        raise ValueError(
            f"token_log_probs takes logits [M, V] and targets [N], not {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}; flatten the token dimensions first"
        )
    if not logits.is_floating_point():
        raise ValueError(f"token_log_probs takes floating-point logits, not {logits.dtype}")
    if rows is None and targets.shape[0] != logits.shape[0]:
        raise ValueError(
            f"{targets.shape[0]} targets for {logits.shape[0]} rows of logits; pass rows= to "
            "say which row each target is of"
        )
    if rows is not None:
        if rows.shape != targets.shape:
            raise ValueError(f"rows {tuple(rows.shape)} must have the targets' shape")
        rows = rows.to(device=logits.device, dtype=torch.long)
        if overwrite_logits and rows.unique().numel() != rows.numel():
            raise ValueError(
                "rows names a row of logits more than once, so its gradient cannot be written "
                "over it; pass overwrite_logits=False"
            )
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, not {temperature}")
    size = log_prob_chunks.chunk_tokens(logits.shape[-1]) if chunk is None else chunk
    if size < 1:
        raise ValueError(f"chunk must be at least 1 target, not {size}")
    targets = targets.to(device=logits.device, dtype=torch.long)
    log_prob, entropy = _TokenLogProbs.apply(
        logits,
        targets,
        rows,
        float(temperature),
        with_entropy,
        entropy_grad,
        overwrite_logits and logits.requires_grad,
        size,
    )
    return log_prob, entropy
