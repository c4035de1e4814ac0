"""The vllm engine's recipe keys, engine arguments, sampling mapping and weight grouping: none
of it needs vLLM, so these run in every test environment."""

from __future__ import annotations

import os

import pytest
import torch

from plugrl.config.structuring import structure
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.context import EngineSpan, SpanNode
from plugrl.parts.rollout import SamplingParams
from plugrl_vllm.config import (
    VLLMRolloutConfig,
    cross_node_environment,
    engine_args,
    resolve_weight_route,
)
from plugrl_vllm.engine import image_token_id, one_token_per_image
from plugrl_vllm.sampling import sampling_kwargs
from plugrl_vllm.worker import FusedGroups, Names, layer_of, weight_plan

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@pytest.fixture
def recipe_with(plugrl_recipe):
    """A recipe (the engine's keys are read by structure(), which works without vLLM)."""

    def make(**rollout):
        recipe = plugrl_recipe(
            {
                "model": {"path": "/models/tiny", "dtype": "bfloat16"},
                "data": {"max_prompt_length": 100, "max_response_length": 28},
                "trainer": {"seed": 11},
            }
        )
        return recipe, structure(VLLMRolloutConfig, {"engine": "vllm", **rollout}, "rollout")

    return make


def test_engine_arguments_come_from_the_recipe(recipe_with):
    config = VLLMRolloutConfig(
        tensor_model_parallel_size=2,
        gpu_memory_utilization=0.7,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        engine_kwargs={"block_size": 32},
    )
    recipe, _ = recipe_with()
    args = engine_args(config, recipe, "cuda", "bfloat16")
    assert args["model"] == args["tokenizer"] == "/models/tiny"
    assert args["dtype"] == "bfloat16"
    assert args["seed"] == 11
    assert args["tensor_parallel_size"] == 2
    assert args["gpu_memory_utilization"] == 0.7
    assert args["max_num_seqs"] == 64
    assert args["max_num_batched_tokens"] == 4096
    assert args["max_model_len"] == 128
    assert args["enable_chunked_prefill"] is True
    assert args["logprobs_mode"] == "processed_logprobs"
    assert args["enforce_eager"] is False
    assert args["enable_sleep_mode"] is True
    assert args["block_size"] == 32


def test_colocated_engines_of_several_devices_on_ray_start_their_own_workers(plugrl_recipe):
    recipe = plugrl_recipe(
        {
            "model": {"path": "/models/tiny"},
            "cluster": {"mode": "ray"},
            "trainer": {"n_gpus_per_node": 4},
        }
    )
    config = VLLMRolloutConfig(tensor_model_parallel_size=2)
    # vLLM in a Ray placement group would ask Ray for devices the trainer's ranks hold
    assert engine_args(config, recipe, "cuda", "bfloat16")["distributed_executor_backend"] == "mp"
    for other in (
        VLLMRolloutConfig(tensor_model_parallel_size=1),
        VLLMRolloutConfig(tensor_model_parallel_size=2, colocate=False),
    ):
        assert "distributed_executor_backend" not in engine_args(other, recipe, "cuda", "bfloat16")


def test_an_engine_over_two_nodes_runs_its_workers_through_vllms_ray_executor(plugrl_recipe):
    """tp 4 over two nodes of two devices, sharing them with the actor's ranks: vLLM's Ray
    executor places rank i on the span's i-th bundle, each asking for the engine's half."""
    recipe = plugrl_recipe(
        {
            "model": {"path": "/models/tiny"},
            "cluster": {"mode": "ray"},
            "trainer": {"nnodes": 2, "n_gpus_per_node": 2},
        }
    )
    span = EngineSpan(
        nodes=(
            SpanNode(node_id="a", bundles=(4, 5), devices=("0", "1")),
            SpanNode(node_id="b", bundles=(6, 7), devices=("0", "1")),
        ),
        device_share=0.5,
    )
    config = VLLMRolloutConfig(tensor_model_parallel_size=4)
    args = engine_args(config, recipe, "cuda", "bfloat16", span)
    assert args["distributed_executor_backend"] == "ray"
    assert args["tensor_parallel_size"] == 4
    assert cross_node_environment(span) == {
        "VLLM_RAY_BUNDLE_INDICES": "4,5,6,7",
        "VLLM_RAY_PER_WORKER_GPUS": "0.5",
    }


