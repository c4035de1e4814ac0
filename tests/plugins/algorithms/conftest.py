"""The algorithm fixtures (see algorithm_stand_ins)."""

from tests.algorithm_stand_ins import global_plugins, plugins, recipe_from  # noqa: F401 (fixtures)
