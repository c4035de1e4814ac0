"""Simulated parts for measuring schedulers: a rollout engine, a training backend and a reward
that take the time a model would, without a model.

They implement the real interfaces, so a scheduler runs its own code over them through
:func:`plugrl.run.runner.run_recipe`; only the costs are simulated, in milliseconds:

* ``rollout.engine: sim`` (:class:`~plugrl_sim.parts.SimEngine`): continuous batching on
  ``sim_devices`` simulated devices, each running up to ``rollout.max_num_seqs`` sequences;
  one decode step of a device costs ``sim_step_ms + sim_token_ms x sequences running on it``
  and adds a token to each. Response lengths are long-tailed like those of DAPO runs:
  ``sim_long_fraction`` of the samples run to ``max_tokens``, the others are log-normal
  around ``sim_median_length_fraction x max_tokens``. Requests can be aborted, paused
  (keeping or ending them), resumed; weights arrive in the three update phases and every
  token records the version it was sampled with.
* ``actor.backend: sim`` (:class:`~plugrl_sim.parts.SimBackend`): forward and update cost
  ``sim_forward_ms_per_ktoken`` / ``sim_train_ms_per_ktoken`` per thousand tokens, divided
  over ``sim_devices``; the policy is one trained log-probability offset, and a few small
  tensors derived from it travel to the engines as its weights, through the run's transport.
* reward function ``plugrl/sim``: the parity of the response text's length.

The plugin is installed with plugrl (entry point ``sim``);
:func:`plugrl_sim.parts.build_sim_task` and :func:`plugrl_sim.parts.sim_recipe` (the test
kit's, :mod:`plugrl.testing.simulated`) make a run of it, and
:func:`plugrl.testing.run_scheduler` runs a scheduler on it.
"""

from __future__ import annotations

from typing import Any

from plugrl.api import hookimpl

SIM_NAME = "sim"
SIM_DATA_SOURCE = "plugrl/sim"


@hookimpl
def register_rollout_engines(register: Any) -> None:
    register(
        SIM_NAME,
        "plugrl_sim.parts:SimEngine",
        config="plugrl_sim.parts:SimEngineConfig",
        description="simulated costs",
    )


@hookimpl
def register_training_backends(register: Any) -> None:
    register(
        SIM_NAME,
        "plugrl_sim.parts:SimBackend",
        config="plugrl_sim.parts:SimBackendConfig",
        description="simulated costs",
    )


@hookimpl
def register_reward_functions(register: Any) -> None:
    register(SIM_DATA_SOURCE, "plugrl_sim.parts:compute_score")
