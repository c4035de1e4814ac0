"""What reward managers share, beside the reward interface (:mod:`plugrl.parts.reward`) and
the scoring functions (:mod:`plugrl.parts.scoring`).

* :mod:`plugrl.rewards.answers`: the ``Answer:`` line of a response, read one way;
* :mod:`plugrl.rewards.workers`: scoring in worker processes with a timeout per call, killed
  by process group when a call hangs (the ``parallel`` manager's plugin holds the same
  contract on Ray actors, ``plugrl_reward_managers.ray_pool``);
* :mod:`plugrl.rewards.results`: the per-sample result, extra columns and score metrics every
  manager reports, wherever its samples were scored.
"""
