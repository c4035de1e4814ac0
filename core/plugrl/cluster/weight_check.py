"""Whether the engines sample with the trainer's weights, checked after every weight sync.

Two checks:

* **log-probs** (always, when the engine returns log-probs): the trainer recomputes the
  log-probs of the sampled tokens (``old_log_probs``) on the weights it just synced; the
  engine's own (``rollout_log_probs``) should be the same distribution up to the rounding of
  the engine's dtype. :func:`rollout_probs_diff_metrics` logs the gap under verl's names
  (``training/rollout_probs_diff_{mean,max,std,valid}``,
  ``training/rollout_actor_probs_pearson_corr``), on probabilities;
  :func:`check_probs_diff` warns or stops (``trainer.check_weight_sync``) when the mean gap
  passes the threshold of the engine's dtype (``trainer.weight_sync_thresholds``).
* **fingerprints** (``trainer.verify_weight_sync``, and tests): every engine reads back the
  weights it holds (:meth:`RolloutEngine.weight_fingerprints
  <plugrl.parts.rollout.RolloutEngine.weight_fingerprints>`) and :func:`verify_fingerprints`
  compares them with the trainer's, cast to the engine's dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from plugrl.errors import PluginError

if TYPE_CHECKING:
    import torch

    from plugrl.cluster.base import WorkerGroup
    from plugrl.cluster.engines import EngineGroup

logger = logging.getLogger("plugrl.run")

PROBS_DIFF_MEAN = "training/rollout_probs_diff_mean"
PROBS_DIFF_MAX = "training/rollout_probs_diff_max"
PROBS_DIFF_STD = "training/rollout_probs_diff_std"
PROBS_DIFF_VALID = "training/rollout_probs_diff_valid"
PROBS_PEARSON = "training/rollout_actor_probs_pearson_corr"

CHECK_MODES = ("warn", "error", "off")
"""The values of ``trainer.check_weight_sync``."""


def rollout_probs_diff_metrics(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """verl's rollout-versus-trainer metrics over the response tokens of ``response_mask``:
    the max, mean and (sample) standard deviation of ``|exp(rollout) - exp(old)|``, and the
    Pearson correlation of the two probabilities. Empty when no token is in the mask."""
    import torch

    mask = response_mask.bool()
    rollout_probs = torch.exp(rollout_log_probs.detach().float().cpu()[mask.cpu()])
    trainer_probs = torch.exp(old_log_probs.detach().float().cpu()[mask.cpu()])
    if rollout_probs.numel() == 0:
        return {}
    gap = (rollout_probs - trainer_probs).abs()
    metrics = {
        PROBS_DIFF_VALID: 1.0,
        PROBS_DIFF_MAX: float(gap.max()),
        PROBS_DIFF_MEAN: float(gap.mean()),
        # one token has no spread (verl's torch.std gives nan there)
        PROBS_DIFF_STD: float(gap.std()) if gap.numel() > 1 else 0.0,
    }
    if rollout_probs.numel() > 1:
        paired = torch.stack([trainer_probs, rollout_probs]).double()
        corr = torch.corrcoef(paired)[0, 1]
        # equal probabilities everywhere have no variance: they agree perfectly
        metrics[PROBS_PEARSON] = float(corr) if torch.isfinite(corr) else 1.0
    return metrics


def threshold_for(thresholds: Mapping[str, float], dtype: str) -> float | None:
    """The mean-gap threshold of an engine running in ``dtype`` (``None``: not checked)."""
    return thresholds.get(dtype)


def check_probs_diff(
    metrics: Mapping[str, Any],
    *,
    mode: str,
    thresholds: Mapping[str, float],
    engine: str,
    dtype: str,
    weight_version: int,
) -> str | None:
    """Compare the step's ``training/rollout_probs_diff_mean`` with the threshold of the
    engine's ``dtype``: beyond it, ``mode`` ``warn`` logs one line and ``error`` raises it
    (:class:`~plugrl.errors.PluginError`). Returns the line, or ``None`` when within."""
    if mode == "off" or PROBS_DIFF_MEAN not in metrics:
        return None
    limit = threshold_for(thresholds, dtype)
    mean = float(metrics[PROBS_DIFF_MEAN])
    if limit is None or mean <= limit:
        return None
    line = (
        f"weight sync check: rollout engine {engine!r} ({dtype}) sampled at weight version "
        f"{weight_version} with token probabilities {mean:.4g} apart from the trainer's on "
        f"average ({PROBS_DIFF_MEAN}, max {float(metrics.get(PROBS_DIFF_MAX, mean)):.3g}; "
        f"threshold {limit:g}, trainer.weight_sync_thresholds.{dtype}): the engine most likely "
        "samples with other weights than the trainer's (a weight sync that did not arrive, "
        "skipped tensors, a name or dtype mismatch); set trainer.verify_weight_sync=true to "
        "find the weight, or trainer.check_weight_sync=off if the gap is expected"
    )
    if mode == "error":
        raise PluginError(line)
    logger.warning(line)
    return line


def verify_fingerprints(
    trainer: WorkerGroup, engines: EngineGroup, dtype: torch.dtype, weight_version: int
) -> int:
    """Read back every engine's fingerprints of the trainer's weights and compare them with
    the trainer's, cast to the engine's ``dtype`` (over the rows an engine covered, when it
    read back part of a weight); raise one :class:`~plugrl.errors.PluginError` line naming
    the engine, the weight and how it differs at the first disagreement. A weight an engine
    leaves out (one it cannot read back) is not compared; returns the fewest weights compared
    on any engine."""
    from plugrl.parts.rollout import fingerprint_difference, weight_fingerprint

    weights = dict(trainer.named_weights())
    names = sorted(weights)
    whole = {name: weight_fingerprint(tensor, dtype) for name, tensor in weights.items()}
    engine = engines.recipe.rollout.engine
    try:
        answers = engines.weight_fingerprints(names)
    except NotImplementedError as exc:
        raise PluginError(
            f"trainer.verify_weight_sync: rollout engine {engine!r} cannot read its weights "
            f"back ({exc}); set trainer.verify_weight_sync=false or use an engine that "
            "implements weight_fingerprints"
        ) from None
    compared = len(names)
    for index, held in enumerate(answers):
        if not held:
            raise PluginError(
                f"weight sync check: engine worker {index} (rollout engine {engine!r}) read "
                f"back none of the {len(names)} weights the trainer sent (names it does not "
                "hold, or weights it keeps in a form of its own); set "
                "trainer.verify_weight_sync=false for this engine"
            )
        # an engine leaves out what it cannot read back (a kernel's packed form)
        compared = min(compared, len(held))
        problems = []
        for name in names:
            if name not in held:
                continue
            rows = held[name].rows
            expected = (
                whole[name] if rows is None else weight_fingerprint(weights[name][:rows], dtype)
            )
            difference = fingerprint_difference(expected, held[name])
            if difference is not None:
                problems.append(f"{name} ({difference})")
        if problems:
            more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
            raise PluginError(
                f"weight sync check: engine worker {index} (rollout engine {engine!r}) holds "
                f"other weights than the trainer's after the sync to version {weight_version}: "
                f"{problems[0]}{more}; the engine skipped or mis-loaded a weight, see its "
                "weight loading for that name"
            )
    return compared
