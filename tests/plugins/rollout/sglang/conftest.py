import importlib.util
import sys
from pathlib import Path

from support import importable_here

importable_here(Path(__file__).parent)
if importlib.util.find_spec("plugrl_sglang") is None:
    # CI installs the distribution (pip install ./plugins/rollout/sglang); without it, test
    # the source folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "plugins" / "rollout" / "sglang"))
