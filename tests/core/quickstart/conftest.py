from __future__ import annotations

from support import one_torch_thread  # noqa: F401 (autouse: one torch thread here)
