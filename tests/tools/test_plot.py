import json
import subprocess
import sys

import pytest

from plugrl.errors import PlugrlError
from plugrl_tools.plot import plot_run


def test_plot_writes_a_png_from_metrics(tmp_path):
    with (tmp_path / "metrics.jsonl").open("w") as file:
        for step in range(1, 6):
            record = {"step": step, "critic/score/mean": step / 10}
            if step % 2 == 1:
                record["val-core/plugrl/arithmetic/acc/mean@1"] = step / 6
            file.write(json.dumps(record) + "\n")
        file.write('{"step": 6, "crit')  # cut by a kill
    path = plot_run(tmp_path)
    assert path == tmp_path / "progress.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "plugrl_tools.cli",
            "plot",
            str(tmp_path),
            "-o",
            str(tmp_path / "again.png"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and (tmp_path / "again.png").exists()


def test_plot_errors(tmp_path):
    with pytest.raises(PlugrlError, match=r"metrics.jsonl not found: is .* a plugrl run folder"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "other": 2}\n')
    with pytest.raises(PlugrlError, match="has no critic/score/mean or val-core accuracy"):
        plot_run(tmp_path)
