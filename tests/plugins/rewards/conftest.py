"""The reward fixtures (see rewards_testlib)."""

from tests.plugins.rewards.rewards_testlib import (  # noqa: F401 (fixtures)
    make_recipe,
    plugins,
    scorer_file,
    tokenizer,
)
