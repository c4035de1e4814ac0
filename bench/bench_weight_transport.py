"""Weight pushes from the fsdp2 backend to engine workers through each transport that applies.

Trainer: the ``fsdp2`` backend, one rank (the actor role, as a run pushes it). Engines: a
receiving engine defined here that copies every tensor it is given into storage allocated once,
at the first push (the warm-up). Transports:

* ``local``: trainer and one engine in this process (``cluster: local``);
* ``object_store`` and ``collective`` (gloo): the trainer rank and the engines as Ray actors,
  pushing to one engine (engine 0 of two, through ``engine_indices``) and to both.

Models: the quickstart model (built or reused under ``--quickstart-dir``, float32 as its recipe
trains it) and a random Qwen2 model of Qwen2.5-0.5B's shapes (hidden 896, 24 layers, 14 heads,
2 KV heads, intermediate 4864, vocabulary 151,936, tied embeddings) built here and pushed in
bfloat16. Bucket sizes: ``--buckets`` MiB (``rollout.update_weights_bucket_megabytes``).

For each model every case (transport x engines x bucket size) pushes once to warm up, then the
cases take turns ``--repeats`` times and each keeps its fastest push: seconds per push (the
push, announce to finish) and MiB per second (the weights'
bytes, per engine, over those seconds).

    python bench/bench_weight_transport.py [--repeats 3] [--buckets 64,512]
        [--models quickstart,qwen2-0.5b] [--engines 1,2]

With ``--lora RANK`` it compares instead what a LoRA actor (``model.lora_rank=RANK``, alpha
twice the rank, every linear layer) sends each step: ``rollout.lora_sync=merged`` (every
weight, adapters merged in) against ``adapters`` (the adapters' factors alone), trainer and
engine in this process (the ``local`` transport, buckets of the last of ``--buckets``), no
Ray. ``--lora-engine`` is the receiving engine above (the transfer alone) or ``vllm`` (vLLM's
CPU build loading what arrives: full weights through ``reload_weights``, or the adapter
registered from memory; run it in ``.venv-vllm``; it then also times a batch of generation
after the pushes, which applying an adapter makes slower). Models then also include
``qwen2-0.5b-8l``: Qwen2.5-0.5B's shapes with 8 of its 24 layers, bfloat16.

    python bench/bench_weight_transport.py --lora 32 [--lora-engine vllm]
        [--models quickstart,qwen2-0.5b-8l] [--buckets 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import torch

import plugrl
from plugrl.errors import PluginError
from plugrl.parts.rollout import Capability, RolloutEngine

ENGINE = "bench_receiver"
QWEN2_05B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,  # the embedding's rows; the tiny tokenizer uses the first few
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}


# --------------------------------------------------------------------------------------------
# The receiving engine (a plugin: this module is registered in-process, Ray workers import it)
# --------------------------------------------------------------------------------------------


@plugrl.hookimpl
def register_rollout_engines(register):
    register(ENGINE, "bench_weight_transport:ReceivingEngine")


class ReceivingEngine(RolloutEngine):
    """Receives weights and nothing else: each tensor is copied into storage of its own,
    allocated when a weight is first announced (as an engine copies into its parameters)."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.WEIGHT_UPDATE})

    def __init__(self, config, context):
        super().__init__(config, context)
        self.storage: dict[str, torch.Tensor] = {}
        self.pending: set[str] = set()
        self.next_version = 0

    async def generate_request(self, request):
        raise NotImplementedError("the bench engine only receives weights")

    async def begin_weight_update(self, version, weights):
        for meta in weights:
            held = self.storage.get(meta.name)
            dtype = getattr(torch, meta.dtype)
            if held is None or tuple(held.shape) != meta.shape or held.dtype != dtype:
                self.storage[meta.name] = torch.empty(meta.shape, dtype=dtype)
        self.pending = {meta.name for meta in weights}
        self.next_version = version

    async def load_weights(self, bucket):
        for name, tensor in bucket:
            self.storage[name].copy_(tensor)
            self.pending.discard(name)

    async def finish_weight_update(self):
        if self.pending:
            raise PluginError(f"{len(self.pending)} weights never arrived")
        self.weight_version = self.next_version


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def qwen2_05b(folder: Path) -> Path:
    """A random bfloat16 Qwen2 model of Qwen2.5-0.5B's shapes under ``folder`` (reused)."""
    from plugrl.testing import save_tiny_model

    if (folder / "config.json").exists():
        return folder
    print(f"building a random Qwen2.5-0.5B-shaped model in {folder} ...", flush=True)
    staging = folder.with_name(folder.name + ".tmp")
    save_tiny_model(staging, seed=0, dtype="bfloat16", **QWEN2_05B)
    staging.rename(folder)
    return folder


