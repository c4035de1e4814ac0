"""The simulated parts behave as their interfaces say, so what a scheduler measures on them is
the scheduler's doing."""

import asyncio
import json
import time

import pytest
import torch
import yaml

import plugrl_sim
from plugrl.errors import CheckpointError, PluginError, PlugrlError
from plugrl.parts.context import DistInfo
from plugrl.parts.rollout import GenerationRequest, SamplingParams, WeightMeta
from plugrl.plugin.manager import get_plugin_manager
from plugrl.testing import make_batch, part_context
from plugrl_sim.parts import (
    SimBackend,
    SimBackendConfig,
    SimEngine,
    SimEngineConfig,
    sim_recipe,
    sim_weights,
)


def engine(**options):
    defaults = {"sim_step_ms": 1.0, "sim_token_ms": 0.0, "sim_devices": 1}
    return SimEngine(SimEngineConfig(**{**defaults, **options}), part_context())


def request(request_id="r", n=2, max_tokens=64, seed=3):
    params = SamplingParams(n=n, max_tokens=max_tokens, seed=seed)
    return GenerationRequest(request_id=request_id, prompt_ids=[5, 6, 7], params=params)


async def until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


def push(sim, version, weights):
    async def update():
        metas = [WeightMeta(name, t.shape, "float32") for name, t in weights.items()]
        await sim.begin_weight_update(version, metas)
        await sim.load_weights(list(weights.items()))
        await sim.finish_weight_update()

    return update()


