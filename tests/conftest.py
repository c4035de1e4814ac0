"""Shared test setup: quiet Ray, no hub access."""

import os
import sys
from pathlib import Path

# shared test helpers (fake_parts) import as top-level modules
sys.path.insert(0, str(Path(__file__).parent))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
