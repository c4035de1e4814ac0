"""Composing a run from its recipe: everything a recipe chose, built and checked up front
(:func:`~plugrl.compose.run_parts.build_run_parts`), as
:class:`~plugrl.compose.run_parts.RunParts`.

One part is built by the construction door, :func:`plugrl.plugin.build.build_part`; what a
reward manager or an estimator hands back is checked by :mod:`plugrl.plugin.boundaries`.
"""
