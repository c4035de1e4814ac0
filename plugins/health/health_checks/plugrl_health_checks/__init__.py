"""The built-in learning-health checks (docs/recipes.md, "Health checks")."""

from __future__ import annotations

from plugrl.api import hookimpl

_CHECKS = "plugrl_health_checks.checks"


@hookimpl
def register_health_checks(register):
    register(
        "response_clipping",
        f"{_CHECKS}:ResponseClipping",
        config=f"{_CHECKS}:ResponseClippingConfig",
    )
    register("zero_variance", f"{_CHECKS}:ZeroVariance", config=f"{_CHECKS}:ZeroVarianceConfig")
    register("grad_norm", f"{_CHECKS}:GradNorm", config=f"{_CHECKS}:GradNormConfig")
    register(
        "entropy_collapse",
        f"{_CHECKS}:EntropyCollapse",
        config=f"{_CHECKS}:EntropyCollapseConfig",
    )
    register(
        "constant_reward",
        f"{_CHECKS}:ConstantReward",
        config=f"{_CHECKS}:ConstantRewardConfig",
    )
    register("kl_explosion", f"{_CHECKS}:KLExplosion", config=f"{_CHECKS}:KLExplosionConfig")