def test_lengths_are_long_tailed_and_seeded():
    async def main():
        sim = engine(sim_step_ms=0.0, sim_long_fraction=0.1, sim_median_length_fraction=0.1)
        out = await sim.generate_request(request(n=300, max_tokens=100, seed=11))
        again = await engine(
            sim_step_ms=0.0, sim_long_fraction=0.1, sim_median_length_fraction=0.1
        ).generate_request(request(n=300, max_tokens=100, seed=11))
        return out, again

    out, again = asyncio.run(main())
    lengths = [len(c.token_ids) for c in out]
    assert lengths == [len(c.token_ids) for c in again]
    assert [c.token_ids for c in out] == [c.token_ids for c in again]
    at_max = sum(length == 100 for length in lengths) / len(lengths)
    assert 0.05 < at_max < 0.16
    short = sorted(length for length in lengths if length < 100)
    assert 5 <= short[len(short) // 2] <= 20  # the median of the rest is about 10% of the max
    for completion in out:
        assert completion.finish_reason == (
            "length" if len(completion.token_ids) == 100 else "stop"
        )
        assert (
            len(completion.log_probs) == len(completion.token_versions) == len(completion.token_ids)
        )
        assert all(lp < 0 for lp in completion.log_probs)
        assert set(completion.token_versions) == {0}
    assert sorted(c.sample_index for c in out) == list(range(300))


def test_pause_keep_holds_requests_and_they_continue_with_the_new_version():
    async def main():
        sim = engine(sim_long_fraction=1.0)  # every sample runs to max_tokens
        task = asyncio.create_task(sim.generate_request(request(max_tokens=40)))
        await until(lambda: sim.tokens_generated >= 10)
        await sim.pause("keep")
        held = sim.tokens_generated
        await asyncio.sleep(0.03)
        assert sim.tokens_generated == held, "tokens were sampled while paused"
        assert not task.done()
        new = {name: t + 1 for name, t in sim.weights.items()}
        await push(sim, 1, new)
        assert sim.weight_version == 1
        assert all(torch.equal(sim.weights[name], t) for name, t in new.items())
        await sim.resume()
        return await task

    for completion in asyncio.run(main()):
        versions = completion.token_versions
        assert len(completion.token_ids) == 40 and completion.finish_reason == "length"
        assert versions[0] == 0 and versions[-1] == 1
        assert versions == sorted(versions)  # old tokens kept, new ones with the new weights
        assert completion.weight_version == 1


def test_abort_returns_the_tokens_so_far():
    async def main():
        sim = engine(sim_long_fraction=1.0)
        task = asyncio.create_task(sim.generate_request(request("a", max_tokens=200)))
        other = asyncio.create_task(sim.generate_request(request("b", max_tokens=5)))
        await until(lambda: sim.tokens_generated >= 12)
        await sim.abort(["a", "unknown"])
        return await task, await other

    aborted, finished = asyncio.run(main())
    for completion in aborted:
        assert completion.finish_reason == "aborted"
        assert 0 < len(completion.token_ids) < 200
        assert len(completion.log_probs) == len(completion.token_ids)
    assert all(c.finish_reason == "length" for c in finished)


def test_pause_abort_ends_everything_in_flight_and_new_requests_wait():
    async def main():
        sim = engine(sim_long_fraction=1.0, max_num_seqs=2)
        running = asyncio.create_task(sim.generate_request(request("a", n=2, max_tokens=500)))
        queued = asyncio.create_task(sim.generate_request(request("b", n=2, max_tokens=500)))
        await until(lambda: sim.tokens_generated >= 6)
        await sim.pause("abort")
        first, second = await running, await queued
        later = asyncio.create_task(sim.generate_request(request("c", n=1, max_tokens=3)))
        await asyncio.sleep(0.02)
        assert not later.done(), "a request ran while paused"
        await sim.resume()
        return first, second, await later

    first, second, later = asyncio.run(main())
    assert all(c.finish_reason == "aborted" and c.token_ids for c in first)
    # admitted nowhere (two sequences per device): aborted before its first token
    assert all(c.finish_reason == "aborted" and not c.token_ids for c in second)
    assert len(later[0].token_ids) == 3


def test_sleeping_engine_waits_and_level_2_needs_weights():
    async def main():
        sim = engine()
        await sim.sleep(level=2)
        task = asyncio.create_task(sim.generate_request(request(max_tokens=4)))
        await asyncio.sleep(0.02)
        await sim.wake_up()
        await asyncio.sleep(0.02)
        assert not task.done(), "generated with the weights dropped by sleep(level=2)"
        await push(sim, 3, sim_weights(0))
        return await task

    assert {c.weight_version for c in asyncio.run(main())} == {3}


def test_weight_updates_are_checked():
    async def main():
        sim = engine()
        with pytest.raises(PluginError, match="announced 'extra', which the sim engine"):
            await sim.begin_weight_update(1, [WeightMeta("extra", (2,), "float32")])
        with pytest.raises(PluginError, match=r"did not announce lm_head\.weight"):
            metas = [
                WeightMeta(name, t.shape, "float32")
                for name, t in sim.weights.items()
                if name != "lm_head.weight"
            ]
            await sim.begin_weight_update(1, metas)
        with pytest.raises(RuntimeError, match="without begin_weight_update"):
            await sim.load_weights([])
        metas = [WeightMeta(name, t.shape, "float32") for name, t in sim.weights.items()]
        await sim.begin_weight_update(1, metas)
        await sim.load_weights([(n, t) for n, t in sim.weights.items() if n != "lm_head.weight"])
        with pytest.raises(PluginError, match=r"finish_weight_update: lm_head.weight did not "):
            await sim.finish_weight_update()
        assert sim.weight_version == 0

    asyncio.run(main())


def test_throughput_scales_with_simulated_devices():
    def seconds(devices):
        async def main():
            sim = engine(
                sim_step_ms=1.0, sim_token_ms=3.0, sim_long_fraction=1.0, sim_devices=devices
            )
            started = time.perf_counter()
            await asyncio.gather(
                *(sim.generate_request(request(f"r{i}", n=1, max_tokens=25)) for i in range(4))
            )
            return time.perf_counter() - started

        return asyncio.run(main())

    # four sequences of 25 tokens: 25 steps of 13 ms on one device, of 4 ms on four
    one, four = seconds(1), seconds(4)
    assert one > 2.0 * four, (one, four)


def backend(recipe=None, **options):
    defaults = {"sim_forward_ms_per_ktoken": 0.0, "sim_train_ms_per_ktoken": 0.0}
    config = SimBackendConfig(**{**defaults, **options})
    sim = SimBackend(config, part_context(recipe, role="actor", device=object(), dist=DistInfo()))
    sim.setup(1)
    return sim


def test_backend_trains_its_offset_through_the_objective(plugrl_recipe):
    from plugrl.algorithms.objective import PolicyObjective

    recipe = plugrl_recipe({"actor.ppo_mini_batch_size": 2, "data.train_batch_size": 2})
    sim = backend(recipe, ppo_mini_batch_size=2)
    sim.config.optim.lr = 0.5
    batch = make_batch(advantages=[1.0, 1.0, 1.0, 1.0], log_probs=True)
    before = sim.weights["model.norm.weight"].clone()
    metrics = sim.update_policy(batch, PolicyObjective.from_recipe(recipe, get_plugin_manager()))
    # positive advantages raise the log-probability of the sampled tokens
    assert sim.shift > 0
    assert "actor/pg_loss" in metrics and metrics["actor/grad_norm"] > 0
    assert not torch.equal(sim.weights["model.norm.weight"], before)
    log_probs = sim.compute_log_prob(batch)["log_probs"]
    mask = batch["response_mask"].bool()
    assert torch.allclose(log_probs[mask], batch["rollout_log_probs"][mask] + sim.shift)
    metas = sim.weight_metadata()
    assert [m.name for m in metas] == [name for name, _ in sim.named_weights()]
    assert {m.dtype for m in metas} == {"float32"}


def test_backend_checkpoints(tmp_path):
    sim = backend()
    sim.shift = 0.25
    sim.save_checkpoint(tmp_path / "actor")
    other = backend()
    other.load_checkpoint(tmp_path / "actor")
    assert other.shift == 0.25
    with pytest.raises(CheckpointError, match=r"sim_backend\.pt is missing"):
        other.load_checkpoint(tmp_path / "nothing")
    with pytest.raises(PlugrlError, match=r"set trainer\.export_hf=false"):
        other.export_hf(tmp_path / "hf")


# ------------------------------------------------------------------ a run of the sync scheduler


def read(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sync_run_logs_wall_clock_and_keeps_it_across_resume(
    sim_task, tmp_path, plugrl_recipe, plugrl_register_plugin, plugrl_plugin_manager
):
    from plugrl.run.runner import run_recipe

    plugrl_register_plugin(plugrl_sim, "plugrl-sim")
    data = sim_recipe(sim_task, tmp_path / "run", train_batch_size=4, n=2, steps=2)
    data["data"]["max_response_length"] = 32
    data["trainer"].update(save_freq=1, test_freq=2, val_before_train=True)
    run_recipe(plugrl_recipe(data), plugrl_plugin_manager)
    first = read(tmp_path / "run")
    assert [r["step"] for r in first] == [0, 1, 2]
    clocks = [r["perf/wall_clock_s"] for r in first]
    assert 0 < clocks[0] < clocks[1] < clocks[2]  # the validation before training too
    assert first[2]["val-core/plugrl/sim/acc/mean@1"] >= 0
    assert first[1]["perf/total_num_tokens"] > 0

    data["trainer"]["total_training_steps"] = 3
    run_recipe(plugrl_recipe(data), plugrl_plugin_manager)
    resumed = read(tmp_path / "run")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    assert resumed[:3] == first
    # the clock goes on from the checkpoint of step 2: the second segment's start-up and
    # step 3 come on top of it
    assert resumed[3]["perf/wall_clock_s"] >= clocks[2] + resumed[3]["timing_s/step"]


@pytest.fixture
def bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[4] / "bench" / "bench_async_sim.py"
    spec = importlib.util.spec_from_file_location("bench_async_sim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_table_shows_lags_against_their_bound(bench):
    def row(label, rate, lag=None, bound=None, baseline=100.0):
        return {
            "label": label,
            "baseline": baseline,
            "median_rate": rate / 2,
            "median_baseline": baseline,
            "trained_tokens_per_s": rate,
            "median_step_s": 1.0,
            "max_version_lag": lag,
            "lag_bound": bound,
            "stale_samples": None,
            "dropped_samples": None,
            "pauses": None,
        }

    table = bench.format_rows(
        [
            row("sync", 100.0, baseline=125.0),
            {**row("a", 300.0, 1, 2), "mean_response_length": 98.46},
            row("b", 250.0, 3, 2),
            row("c", 50.0, 2, baseline=None),
        ]
    ).splitlines()
    assert table[1].split()[:5] == ["sync", "100", "0.80x", "0.40x", "1.000"]
    assert table[2].split()[2:4] == ["3.00x", "1.50x"]
    assert table[2].split()[5:9] == ["1", "/", "2", "98.5"]  # and the mean response length
    assert table[3].split()[5:9] == ["3", "/", "2", "OVER"]
    assert table[4].split()[1:4] == ["50", "-", "-"]
    assert table[4].split()[5:8] == ["2", "/", "-"]
    with pytest.raises(SystemExit, match="does not split --devices 4"):
        bench.parse_splits("1:2", 4)
    assert bench.parse_splits("1:3,2:2", 4) == [(1, 3), (2, 2)]


def test_bench_refuses_a_weight_period_that_does_not_divide_the_steps(bench):
    with pytest.raises(SystemExit, match="--steps 8 is not a multiple of --sync-step 3"):
        bench.main(["--steps", "8", "--sync-step", "3"])
    with pytest.raises(SystemExit, match="--sync-step 0: a weight period is 1 step or more"):
        bench.main(["--sync-step", "0"])


def test_bench_names_a_missing_scheduler(bench, tmp_path, capsys, plugrl_plugin_manager):
    code = bench.main(
        [
            "--steps", "2", "--batch", "4", "--n", "2", "--max-response-length", "16",
            "--async-scheduler", "no_such_scheduler", "--work-dir", str(tmp_path),
            "--time-scale", "0.5", "--set", "actor.sim_train_ms_per_ktoken=7",
        ]
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == 1
    assert "sync 4 colocated #1" in out.out
    recipe = yaml.safe_load((tmp_path / "sync-1" / "recipe.yaml").read_text())
    assert recipe["rollout"]["sim_step_ms"] == 1.0  # half the default
    assert recipe["actor"]["sim_forward_ms_per_ktoken"] == 10.0
    assert recipe["actor"]["sim_train_ms_per_ktoken"] == 7  # --set wins
    assert recipe["rollout"]["sim_devices"] == recipe["actor"]["sim_devices"] == 4
    assert (
        out.err.strip()
        .splitlines()[-1]
        .startswith(
            "error: scheduler 'no_such_scheduler' is not installed here (plugrl plugins lists the "
            "schedulers: "
        )
    )
