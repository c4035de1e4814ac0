"""Errors a user can act on. The CLI prints them as one line, without a traceback."""

from __future__ import annotations


class PlugrlError(Exception):
    """Base of every error whose message alone tells the user what is wrong and how to fix it."""


class PluginError(PlugrlError):
    """A plugin is broken, missing, duplicated or cannot run here."""


class RecipeError(PlugrlError):
    """A recipe (YAML file or command-line override) is malformed or names something unknown.

    ``key`` is the dotted recipe key at fault, when there is one.
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)
        self.bare_message = message


class UnknownNameError(RecipeError, PluginError):
    """A recipe names a plugin part that is not registered."""


class DataError(PlugrlError):
    """The training or validation data does not fit the recipe (missing column, over-long row)."""


class CheckpointError(PlugrlError):
    """A checkpoint is missing, incomplete or corrupt."""


class ConvertError(PlugrlError):
    """A script given to ``plugrl convert`` cannot be read or holds no command to convert."""


class HealthError(PlugrlError):
    """A learning-health check found a run that trains without learning, and the recipe asked
    to stop on it (``trainer.health.mode: error``)."""