def test_cpu_defaults_run_eagerly_without_sleep_mode(recipe_with):
    recipe, config = recipe_with()
    args = engine_args(config, recipe, "cpu", "float32")
    assert args["enforce_eager"] is True
    assert args["enable_sleep_mode"] is False
    explicit = engine_args(VLLMRolloutConfig(enforce_eager=False), recipe, "cpu", "float32")
    assert explicit["enforce_eager"] is False


def test_without_chunked_prefill_a_whole_sequence_fits_one_step(recipe_with):
    recipe, config = recipe_with(enable_chunked_prefill=False, max_num_batched_tokens=64)
    assert engine_args(config, recipe, "cuda", "bfloat16")["max_num_batched_tokens"] == 128


def test_engine_kwargs_may_not_set_what_a_recipe_key_sets(recipe_with):
    recipe, config = recipe_with(engine_kwargs={"max_num_seqs": 8})
    with pytest.raises(RecipeError, match=r"engine_kwargs sets max_num_seqs.*rollout.max_num_seqs"):
        engine_args(config, recipe, "cuda", "bfloat16")


def test_the_recipe_reads_the_engine_keys(recipe_with):
    _, config = recipe_with(enforce_eager=True, weight_route="reload_weights", max_model_len=256)
    assert config.enforce_eager is True
    assert config.weight_route == "reload_weights"
    assert config.max_model_len == 256
    with pytest.raises(RecipeError, match="weight_route"):
        recipe_with(weight_route="disk")


def test_the_weight_route_is_chosen_per_device():
    assert resolve_weight_route(VLLMRolloutConfig(), "cpu") == "reload_weights"
    assert resolve_weight_route(VLLMRolloutConfig(), "cuda") == "load_weights"
    assert resolve_weight_route(VLLMRolloutConfig(), "npu") == "load_weights"
    chosen = VLLMRolloutConfig(weight_route="reload_weights")
    assert resolve_weight_route(chosen, "cuda") == "reload_weights"


def test_a_route_that_does_not_work_on_the_device_is_an_error():
    with pytest.raises(RecipeError) as error:
        resolve_weight_route(VLLMRolloutConfig(weight_route="load_weights"), "cpu")
    assert str(error.value) == (
        "rollout.weight_route: load_weights does not work on cpu: vLLM's CPU build repacks "
        "linear weights for oneDNN after loading, so the model's load_weights leaves the "
        "kernels on the old weights; set it to auto or reload_weights"
    )


def test_sampling_parameters_map_to_one_vllm_sample():
    params = SamplingParams(
        n=4, temperature=0.7, top_p=0.9, top_k=-1, max_tokens=12, stop=["\n\n"], stop_token_ids=[5]
    )
    kwargs = sampling_kwargs(params, seed=123)
    assert kwargs["n"] == 1
    assert kwargs["seed"] == 123
    assert kwargs["temperature"] == 0.7
    assert kwargs["top_p"] == 0.9
    assert kwargs["top_k"] == 0
    assert kwargs["max_tokens"] == 12
    assert kwargs["stop"] == ["\n\n"]
    assert kwargs["stop_token_ids"] == [5]
    assert kwargs["logprobs"] == 0
    assert kwargs["detokenize"] is True
    greedy = sampling_kwargs(SamplingParams(temperature=0.0, top_k=20), seed=1)
    assert greedy["temperature"] == 0.0
    assert greedy["top_k"] == 20
    assert greedy["stop"] is None
    assert greedy["detokenize"] is False


def test_shards_of_fused_layers_map_to_the_fused_layer():
    assert layer_of("model.layers.3.self_attn.k_proj.bias", PACKED) == (
        "model.layers.3.self_attn.qkv_proj"
    )
    assert (
        layer_of("model.layers.0.mlp.up_proj.weight", PACKED) == "model.layers.0.mlp.gate_up_proj"
    )
    assert layer_of("model.layers.0.mlp.down_proj.weight", PACKED) == "model.layers.0.mlp.down_proj"
    assert layer_of("model.norm.weight", PACKED) == "model.norm"


