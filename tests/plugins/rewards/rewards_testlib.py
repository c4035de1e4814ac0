"""Helpers shared by the reward tests (the core's scoring and workers, the reward plugins): a
character tokenizer, batches in the scheduler's column layout, and the fixtures their
conftests take from here: recipes built through the real recipe code with stand-ins for the
non-reward parts, a tokenizer, files holding scoring functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from plugrl.data.batch import Batch
from plugrl.plugin.manager import PluginManager, set_plugin_manager
from plugrl.recipe import build_recipe
from tests.plugins.rewards import rewards_stub_parts

PAD = 0
EOS = 1  # a special token: decoding must skip it


class CharTokenizer:
    """One token per character (id = code point + 2); ids 0 and 1 are pad and eos."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 2 for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        special = {PAD: "<pad>", EOS: "<eos>"}
        return "".join(
            ("" if skip_special_tokens else special[i]) if i in special else chr(i - 2) for i in ids
        )


def make_batch(
    tokenizer: CharTokenizer,
    texts: Sequence[str],
    data_sources: Sequence[str] | str,
    ground_truths: Sequence[Any],
    *,
    width: int | None = None,
    eos: bool = True,
) -> Batch:
    """Right-padded ``responses`` and ``response_mask`` (an eos token ends each response, as
    generation leaves it) plus the non-tensor columns a reward manager reads."""
    encoded = [tokenizer.encode(t) + ([EOS] if eos else []) for t in texts]
    width = width or max([len(e) for e in encoded] + [1])
    responses = torch.full((len(texts), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(texts), width), dtype=torch.long)
    for row, ids in enumerate(encoded):
        ids = ids[:width]
        responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[row, : len(ids)] = 1
    if isinstance(data_sources, str):
        data_sources = [data_sources] * len(texts)
    return Batch(
        tensors={"responses": responses, "response_mask": mask},
        columns={
            "data_source": list(data_sources),
            "ground_truth": list(ground_truths),
            "extra_info": [{"index": i} for i in range(len(texts))],
        },
    )


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture
def plugins():
    """The installed built-in plugins plus stand-ins for the non-reward parts."""
    manager = PluginManager(environ={"PLUGRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    manager.load_entry_points()
    manager.register(rewards_stub_parts, "rewards-test-stubs")
    previous = set_plugin_manager(manager)
    yield manager
    set_plugin_manager(previous)


STUB_SECTIONS = {
    "device": {"name": "cpu"},
    "actor": {
        "backend": "rewards_test_backend",
        "policy_loss": "rewards_test_loss",
        "kl_loss_type": "rewards_test_kl",
    },
    "rollout": {"engine": "rewards_test_engine"},
    "algorithm": {"adv_estimator": "rewards_test_estimator", "kl_penalty": "rewards_test_kl"},
    "scheduler": {"name": "rewards_test_scheduler"},
}


@pytest.fixture
def make_recipe(plugins) -> Callable[..., Any]:
    """make_recipe(reward={...}, max_response_length=...) -> a validated Recipe."""

    def make(reward: dict[str, Any] | None = None, max_response_length: int = 64) -> Any:
        raw = {**STUB_SECTIONS, "reward": reward or {}}
        raw["data"] = {"max_response_length": max_response_length}
        return build_recipe(raw, plugins)

    return make


@pytest.fixture
def scorer_file(tmp_path) -> Callable[[str, str], Path]:
    """scorer_file(code, name="reward.py") -> path of a Python file holding ``code``."""

    def write(code: str, name: str = "reward.py") -> Path:
        path = tmp_path / name
        path.write_text(code, encoding="utf-8")
        return path

    return write
