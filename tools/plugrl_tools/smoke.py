"""The harness of the smoke scripts that check a whole run on a real accelerator
(``python -m plugrl_cuda.smoke``, ``plugrl_npu.smoke``, ``plugrl_sglang.smoke``,
``plugrl_megatron.smoke``): so that each prints its checks, runs ``plugrl run`` and judges a
step's metrics the same way.

* :func:`check` runs one check and prints one ``PASS name: detail`` or ``FAIL name: why``
  line; a check fails by raising :class:`SmokeFailure`.
* :func:`parse_run_arguments` gives a script the arguments of a short run and its folder.
* :func:`run_plugrl` runs ``plugrl run`` in a fresh process; :func:`run_quickstart` runs a few
  GRPO steps of the quickstart that way, :func:`grpo_recipe` is a recipe of a few GRPO steps
  with a KL loss on :func:`~plugrl_tools.quickstart.untrained.build_untrained_task`'s task.
* :func:`check_step` and :func:`each_step` judge the metrics a run logged.

Plain functions, not a pytest plugin (that is :mod:`plugrl.testing`): the scripts run on
accelerator machines where pytest need not be installed.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugrl_tools.quickstart.untrained import UntrainedTask


class SmokeFailure(Exception):
    """A check did not hold; the message says what was seen."""


def check(name: str, body: Callable[[], str]) -> bool:
    """Run ``body`` and print ``PASS name: <what it returned>`` (just ``PASS name`` when that
    is empty), or ``FAIL name: <message>`` when it raises :class:`SmokeFailure`; whether it
    passed. Any other exception propagates: it is a bug of the script, not a failed check."""
    try:
        detail = body()
    except SmokeFailure as exc:
        print(f"FAIL {name}: {exc}", flush=True)
        return False
    print(f"PASS {name}{f': {detail}' if detail else ''}", flush=True)
    return True


def parse_run_arguments(
    parser: argparse.ArgumentParser, argv: list[str] | None, *, prefix: str
) -> tuple[argparse.Namespace, Path]:
    """Add the arguments of a short run (``--steps``, ``--workdir``, ``--timeout``) to
    ``parser``, after the script's own; parse ``argv`` and create the work folder (by default
    a new temporary one named ``prefix...``)."""
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps (default: 2)")
    parser.add_argument("--workdir", default=None, help="default: a new temporary folder")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the run")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    return args, workdir


def run_plugrl(
    recipe: str | Path, *overrides: str, cwd: Path | None = None, timeout: float | None = 900
) -> str:
    """``plugrl run recipe overrides...`` in a fresh process (in ``cwd``, by default the
    recipe file's folder); its stderr, or a :class:`SmokeFailure` with the end of it when it
    fails or runs past ``timeout`` seconds (None: no limit)."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "plugrl_tools.cli", "run", str(recipe), *overrides],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=Path(recipe).parent if cwd is None else cwd,
        )
    except subprocess.TimeoutExpired:
        raise SmokeFailure(f"plugrl run {Path(recipe).name} took over {timeout:.0f} s") from None
    if result.returncode != 0:
        raise SmokeFailure(f"plugrl run exited {result.returncode}: {result.stderr[-2000:]}")
    return result.stderr


def run_quickstart(
    workdir: Path, run_dir: Path, steps: int, *overrides: str, timeout: float | None
) -> str:
    """``steps`` GRPO steps of ``plugrl run quickstart`` in a fresh process, on the
    quickstart's model and data (built in ``workdir/assets``, nothing is downloaded), with
    ``overrides`` (the device, engine or backend under test): no validation, checkpoint or
    export, metrics in ``run_dir/metrics.jsonl``. Its stderr, as :func:`run_plugrl`."""
    from plugrl_tools.quickstart import prepare_quickstart, quickstart_overrides

    paths = prepare_quickstart(workdir / "assets")
    return run_plugrl(
        "quickstart",
        *quickstart_overrides(paths),
        *overrides,
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.export_hf=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
        cwd=workdir,
        timeout=timeout,
    )


def grpo_recipe(task: UntrainedTask, device: str, run_dir: Path, **sections: Any) -> dict[str, Any]:
    """A recipe of GRPO with a KL loss on ``task``: 4 prompts x 2 responses of at most 16
    tokens a step, float32, on one rank of ``device``, metrics in ``run_dir``. Each of
    ``sections`` updates the section it names (see :func:`merge_sections`)."""
    recipe = {
        **task.recipe_sections(max_response_length=16),
        "device": device,
        "actor": {
            "ppo_mini_batch_size": 4,
            "use_kl_loss": True,
            "kl_loss_coef": 0.1,
            "optim": {"lr": 1e-4},
        },
        "rollout": {"n": 2},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"default_local_dir": str(run_dir), "logger": ["jsonl"], "seed": 1},
        "cluster": "local",
    }
    return merge_sections(recipe, sections)


def merge_sections(recipe: dict[str, Any], sections: Mapping[str, Any]) -> dict[str, Any]:
    """``recipe`` with each of ``sections`` merged in: a mapping updates the keys it names of
    a section that is a mapping, anything else replaces the section."""
    merged = dict(recipe)
    for name, values in sections.items():
        if isinstance(values, Mapping) and isinstance(merged.get(name), Mapping):
            merged[name] = {**merged[name], **values}
        else:
            merged[name] = values
    return merged


def check_step(
    record: Mapping[str, Any] | None, step: int, metrics: Iterable[str], *, where: str = ""
) -> Mapping[str, Any]:
    """``record``, the metrics logged at ``step``, when it exists, each of ``metrics`` in it
    is a finite number and it has a gradient (``actor/grad_norm`` above 0); else a
    :class:`SmokeFailure` naming the step (and ``where``, e.g. ``" in RUN_DIR"``)."""
    if record is None:
        raise SmokeFailure(f"no metrics for step {step}{where}")
    for name in metrics:
        value = record.get(name)
        # the jsonl logger writes NaN and infinity as strings
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SmokeFailure(f"step {step}: {name} is {value!r}")
    if not record.get("actor/grad_norm", 0) > 0:
        raise SmokeFailure(f"step {step}: no gradient (actor/grad_norm is 0)")
    return record


def each_step(
    records: Iterable[Mapping[str, Any]],
    steps: Iterable[int],
    metrics: Iterable[str],
    *,
    where: str = "",
) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """``(step, record)`` for each of ``steps``, in order, each record passed by
    :func:`check_step` (a step logged twice counts with its last record)."""
    by_step = {record["step"]: record for record in records}
    metrics = tuple(metrics)
    for step in steps:
        yield step, check_step(by_step.get(step), step, metrics, where=where)
