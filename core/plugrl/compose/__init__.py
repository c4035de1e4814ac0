"""Composing a run from its recipe.

* :mod:`plugrl.plugin.build`: one registered part, checked against its interface and built as
  ``cls(config, context)`` (:func:`~plugrl.plugin.build.build_part`), and the algorithm parts
  built from their recipe keys (``build_estimator``, ``build_policy_loss``).
* :mod:`plugrl.compose.run_parts`: everything a recipe chose, built and checked up front
  (:func:`~plugrl.compose.run_parts.build_run_parts`), as
  :class:`~plugrl.compose.run_parts.RunParts`.
* :mod:`plugrl.plugin.boundaries`: what a reward manager or an estimator hands back, checked
  where the core receives it (:func:`~plugrl.plugin.boundaries.check_reward_output`,
  :func:`~plugrl.plugin.boundaries.check_estimator_output`).
"""
