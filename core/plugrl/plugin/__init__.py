"""The plugin machinery: how plugins are found, what they register, and how a part is built.

* :mod:`plugrl.plugin.hookspecs`: the hooks a plugin implements (``register``, ``prepare_backend``,
  ...).
* :mod:`plugrl.plugin.manager`: the process's plugin manager, loaded from the ``plugrl`` entry
  points (:func:`~plugrl.plugin.manager.get_plugin_manager`).
* :mod:`plugrl.plugin.registry`: the kinds of part and the names registered for each.
* :mod:`plugrl.plugin.build`: one registered part, checked against its interface and built as
  ``cls(config, context)`` (:func:`~plugrl.plugin.build.build_part`).
"""
