"""Parking storages in host memory and bringing them back (plugrl_megatron.offload), with torch
alone.

Without an accelerator the "device" is the CPU too. What the CPU tests prove: the device
storages are really emptied (zero bytes) and refilled in place, the bytes kept go to the
``host`` device given as an argument, tensors and views keep their identity and come back
bitwise, and storages on other devices than ``device`` are left alone. The copy across a bus
(CUDA memory to pinned host memory and back, and the device memory it releases) is the last
test's, which runs only where CUDA is.
"""

from __future__ import annotations

import pytest
import torch

from plugrl_megatron.offload import Offloader, optimizer_tensors, park, unpark

CPU = torch.device("cpu")


def test_parked_storages_are_emptied_kept_on_the_host_and_come_back_bitwise():
    buffer = torch.randn(10, generator=torch.Generator().manual_seed(0))
    first, second = buffer[:4].view(2, 2), buffer[4:]  # views sharing one storage
    alone = torch.randn(3, 3, dtype=torch.bfloat16)
    before = [t.clone() for t in (buffer, first, second, alone)]

    parked = park([first, second, alone], device=CPU, host=CPU)

    assert len(parked) == 2  # the shared storage once
    assert buffer.untyped_storage().nbytes() == alone.untyped_storage().nbytes() == 0
    assert [p.copy.device for p in parked] == [CPU, CPU]
    assert parked[0].copy.untyped_storage().data_ptr() != 0
    assert torch.equal(parked[0].copy.view(torch.float32), before[0])

    unpark(parked)
    for tensor, value in zip((buffer, first, second, alone), before, strict=True):
        assert torch.equal(tensor, value)
    first.add_(1.0)  # still views of one storage
    assert torch.equal(buffer[:4], before[0][:4] + 1.0)


def test_storages_not_kept_come_back_as_zeros_and_parked_ones_are_not_parked_twice():
    grads = torch.ones(6)
    parked = park([grads], device=CPU, host=CPU, keep=False)
    assert parked[0].copy is None and grads.untyped_storage().nbytes() == 0
    assert park([grads], device=CPU, host=CPU) == []  # already empty
    unpark(parked)
    assert torch.equal(grads, torch.zeros(6))


def test_only_storages_on_the_given_device_are_parked():
    weights = torch.ones(4)
    skipped = torch.ones(4)
    accelerator = torch.device("cuda", 0)  # nothing here lives there
    assert park([weights], device=accelerator, host=CPU) == []
    assert weights.untyped_storage().nbytes() == 16
    skip = {skipped.untyped_storage().data_ptr()}
    assert park([skipped], device=CPU, host=CPU, skip=skip) == []
    assert skipped.untyped_storage().nbytes() == 16


def adamw_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.arange(12.0).view(3, 4)).square().sum().backward()
    optimizer.step()


