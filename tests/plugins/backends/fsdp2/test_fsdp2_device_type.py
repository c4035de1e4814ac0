"""The fsdp2 backend makes its device mesh on the device's torch type, not its registered name."""

from __future__ import annotations

from types import SimpleNamespace

import plugrl_fsdp2.model as model


def test_the_mesh_is_made_on_the_torch_device_type(monkeypatch):
    made = []
    monkeypatch.setattr(
        model, "init_device_mesh", lambda kind, shape, **options: made.append((kind, shape))
    )
    device = SimpleNamespace(name="myxpu", torch_device_type="xpu")
    model.device_mesh(device, 4, -1)
    model.device_mesh(device, 4, 2)
    assert made == [("xpu", (4,)), ("xpu", (2, 2))]