def qwen2_05b_8_layers(folder: Path) -> Path:
    """A random bfloat16 Qwen2 model of Qwen2.5-0.5B's shapes but 8 layers (reused)."""
    from plugrl.testing import save_tiny_model

    if (folder / "config.json").exists():
        return folder
    print(f"building a random 8-layer Qwen2.5-0.5B-shaped model in {folder} ...", flush=True)
    staging = folder.with_name(folder.name + ".tmp")
    save_tiny_model(staging, seed=0, dtype="bfloat16", **{**QWEN2_05B, "num_hidden_layers": 8})
    staging.rename(folder)
    return folder


def models(names: list[str], quickstart_dir: str) -> list[tuple[str, Path, str]]:
    chosen = []
    for name in names:
        if name == "quickstart":
            from plugrl_tools.quickstart import prepare_quickstart

            chosen.append((name, prepare_quickstart(quickstart_dir).model_path, "float32"))
        elif name == "qwen2-0.5b":
            chosen.append((name, qwen2_05b(Path("runs/bench-qwen2-0.5b-random")), "bfloat16"))
        elif name == "qwen2-0.5b-8l":
            folder = Path("runs/bench-qwen2-0.5b-8l-random")
            chosen.append((name, qwen2_05b_8_layers(folder), "bfloat16"))
        else:
            raise SystemExit(f"unknown model {name!r}: quickstart, qwen2-0.5b or qwen2-0.5b-8l")
    return chosen


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


def recipes(model_path: Path, dtype: str, mode: str) -> tuple[Any, Any]:
    """The trainer's recipe (the model) and the engines' (no model folder: the bench engine
    needs none)."""
    from plugrl.parts.rollout import RolloutConfig
    from plugrl.recipe import ClusterConfig, ModelConfig, Recipe
    from plugrl_fsdp2.config import FSDP2ActorConfig

    cluster = ClusterConfig(mode=mode, num_cpus=4)
    trainer = Recipe(
        model=ModelConfig(path=str(model_path), dtype=dtype),
        actor=FSDP2ActorConfig(ppo_mini_batch_size=1),
        cluster=cluster,
    )
    engines = Recipe(
        rollout=RolloutConfig(engine=ENGINE, colocate=False, n_gpus_per_node=2), cluster=cluster
    )
    return trainer, engines


def transport(name: str, bucket_mib: int, recipe: Any) -> Any:
    from plugrl.cluster.transports.buckets import LocalTransport, ObjectStoreTransport
    from plugrl.cluster.transports.collective import CollectiveTransport
    from plugrl.parts.context import PartContext
    from plugrl.parts.rollout import RolloutConfig

    classes = {
        "local": LocalTransport,
        "object_store": ObjectStoreTransport,
        "collective": CollectiveTransport,
    }
    config = RolloutConfig(update_weights_bucket_megabytes=bucket_mib)
    return classes[name](config, PartContext(recipe=recipe))


def run_model(
    name: str, path: Path, dtype: str, args: argparse.Namespace, plugins: Any
) -> list[dict]:
    from plugrl.cluster.engines import make_engine_group
    from plugrl.cluster.groups import make_worker_group

    print(f"\n{name}: starting the trainer and engines ...", flush=True)
    groups = []
    local_trainer_recipe, local_engine_recipe = recipes(path, dtype, "local")
    ray_trainer_recipe, ray_engine_recipe = recipes(path, dtype, "ray")
    local_trainer = make_worker_group(
        local_trainer_recipe, "actor", device_name="cpu", plugins=plugins
    )
    groups.append(local_trainer)
    local_engines = make_engine_group(local_engine_recipe, device_name="cpu", plugins=plugins)
    ray_trainer = make_worker_group(
        ray_trainer_recipe, "actor", device_name="cpu", plugins=plugins, world_size=1
    )
    groups.append(ray_trainer)
    ray_engines = make_engine_group(ray_engine_recipe, device_name="cpu", plugins=plugins)
    try:
        for trainer in (local_trainer, ray_trainer):
            trainer.setup(1)
        cases = []
        for bucket in args.buckets:
            cases.append(("local", 1, bucket, local_trainer, local_engines, None))
            for kind in ("object_store", "collective"):
                for engines in args.engines:
                    indices = [0] if engines == 1 else None
                    cases.append((kind, engines, bucket, ray_trainer, ray_engines, indices))
        best: dict[tuple, dict[str, float]] = {}
        version = 0
        for round_number in range(args.repeats + 1):
            label = "warm-up" if round_number == 0 else f"round {round_number}/{args.repeats}"
            print(f"  {label}", flush=True)
            for kind, engines, bucket, trainer, engine_group, indices in cases:
                version += 1
                chosen = transport(kind, bucket, ray_engine_recipe)
                start = time.perf_counter()
                metrics = chosen.push(trainer, engine_group, version, engine_indices=indices)
                seconds = time.perf_counter() - start
                key = (kind, engines, bucket)
                if round_number == 0:
                    continue
                if key not in best or seconds < best[key]["seconds"]:
                    best[key] = {
                        "seconds": seconds,
                        "megabytes": metrics["perf/weight_sync_megabytes"],
                    }
        rows = []
        for (kind, engines, bucket), figures in best.items():
            rows.append(
                {
                    "model": name,
                    "dtype": dtype,
                    "transport": kind,
                    "engines": engines,
                    "bucket_mib": bucket,
                    "mib": figures["megabytes"],
                    "seconds": figures["seconds"],
                    "mib_per_s": figures["megabytes"] / figures["seconds"],
                }
            )
        return rows
    finally:
        ray_engines.close()
        ray_trainer.close()
        local_engines.close()
        local_trainer.close()


