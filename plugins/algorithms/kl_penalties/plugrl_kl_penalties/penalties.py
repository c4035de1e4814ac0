"""KL divergence estimators (the ``kl_penalties`` this plugin registers).

Each estimator is a function ``(log_prob, ref_log_prob) -> per-token tensor`` of the sampled
tokens' log-probabilities under the policy and the reference (J. Schulman, "Approximating KL
divergence", 2020), with ``d = log_prob - ref_log_prob``:

* ``kl`` (``k1``): ``d``. Unbiased value, high variance, can be negative.
* ``abs``: ``|d|``.
* ``mse`` (``k2``): ``d² / 2``. Its gradient is the unbiased gradient of KL(policy || ref).
* ``low_var_kl`` (``k3``): ``exp(-d) + d - 1``, with ``d`` clamped to [-20, 20] and the result
  to [-10, 10]. Unbiased value, low variance, always >= 0.
* ``+`` variants (``kl+``, ``abs+``, ``low_var_kl+``, alias ``k1+``, ``k3+``): the value of the
  named estimator with the gradient of ``k2`` (straight-through), because the expected
  gradient of k1 and k3 as losses is not the gradient of the KL. ``mse+``/``k2+`` are ``k2``.
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """``k1 = log_prob - ref_log_prob``."""
    return log_prob - ref_log_prob


def kl_abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """``|log_prob - ref_log_prob|``."""
    return (log_prob - ref_log_prob).abs()


def kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """``k2 = (log_prob - ref_log_prob)² / 2``."""
    return 0.5 * (log_prob - ref_log_prob).square()


def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """``k3 = exp(-d) + d - 1`` (low variance), ``d`` clamped to ±20, result to ±10."""
    log_ratio = torch.clamp(ref_log_prob - log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(log_ratio.exp() - log_ratio - 1, -K3_CLAMP, K3_CLAMP)


def _straight_through(
    value: torch.Tensor, log_prob: torch.Tensor, ref_log_prob: torch.Tensor
) -> torch.Tensor:
    """``value`` in the forward pass, the gradient of k2 in the backward pass."""
    surrogate = kl_k2(log_prob, ref_log_prob)
    return surrogate - surrogate.detach() + value.detach()


def kl_k1_plus(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """Value of k1, gradient of k2."""
    return _straight_through(kl_k1(log_prob, ref_log_prob), log_prob, ref_log_prob)


def kl_abs_plus(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """Value of abs, gradient of k2."""
    return _straight_through(kl_abs(log_prob, ref_log_prob), log_prob, ref_log_prob)


def kl_k3_plus(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """Value of k3 (low_var_kl), gradient of k2."""
    return _straight_through(kl_k3(log_prob, ref_log_prob), log_prob, ref_log_prob)
