"""Advantage estimators with verl's names and formulas: ``gae``, ``grpo``, ``rloo``,
``reinforce_plus_plus`` and its baseline variant, ``remax``, ``opo``, ``gpg``, ``grpo_passk``,
``gdpo``, ``optimal_token_baseline`` and ``tir_optimal_token_baseline``.

Registration only; the implementations (torch) are imported when a recipe chooses one.
Formulas: docs/algorithms.md.
"""

from __future__ import annotations

from plugrl.api import hookimpl

ESTIMATORS = {
    "gae": ("GAE", "plugrl_estimators.options:GAEArgs"),
    "grpo": ("GRPO", None),
    "rloo": ("RLOO", None),
    "reinforce_plus_plus": ("ReinforcePlusPlus", None),
    "reinforce_plus_plus_baseline": ("ReinforcePlusPlusBaseline", None),
    "remax": ("ReMax", None),
    "opo": ("OPO", None),
    "gpg": ("GPG", None),
    "grpo_passk": ("GRPOPassK", None),
    "gdpo": ("GDPO", "plugrl_estimators.options:GDPOArgs"),
    "optimal_token_baseline": (
        "OptimalTokenBaseline",
        "plugrl_estimators.options:OptimalTokenBaselineArgs",
    ),
    "tir_optimal_token_baseline": (
        "TIROptimalTokenBaseline",
        "plugrl_estimators.options:OptimalTokenBaselineArgs",
    ),
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
    "gdpo": "Multi-reward GRPO: each reward component group-normalised, summed, whitened",
    "optimal_token_baseline": "Per-token group baseline weighted by the gradient variance",
    "tir_optimal_token_baseline": "Optimal token baseline aligned by valid token (tool use)",
}


@hookimpl
def register_advantage_estimators(register):
    for name, (attr, config) in ESTIMATORS.items():
        register(
            name,
            f"plugrl_estimators.estimators:{attr}",
            config=config,
            description=ESTIMATOR_DESCRIPTIONS[name],
        )