def print_table(rows: list[dict]) -> None:
    reference = {
        (row["model"], row["engines"], row["bucket_mib"]): row["seconds"]
        for row in rows
        if row["transport"] == "object_store"
    }
    print(
        "\n| model | MiB per push | bucket MiB | transport | engines | s/push | MiB/s per engine "
        "| time vs object_store |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        base = reference.get((row["model"], row["engines"], row["bucket_mib"]))
        ratio = f"{row['seconds'] / base:.2f}x" if base else "-"
        print(
            f"| {row['model']} ({row['dtype']}) | {row['mib']:.1f} | {row['bucket_mib']} | "
            f"{row['transport']} | {row['engines']} | {row['seconds']:.3f} | "
            f"{row['mib_per_s']:.0f} | {ratio} |"
        )


# --------------------------------------------------------------------------------------------
# LoRA: merged weights against adapters alone
# --------------------------------------------------------------------------------------------


def lora_recipes(
    model_path: Path, dtype: str, rank: int, sync: str, engine: str, bucket_mib: int
) -> tuple[Any, Any]:
    """The trainer's recipe (a LoRA actor whose engine takes adapters: vLLM's config) and
    the engines' (the receiving engine, or the same vLLM recipe)."""
    from plugrl.parts.rollout import RolloutConfig
    from plugrl.recipe import ClusterConfig, DataConfig, ModelConfig, Recipe
    from plugrl_fsdp2.config import FSDP2ActorConfig
    from plugrl_vllm.config import VLLMRolloutConfig

    cluster = ClusterConfig(mode="local", num_cpus=2)
    shared = {
        "update_weights_bucket_megabytes": bucket_mib,
        "dtype": dtype,
        "colocate": True,
    }
    trainer = Recipe(
        model=ModelConfig(path=str(model_path), dtype=dtype, lora_rank=rank, lora_alpha=2 * rank),
        actor=FSDP2ActorConfig(ppo_mini_batch_size=1),
        rollout=VLLMRolloutConfig(engine="vllm", lora_sync=sync, **shared),
        data=DataConfig(max_prompt_length=64, max_response_length=64),
        cluster=cluster,
    )
    if engine == "vllm":
        return trainer, trainer
    return trainer, Recipe(rollout=RolloutConfig(engine=ENGINE, **shared), cluster=cluster)


def run_lora_model(
    name: str, path: Path, dtype: str, args: argparse.Namespace, plugins: Any
) -> list[dict]:
    from plugrl.cluster.engines import make_engine_group
    from plugrl.cluster.groups import make_worker_group
    from plugrl.cluster.transports.buckets import LocalTransport
    from plugrl.parts.context import PartContext

    rows = []
    for sync in ("merged", "adapters"):
        trainer_recipe, engine_recipe = lora_recipes(
            path, dtype, args.lora, sync, args.lora_engine, args.buckets[-1]
        )
        print(f"\n{name}, {sync}: starting the trainer and the {args.lora_engine} engine ...")
        trainer = make_worker_group(trainer_recipe, "actor", device_name="cpu", plugins=plugins)
        engines = make_engine_group(engine_recipe, device_name="cpu", plugins=plugins)
        try:
            trainer.setup(1)
            chosen = LocalTransport(engine_recipe.rollout, PartContext(recipe=engine_recipe))
            times = []
            for version in range(args.repeats + 1):
                start = time.perf_counter()
                metrics = chosen.push(trainer, engines, version + 1)
                if version > 0:  # the first is the warm-up
                    times.append(time.perf_counter() - start)
            tensors = len(trainer.weight_metadata())
            generation = generation_seconds(engines) if args.lora_engine == "vllm" else None
        finally:
            engines.close()
            trainer.close()
        rows.append(
            {
                "model": name,
                "dtype": dtype,
                "sync": sync,
                "tensors": tensors,
                "mib": metrics["perf/weight_sync_megabytes"],
                "seconds": min(times),
                "median_seconds": sorted(times)[len(times) // 2],
                "generation_seconds": generation,
            }
        )
    return rows


GENERATION_PROMPTS = 64
GENERATION_TOKENS = 32


def generation_seconds(engines: Any) -> float:
    """The best of two timed batches of :data:`GENERATION_PROMPTS` prompts x
    :data:`GENERATION_TOKENS` new tokens (temperature 1, no stop), after one warm-up batch:
    what the engine's way of applying the adapter costs each rollout."""
    from plugrl.parts.rollout import SamplingParams

    prompts = [[(7 * row + column) % 200 + 3 for column in range(16)] for row in range(64)]
    params = SamplingParams(temperature=1.0, max_tokens=GENERATION_TOKENS, seed=0)
    times = []
    for attempt in range(3):
        start = time.perf_counter()
        engines.generate(prompts[:GENERATION_PROMPTS], params)
        if attempt > 0:
            times.append(time.perf_counter() - start)
    return min(times)


def print_lora_table(rows: list[dict], rank: int, engine: str) -> None:
    merged = {row["model"]: row for row in rows if row["sync"] == "merged"}
    print(
        "\n| model | LoRA rank | engine | sync | tensors | MiB per push | s/push (best) "
        "| s/push (median) | bytes vs merged | time vs merged "
        f"| generation s ({GENERATION_PROMPTS} x {GENERATION_TOKENS} tokens) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        base = merged[row["model"]]
        generation = row["generation_seconds"]
        print(
            f"| {row['model']} ({row['dtype']}) | {rank} | {engine} | {row['sync']} | "
            f"{row['tensors']} | {row['mib']:.2f} | {row['seconds']:.3f} | "
            f"{row['median_seconds']:.3f} | {row['mib'] / base['mib']:.3f}x | "
            f"{row['seconds'] / base['seconds']:.3f}x | "
            + (f"{generation:.2f} |" if generation is not None else "- |")
        )


NEEDS_RAY = (
    "bench_weight_transport needs Ray for its object_store and collective cases: "
    "pip install -c constraints/cpu.txt -e '.[ray]'"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quickstart-dir", default="runs/quickstart-assets")
    parser.add_argument("--models", default="quickstart,qwen2-0.5b")
    parser.add_argument("--buckets", default="64,512", help="bucket sizes in MiB")
    parser.add_argument("--engines", default="1,2", help="engine workers pushed to")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    parser.add_argument("--lora", type=int, default=0, help="compare LoRA syncs at this rank")
    parser.add_argument("--lora-engine", default="receiver", choices=["receiver", "vllm"])
    args = parser.parse_args(argv)
    if args.lora:
        return lora_main(args)
    if importlib.util.find_spec("ray") is None:
        raise SystemExit(NEEDS_RAY)
    args.buckets = [int(b) for b in args.buckets.split(",")]
    args.engines = [int(e) for e in args.engines.split(",")]
    # the Ray actors run one torch thread each (one CPU each); so does the local case
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))

    import bench_weight_transport as engine_plugin
    import ray

    from plugrl.plugin.manager import PluginManager

    plugins = PluginManager()
    plugins.load_entry_points()
    plugins.register(engine_plugin, name="bench_weight_transport")
    chosen = models(args.models.split(","), args.quickstart_dir)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    start = time.perf_counter()
    rows = []
    try:
        for name, path, dtype in chosen:
            rows.extend(run_model(name, path, dtype, args, plugins))
    finally:
        ray.shutdown()
    print_table(rows)
    print(
        f"\n{args.repeats} rounds after a warm-up, best push of each case; "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {time.perf_counter() - start:.0f} s"
    )


def lora_main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_weight_transport as engine_plugin

    from plugrl.plugin.manager import PluginManager

    plugins = PluginManager()
    plugins.load_entry_points()
    plugins.register(engine_plugin, name="bench_weight_transport")
    args.buckets = [int(b) for b in args.buckets.split(",")]
    names = args.models.split(",") if args.models != "quickstart,qwen2-0.5b" else None
    chosen = models(names or ["quickstart", "qwen2-0.5b-8l"], args.quickstart_dir)
    start = time.perf_counter()
    rows = []
    for name, path, dtype in chosen:
        rows.extend(run_lora_model(name, path, dtype, args, plugins))
    print_lora_table(rows, args.lora, args.lora_engine)
    print(
        f"\n{args.repeats} pushes after a warm-up each, bucket {args.buckets[-1]} MiB; "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
