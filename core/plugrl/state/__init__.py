"""What a run saves and restores: checkpoints (:mod:`plugrl.state.checkpoint`) and the random
generators' states (:mod:`plugrl.state.rng`); and the seeds of what a run samples
(:mod:`plugrl.state.seeds`)."""
