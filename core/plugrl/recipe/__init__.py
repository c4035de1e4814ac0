"""Recipes: YAML files (plus ``a.b.c=value`` overrides) read into attrs config classes.

A recipe has one section per part. Sections whose part is chosen by a plugin (``device``,
``actor``, ``rollout``, ``reward``, ``scheduler``) are read into the chosen plugin's config
class, which extends the core's base class for that section; the core owns the others. Every
error is a :class:`~plugrl.errors.RecipeError` with a one-line message that names the key and
the fix.

The modules, one concern each:

* :mod:`~plugrl.recipe.sections`: the core's sections and :class:`Recipe`;
* :mod:`~plugrl.recipe.composition`: reading YAML, ``defaults``, overrides, shipped recipes;
* :mod:`~plugrl.recipe.build`: a :class:`Recipe` from a mapping, with the plugins' sections,
  names and options checked;
* :mod:`~plugrl.recipe.checks`: settings of one section that contradict another;
* :mod:`~plugrl.recipe.paths`: the options that hold paths, made absolute in the driver;
* :mod:`~plugrl.recipe.explaining`: ``plugrl explain``;
* :mod:`~plugrl.recipe.verl_names`: verl's name of each key, the installed plugins' included.

Reading a mapping into a config class, and its one-line errors, is :mod:`plugrl.config.structuring`.
The kinds of part, and which recipe key chooses each, are :data:`plugrl.plugin.registry.PART_KINDS`.
"""

from plugrl.plugin.build import part_args
from plugrl.recipe.build import (
    build_recipe,
    iter_options,
    load_recipe,
    read_section,
    section_class,
    validate_names,
)
from plugrl.recipe.checks import check_recipe
from plugrl.recipe.composition import (
    apply_overrides,
    compose_file,
    deep_merge,
    find_recipe,
    normalize_shorthand,
    parse_override,
    read_yaml,
    shipped_recipes,
)
from plugrl.recipe.explaining import KeyInfo, explain
from plugrl.recipe.paths import PathOption, path_keys, path_options, resolve_paths
from plugrl.recipe.sections import ClusterConfig, DataConfig, ModelConfig, Recipe, TrainerConfig
from plugrl.recipe.verl_names import VerlName, verl_names

__all__ = [
    "ClusterConfig",
    "DataConfig",
    "KeyInfo",
    "ModelConfig",
    "PathOption",
    "Recipe",
    "TrainerConfig",
    "VerlName",
    "apply_overrides",
    "build_recipe",
    "check_recipe",
    "compose_file",
    "deep_merge",
    "explain",
    "find_recipe",
    "iter_options",
    "load_recipe",
    "normalize_shorthand",
    "parse_override",
    "part_args",
    "path_keys",
    "path_options",
    "read_section",
    "read_yaml",
    "resolve_paths",
    "section_class",
    "shipped_recipes",
    "validate_names",
    "verl_names",
]
