"""Built-in algorithms: advantage estimators, policy losses and KL penalties (verl's names).

Registration only; the implementations (torch) are imported when a recipe chooses them.
The pieces a scheduler or backend calls directly:

* :class:`plugrl_plugins.algorithms.objective.PolicyObjective`: the actor objective;
* :func:`plugrl_plugins.algorithms.validate.check_algorithm`: start-up checks;
* :mod:`plugrl_plugins.algorithms.kl`: KL in the reward and its controllers;
* :mod:`plugrl_plugins.algorithms.importance`: truncated importance weights;
* :mod:`plugrl_plugins.algorithms.dynamic_sampling`: DAPO's group filtering.
"""

from __future__ import annotations

import plugrl

_PKG = "plugrl_plugins.algorithms"

ESTIMATORS = {
    "gae": ("GAE", f"{_PKG}.options:GAEArgs"),
    "grpo": ("GRPO", None),
    "rloo": ("RLOO", None),
    "reinforce_plus_plus": ("ReinforcePlusPlus", None),
    "reinforce_plus_plus_baseline": ("ReinforcePlusPlusBaseline", None),
    "remax": ("ReMax", None),
    "opo": ("OPO", None),
    "gpg": ("GPG", None),
    "grpo_passk": ("GRPOPassK", None),
}

ESTIMATOR_DESCRIPTIONS = {
    "gae": "Generalised advantage estimation with a critic (PPO)",
    "grpo": "Group-normalised outcome advantage (Dr.GRPO without std normalisation)",
    "rloo": "REINFORCE leave-one-out group baseline",
    "reinforce_plus_plus": "REINFORCE++: discounted return, whitened over the batch",
    "reinforce_plus_plus_baseline": "REINFORCE++ with a group-mean baseline",
    "remax": "ReMax: return minus the greedy response's reward",
    "opo": "Length-weighted group baseline (optimal on-policy baseline)",
    "gpg": "Group policy gradient: rescaled group-mean baseline",
    "grpo_passk": "Pass@k: only the best response of a group, by its margin",
}

LOSSES = {
    "vanilla": ("VanillaPPO", None, "PPO clipped surrogate, asymmetric and dual clip"),
    "gspo": ("GSPO", None, "PPO clipping of the sequence-level ratio"),
    "clip_cov": (
        "ClipCov",
        f"{_PKG}.options:ClipCovArgs",
        "PPO clip plus gradient cut of high-covariance tokens",
    ),
    "kl_cov": (
        "KLCov",
        f"{_PKG}.options:KLCovArgs",
        "Policy gradient plus KL penalty on high-covariance tokens",
    ),
    "geo_mean": ("GeoMean", None, "GMPO: clipped geometric mean of token ratios"),
    "cispo": ("CISPO", None, "REINFORCE weighted by the clipped, stop-gradient ratio"),
    "reinforce": ("Reinforce", None, "Plain policy gradient -A * log_prob"),
}

KL_PENALTIES = {
    "kl": ("kl_k1", ("k1",), "k1 = log_prob - ref_log_prob"),
    "abs": ("kl_abs", (), "|log_prob - ref_log_prob|"),
    "mse": ("kl_k2", ("k2", "mse+", "k2+"), "k2 = (log_prob - ref_log_prob)^2 / 2"),
    "low_var_kl": ("kl_k3", ("k3",), "k3 = exp(-d) + d - 1, low variance, clamped"),
    "kl+": ("kl_k1_plus", ("k1+",), "value of k1, gradient of k2 (straight-through)"),
    "abs+": ("kl_abs_plus", (), "value of abs, gradient of k2 (straight-through)"),
    "low_var_kl+": ("kl_k3_plus", ("k3+",), "value of k3, gradient of k2 (straight-through)"),
}


@plugrl.hookimpl
def register_advantage_estimators(register):
    for name, (attr, config) in ESTIMATORS.items():
        register(
            name,
            f"{_PKG}.estimators:{attr}",
            config=config,
            description=ESTIMATOR_DESCRIPTIONS[name],
        )


@plugrl.hookimpl
def register_policy_losses(register):
    for name, (attr, config, description) in LOSSES.items():
        register(name, f"{_PKG}.losses:{attr}", config=config, description=description)


@plugrl.hookimpl
def register_kl_penalties(register):
    for name, (attr, aliases, description) in KL_PENALTIES.items():
        register(name, f"{_PKG}.kl:{attr}", aliases=aliases, description=description)
