"""With several ranks only rank 0 reads the weights; the others get their shards from it."""

import pytest
import torch
import torch.multiprocessing as mp

from plugrl.cluster.distributed import free_port
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    make_batch,
    plain_log_probs,
    rank_log_probs_worker,
)

pytestmark = pytest.mark.slow


def test_only_rank0_reads_the_weights_and_every_rank_computes_with_them(tiny_model, tmp_path):
    mp.spawn(
        rank_log_probs_worker,
        args=(2, free_port(), str(tiny_model), str(tmp_path)),
        nprocs=2,
        join=True,
    )
    expected, _ = plain_log_probs(tiny_model, make_batch(8))
    for rank in (0, 1):
        log_probs = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=0)


def test_rank0_without_the_loaded_model_is_refused():
    from plugrl.cluster.distributed import ensure_process_group
    from plugrl.parts.context import DistInfo
    from plugrl_cpu.device import CpuDevice
    from plugrl_fsdp2.model import fill_from_rank0

    ensure_process_group(CpuDevice(), DistInfo())  # this process is rank 0 of one
    with pytest.raises(ValueError, match=r"^rank 0 must pass the loaded model$"):
        fill_from_rank0(torch.nn.Linear(2, 2, device="meta"), None, torch.device("cpu"))
