"""Built-in weight transports (``rollout.weight_transport``): ``local``, ``object_store`` and
``collective``.

Registration only; the classes are imported when a run uses them.
"""

from __future__ import annotations

import plugrl

_PKG = "plugrl.cluster.transports"


@plugrl.hookimpl
def register_weight_transports(register):
    register(
        "local",
        f"{_PKG}.buckets:LocalTransport",
        description="trainer and engine in one process: buckets of tensors handed over",
    )
    register(
        "object_store",
        f"{_PKG}.buckets:ObjectStoreTransport",
        requires=["ray"],
        install="pip install 'plugrl[ray]'",
        description="Ray's object store: each bucket put once by the trainer, fetched by engines",
    )
    register(
        "collective",
        f"{_PKG}.collective:CollectiveTransport",
        description="trainer rank 0 broadcasts buckets to the engines over the device's "
        "collective backend (nccl, hccl, gloo)",
    )
