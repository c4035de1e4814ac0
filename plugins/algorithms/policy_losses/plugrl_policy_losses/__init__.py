"""Policy losses with verl's names and formulas: ``vanilla`` (PPO, dual clip), ``gspo``,
``clip_cov``, ``kl_cov``, ``geo_mean``, ``cispo``, ``reinforce``
(verl's ``gpg``), ``sapo``, ``dppo_tv``, ``dppo_kl``.

Registration only; the implementations (torch) are imported when a recipe chooses one.
Formulas: docs/algorithms.md.
"""

from __future__ import annotations

from plugrl.api import hookimpl

LOSSES = {
    "vanilla": ("VanillaPPO", None, "PPO clipped surrogate, asymmetric and dual clip"),
    "gspo": ("GSPO", None, "PPO clipping of the sequence-level ratio"),
    "clip_cov": (
        "ClipCov",
        "plugrl_policy_losses.options:ClipCovArgs",
        "PPO clip plus gradient cut of high-covariance tokens",
    ),
    "kl_cov": (
        "KLCov",
        "plugrl_policy_losses.options:KLCovArgs",
        "Policy gradient plus KL penalty on high-covariance tokens",
    ),
    "geo_mean": ("GeoMean", None, "GMPO: clipped geometric mean of token ratios"),
    "cispo": ("CISPO", None, "REINFORCE weighted by the clipped, stop-gradient ratio"),
    "reinforce": ("Reinforce", None, "Plain policy gradient -A * log_prob"),
    "sapo": (
        "SAPO",
        "plugrl_policy_losses.options:SapoArgs",
        "Soft sigmoid gate of the ratio in place of PPO's clip",
    ),
    "dppo_tv": ("DPPOTV", None, "DPPO: policy gradient inside a probability-change trust region"),
    "dppo_kl": ("DPPOKL", None, "DPPO: policy gradient inside a binary-KL trust region"),
}

ALIASES = {"reinforce": ["gpg"]}
"""verl's names for the same loss: verl's ``gpg`` loss is ``-A * log_prob`` aggregated by
``loss_agg_mode``, which is ``reinforce``."""


@hookimpl
def register_policy_losses(register):
    for name, (attr, config, description) in LOSSES.items():
        register(
            name,
            f"plugrl_policy_losses.losses:{attr}",
            config=config,
            description=description,
            aliases=ALIASES.get(name, ()),
        )
