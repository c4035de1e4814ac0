"""What the algorithm parts share, in the core so that no plugin imports another.

* :mod:`plugrl.algorithms.functional`: masked means, whitening, loss aggregation and
  truncated importance weights, the formulas every estimator, loss and backend uses;
* :mod:`plugrl.algorithms.objective`: the actor objective a backend calls per micro-batch
  (policy loss + KL loss - entropy bonus, with importance weights);
* :mod:`plugrl.algorithms.kl_in_reward`: the KL penalty in the reward and its controllers;
* :mod:`plugrl.algorithms.dynamic_sampling`: DAPO's group filtering;
* :mod:`plugrl.algorithms.checks`: the start-up checks of the algorithm keys;
* :mod:`plugrl.algorithms.training`: what training backends share (optimizer and schedule,
  mini- and micro-batches of an update, response log-probs).
"""
