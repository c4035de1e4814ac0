"""Shared test setup: quiet Ray, no hub access, shared helpers importable."""

import os
import sys
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).parent))

from support import importable_here

# shared test helpers (fake_parts, support) import as top-level modules
importable_here(Path(__file__).parent)
