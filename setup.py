"""Package discovery for the two source roots.

The core lives in ``core/plugrl`` (import name ``plugrl``); the built-in plugins live in
``plugins/`` (import name ``plugrl_plugins``); the ready recipes in ``recipes/`` are installed
as ``plugrl_recipes`` so that ``plugrl run NAME`` finds them anywhere. Folders under
``plugins/`` that are separate distributions (they have their own pyproject and no
``__init__.py``) are not picked up here.
"""

from setuptools import find_packages, setup

core_packages = ["plugrl", *(f"plugrl.{p}" for p in find_packages("core/plugrl"))]
builtin_packages = ["plugrl_plugins", *(f"plugrl_plugins.{p}" for p in find_packages("plugins"))]

setup(
    packages=[*core_packages, *builtin_packages, "plugrl_recipes"],
    package_dir={"plugrl": "core/plugrl", "plugrl_plugins": "plugins", "plugrl_recipes": "recipes"},
    package_data={"plugrl_recipes": ["*.yaml", "rewards/*.py"]},
)
