"""Package discovery for the source roots of the ``plugrl`` distribution.

* ``core/plugrl``: the core (import name ``plugrl``);
* ``tools/plugrl_tools``: the command line and the tools built on the core;
* ``plugins/<kind>/<name>/plugrl_<name>``: each built-in plugin, a package of its own, in the
  same shape as the plugins that are distributions of their own (those have a
  ``pyproject.toml`` in ``plugins/<kind>/<name>/`` and are not picked up here);
* ``recipes``: the ready recipes, installed as ``plugrl_recipes`` so that ``plugrl run NAME``
  finds them anywhere.
"""

from pathlib import Path

from setuptools import find_packages, setup

package_dir = {"plugrl": "core/plugrl", "plugrl_tools": "tools/plugrl_tools"}
for plugin_folder in sorted(Path("plugins").glob("*/*")):
    if (plugin_folder / "pyproject.toml").exists():
        continue  # a distribution of its own
    for package in plugin_folder.glob("plugrl_*/__init__.py"):
        package_dir[package.parent.name] = package.parent.as_posix()

packages = [
    sub
    for name, folder in package_dir.items()
    for sub in [name, *(f"{name}.{p}" for p in find_packages(folder))]
]
package_dir["plugrl_recipes"] = "recipes"

setup(
    packages=[*packages, "plugrl_recipes"],
    package_dir=package_dir,
    package_data={
        "plugrl": ["py.typed", "plan/shapes/*.json"],
        "plugrl_recipes": ["*.yaml", "rewards/*.py"],
    },
)
