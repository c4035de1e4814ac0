"""Contract tests of the sglang engine against a fake SGLang module (fake_sglang.py): which
SGLang calls it makes, with which arguments, in which order, and what it makes of the answers.
SGLang itself cannot run here (it needs a CUDA build of torch)."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pytest
import torch

import plugrl_sglang
from plugrl.errors import PluginError
from plugrl.parts.rollout import (
    Capability,
    Completion,
    GenerationRequest,
    SamplingParams,
    WeightMeta,
    batch_requests,
    continuation_request,
)
from plugrl.testing import part_context
from plugrl_sglang.engine import SGLangRolloutEngine, engine_arguments, load_sglang_api
from tests import install_hints as hints
from tests.plugins.rollout.sglang import fake_sglang

EOS = 96
PROMPT = (3, 5, 7)


@pytest.fixture
def fake(monkeypatch):
    return fake_sglang.install(monkeypatch)


@pytest.fixture
def make_engine(fake, plugrl_register_plugin, plugrl_recipe):
    plugrl_register_plugin(plugrl_sglang)
    engines = []

    def make(**rollout):
        recipe = plugrl_recipe(
            {
                "model": {"path": "/models/tiny", "dtype": "bfloat16"},
                "rollout": {"engine": "sglang", **rollout},
                "trainer": {"seed": 11},
            }
        )
        context = part_context(recipe, tokenizer=SimpleNamespace(eos_token_id=EOS))
        engine = SGLangRolloutEngine(recipe.rollout, context)
        engines.append(engine)
        return engine, fake.instances[-1]

    yield make
    for engine in engines:
        engine.close()


def request(request_id="r", max_tokens=4, **params):
    return GenerationRequest(
        request_id=request_id,
        prompt_ids=PROMPT,
        params=SamplingParams(max_tokens=max_tokens, **params),
    )


def calls(fake_engine, *names):
    return [(name, args) for name, args in fake_engine.calls if not names or name in names]


async def turns(count=5):
    for _ in range(count):
        await asyncio.sleep(0)


def weights(scale=1.0):
    return {
        "embed.weight": torch.full((4, 2), scale),
        "head.weight": torch.full((2, 4), scale),
        "norm.weight": torch.full((2,), scale),
    }


def metas(named):
    return [WeightMeta(name, tensor.shape, "float32") for name, tensor in named.items()]


async def push(engine, version, named, bucket_names=None):
    await engine.begin_weight_update(version, metas(named))
    for names in bucket_names or [list(named)]:
        await engine.load_weights([(name, named[name]) for name in names])
    await engine.finish_weight_update()


def test_registered_with_requirement_install_line_and_framework_module(
    plugrl_register_plugin, plugrl_plugin_manager
):
    plugrl_register_plugin(plugrl_sglang)
    entry = plugrl_plugin_manager.registry("rollout_engines").get("sglang")
    assert entry.requires == ("sglang",)
    assert entry.install == hints.SGLANG
    assert entry.framework_modules == ("sglang",)
    # the recipe keys are readable where SGLang is not installed
    assert "sglang" not in sys.modules
    assert entry.load_config().__name__ == "SGLangRolloutConfig"
    assert "sglang" not in sys.modules


def test_the_engine_starts_with_server_args_from_the_recipe(make_engine):
    engine, fake_engine = make_engine(
        dtype="bfloat16",
        tensor_model_parallel_size=2,
        gpu_memory_utilization=0.7,
        max_num_seqs=64,
        enforce_eager=True,
        max_num_batched_tokens=4096,
        engine_kwargs={"attention_backend": "ascend", "mem_fraction_static": 0.6},
    )
    assert fake_engine.server_args == {
        "model_path": "/models/tiny",
        "dtype": "bfloat16",
        "tp_size": 2,
        "mem_fraction_static": 0.6,  # engine_kwargs win
        "max_running_requests": 64,
        "random_seed": 11,
        "skip_tokenizer_init": True,
        "disable_cuda_graph": True,
        "enable_memory_saver": True,
        "enable_weights_cpu_backup": True,
        "chunked_prefill_size": 4096,
        "attention_backend": "ascend",
    }
    assert engine.capabilities == {
        Capability.STREAM,
        Capability.ABORT,
        Capability.PAUSE_KEEP,
        Capability.WEIGHT_UPDATE,
        Capability.SLEEP,
        Capability.IMAGES,
    }


def test_stop_strings_keep_the_tokenizer_and_no_sleep_means_no_memory_saver(make_engine):
    _, fake_engine = make_engine(stop=["</answer>"], free_cache_engine=False)
    args = fake_engine.server_args
    assert args["skip_tokenizer_init"] is False
    assert "enable_memory_saver" not in args and "enable_weights_cpu_backup" not in args
    _, fake_engine = make_engine(enable_chunked_prefill=False, colocate=False)
    assert fake_engine.server_args["chunked_prefill_size"] == -1
    assert "enable_memory_saver" not in fake_engine.server_args


def test_samples_map_sampling_params_and_read_token_log_probs(make_engine):
    engine, fake_engine = make_engine()
    params = dict(n=2, temperature=0.7, top_p=0.9, top_k=0, seed=5, stop_token_ids=[90])
    completions = asyncio.run(engine.generate_request(request(max_tokens=4, **params)))
    sent = calls(fake_engine, "async_generate")
    assert [args["rid"] for _, args in sent] == ["r/0#1", "r/1#2"]
    for _, args in sent:
        assert args["input_ids"] == list(PROMPT)
        assert args["return_logprob"] is True and args["stream"] is False
        sampling = dict(args["sampling_params"])
        sampling.pop("sampling_seed")
        assert sampling == {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,  # 0 disables top-k, SGLang spells that -1
            "max_new_tokens": 4,
            "stop_token_ids": [90, EOS],
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
    seeds = [args["sampling_params"]["sampling_seed"] for _, args in sent]
    assert len(set(seeds)) == 2  # one seed per sample
    first = sum(PROMPT)
    for index, completion in enumerate(completions):
        assert completion.sample_index == index and completion.request_id == "r"
        assert completion.token_ids == [first, first + 1, first + 2, first + 3]
        assert completion.log_probs == [-0.1] * 4
        assert completion.token_versions == [0] * 4
        assert completion.finish_reason == "length"


def test_a_stop_token_ends_a_sample_with_stop(make_engine):
    engine, _ = make_engine()
    stop_at = sum(PROMPT) + 1
    (completion,) = asyncio.run(
        engine.generate_request(request(max_tokens=8, stop_token_ids=[stop_at]))
    )
    assert completion.token_ids == [sum(PROMPT), stop_at]
    assert completion.finish_reason == "stop"


def test_abort_ends_the_named_request_with_its_tokens(make_engine):
    engine, fake_engine = make_engine()

    async def scenario():
        long = asyncio.ensure_future(engine.generate_request(request("long", max_tokens=500)))
        other = asyncio.ensure_future(engine.generate_request(request("other", max_tokens=3)))
        await turns(6)
        await engine.abort(["long", "unknown"])
        return await long, await other

    (aborted,), (finished,) = asyncio.run(scenario())
    assert aborted.finish_reason == "aborted" and 0 < len(aborted.token_ids) < 500
    assert len(aborted.log_probs) == len(aborted.token_ids)
    assert finished.finish_reason == "length" and len(finished.token_ids) == 3
    assert calls(fake_engine, "abort_request") == [
        ("abort_request", {"rid": "long/0#1", "abort_all": False})
    ]


def test_pause_keep_update_resume_continues_samples_with_the_new_weights(make_engine):
    engine, fake_engine = make_engine()
    named = weights(2.0)

    async def scenario():
        task = asyncio.ensure_future(engine.generate_request(request("r", max_tokens=12)))
        await turns(6)
        await engine.pause("keep")
        await push(engine, 1, named)
        await engine.resume()
        return await task

    (completion,) = asyncio.run(scenario())
    assert completion.finish_reason == "length" and len(completion.token_ids) == 12
    cut = completion.token_versions.index(1)
    assert 0 < cut < 12
    assert completion.token_versions == [0] * cut + [1] * (12 - cut)
    # the fake's log-probs say which weights sampled each token
    assert completion.log_probs == [-0.1] * cut + [-0.2] * (12 - cut)
    assert completion.weight_version == 1 and engine.weight_version == 1
    names = [name for name, _ in fake_engine.calls if name != "Engine"]
    assert names == [
        "async_generate",
        "pause_generation",
        "update_weights_from_tensor",
        "flush_cache",
        "continue_generation",
        "async_generate",
    ]
    assert calls(fake_engine, "pause_generation")[0][1] == {"mode": "abort"}
    assert calls(fake_engine, "update_weights_from_tensor")[0][1]["in_flight"] == 0
    continued = calls(fake_engine, "async_generate")[1][1]
    assert continued["input_ids"] == [*PROMPT, *completion.token_ids[:cut]]
    assert continued["sampling_params"]["max_new_tokens"] == 12 - cut
    assert continued["rid"] != calls(fake_engine, "async_generate")[0][1]["rid"]


def test_pause_abort_ends_the_requests_in_flight_and_later_ones_run(make_engine):
    engine, fake_engine = make_engine()

    async def scenario():
        task = asyncio.ensure_future(engine.generate_request(request("r", max_tokens=500)))
        await turns(6)
        await engine.pause("abort")
        later = asyncio.ensure_future(engine.generate_request(request("later", max_tokens=2)))
        await turns(6)
        assert not later.done()  # requests sent while paused wait
        await engine.resume()
        return await task, await later

    (aborted,), (later,) = asyncio.run(scenario())
    assert aborted.finish_reason == "aborted" and 0 < len(aborted.token_ids) < 500
    assert later.finish_reason == "length" and len(later.token_ids) == 2
    assert [args["rid"] for _, args in calls(fake_engine, "async_generate")] == [
        "r/0#1",
        "later/0#2",
    ]


def test_weights_arrive_in_buckets_one_payload_per_tensor_parallel_rank(make_engine):
    engine, fake_engine = make_engine(tensor_model_parallel_size=2)
    named = weights(3.0)
    asyncio.run(push(engine, 7, named, [["embed.weight", "head.weight"], ["norm.weight"]]))
    updates = [args for _, args in calls(fake_engine, "update_weights_from_tensor")]
    assert [args["names"] for args in updates] == [["embed.weight", "head.weight"], ["norm.weight"]]
    for args in updates:
        assert args["payloads"] == 2
        assert args["load_format"] is None and args["flush_cache"] is False
        assert args["request"] is None
    assert [name for name, _ in fake_engine.calls][-1] == "flush_cache"
    assert all(torch.equal(fake_engine.weights[n], t) for n, t in named.items())
    assert engine.weight_version == 7


def test_weights_read_back_through_get_weights_by_name_cover_their_first_rows(make_engine):
    from plugrl.parts.rollout import fingerprint_difference, weight_fingerprint
    from plugrl_sglang.engine import READBACK_ROWS

    engine, fake_engine = make_engine()
    named = {**weights(2.0), "tall.weight": torch.randn(READBACK_ROWS + 36, 3)}
    asyncio.run(push(engine, 3, named))
    held = asyncio.run(engine.weight_fingerprints([*named, "absent.weight"]))
    assert set(held) == set(named)  # a name SGLang does not have is left out
    assert held["tall.weight"].rows == READBACK_ROWS
    assert held["norm.weight"].rows == 2
    for name, tensor in named.items():
        expected = weight_fingerprint(tensor[: held[name].rows], torch.float32)
        assert fingerprint_difference(expected, held[name]) is None, name
    # a weight SGLang kept on old values is told apart
    fake_engine.weights["tall.weight"] = named["tall.weight"] * 0.5
    stale = asyncio.run(engine.weight_fingerprints(["tall.weight"]))["tall.weight"]
    expected = weight_fingerprint(named["tall.weight"][:READBACK_ROWS], torch.float32)
    assert fingerprint_difference(expected, stale) is not None


def test_bad_weight_updates_fail_with_one_line(make_engine):
    engine, fake_engine = make_engine()
    named = weights()
    with pytest.raises(RuntimeError, match="load_weights without begin_weight_update"):
        asyncio.run(engine.load_weights([]))

    async def missing_one():
        await engine.begin_weight_update(1, metas(named))
        await engine.load_weights([("embed.weight", named["embed.weight"])])
        await engine.finish_weight_update()

    with pytest.raises(
        PluginError, match=r"1 of 3 announced weights arrived; missing head\.weight"
    ):
        asyncio.run(missing_one())
    assert engine.weight_version == 0

    async def unannounced():
        await engine.begin_weight_update(1, metas({"embed.weight": named["embed.weight"]}))
        await engine.load_weights([("head.weight", named["head.weight"])])

    with pytest.raises(PluginError, match=r"'head\.weight', which begin_weight_update did not"):
        asyncio.run(unannounced())

    async def wrong_shape():
        await engine.begin_weight_update(1, metas(named))
        await engine.load_weights([("embed.weight", torch.zeros(2, 2))])

    with pytest.raises(PluginError, match=r"shape \(2, 2\), announced as \(4, 2\)"):
        asyncio.run(wrong_shape())

    fake_engine.refuse_weights = True
    with pytest.raises(PluginError, match=r"SGLang did not load a bucket of 3 weights .*unknown"):
        asyncio.run(push(engine, 1, named))


def test_sleep_releases_memory_and_requests_wait_for_wake_up(make_engine):
    engine, fake_engine = make_engine()

    async def scenario():
        await engine.sleep(level=1)
        task = asyncio.ensure_future(engine.generate_request(request("r", max_tokens=2)))
        await turns(6)
        assert not task.done()
        with pytest.raises(RuntimeError, match="wake_up"):
            await engine.begin_weight_update(1, [])
        await engine.wake_up(tags=["weights"])
        await turns(6)
        assert not task.done()  # the cache is still released
        await engine.wake_up()
        return await task

    (completion,) = asyncio.run(scenario())
    assert len(completion.token_ids) == 2
    memory = calls(fake_engine, "release_memory_occupation", "resume_memory_occupation")
    assert memory == [
        ("release_memory_occupation", {"tags": ["kv_cache", "weights"]}),
        ("resume_memory_occupation", {"tags": ["weights"]}),
        ("resume_memory_occupation", {"tags": ["kv_cache"]}),
    ]


def test_an_engine_that_does_not_sleep_makes_no_memory_calls(make_engine):
    engine, fake_engine = make_engine(free_cache_engine=False)
    asyncio.run(engine.sleep())
    asyncio.run(engine.wake_up())
    assert not calls(fake_engine, "release_memory_occupation", "resume_memory_occupation")


def test_close_shuts_the_engine_down_once(make_engine):
    engine, fake_engine = make_engine()
    engine.close()
    engine.close()
    assert calls(fake_engine, "shutdown") == [("shutdown", {})]


def test_model_from_trainer_is_refused(fake, plugrl_register_plugin, plugrl_recipe):
    plugrl_register_plugin(plugrl_sglang)
    recipe = plugrl_recipe({"rollout": {"engine": "sglang"}})
    context = part_context(recipe, model_from_trainer=True)
    with pytest.raises(PluginError, match="cannot generate with the trainer's model"):
        SGLangRolloutEngine(recipe.rollout, context)
    assert not fake.instances


def test_without_sglang_the_error_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang raises ImportError
    with pytest.raises(PluginError) as error:
        load_sglang_api()
    assert str(error.value) == (
        "the sglang rollout engine needs SGLang 0.5.5 or newer (import of sglang halted; None "
        f"in sys.modules); install it with {hints.SGLANG}"
    )


def test_an_answer_without_log_probs_is_an_error(make_engine, monkeypatch):
    engine, fake_engine = make_engine()

    async def no_log_probs(**kwargs):
        return {"output_ids": [1], "meta_info": {"finish_reason": {"type": "length"}}}

    monkeypatch.setattr(fake_engine, "async_generate", no_log_probs)
    with pytest.raises(PluginError, match="no output_token_logprobs or no finish_reason"):
        asyncio.run(engine.generate_request(request()))


def test_sglang_is_given_the_torch_device_type_not_the_registered_name(
    fake, plugrl_register_plugin, plugrl_recipe
):
    plugrl_register_plugin(plugrl_sglang)
    recipe = plugrl_recipe({"model": {"path": "/models/tiny"}, "rollout": {"engine": "sglang"}})
    device = SimpleNamespace(name="my_ascend", torch_device_type="npu", fast_bfloat16=lambda: True)
    arguments = engine_arguments(recipe.rollout, part_context(recipe, device=device))
    assert arguments["device"] == "npu"
    assert arguments["dtype"] == "bfloat16"  # rollout.dtype auto on a device with bfloat16 units
    on_cpu = SimpleNamespace(name="my_cpu", torch_device_type="cpu", fast_bfloat16=lambda: False)
    on_cpu_arguments = engine_arguments(recipe.rollout, part_context(recipe, device=on_cpu))
    assert "device" not in on_cpu_arguments
    assert on_cpu_arguments["dtype"] == "float32"


def test_a_request_with_images_gives_sglang_the_processor_output_beside_its_token_ids(
    make_engine,
):
    engine, fake_engine = make_engine()
    inputs = {"pixel_values": torch.ones(8, 6), "image_grid_thw": torch.tensor([[1, 2, 4]])}
    (with_images,) = batch_requests(
        [[3, 20, 9, 9, 21, 5]],
        SamplingParams(max_tokens=2, n=2, seed=1),
        "images",
        images=[inputs],
        encoded_images=[(b"png bytes",)],
    )
    assert with_images.multi_modal_inputs is inputs and with_images.images == (b"png bytes",)
    with pytest.raises(ValueError, match=r"request 'images-0' has images but the sglang engine's"):
        asyncio.run(engine.generate_request(with_images))
    assert calls(fake_engine, "async_generate") == []

    fake_engine.tokenizer_manager.model_config.is_multimodal = True
    asyncio.run(engine.generate_request(with_images))
    # the continuation of an aborted sample keeps the prompt's images
    partial = Completion(token_ids=[7], log_probs=[-0.1], finish_reason="aborted")
    asyncio.run(engine.generate_request(continuation_request(with_images, partial)))
    sent = calls(fake_engine, "async_generate")
    assert [args["input_ids"] for _, args in sent] == [[3, 20, 9, 9, 21, 5]] * 2 + [
        [3, 20, 9, 9, 21, 5, 7]
    ]
    for _, args in sent:
        (item,) = args["image_data"]
        assert item["format"] == "processor_output"
        assert item["pixel_values"] is inputs["pixel_values"]
        assert item["image_grid_thw"] is inputs["image_grid_thw"]
    # a text prompt sends no image data
    asyncio.run(engine.generate_request(request("text")))
    assert calls(fake_engine, "async_generate")[-1][1]["image_data"] is None


def test_a_request_with_videos_gives_sglang_their_processor_output_as_video_data(make_engine):
    engine, fake_engine = make_engine()
    fake_engine.tokenizer_manager.model_config.is_multimodal = True
    inputs = {
        "pixel_values": torch.ones(4, 6),
        "image_grid_thw": torch.tensor([[1, 2, 2]]),
        "pixel_values_videos": torch.ones(8, 6),
        "video_grid_thw": torch.tensor([[2, 2, 2]]),
        "second_per_grid_ts": torch.tensor([0.5]),
    }
    (with_videos,) = batch_requests(
        [[3, 20, 9, 21, 20, 8, 8, 21, 5]], SamplingParams(max_tokens=2), "videos", images=[inputs]
    )
    asyncio.run(engine.generate_request(with_videos))
    ((_, args),) = calls(fake_engine, "async_generate")
    (image,) = args["image_data"]
    (video,) = args["video_data"]
    assert set(image) == {"format", "pixel_values", "image_grid_thw"}
    assert video["format"] == "processor_output"
    assert video["pixel_values_videos"] is inputs["pixel_values_videos"]
    assert video["video_grid_thw"] is inputs["video_grid_thw"]
    assert video["second_per_grid_ts"] is inputs["second_per_grid_ts"]
