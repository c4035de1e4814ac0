"""Plans of a 7B recipe on 8 devices for the plugins' memory-term tests: Qwen2.5-7B
(h=3584, a=3584, k=512, i=18944, V=152064, L=28, P=7,615,616,512), 8 ranks on Ray."""

from __future__ import annotations

from plugrl.plan import GIB, Plan, plan_recipe
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import load_recipe

P7B = 7_615_616_512
BASE_7B = [
    "model.path=qwen2.5-7b",
    "cluster=ray",
    "trainer.n_gpus_per_node=8",
    "data.train_batch_size=64",
    "data.max_prompt_length=512",
    "data.max_response_length=1536",
    "actor.ppo_mini_batch_size=16",
    "actor.ppo_micro_batch_size_per_gpu=2",
    "rollout.n=8",
]


def plan_7b(*overrides: str, device_memory: int | None = 80 * GIB) -> Plan:
    plugins = get_plugin_manager()
    recipe = load_recipe(None, [*BASE_7B, *overrides], plugins, runnable_here=False)
    return plan_recipe(recipe, device_memory, plugins)


def terms(plan: Plan, role: str, phase: str = "update", devices: str = "trainer") -> dict:
    """Every term of ``role`` in ``phase``, the instants' included, by name."""
    estimate = plan.phase(devices, phase)
    everything = estimate.persistent + tuple(t for ts in estimate.instants.values() for t in ts)
    return {t.name: t.bytes for t in everything if t.role == role}
