"""A run: the recipe's parts handed to the scheduler, and the loop around it.

* :mod:`plugrl.run.runner`: :func:`~plugrl.run.runner.run_recipe` and the
  :class:`~plugrl.run.runner.RunContext` a scheduler receives.
* :mod:`plugrl.run.loop`: the one run loop (resume, validation, logging, checkpoints).
* :mod:`plugrl.run.steps`: the pieces of a training step that schedulers share.
* :mod:`plugrl.run.metrics`: step metrics under verl's names.
* :mod:`plugrl.run.folder`: the run folder (recipe record, resume checks).
* :mod:`plugrl.run.sample_dump`: the samples a run writes for reading.
"""
