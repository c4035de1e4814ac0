"""Shared test setup and fixtures: quiet Ray, no hub access, one torch thread per test module."""

import os

import pytest
import yaml

from tests import fake_parts

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# rollout.dtype auto is float32 on every CPU the tests run on, bfloat16 units or not: the
# tests compare engines with float32 references (those of bfloat16 set rollout.dtype)
os.environ["PLUGRL_CPU_BFLOAT16"] = "0"


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Run each test module on one intra-op torch thread, then restore the setting.

    The tiny models' operations are small: a second thread gains little, and when other
    processes keep the cores busy, threads waiting on each other make every operation many
    times slower.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Tiny models, tokenizers and data sets are built once per test session, whichever module or
# xdist worker asks first (plugrl_build_once): fixtures asking for the same builder and
# arguments share one folder, which no test may change.


@pytest.fixture(scope="session")
def sim_task(plugrl_build_once):
    """A tokenizer and prompts for runs of the simulated parts (``plugrl_sim``): real
    schedulers, the core's loop, no model."""
    from plugrl_sim.parts import build_sim_task

    return plugrl_build_once(build_sim_task, num_train=32, num_val=4)


@pytest.fixture(scope="session")
def tiny_task(plugrl_build_once):
    """The quickstart's untrained tiny model and arithmetic prompts (16 to train, 4 to
    validate) for runs of the real parts."""
    from plugrl_tools.quickstart.untrained import build_untrained_task

    return plugrl_build_once(build_untrained_task)


@pytest.fixture(scope="session")
def tiny_vl_model(plugrl_build_once):
    """A tiny Qwen2.5-VL-architecture model folder (the quickstart's tokenizer plus the vision
    tokens, the PIL image processor's config), built once per test session."""
    from plugrl_qwen2_vl.tiny import save_tiny_vl_model

    return plugrl_build_once(save_tiny_vl_model, seed=0, weight_std=0.1)


@pytest.fixture
def fake_parts_manager(plugrl_plugin_manager, plugrl_register_plugin):
    """The installed plugins plus ``tests.fake_parts``."""
    plugrl_register_plugin(fake_parts, "fake-parts")
    return plugrl_plugin_manager


@pytest.fixture
def write_recipe(tmp_path):
    """write_recipe(data, name="recipe.yaml") -> path; data is a dict or YAML text."""

    def write(data, name="recipe.yaml"):
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
        return path

    return write


@pytest.fixture(autouse=True, scope="session")
def shared_ray_stops_with_the_session():
    """Stop the test process's shared Ray (tests.support) when the session ends."""
    yield
    from tests.support import stop_shared_ray

    stop_shared_ray()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with end-to-end runs (a ``slow`` test) first, each kept whole and in its order.

    The suite's two test processes take one module at a time (xdist ``loadscope``, with
    ``--no-loadscope-reorder``): long modules started first leave the many short ones to even
    out the end, where a long run started last keeps one process busy while the other waits.
    """
    slow_files = {
        item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slow")
    }
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in slow_files)
