import os
from pathlib import Path

from support import importable_here

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
importable_here(Path(__file__).parent)
# the counting engine lives with the engine-group tests
importable_here(Path(__file__).parents[2] / "core" / "cluster")
