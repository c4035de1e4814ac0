"""KL penalties with verl's names: ``kl`` (k1), ``abs``, ``mse`` (k2), ``low_var_kl`` (k3)
and their straight-through ``+`` variants.

Registration only; the functions (torch) are imported when a recipe chooses one.
"""

from __future__ import annotations

from plugrl.api import hookimpl

KL_PENALTIES = {
    "kl": ("kl_k1", ("k1",), "k1 = log_prob - ref_log_prob"),
    "abs": ("kl_abs", (), "|log_prob - ref_log_prob|"),
    "mse": ("kl_k2", ("k2", "mse+", "k2+"), "k2 = (log_prob - ref_log_prob)^2 / 2"),
    "low_var_kl": ("kl_k3", ("k3",), "k3 = exp(-d) + d - 1, low variance, clamped"),
    "kl+": ("kl_k1_plus", ("k1+",), "value of k1, gradient of k2 (straight-through)"),
    "abs+": ("kl_abs_plus", (), "value of abs, gradient of k2 (straight-through)"),
    "low_var_kl+": ("kl_k3_plus", ("k3+",), "value of k3, gradient of k2 (straight-through)"),
}


@hookimpl
def register_kl_penalties(register):
    for name, (attr, aliases, description) in KL_PENALTIES.items():
        register(
            name,
            f"plugrl_kl_penalties.penalties:{attr}",
            aliases=aliases,
            description=description,
        )