def test_an_update_after_a_round_trip_equals_the_update_without_it():
    torch.manual_seed(0)
    plain = torch.nn.Linear(4, 4)
    offloaded = torch.nn.Linear(4, 4)
    offloaded.load_state_dict(plain.state_dict())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (plain, offloaded)]
    offloader = Offloader(
        {
            "params": offloaded.parameters,
            "grads": lambda: [p.grad for p in offloaded.parameters() if p.grad is not None],
            "optimizer": lambda: optimizer_tensors(optimizers[1]),
        },
        model_params=offloaded.parameters,
        device=CPU,
        host=CPU,
    )
    offloader.offload()
    # no gradients nor optimizer state yet: those parked after the first step
    assert {part: len(parked) for part, parked in offloader.parked.items()} == {
        "params": 2,
        "grads": 0,
        "optimizer": 0,
    }
    for _ in range(3):
        adamw_step(plain, optimizers[0])
        with offloader.resident("params", "grads", "optimizer"):
            with offloader.resident("params"):  # nested: the outer block owns them
                pass
            assert offloaded.weight.untyped_storage().nbytes() == 64
            adamw_step(offloaded, optimizers[1])
        assert set(offloader.parked) == {"params", "grads", "optimizer"}
        assert offloaded.weight.untyped_storage().nbytes() == 0
        # the optimizer's parameters are the model's: parked with the parameters, not twice
        moments = [s["exp_avg"] for s in optimizers[1].state.values()]
        assert all(m.untyped_storage().nbytes() == 0 for m in moments)
        assert len(offloader.parked["optimizer"]) == 3 * len(moments)  # exp_avg(_sq), step
    offloader.reload()
    for mine, theirs in zip(offloaded.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    for mine, theirs in zip(
        optimizers[1].state.values(), optimizers[0].state.values(), strict=True
    ):
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_the_optimizer_part_leaves_the_model_s_parameters_to_the_parameters_part():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    adamw_step_2d(model, optimizer)
    offloader = Offloader(
        {"optimizer": lambda: optimizer_tensors(optimizer)},
        model_params=model.parameters,
        device=CPU,
        host=CPU,
    )
    offloader.offload()
    assert model.weight.untyped_storage().nbytes() == 16
    assert optimizer.state[model.weight]["exp_avg"].untyped_storage().nbytes() == 0
    offloader.reload()
    assert offloader.parked == {}


def adamw_step_2d(model, optimizer):
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()


def test_megatron_s_wrapped_and_chained_optimizers_are_looked_into():
    class Wrapped:  # megatron's optimizers hold a torch optimizer in .optimizer
        def __init__(self, optimizer):
            self.optimizer = optimizer

    class Chained:
        def __init__(self, *optimizers):
            self.chained_optimizers = list(optimizers)

    weights = [torch.nn.Parameter(torch.ones(2)) for _ in range(2)]
    inner = [torch.optim.SGD([w], lr=0.1) for w in weights]
    found = list(optimizer_tensors(Chained(Wrapped(inner[0]), Wrapped(inner[1]), Wrapped(None))))
    assert [id(t) for t in found] == [id(w) for w in weights]


def test_an_unknown_part_is_named():
    with pytest.raises(ValueError, match=r"cannot offload \['weights'\]; the parts are"):
        Offloader({"weights": list}, model_params=list, device=CPU, host=CPU)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_on_cuda_the_device_memory_is_released_and_the_bytes_come_back_from_pinned_host_memory():
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    plain = torch.nn.Linear(1024, 1024, device=device)
    offloaded = torch.nn.Linear(1024, 1024, device=device)
    offloaded.load_state_dict(plain.state_dict())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (plain, offloaded)]
    offloader = Offloader(
        {
            "params": offloaded.parameters,
            "grads": lambda: [p.grad for p in offloaded.parameters() if p.grad is not None],
            "optimizer": lambda: optimizer_tensors(optimizers[1]),
        },
        model_params=offloaded.parameters,
        device=device,
        host=CPU,
        empty_cache=torch.cuda.empty_cache,
    )
    inputs = torch.randn(8, 1024, device=device)

    def step(model, optimizer):
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()

    offloader.offload()
    for _ in range(3):
        step(plain, optimizers[0])
        with offloader.resident("params", "grads", "optimizer"):
            step(offloaded, optimizers[1])
            held = torch.cuda.memory_allocated(device)
        released = torch.cuda.memory_allocated(device)
        # the 4 MiB weight, its gradient and its two moments left the device (and the bias's)
        assert held - released >= 4 * 4 * 2**20
        copies = [
            p.copy for parked in offloader.parked.values() for p in parked if p.copy is not None
        ]
        assert copies and all(c.device == CPU and c.is_pinned() for c in copies)
    offloader.reload()
    for mine, theirs in zip(offloaded.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    for mine, theirs in zip(
        optimizers[1].state.values(), optimizers[0].state.values(), strict=True
    ):
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
