"""Freeze verl's loss aggregation of a few fixed batches into ``data/verl_agg_loss.json``, which
``test_fsdp2_loss_scale.py`` reads to check that the fsdp2 backend's ``LossScale`` makes
plugrl's aggregation give verl's values (``seq-mean-token-sum-norm`` above all).

Not a test and not run in CI: verl is not a dependency of plugrl. Rerun it by hand after
changing the batches below, against verl 0.9.1 installed without its dependencies::

    pip install --no-deps --target /tmp/verl-0.9.1 verl==0.9.1 codetiming hydra-core \\
        omegaconf antlr4-python3-runtime==4.9.3 dill pylatexenc tensordict pyvers \\
        cloudpickle orjson
    PYTHONPATH=/tmp/verl-0.9.1 python tests/plugins/backends/fsdp2/freeze_verl_agg_loss.py

verl pads every response to ``data.max_response_length`` (its rollout does), so the batches
are given to ``verl.trainer.ppo.core_algos.agg_loss`` at that width, whole (one rank, one
micro-batch), with ``loss_scale_factor`` unset (verl's default) or set.
"""

from __future__ import annotations

import json
from pathlib import Path

OUTPUT = Path(__file__).parent / "data" / "verl_agg_loss.json"
VERL_VERSION = "0.9.1"
MAX_RESPONSE_LENGTH = 16

# response lengths of each batch (0: an empty response); the longest differs between batches
BATCHES = {
    "long": [5, 1, 0, 3, 11, 2],
    "short": [2, 3, 1, 3],
}
MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean")
SUM_NORM = "seq-mean-token-sum-norm"
FACTORS = (None, 1000, 7)


def main() -> None:
    import torch
    import verl
    from verl.trainer.ppo.core_algos import agg_loss

    if verl.__version__ != VERL_VERSION:
        raise SystemExit(f"found verl {verl.__version__}; freeze against {VERL_VERSION}")
    generator = torch.Generator().manual_seed(0)
    batches = {}
    cases = []
    for name, lengths in BATCHES.items():
        rows = len(lengths)
        loss_mat = torch.randn(rows, MAX_RESPONSE_LENGTH, generator=generator)
        mask = torch.zeros(rows, MAX_RESPONSE_LENGTH)
        for row, length in enumerate(lengths):
            mask[row, :length] = 1
        batches[name] = {"lengths": lengths, "loss_mat": loss_mat.tolist()}
        runs = [(mode, None) for mode in MODES] + [(SUM_NORM, factor) for factor in FACTORS]
        for mode, factor in runs:
            value = agg_loss(loss_mat, mask, mode, loss_scale_factor=factor)
            cases.append(
                {"batch": name, "mode": mode, "loss_scale_factor": factor, "value": float(value)}
            )
    frozen = {
        "verl_version": VERL_VERSION,
        "made_by": "tests/plugins/backends/fsdp2/freeze_verl_agg_loss.py",
        "max_response_length": MAX_RESPONSE_LENGTH,
        "batches": batches,
        "cases": cases,
    }
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(json.dumps(frozen, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {OUTPUT}")


if __name__ == "__main__":
    main()