VLLM_PARAMETERS = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.0.self_attn.qkv_proj.bias",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
]
TIED = {"lm_head.weight": "model.embed_tokens.weight"}
HF_NAMES = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",
    "model.layers.0.self_attn.q_proj.bias",
    "model.layers.0.self_attn.k_proj.bias",
    "model.layers.0.self_attn.v_proj.bias",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.norm.weight",
]


def test_a_tied_output_embedding_sent_once_is_loaded_under_both_names():
    plan = weight_plan(HF_NAMES, PACKED, VLLM_PARAMETERS, TIED)
    assert plan.aliases == {"model.embed_tokens.weight": ["lm_head.weight"]}
    assert plan.layers["lm_head.weight"] == "lm_head"
    assert plan.layers["model.layers.0.self_attn.v_proj.bias"] == (
        "model.layers.0.self_attn.qkv_proj"
    )
    # sent under both names by the trainer: nothing to add
    both = weight_plan([*HF_NAMES, "lm_head.weight"], PACKED, VLLM_PARAMETERS, TIED)
    assert both.aliases == {}
    groups = FusedGroups.from_plan(plan)
    embedding = torch.ones(2)
    ready = groups.add([("model.embed_tokens.weight", embedding)])
    assert ready == [("model.embed_tokens.weight", embedding), ("lm_head.weight", embedding)]


def test_the_weight_plan_names_unknown_and_missing_weights():
    with pytest.raises(PluginError, match=r"announced model.extra.weight, which the vllm rollout"):
        weight_plan([*HF_NAMES, "model.extra.weight"], PACKED, VLLM_PARAMETERS, TIED)
    without_norm = [name for name in HF_NAMES if name != "model.norm.weight"]
    with pytest.raises(PluginError, match=r"4 of 5 layers.*none for model.norm; push every"):
        weight_plan(without_norm, PACKED, VLLM_PARAMETERS, TIED)
    # untied: the output embedding is a weight of its own, and the trainer must send it
    with pytest.raises(PluginError, match=r"none for lm_head; push every"):
        weight_plan(HF_NAMES, PACKED, VLLM_PARAMETERS, {})


class PrefixMapper:
    """Stands in for vLLM's ``WeightsMapper`` (``map_name``, ``orig_to_new_prefix``): the
    first prefix that matches is replaced, a prefix mapped to None drops the weight."""

    def __init__(self, orig_to_new_prefix: dict[str, str | None]) -> None:
        self.orig_to_new_prefix = orig_to_new_prefix

    def map_name(self, name: str) -> str | None:
        for original, new in self.orig_to_new_prefix.items():
            if name.startswith(original):
                return None if new is None else new + name[len(original) :]
        return name


# the prefixes vLLM's Qwen2.5-VL model renames checkpoint weights by (its hf_to_vllm_mapper)
VL_MAPPER = PrefixMapper(
    {
        "model.language_model.": "language_model.model.",
        "model.visual.": "visual.",
        "lm_head.": "language_model.lm_head.",
        "model.": "language_model.model.",
    }
)
VL_PACKED = {**PACKED, "qkv": ["qkv"]}
VL_HF_NAMES = [
    "model.visual.patch_embed.proj.weight",
    "model.visual.blocks.0.attn.qkv.weight",
    "model.visual.blocks.0.mlp.gate_proj.weight",
    "model.visual.blocks.0.mlp.up_proj.weight",
    "model.visual.merger.mlp.0.weight",
    "model.language_model.embed_tokens.weight",
    "model.language_model.layers.0.self_attn.q_proj.weight",
    "model.language_model.layers.0.self_attn.k_proj.weight",
    "model.language_model.layers.0.self_attn.v_proj.weight",
    "model.language_model.norm.weight",
]
VL_PARAMETERS = [
    "visual.patch_embed.proj.weight",
    "visual.blocks.0.attn.qkv.weight",
    "visual.blocks.0.mlp.gate_up_proj.weight",
    "visual.merger.mlp.0.weight",
    "language_model.model.embed_tokens.weight",
    "language_model.model.layers.0.self_attn.qkv_proj.weight",
    "language_model.model.norm.weight",
    "language_model.lm_head.weight",
]
VL_TIED = {"language_model.lm_head.weight": "language_model.model.embed_tokens.weight"}


