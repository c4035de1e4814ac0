"""What reward managers share, beside the reward interface (:mod:`plugrl.parts.reward`).

* :mod:`plugrl.parts.scoring`: the scoring function of each data source, its options, and
  one call of it on one sample (:class:`~plugrl.parts.scoring.Scorer`);
* :mod:`plugrl.rewards.workers`: scoring in worker processes with a timeout per call, killed
  by process group when a call hangs;
* :mod:`plugrl.rewards.ray_pool`: the same contract on Ray actors;
* :mod:`plugrl.rewards.results`: the per-sample result, extra columns and score metrics every
  manager reports, wherever its samples were scored.
"""
