import math

import pytest

from plugrl.parts.backend import OptimConfig
from plugrl_plugins.backends.fsdp2.optim import LRSchedule, lr_schedule


def test_constant_with_warmup():
    schedule = LRSchedule("constant", warmup_steps=4, total_steps=10)
    assert [schedule(step) for step in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_decays_to_the_floor():
    schedule = LRSchedule("cosine", warmup_steps=2, total_steps=12, min_lr_ratio=0.1)
    assert schedule(1) == 0.5
    assert schedule(2) == pytest.approx(1.0)
    assert schedule(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert schedule(12) == pytest.approx(0.1)
    assert schedule(20) == pytest.approx(0.1)


def test_warmup_ratio_applies_when_steps_are_unset():
    config = OptimConfig(lr=1.0, lr_warmup_steps=-1, lr_warmup_steps_ratio=0.25)
    assert lr_schedule(config, total_steps=20).warmup_steps == 5
    config = OptimConfig(lr=1.0, lr_warmup_steps=3, lr_warmup_steps_ratio=0.25)
    assert lr_schedule(config, total_steps=20).warmup_steps == 3