def test_a_vision_language_models_weights_reach_vllms_renamed_layers_vision_tower_too():
    renaming = Names.of_model(type("Model", (), {"hf_to_vllm_mapper": VL_MAPPER})())
    plan = weight_plan(VL_HF_NAMES, VL_PACKED, VL_PARAMETERS, VL_TIED, renaming)
    assert plan.layers["model.visual.blocks.0.mlp.up_proj.weight"] == (
        "visual.blocks.0.mlp.gate_up_proj"
    )
    assert plan.layers["model.visual.blocks.0.attn.qkv.weight"] == "visual.blocks.0.attn.qkv"
    assert plan.layers["model.language_model.layers.0.self_attn.k_proj.weight"] == (
        "language_model.model.layers.0.self_attn.qkv_proj"
    )
    # the tied output embedding goes to the loader under a checkpoint name it renames back
    assert plan.aliases == {"model.language_model.embed_tokens.weight": ["lm_head.weight"]}
    assert plan.layers["lm_head.weight"] == "language_model.lm_head"
    groups = FusedGroups.from_plan(plan)
    gate, up = torch.zeros(2), torch.ones(2)
    assert groups.add([("model.visual.blocks.0.mlp.gate_proj.weight", gate)]) == []
    ready = groups.add([("model.visual.blocks.0.mlp.up_proj.weight", up)])
    assert [name for name, _ in ready] == [
        "model.visual.blocks.0.mlp.gate_proj.weight",
        "model.visual.blocks.0.mlp.up_proj.weight",
    ]
    # the vision tower is checked as the language model is: every layer gets its weights
    without_merger = [name for name in VL_HF_NAMES if "merger" not in name]
    with pytest.raises(PluginError, match=r"none for visual.merger.mlp.0; push every"):
        weight_plan(without_merger, VL_PACKED, VL_PARAMETERS, VL_TIED, renaming)
    with pytest.raises(PluginError, match=r"announced model.visual.extra.weight, which"):
        weight_plan(
            [*VL_HF_NAMES, "model.visual.extra.weight"],
            VL_PACKED,
            VL_PARAMETERS,
            VL_TIED,
            renaming,
        )
    # without the renaming no checkpoint name is one of the model's
    with pytest.raises(PluginError, match=r"which the vllm rollout model does not have"):
        weight_plan(VL_HF_NAMES, VL_PACKED, VL_PARAMETERS, VL_TIED)


def test_each_images_tokens_go_to_vllm_as_one_token():
    image, start, end = 9, 7, 8
    expanded = [1, start, image, image, image, image, end, 2, start, image, end, 3]
    assert one_token_per_image(expanded, image) == [1, start, image, end, 2, start, image, end, 3]
    assert one_token_per_image([1, 2, 3], image) == [1, 2, 3]

    class Vision:
        vision_config = object()
        image_token_id = 9

    class Text:
        image_token_id = 9

    assert image_token_id(Vision()) == 9
    assert image_token_id(Text()) is None


def test_a_fused_layer_is_sent_once_all_its_weights_arrived():
    plan = weight_plan(HF_NAMES, PACKED, VLLM_PARAMETERS, TIED)
    groups = FusedGroups.from_plan(plan)
    bucket = [(name, torch.full((2,), float(i))) for i, name in enumerate(HF_NAMES)]
    first = groups.add(bucket[:2] + bucket[7:8])  # embed, q weight, gate
    assert [name for name, _ in first] == ["model.embed_tokens.weight", "lm_head.weight"]
    assert set(groups.pending) == {
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.mlp.gate_up_proj",
    }
    # the bucket's memory is reused for the next bucket: what is held back is a copy
    bucket[1][1].fill_(-1.0)
    second = groups.add(bucket[2:7] + bucket[8:])
    names = [name for name, _ in second]
    assert sorted(names) == sorted(HF_NAMES[1:])
    assert dict(second)["model.layers.0.self_attn.q_proj.weight"].tolist() == [1.0, 1.0]
    assert groups.pending == {}


def test_the_cpu_environment_keeps_what_the_user_set(monkeypatch):
    from plugrl_vllm.engine import set_cpu_environment

    # set, then unset: the variable is restored to what it was when the test ends
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert set_cpu_environment() == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4"


# ------------------------------------------------------------------------- vLLM's own logging


@pytest.fixture
def restore_logging(monkeypatch):
    """Put back what apply_engine_log_level changes: the variable, logger levels, filters."""
    import logging
    import warnings

    # set, then removed: monkeypatch then restores the variable as it was, absent or not
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "")
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    loggers = [logging.getLogger(name) for name in ("vllm", "torch._library.triton", "plugrl")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def test_vllm_logs_warnings_only_unless_asked(restore_logging, monkeypatch):
    import logging

    from plugrl_vllm.logs import engine_log_level

    assert engine_log_level(None) == "warning"
    assert engine_log_level("debug") == "debug"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")  # the user's own setting
    assert engine_log_level(None) == "info"
    assert engine_log_level("error") == "error"  # the recipe's wins
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    logging.getLogger("plugrl").setLevel(logging.DEBUG)  # plugrl -v
    assert engine_log_level(None) == "info"


def test_a_quiet_vllm_hides_its_start_up_noise(restore_logging):
    import logging
    import warnings

    from plugrl_vllm.logs import apply_engine_log_level

    vllm_logger = logging.getLogger("vllm")
    handler = logging.StreamHandler()
    vllm_logger.addHandler(handler)  # as vLLM's own configuration adds one
    try:
        apply_engine_log_level("warning")
        assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"  # for its engine processes
        assert vllm_logger.level == handler.level == logging.WARNING
        assert logging.getLogger("torch._library.triton").level == logging.ERROR
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn_explicit(
                "`torch.distributed.reduce_op` is deprecated, please use "
                "`torch.distributed.ReduceOp` instead",
                FutureWarning,
                "dispatcher.py",
                138,
                module="vllm.triton_utils.dispatcher",
            )
            warnings.warn_explicit("another warning", FutureWarning, "dispatcher.py", 140)
        assert [str(w.message) for w in caught] == ["another warning"]
        apply_engine_log_level("info")
        assert vllm_logger.level == handler.level == logging.INFO
    finally:
        vllm_logger.removeHandler(handler)


def test_the_rotary_embeddings_reload_notice_is_dropped_and_no_other(restore_logging):
    import logging

    from plugrl_vllm.logs import RELOAD_LOGGER, RotaryReloadNotice, hide_rotary_reload_notice

    def record(msg, *args):
        return logging.LogRecord(
            RELOAD_LOGGER, logging.WARNING, "layerwise.py", 266, msg, args, None
        )

    notice = RotaryReloadNotice()
    assert not notice.filter(record("%s: Failed to load weights", "RotaryEmbedding"))
    assert not notice.filter(record("%s: Failed to load weights", "YaRNScalingRotaryEmbedding"))
    assert notice.filter(record("%s: Failed to load weights", "QKVParallelLinear"))
    assert notice.filter(record("%s: Delayed processing", "RotaryEmbedding"))
    reload_logger = logging.getLogger(RELOAD_LOGGER)
    try:
        hide_rotary_reload_notice()
        hide_rotary_reload_notice()
        assert sum(isinstance(f, RotaryReloadNotice) for f in reload_logger.filters) == 1
    finally:
        for installed in list(reload_logger.filters):
            reload_logger.removeFilter(installed)


def test_the_engine_log_level_is_one_of_the_levels(recipe_with):
    with pytest.raises(RecipeError) as error:
        recipe_with(engine_log_level="loud")
    assert str(error.value) == (
        "rollout.engine_log_level: must be one of null, debug, info, warning, error, got 'loud'"
    )
    assert recipe_with(engine_log_level="info")[1].engine_log_level == "info"


def test_a_weight_is_read_back_from_its_rows_of_vllms_fused_or_padded_layer():
    from plugrl_vllm.worker import hf_view

    q, k, v = torch.randn(8, 4), torch.randn(2, 4), torch.randn(2, 4)
    embed = torch.randn(10, 4)
    held = {
        "model.layers.0.self_attn.qkv_proj.weight": torch.cat([q, k, v]),
        # vLLM pads the vocabulary to a multiple
        "model.embed_tokens.weight": torch.cat([embed, torch.zeros(6, 4)]),
    }
    shapes = {
        "model.layers.0.self_attn.q_proj.weight": [8, 4],
        "model.layers.0.self_attn.k_proj.weight": [2, 4],
        "model.layers.0.self_attn.v_proj.weight": [2, 4],
        "model.embed_tokens.weight": [10, 4],
    }
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    def view(name):
        return hf_view(name, shapes[name], held, packed, shapes)

    assert torch.equal(view("model.layers.0.self_attn.q_proj.weight"), q)
    assert torch.equal(view("model.layers.0.self_attn.k_proj.weight"), k)
    assert torch.equal(view("model.layers.0.self_attn.v_proj.weight"), v)
    assert torch.equal(view("model.embed_tokens.weight"), embed)
    assert hf_view("lm_head.weight", [10, 4], held, packed, shapes) is None


def lora_recipe(rank: int = 8, **rollout):
    from plugrl.recipe import ModelConfig, Recipe
    from plugrl_fsdp2.config import FSDP2ActorConfig

    return Recipe(
        model=ModelConfig(path="/models/tiny", lora_rank=rank, dtype="bfloat16"),
        actor=FSDP2ActorConfig(),
        rollout=VLLMRolloutConfig(engine="vllm", **rollout),
    )


def test_lora_actors_send_vllm_their_adapters_unless_told_to_merge():
    from plugrl.parts.rollout import lora_sync_mode

    assert lora_sync_mode(lora_recipe(), "cuda") == "adapters"
    assert lora_sync_mode(lora_recipe(lora_sync="merged"), "cuda") == "merged"
    assert lora_sync_mode(lora_recipe(rank=0), "cuda") == "merged"
    # vLLM's CPU LoRA kernels cost generation more than merged syncs cost: asked for only
    assert lora_sync_mode(lora_recipe(), "cpu") == "merged"
    assert lora_sync_mode(lora_recipe(lora_sync="adapters"), "cpu") == "adapters"
    recipe = lora_recipe(rank=20, lora_sync="adapters")
    args = engine_args(recipe.rollout, recipe, "cpu", "float32")
    # vLLM accepts a few ranks only: the smallest that holds the adapter's
    assert (args["enable_lora"], args["max_loras"], args["max_lora_rank"]) == (True, 1, 32)
    merged = lora_recipe(lora_sync="merged")
    assert "enable_lora" not in engine_args(merged.rollout, merged, "cpu", "float32")


def test_the_plans_weight_sync_bucket_holds_the_adapters_alone():
    from plugrl.plan.estimate import weight_sync_terms
    from plugrl.plan.shape import read_shape

    shape = read_shape("qwen2.5-0.5b")  # h=896, a=896, k=128, i=4864, L=24, V=151936

    def bucket(recipe):
        (term,) = weight_sync_terms(recipe, shape, None)
        return term.bytes

    # rank 8 on the seven projections: 8 x (2 (896 + 896) + 2 (896 + 128) + 3 (896 + 4864))
    # factors a layer, 24 layers, bfloat16
    factors = 24 * 8 * (2 * 1792 + 2 * 1024 + 3 * 5760)
    assert factors == 4_399_104
    assert bucket(lora_recipe()) == factors * 2
    assert bucket(lora_recipe(update_weights_bucket_megabytes=1)) == 2**20
    # merged weights: the 512 MiB bucket, above the 151936 x 896 vocabulary table
    assert bucket(lora_recipe(lora_sync="merged")) == 512 * 2**20


def test_an_adapter_folder_of_a_higher_rank_raises_the_engines_rank(tmp_path):
    import json

    from plugrl_vllm.config import lora_rank_slot

    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 48, "rank_pattern": {}}))
    recipe = lora_recipe(rank=8)
    recipe.model.lora_adapter_path = str(tmp_path)
    assert lora_rank_slot(recipe) == 64
    with pytest.raises(RecipeError, match="above the largest LoRA rank vLLM serves"):
        lora_rank_slot(lora_recipe(rank=600))


def test_adapter_factors_on_modules_vllm_has_no_lora_for_are_named():
    from plugrl_vllm.worker import adapter_module, unknown_adapter_modules

    prefix = "base_model.model.model.layers.0."
    names = [f"{prefix}self_attn.q_proj.lora_A.weight", f"{prefix}mlp.router.lora_B.weight"]
    assert adapter_module(names[0]) == "model.layers.0.self_attn.q_proj"
    assert unknown_adapter_modules(names, ["q_proj", "k_proj"]) == [names[1]]
