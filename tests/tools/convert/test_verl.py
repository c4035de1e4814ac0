"""Converting verl launch scripts: the three fixture scripts (shaped like the scripts people
run: sync GRPO on GSM8K, DAPO with a custom reward, fully-async on NPU with Megatron and vLLM),
then each mapping rule on a small script, then the errors."""

import pytest

from plugrl.errors import ConvertError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import build_recipe, normalize_shorthand
from plugrl_tools.convert.output import recipe_yaml, report, validate
from plugrl_tools.convert.verl import convert_script
from tests import install_hints as hints


def unmapped(conversion, category=None):
    """{override: reason} of what was not converted (of one category)."""
    return {
        item.override: item.reason
        for item in conversion.unmapped
        if category is None or item.category == category
    }


VLLM = f"a key of rollout engine 'vllm', which is not installed here ({hints.VLLM})"
MEGATRON = f"a key of training backend 'megatron', which is not installed here ({hints.MEGATRON})"
FULLY_ASYNC_UNKNOWN = (
    "scheduler 'fully_async' has no such key (plugrl explain scheduler lists the keys)"
)


# ------------------------------------------------------------- sync GRPO on GSM8K


def test_gsm8k_grpo_recipe(script_text, plugrl_plugin_manager):
    conversion = convert_script(
        script_text("gsm8k_grpo_qwen2.5_0.5b.sh"), "gsm8k.sh", plugins=get_plugin_manager()
    )
    data = "/home/ma-user/work/data/gsm8k"
    assert conversion.module == "verl.trainer.main_ppo"
    assert conversion.recipe == {
        "model": {
            "path": "/home/ma-user/work/models/Qwen2.5-0.5B-Instruct",
            "enable_gradient_checkpointing": True,
        },
        "data": {
            "train_files": [f"{data}/train.parquet"],
            "val_files": [f"{data}/test.parquet"],
            "max_prompt_length": 2048,
            "max_response_length": 3072,
            "train_batch_size": 128,
            "filter_overlong_prompts": True,
        },
        "device": "npu",
        "actor": {
            "use_kl_loss": True,
            "entropy_coeff": 0.001,
            "ppo_mini_batch_size": 64,
            "ppo_micro_batch_size_per_gpu": 2,
            "log_prob_micro_batch_size_per_gpu": 2,
            "optim": {"lr": 5e-7},
        },
        "rollout": {"engine": "vllm", "n": 8, "gpu_memory_utilization": 0.7},
        "trainer": {
            "project_name": "verl_grpo_example_gsm8k",
            "experiment_name": "qwen2_7b_function_rm",
            "test_freq": 5,
            "logger": ["console"],
            "n_gpus_per_node": 2,
        },
        "cluster": "ray",
    }
    assert (conversion.overrides, len(conversion.unmapped)) == (40, 3)


def test_gsm8k_grpo_not_converted(script_text, plugrl_plugin_manager):
    conversion = convert_script(
        script_text("gsm8k_grpo_qwen2.5_0.5b.sh"), "gsm8k.sh", plugins=get_plugin_manager()
    )
    assert unmapped(conversion, "plugin") == {
        "actor_rollout_ref.rollout.enable_chunked_prefill=False": VLLM
    }
    assert unmapped(conversion, "dropped") == {
        "actor_rollout_ref.ref.fsdp_config.param_offload=True": (
            "plugrl's reference model takes the actor's settings: actor.param_offload is False "
            "(from actor_rollout_ref.actor.fsdp_config.param_offload)"
        ),
        "trainer.critic_warmup=0": "plugrl has no critic warm-up, as 0 asks",
    }
    assert conversion.notes == [
        "the command passes on the script's arguments ($@): give them to plugrl run as "
        "KEY=VALUE overrides in plugrl's names",
        "environment of the run, not part of a recipe: VLLM_ASCEND_ENABLE_NZ, "
        "VLLM_ATTENTION_BACKEND; export what plugrl's run needs before plugrl run",
    ]


def test_gsm8k_grpo_validates_but_for_the_npu_and_vllm_plugins(script_text, plugrl_plugin_manager):
    conversion = convert_script(
        script_text("gsm8k_grpo_qwen2.5_0.5b.sh"), "gsm8k.sh", plugins=get_plugin_manager()
    )
    validation = validate(conversion.recipe, get_plugin_manager())
    assert validation.missing == (
        ("device.name", f"device 'npu' is not installed: {hints.NPU}", "auto"),
        ("rollout.engine", f"rollout engine 'vllm' is not installed: {hints.VLLM}", "hf"),
    )
    assert validation.error is None


def test_gsm8k_grpo_validates_with_its_plugins(script_text, stand_ins):
    conversion = convert_script(
        script_text("gsm8k_grpo_qwen2.5_0.5b.sh"), "gsm8k.sh", plugins=get_plugin_manager()
    )
    # the vllm engine declares the verl name of this key, so it is converted now
    assert conversion.recipe["rollout"]["enable_chunked_prefill"] is False
    assert unmapped(conversion, "plugin") == {}
    validation = validate(conversion.recipe, get_plugin_manager())
    assert (validation.missing, validation.error) == ((), None)


# --------------------------------------------------------- DAPO with a custom reward


def test_dapo_recipe(script_text, plugrl_plugin_manager):
    conversion = convert_script(
        script_text("dapo_qwen3_8b_custom_reward.sh"), "dapo.sh", plugins=get_plugin_manager()
    )
    recipe = conversion.recipe
    assert conversion.module == "recipe.dapo.main_dapo"
    assert "scheduler" not in recipe  # DAPO's trainer is the sync loop with dynamic sampling
    assert recipe["data"] == {
        "train_files": ["/path/to/train.parquet"],
        "val_files": ["/path/to/train.parquet"],
        "max_prompt_length": 1024,
        "max_response_length": 10000,
        "train_batch_size": 128,
        "gen_batch_size": 256,
        "filter_overlong_prompts": True,
    }
    assert recipe["actor"] == {
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 10.0,
        "use_kl_loss": True,
        "ppo_mini_batch_size": 32,
        "ppo_micro_batch_size_per_gpu": 2,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 11024,  # $(((1024 + 10000) / 1))
        "optim": {"lr_warmup_steps": 10},
        "param_offload": True,
        "use_remove_padding": True,
    }
    assert recipe["algorithm"] == {"filter_groups": {"enable": True, "max_num_gen_batches": 5}}
    assert recipe["reward"] == {
        "manager": "dapo",
        "custom_function": {"path": "recipes/rewards/multiple_choice.py"},
        "overlong_buffer": {"enable": True, "len": 2048},
    }
    assert recipe["trainer"] == {
        "project_name": "DAPO",
        "experiment_name": "Qwen3-8B-dapo",
        "total_epochs": 5,
        "val_before_train": False,
        "save_freq": 5,
        "default_local_dir": "/path/to/checkpoints/Qwen3-8B-dapo",
        "max_ckpt_to_keep": 2,
        "logger": ["console", "wandb"],
        "n_gpus_per_node": 16,
    }
    assert "line 43: actor_rollout_ref.actor.strategy=fsdp becomes actor.backend: fsdp2" in (
        conversion.notes
    )


def test_dapo_not_converted(script_text, plugrl_plugin_manager):
    conversion = convert_script(
        script_text("dapo_qwen3_8b_custom_reward.sh"), "dapo.sh", plugins=get_plugin_manager()
    )
    assert unmapped(conversion, "plugin") == {
        "actor_rollout_ref.rollout.max_num_batched_tokens=11024": VLLM,
        "actor_rollout_ref.rollout.enforce_eager=False": VLLM,
    }
    assert conversion.recipe["trainer"]["logger"] == ["console", "wandb"]
    assert set(unmapped(conversion, "dropped")) == {
        "actor_rollout_ref.actor.use_torch_compile=False",
        "trainer.critic_warmup=0",
    }
    # settings verl keeps apart and plugrl shares are converted when they agree
    for agreeing in (
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=11024",
        "trainer.max_critic_ckpt_to_keep=2",
    ):
        assert agreeing not in unmapped(conversion)
    assert conversion.recipe["actor"]["use_remove_padding"] is True
    assert len(conversion.unmapped) == 4


def test_dapo_validates_but_for_the_npu_and_vllm_plugins(script_text, plugrl_plugin_manager):
    conversion = convert_script(
        script_text("dapo_qwen3_8b_custom_reward.sh"), "dapo.sh", plugins=get_plugin_manager()
    )
    validation = validate(conversion.recipe, get_plugin_manager())
    assert [key for key, _, _ in validation.missing] == ["device.name", "rollout.engine"]
    assert validation.error is None
    assert validation.warnings == (
        "actor.ppo_micro_batch_size_per_gpu: 2 is ignored: actor.use_dynamic_bsz packs "
        "micro-batches by actor.ppo_max_token_len_per_gpu tokens instead",
    )


def test_dapo_validates_with_its_plugins(script_text, stand_ins):
    conversion = convert_script(
        script_text("dapo_qwen3_8b_custom_reward.sh"), "dapo.sh", plugins=get_plugin_manager()
    )
    assert conversion.recipe["rollout"]["max_num_batched_tokens"] == 11024
    assert "actor_rollout_ref.rollout.enforce_eager=False" not in unmapped(conversion)
    validation = validate(conversion.recipe, get_plugin_manager())
    assert (validation.missing, validation.error) == ((), None)


# ------------------------------------------------- fully-async on NPU, Megatron, vLLM


def test_fully_async_recipe(script_text, plugrl_plugin_manager):
    conversion = convert_script(
        script_text("fully_async_npu_megatron.sh"), "async.sh", plugins=get_plugin_manager()
    )
    recipe = conversion.recipe
    assert conversion.module == "recipe.fully_async_policy.fully_async_main"
    assert recipe["scheduler"] == {
        "name": "fully_async",
        "staleness_threshold": 0.2,
        "trigger_parameter_sync_step": 4,
        "use_rollout_log_probs": True,
        "total_rollout_steps": 51200,
    }  # require_batches=1 and partial_rollout=True are the scheduler's defaults
    assert recipe["device"] == "npu"
    assert recipe["model"] == {
        "path": "/home/ma-user/work/models/Qwen2.5-0.5B-Instruct",
        "override_config": {"max_position_embeddings": 5120},
    }
    assert recipe["data"]["truncation"] == "left"
    assert "train_batch_size" not in recipe["data"]
    actor = recipe["actor"]
    assert next(iter(actor)) == "backend"  # the key choosing the section's part comes first
    assert actor["backend"] == "megatron"  # from --config-name fully_async_ppo_megatron_trainer
    assert (actor["use_dynamic_bsz"], actor["ppo_max_token_len_per_gpu"]) == (True, 5120)
    assert actor["log_prob_micro_batch_size_per_gpu"] == 64
    assert actor["optim"] == {"weight_decay": 0.1, "lr_warmup_steps": 10}
    assert recipe["rollout"] == {
        "engine": "vllm",
        "n": 8,
        "colocate": False,
        "gpu_memory_utilization": 0.8,
        "val_kwargs": {"do_sample": True, "temperature": 1.0, "top_p": 0.7},
    }
    assert recipe["algorithm"] == {"kl_ctrl": {"kl_coef": 0.0}}
    assert recipe["reward"] == {
        "manager": "dapo",
        "overlong_buffer": {"enable": True, "len": 512},
        "max_resp_len": 3072,
    }
    assert recipe["cluster"] == "ray"


def test_fully_async_not_converted(script_text, plugrl_plugin_manager):
    conversion = convert_script(
        script_text("fully_async_npu_megatron.sh"), "async.sh", plugins=get_plugin_manager()
    )
    plugins = unmapped(conversion, "plugin")
    assert {o for o, r in plugins.items() if r == MEGATRON} == {
        "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True",
        "actor_rollout_ref.actor.megatron.use_mbridge=False",
        "actor_rollout_ref.actor.megatron.use_dist_checkpointing=False",
        "actor_rollout_ref.actor.megatron.param_offload=false",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
        "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=null",
        "+actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn=True",
        "actor_rollout_ref.ref.megatron.param_offload=false",
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1",
    }
    assert {o for o, r in plugins.items() if r == VLLM} == {
        "actor_rollout_ref.rollout.enable_chunked_prefill=True",
        "actor_rollout_ref.rollout.max_num_batched_tokens=5120",
        "actor_rollout_ref.rollout.enforce_eager=True",
    }
    # the rollouter's epochs are the run's; its validation counts weight syncs, 4 steps each
    assert unmapped(conversion, "unknown") == {}
    assert conversion.recipe["trainer"]["test_freq"] == 80
    assert "total_epochs" not in conversion.recipe["trainer"]  # 1, plugrl's default
    dropped = unmapped(conversion, "dropped")
    assert dropped["data.train_batch_size=0"].startswith(
        "0 tells verl's fully-async trainer to ignore it"
    )
    assert set(dropped) == {
        "data.train_batch_size=0",
        "data.return_raw_chat=True",  # set inside `if [ "$rollout_mode" = "async" ]`
        "actor_rollout_ref.model.use_fused_kernels=False",
        "actor_rollout_ref.actor.optim.lr_decay_steps=51200",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    }
    assert len(conversion.unmapped) == 19 and conversion.overrides == 90
    assert conversion.notes[1:] == [
        "environment of the run, not part of a recipe: PYTHONPATH, VLLM_USE_V1; export what "
        "plugrl's run needs before plugrl run",
        'line 21: if [ "$rollout_mode" = "async" ] is true',
        "recipe.fully_async_policy.fully_async_main runs as plugrl's fully_async scheduler",
        "--config-name fully_async_ppo_megatron_trainer.yaml trains with actor.backend megatron",
        "line 169: rollout.test_freq=20 counts weight syncs, 4 trainer steps each: "
        "trainer.test_freq 80",
        "not set by the script, so verl used its defaults, which plugrl's differ from: "
        "model.enable_gradient_checkpointing (verl True, plugrl False); set them where the run "
        "relied on verl's",
    ]


def test_fully_async_names_the_missing_plugins_and_the_rest_validates(
    script_text, plugrl_plugin_manager
):
    conversion = convert_script(
        script_text("fully_async_npu_megatron.sh"), "async.sh", plugins=get_plugin_manager()
    )
    validation = validate(conversion.recipe, get_plugin_manager())
    assert validation.missing == (
        ("device.name", f"device 'npu' is not installed: {hints.NPU}", "auto"),
        (
            "actor.backend",
            f"training backend 'megatron' is not installed: {hints.MEGATRON}",
            "fsdp2",
        ),
        ("rollout.engine", f"rollout engine 'vllm' is not installed: {hints.VLLM}", "hf"),
    )
    assert validation.error is None


def test_fully_async_validates_with_its_plugins(script_text, stand_ins):
    conversion = convert_script(
        script_text("fully_async_npu_megatron.sh"), "async.sh", plugins=get_plugin_manager()
    )
    recipe = conversion.recipe
    assert recipe["scheduler"]["staleness_threshold"] == 0.2
    assert recipe["trainer"]["logger"] == ["console", "tensorboard"]
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1" not in unmapped(
        conversion
    )
    assert unmapped(conversion)["actor_rollout_ref.actor.megatron.use_mbridge=False"] == (
        "training backend 'megatron' has no such key (plugrl explain actor lists the keys)"
    )
    validation = validate(recipe, get_plugin_manager())
    assert (validation.missing, validation.error) == ((), None)
    resolved = build_recipe(normalize_shorthand(recipe), get_plugin_manager())
    assert (resolved.scheduler.staleness_threshold, resolved.actor.backend) == (0.2, "megatron")
    # verl's staleness rule is the default: the strict bound is plugrl's own and stays off
    assert "max_version_lag" not in recipe["scheduler"]
    assert resolved.scheduler.max_version_lag is None


def test_written_recipe_reads_back_as_converted(script_text, plugrl_plugin_manager):
    import yaml

    conversion = convert_script(
        script_text("fully_async_npu_megatron.sh"), "async.sh", plugins=get_plugin_manager()
    )
    text = recipe_yaml(conversion)
    assert text.startswith(
        "# Converted by `plugrl convert verl` from async.sh "
        "(recipe.fully_async_policy.fully_async_main, line 82).\n"
    )
    assert "  train_files: [/home/ma-user/work/data/gsm8k/train.parquet]\n" in text
    assert yaml.safe_load(text) == conversion.recipe
    assert list(yaml.safe_load(text)) == [
        "model",
        "data",
        "device",
        "actor",
        "rollout",
        "algorithm",
        "reward",
        "scheduler",
        "trainer",
        "cluster",
    ]


# ---------------------------------------------------------------- mapping rules


def convert(*overrides, env=None, module="verl.trainer.main_ppo", before=""):
    text = before + f"python3 -m {module} \\\n" + " \\\n".join(f"    {o}" for o in overrides)
    return convert_script(text + "\n", "run.sh", env, plugins=get_plugin_manager())


def test_values_take_the_type_of_the_plugrl_key(plugrl_plugin_manager):
    conversion = convert(
        'trainer.nnodes="2"',
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.actor.optim.lr=3e-6",
        "data.train_files=/data/train.parquet",
        "data.val_files=\"['/data/a.parquet', '/data/b.parquet']\"",
        "trainer.logger=console",
        "actor_rollout_ref.rollout.do_sample=False",
        "actor_rollout_ref.rollout.temperature=1",
        "algorithm.rollout_is=null",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    )
    recipe = conversion.recipe
    assert recipe["trainer"] == {"logger": ["console"], "nnodes": 2, "n_gpus_per_node": 4}
    assert recipe["actor"] == {"ppo_mini_batch_size": 64, "optim": {"lr": 3e-6}}
    assert recipe["data"] == {
        "train_files": ["/data/train.parquet"],
        "val_files": ["/data/a.parquet", "/data/b.parquet"],
    }
    assert recipe["rollout"] == {"do_sample": False}  # temperature 1.0 is the default
    assert isinstance(recipe["actor"]["optim"]["lr"], float)
    assert conversion.unmapped == []


def test_the_rollout_dtype_is_verls_key(plugrl_plugin_manager):
    conversion = convert("actor_rollout_ref.rollout.dtype=bfloat16")
    assert conversion.recipe["rollout"] == {"dtype": "bfloat16"}
    assert conversion.unmapped == []


def test_keys_inside_a_mapping_option(plugrl_plugin_manager):
    conversion = convert(
        "+actor_rollout_ref.model.override_config.attention_dropout=0.",
        "+actor_rollout_ref.model.override_config.model_config.rope_theta=1000000",
        "custom_reward_function.path=reward.py",
        "+custom_reward_function.reward_kwargs.strict=True",
        "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
        "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.001",
    )
    recipe = conversion.recipe
    assert recipe["model"] == {"override_config": {"attention_dropout": 0.0, "rope_theta": 1000000}}
    assert recipe["reward"] == {
        "custom_function": {"path": "reward.py", "kwargs": {"strict": True}}
    }
    assert recipe["actor"] == {
        "policy_loss": "clip_cov",
        "policy_loss_args": {"clip_cov_ratio": 0.001},
    }
    assert validate(recipe, get_plugin_manager()).error is None


def test_renamed_verl_keys(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.actor.optim.lr_decay_style=cosine",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "reward_model.reward_manager=dapo",
        "+ray_kwargs.ray_init.num_cpus=8",
        "critic.optim.lr=1e-5",
    )
    assert conversion.recipe["actor"] == {"optim": {"lr_scheduler_type": "cosine"}}
    assert conversion.recipe["reward"] == {"manager": "dapo", "overlong_buffer": {"enable": True}}
    assert conversion.recipe["cluster"] == {"mode": "ray", "num_cpus": 8}
    assert "critic" not in conversion.recipe  # 1e-5 is plugrl's default for the critic
    assert convert("ray_init.num_cpus=4").recipe["cluster"] == {"mode": "ray", "num_cpus": 4}


def test_shared_keys_that_disagree_are_reported(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    )
    assert unmapped(conversion, "dropped") == {
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True": (
            "plugrl offloads parameters, gradients and optimizer state together: "
            "actor.param_offload is False "
            "(from actor_rollout_ref.actor.fsdp_config.param_offload)"
        ),
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4": (
            "plugrl's reference model takes the actor's settings: "
            "actor.log_prob_micro_batch_size_per_gpu is None (the default)"
        ),
    }


def test_the_critic_shares_the_actors_backend(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
        "critic.model.fsdp_config.param_offload=True",
        "critic.strategy=fsdp",
        "critic.model.fsdp_config.fsdp_size=4",
    )
    assert conversion.recipe["actor"] == {"param_offload": True}
    assert unmapped(conversion) == {
        "critic.model.fsdp_config.fsdp_size=4": (
            "plugrl's backend settings apply to every model it builds, the critic's too: "
            "actor.fsdp_size is -1 (the default)"
        )
    }


def test_keys_of_a_part_the_script_does_not_choose(plugrl_plugin_manager):
    conversion = convert(
        "reward_model.overlong_buffer.enable=True",
        "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.001",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    )
    assert unmapped(conversion, "plugin") == {
        "reward_model.overlong_buffer.enable=True": (
            "a key of reward manager 'dapo', but the script chooses 'naive'"
        ),
        "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.001": (
            "a key of policy loss 'clip_cov', but the script chooses 'vanilla'"
        ),
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2": (
            f"a key of training backend 'megatron', which is not installed here "
            f"({hints.MEGATRON}), but the script chooses 'fsdp2'"
        ),
    }


def test_unknown_of_a_missing_part_names_it(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.some_engine_knob=1",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.some_backend_knob=1",
    )
    assert unmapped(conversion) == {
        "actor_rollout_ref.rollout.some_engine_knob=1": (
            "not a key of plugrl's core; it may be one of rollout engine 'sglang', which is not "
            f"installed here ({hints.SGLANG})"
        ),
        "actor_rollout_ref.actor.some_backend_knob=1": (
            "not a key of plugrl's core; it may be one of training backend 'megatron', which is "
            f"not installed here ({hints.MEGATRON})"
        ),
    }


def test_engine_keys_with_the_hf_engine(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.enforce_eager=True"
    )
    assert unmapped(conversion) == {
        "actor_rollout_ref.rollout.enforce_eager=True": (
            "a key of the vllm and sglang engines; the script's engine, hf, has none"
        )
    }


@pytest.mark.parametrize(
    ("override", "category", "reason"),
    [
        (
            "trainer.foo=1",
            "unknown",
            "no plugrl key has this meaning (plugrl explain trainer lists that section's keys)",
        ),
        (
            "actor_rollout_ref.ref.bar=1",
            "unknown",
            "no plugrl key has this meaning (plugrl explain actor lists that section's keys)",
        ),
        ("something_else=1", "unknown", "no plugrl key has this meaning"),
        (
            "trainer.balance_batch=True",
            "dropped",
            "verl reorders a batch so its data-parallel ranks get similar token counts (speed); "
            "plugrl splits the batch in its own order: the same samples train, grouped into "
            "micro-batches by plugrl's own token budget",
        ),
        (
            "ray_kwargs.ray_init.runtime_env.py_executable='uv run --frozen --extra vllm'",
            "dropped",
            "the interpreter Ray starts verl's workers with (a `uv run ...` prefix runs them in "
            "uv's project environment); plugrl's Ray workers run the interpreter plugrl run runs "
            "with, so start it the same way: `uv run ... plugrl run RECIPE`, or from the "
            "environment plugrl is installed in",
        ),
        (
            "hydra.run.dir=outputs",
            "dropped",
            "a setting of Hydra itself, which plugrl does not use",
        ),
        ("~trainer.logger", "dropped", "deletes a key of verl's config; plugrl has none"),
        (
            "trainer.project_name='${data.x}'",
            "unresolved",
            "'${data.x}' is a Hydra interpolation, which reads verl's own config; write the value",
        ),
        ("data.train_batch_size=$BATCH", "unresolved", "$BATCH is not set in the script"),
        (
            "data.truncation=sideways",
            "invalid",
            "data.truncation: must be one of error, left, right, middle, got 'sideways'",
        ),
        (
            "data.train_batch_size=abc",
            "invalid",
            "data.train_batch_size: expected an integer, got 'abc'",
        ),
        (
            "actor_rollout_ref.rollout.top_p=1.5",
            "invalid",
            "rollout.top_p: must be between 0 and 1, got 1.5",
        ),
        ("data.train_batch_size=0", "invalid", "data.train_batch_size: must be > 0, got 0"),
        ("trainer.logger=[console", "invalid", "'[' is never closed by ']' in '[console'"),
        (
            "actor_rollout_ref.rollout.n",
            "invalid",
            "'actor_rollout_ref.rollout.n' has no value; write actor_rollout_ref.rollout.n=VALUE",
        ),
    ],
)
def test_why_an_override_is_not_converted(plugrl_plugin_manager, override, category, reason):
    conversion = convert(override)
    ((item),) = conversion.unmapped
    assert (item.category, item.reason, item.line) == (category, reason, 2)


def test_env_gives_what_the_script_does_not_set(plugrl_plugin_manager):
    conversion = convert("actor_rollout_ref.model.path=$MODEL", env={"MODEL": "/m"})
    assert conversion.recipe["model"] == {"path": "/m"}


def test_the_last_of_a_key_given_twice_counts(plugrl_plugin_manager):
    conversion = convert("actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.n=8")
    assert conversion.recipe["rollout"] == {"n": 8}
    assert conversion.notes[0] == (
        "line 3: actor_rollout_ref.rollout.n is given twice; the last value, 8, counts "
        "(as in Hydra)"
    )


def test_config_names(plugrl_plugin_manager):
    megatron = convert("--config-name=ppo_megatron_trainer", "trainer.nnodes=1")
    assert megatron.recipe["actor"] == {"backend": "megatron"}
    custom = convert("--config-path", "/my/configs", "--config-name", "my_run", "trainer.nnodes=1")
    assert custom.notes[0] == (
        "--config-name my_run: only the command line is converted; what my_run.yaml changes "
        "from verl's defaults is not"
    )


def test_a_logger_no_plugin_registers_is_dropped_and_named(plugrl_plugin_manager):
    conversion = convert("trainer.logger=[console,clearml]")
    assert conversion.recipe["trainer"]["logger"] == ["console"]
    (reason,) = unmapped(conversion, "plugin").values()
    assert reason.startswith("logger 'clearml': no installed plugin registers it (installed: ")
    assert reason.endswith("); kept: console")


def test_verl_defaults_the_script_relies_on_are_noted(plugrl_plugin_manager):
    conversion = convert("algorithm.adv_estimator=grpo", "trainer.total_epochs=2")
    assert conversion.notes == [
        "not set by the script, so verl used its defaults, which plugrl's differ from: "
        "model.enable_gradient_checkpointing (verl True, plugrl False), "
        "rollout.tensor_model_parallel_size (verl 2, plugrl 1), trainer.n_gpus_per_node "
        "(verl 8, plugrl 1), trainer.logger (verl ['console', 'wandb'], plugrl ['console', "
        "'jsonl']); set them where the run relied on verl's"
    ]
    assert "algorithm" not in conversion.recipe  # grpo is plugrl's default


def test_commands_around_verl(plugrl_plugin_manager):
    text = (
        "ray job submit --address=http://head:8265 -- python3 -u -m verl.trainer.main_ppo "
        "trainer.nnodes=2 &\n"
    )
    assert convert_script(text, "run.sh", plugins=get_plugin_manager()).recipe["trainer"] == {
        "nnodes": 2
    }
    text = "nohup python3 verl/trainer/main_ppo.py trainer.nnodes=3 > log 2>&1\n"
    assert convert_script(text, "run.sh", plugins=get_plugin_manager()).recipe["trainer"] == {
        "nnodes": 3
    }


# -------------------------------------------------------------------------- errors


def test_no_verl_command():
    with pytest.raises(ConvertError) as error:
        convert_script(
            "echo hello\npython3 -m other.module a=1\n", "run.sh", plugins=get_plugin_manager()
        )
    assert str(error.value) == (
        "run.sh: no verl training command found; expected python3 -m verl.trainer.main_ppo "
        "(or recipe.dapo.main_dapo, or a fully_async_main) followed by its overrides"
    )


def test_two_verl_commands():
    text = "python3 -m verl.trainer.main_ppo a.b=1\nsleep 1\npython3 -m verl.trainer.main_ppo\n"
    with pytest.raises(ConvertError) as error:
        convert_script(text, "run.sh", plugins=get_plugin_manager())
    assert str(error.value) == (
        "run.sh: 2 verl training commands (lines 1, 3); convert one at a time, from a copy of "
        "the script that keeps only that one"
    )


def test_a_recipe_that_does_not_validate_names_the_key(plugrl_plugin_manager):
    conversion = convert(
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    )
    assert validate(conversion.recipe, get_plugin_manager()).error == (
        "rollout.tensor_model_parallel_size: 4 devices per engine is more than the trainer's 2 "
        "(trainer.nnodes x trainer.n_gpus_per_node), whose devices colocated engines share; "
        "use at most 2, or set rollout.colocate=false to give the engines devices of their own"
    )


def test_the_worked_example_of_the_docs_is_what_convert_prints(plugrl_plugin_manager):
    import re
    from pathlib import Path

    from plugrl_tools.convert.output import report

    docs = Path(__file__).parents[3] / "docs" / "migrating-from-verl.md"
    example = docs.read_text().split("## A worked example", 1)[1]
    script, recipe, printed = (
        re.search(rf"```{kind}\n(.*?)```", example, re.DOTALL).group(1)
        for kind in ("bash", "yaml", "text")
    )
    conversion = convert_script(script, "run_gsm8k_grpo.sh", plugins=get_plugin_manager())
    assert recipe_yaml(conversion) == recipe
    lines = report(conversion, validate(conversion.recipe, get_plugin_manager()), "gsm8k-grpo.yaml")
    assert "\n".join(lines) + "\n" == printed


def test_the_installed_megatron_backend_takes_the_scripts_megatron_keys(
    script_text, plugrl_make_plugin_manager
):
    pytest.importorskip("plugrl_megatron")
    plugrl_make_plugin_manager()  # every installed plugin, plugrl-megatron among them
    conversion = convert_script(
        script_text("fully_async_npu_megatron.sh"), "async.sh", plugins=get_plugin_manager()
    )
    actor = conversion.recipe["actor"]
    assert actor["backend"] == "megatron"
    assert actor["override_transformer_config"] == {"use_flash_attn": True}
    assert actor["optimizer_cpu_offload"] is True
    not_converted = unmapped(conversion)
    assert MEGATRON not in not_converted.values()
    # 1 is the backend's default, so the key converts and the recipe leaves it out
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1" not in not_converted
    # verl's own converters give the weights plugrl's conversion gives
    assert actor["use_mbridge"] is False
    assert not [override for override in not_converted if ".megatron." in override]


def test_the_samples_dump_folders(plugrl_plugin_manager):
    conversion = convert(
        "trainer.rollout_data_dir=/data/rollouts", "trainer.validation_data_dir=val_dump"
    )
    assert conversion.recipe["trainer"] == {
        "rollout_data_dir": "/data/rollouts",
        "validation_data_dir": "val_dump",
    }
    assert conversion.unmapped == []


# ------------------------------------------------------------------ verl's reward model


def test_an_enabled_reward_model_becomes_the_reward_model_manager(plugrl_plugin_manager):
    conversion = convert(
        "reward_model.enable=True",
        "reward_model.model.path=/models/Skywork-Reward",
        "reward_model.model.trust_remote_code=True",
        "reward_model.model.input_tokenizer=/models/Qwen2.5-0.5B-Instruct",
        "reward_model.micro_batch_size_per_gpu=16",
        "reward_model.max_length=4096",
        "reward_model.model.fsdp_config.param_offload=True",
        "reward_model.nnodes=1",
        "reward_model.n_gpus_per_node=2",
    )
    assert conversion.recipe["reward"] == {
        "manager": "reward_model",
        "model": {"path": "/models/Skywork-Reward", "trust_remote_code": True},
        "micro_batch_size": 16,
        "max_length": 4096,
        "num_workers": 2,
        "offload": True,
    }
    assert unmapped(conversion) == {
        "reward_model.model.input_tokenizer=/models/Qwen2.5-0.5B-Instruct": (
            "plugrl's reward model always reads responses decoded with the run's tokenizer and "
            "rendered with the reward model's own chat template"
        ),
        "reward_model.nnodes=1": (
            "plugrl's reward model runs on reward.num_workers Ray actors wherever Ray places "
            "them; set that to nnodes x n_gpus_per_node, as 1 asks"
        ),
    }
    assert validate(conversion.recipe, get_plugin_manager()).error is None


def test_the_older_micro_batch_size_is_the_reward_models_too(plugrl_plugin_manager):
    conversion = convert(
        "reward_model.enable=True",
        "reward_model.micro_batch_size=4",
    )
    assert conversion.recipe["reward"] == {"manager": "reward_model", "micro_batch_size": 4}


def test_with_a_reward_model_verl_never_calls_the_custom_function(plugrl_plugin_manager):
    conversion = convert(
        "reward_model.enable=True",
        "reward_model.model.path=/models/rm",
        "reward_model.reward_manager=dapo",
        "custom_reward_function.path=my_reward.py",
        "custom_reward_function.name=score",
    )
    assert conversion.recipe["reward"] == {
        "manager": "reward_model",
        "model": {"path": "/models/rm"},
    }
    replaced = (
        "with reward_model.enable verl's reward is the reward model's score alone: its reward "
        "manager returns the model's scores and never calls the rule or custom function"
    )
    assert unmapped(conversion, "dropped") == {
        "reward_model.reward_manager=dapo": replaced,
        "custom_reward_function.path=my_reward.py": replaced,
        "custom_reward_function.name=score": replaced,
    }
    written = recipe_yaml(conversion)
    assert (
        "# reward_model.enable=True: the reward model's score is the reward (reward.manager:\n"
        "# reward_model), as in verl.\n"
        "# The script's custom_reward_function is left out: verl never calls it while the reward\n"
        "# model is on (its reward manager returns the model's scores). To add it to the model's\n"
        "# score, weigh both with reward.components.\n"
    ) in written
    assert "custom_function" not in written


def test_a_disabled_reward_model_keeps_the_rule_reward(plugrl_plugin_manager):
    conversion = convert(
        "reward_model.enable=False",
        "custom_reward_function.path=my_reward.py",
    )
    assert conversion.recipe["reward"] == {"custom_function": {"path": "my_reward.py"}}
    assert unmapped(conversion) == {
        "reward_model.enable=False": (
            "the reward model is off, as in plugrl unless reward.manager is reward_model"
        )
    }
    assert conversion.comments == []


# ------------------------------------------------------ scripts as people write them now


def test_a_launch_through_bash_arrays_converts_every_element(plugrl_plugin_manager):
    text = (
        "CMD=(python3)\n"
        "DATA=(\n"
        "    data.train_batch_size=64  # prompts per step (the paper's setting)\n"
        "    # data.max_prompt_length=9 isn't used\n"
        "    actor_rollout_ref.rollout.n=4\n"
        ")\n"
        'TRAINER=("trainer.nnodes=2")\n'
        '"${CMD[@]}" -m verl.trainer.main_ppo "${DATA[@]}" "${TRAINER[@]}" trainer.test_freq=5\n'
    )
    conversion = convert_script(text, "run.sh", plugins=get_plugin_manager())
    assert conversion.recipe["data"] == {"train_batch_size": 64}
    assert conversion.recipe["rollout"] == {"n": 4}
    assert conversion.recipe["trainer"] == {"test_freq": 5, "nnodes": 2}
    assert (conversion.overrides, conversion.unmapped, conversion.line) == (4, [], 8)


def test_home_comes_from_the_environment_and_is_named(plugrl_plugin_manager):
    text = "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=$HOME/models/qwen\n"
    conversion = convert_script(
        text, "run.sh", plugins=get_plugin_manager(), inherited={"HOME": "/home/me"}
    )
    assert conversion.recipe["model"] == {"path": "/home/me/models/qwen"}
    assert conversion.notes[0] == (
        "read from this machine's environment: HOME=/home/me; where the run happens they may "
        "differ: give them with --env HOME=..."
    )


def test_an_argument_default_chooses_the_engine(plugrl_plugin_manager):
    conversion = convert("actor_rollout_ref.rollout.name=$ENGINE", before="ENGINE=${1:-sglang}\n")
    assert conversion.recipe["rollout"] == {"engine": "sglang"}
    assert (
        "${1:-sglang} is read as its default, 'sglang', as when the script is run without arguments"
    ) in conversion.notes


def test_verls_newer_names(plugrl_plugin_manager):
    conversion = convert(
        "reward.reward_manager.name=dapo",
        "reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        "reward.reward_kwargs.overlong_buffer_cfg.len=512",
        "reward.custom_reward_function.path=/r/score.py",
        "actor_rollout_ref.actor.optim.clip_grad=0.5",
        "critic.optim.clip_grad=0.7",
    )
    assert conversion.unmapped == []
    reward = conversion.recipe["reward"]
    assert reward["manager"] == "dapo"
    assert reward["overlong_buffer"] == {"enable": True, "len": 512}
    assert reward["custom_function"] == {"path": "/r/score.py"}
    assert conversion.recipe["actor"]["grad_clip"] == 0.5
    assert conversion.recipe["critic"]["grad_clip"] == 0.7


def test_the_one_step_off_policy_trainer_runs_as_fully_async(plugrl_plugin_manager):
    module = "verl.experimental.one_step_off_policy.main_ppo"
    conversion = convert(
        "data.train_batch_size=128", "actor_rollout_ref.actor.ppo_mini_batch_size=32", module=module
    )
    assert conversion.recipe["scheduler"] == {
        "name": "fully_async",
        "staleness_threshold": 0.0,
        "trigger_parameter_sync_step": 1,
        "require_batches": 4,
        "partial_rollout": False,
    }
    message = (
        f"{module} (verl's one-step-off-policy trainer) runs as plugrl's fully_async scheduler "
        "with staleness_threshold 0.0, trigger_parameter_sync_step 1, partial_rollout False, "
        "require_batches 4 (data.train_batch_size / actor.ppo_mini_batch_size): the engines "
        "generate the next batch with the weights of one step before while the trainer trains "
        "the current one."
    )
    assert message in conversion.notes and conversion.comments == [message]
    validation = validate(conversion.recipe, get_plugin_manager(), check_files=False)
    assert validation.error is None


def test_one_step_off_with_a_batch_the_mini_batches_do_not_divide(plugrl_plugin_manager):
    conversion = convert(
        "data.train_batch_size=100",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        module="recipe.one_step_off_policy.main_ppo",
    )
    assert "require_batches" not in conversion.recipe["scheduler"]
    assert (
        "data.train_batch_size 100 is not a multiple of actor.ppo_mini_batch_size 32: set "
        "scheduler.require_batches to the mini-batches a step trains"
    ) in conversion.notes


def test_fully_async_keys_of_the_rollouter(plugrl_plugin_manager):
    conversion = convert(
        "rollout.total_epochs=3",
        "trainer.total_epochs=10",
        "rollout.test_freq=5",
        "trainer.test_freq=2",
        "data.gen_batch_size=1",
        module="verl.experimental.fully_async_policy.fully_async_main",
    )
    assert conversion.recipe["trainer"] == {"total_epochs": 3, "test_freq": 5}
    assert unmapped(conversion) == {
        "trainer.total_epochs=10": (
            "verl's fully-async run lasts the rollouter's rollout.total_epochs, which the script "
            "also sets; that is trainer.total_epochs here"
        ),
        "trainer.test_freq=2": (
            "verl's fully-async trainer validates every rollout.test_freq weight syncs, which "
            "the script also sets; that is trainer.test_freq here"
        ),
        "data.gen_batch_size=1": (
            "in verl's fully-async trainer the rollouter's unit of streaming (one prompt), not "
            "dynamic sampling; plugrl's fully_async scheduler streams each prompt as an engine "
            "has room (scheduler.max_in_flight_per_engine)"
        ),
    }


def test_keys_of_the_critic_are_reported_as_the_actors(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.model.use_remove_padding=True",
        "critic.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "critic.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "critic.model.enable_gradient_checkpointing=False",
    )
    reasons = unmapped(conversion)
    # what plugrl has (packed updates) the critic's key carries over as the actor's
    assert "critic.model.use_remove_padding=True" not in reasons
    assert "actor_rollout_ref.model.use_remove_padding=True" not in reasons
    assert "critic.ulysses_sequence_parallel_size=2" not in reasons
    assert conversion.recipe["actor"]["ulysses_sequence_parallel_size"] == 2
    assert reasons["critic.model.enable_gradient_checkpointing=False"] == (
        "plugrl builds every model, the critic too, with the settings of model: "
        "model.enable_gradient_checkpointing is True (from "
        "actor_rollout_ref.model.enable_gradient_checkpointing)"
    )


# ------------------------------------------------------------------- rollout correction


def test_rollout_correction_under_verls_names(plugrl_plugin_manager):
    conversion = convert(
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=3.0",
        "algorithm.rollout_correction.rollout_rs=null",
        "algorithm.rollout_correction.rollout_rs_threshold=",
        "algorithm.rollout_correction.bypass_mode=false",
        "algorithm.rollout_correction.loss_type=ppo_clip",
        "algorithm.rollout_correction.rollout_is_batch_normalize=False",
    )
    assert conversion.recipe["algorithm"] == {"rollout_is": "token", "rollout_is_threshold": 3.0}
    dropped = unmapped(conversion, "dropped")
    assert dropped["algorithm.rollout_correction.rollout_rs=null"].endswith(", as null asks")
    assert dropped["algorithm.rollout_correction.rollout_rs_threshold="].endswith(
        ", as an empty value asks"
    )
    assert {o: r.rsplit(", as ", 1)[0] for o, r in dropped.items()} == {
        "algorithm.rollout_correction.rollout_rs=null": NO_REJECTION,
        "algorithm.rollout_correction.rollout_rs_threshold=": NO_REJECTION,
        "algorithm.rollout_correction.bypass_mode=false": NO_BYPASS,
        "algorithm.rollout_correction.loss_type=ppo_clip": NO_REINFORCE,
        "algorithm.rollout_correction.rollout_is_batch_normalize=False": NO_NORMALIZE,
    }


def test_rollout_correction_plugrl_lacks_is_refused_by_name(plugrl_plugin_manager):
    conversion = convert(
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
        'algorithm.rollout_correction.rollout_rs_threshold="0.999_1.001"',
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is_batch_normalize=true",
        "algorithm.rollout_is_threshold=4",  # verl 0.6's name
        "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4",
    )
    assert conversion.recipe["algorithm"] == {"rollout_is": "sequence", "rollout_is_threshold": 4.0}
    assert unmapped(conversion, "unknown") == {
        "algorithm.rollout_correction.rollout_rs=seq_mean_k1": NO_REJECTION,
        "algorithm.rollout_correction.rollout_rs_threshold=0.999_1.001": NO_REJECTION,
        "algorithm.rollout_correction.bypass_mode=true": NO_BYPASS,
        "algorithm.rollout_correction.loss_type=reinforce": NO_REINFORCE,
        "algorithm.rollout_correction.rollout_is_batch_normalize=true": NO_NORMALIZE,
        "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4": NO_REJECTION,
    }


NO_REJECTION = (
    "plugrl has no rejection sampling against the rollout policy; its correction "
    "(algorithm.rollout_is) weighs tokens, it does not drop them"
)
NO_BYPASS = (
    "plugrl has no bypass mode: the trainer recomputes the old log-probs (with scheduler: "
    "fully_async, scheduler.use_rollout_log_probs takes the engines' instead)"
)
NO_REINFORCE = (
    "plugrl's correction weighs the PPO-clip loss; the REINFORCE loss of verl's bypass mode "
    "has no counterpart"
)
NO_NORMALIZE = "plugrl does not normalise the importance weights over the batch"


def test_a_recipes_own_trainer_is_converted_as_the_one_it_is_named_after(plugrl_plugin_manager):
    conversion = convert("trainer.nnodes=2", module="recipe.partial_rollout.main_ppo")
    assert conversion.recipe["trainer"] == {"nnodes": 2}
    assert conversion.notes[0] == (
        "recipe.partial_rollout.main_ppo is not one of verl's own trainers; its overrides are "
        "converted as those of verl's main_ppo, and what it does differently is not"
    )


def test_the_reference_and_the_critic_split_sequences_as_the_actor(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2",
        "critic.ulysses_sequence_parallel_size=2",
    )
    assert conversion.recipe["actor"] == {"ulysses_sequence_parallel_size": 2}
    assert unmapped(conversion) == {}
    conversion = convert(
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4",
        "critic.ulysses_sequence_parallel_size=1",
    )
    from_actor = (
        "actor.ulysses_sequence_parallel_size is 2 (from "
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size)"
    )
    assert unmapped(conversion) == {
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4": (
            f"plugrl's reference model takes the actor's settings: {from_actor}"
        ),
        "critic.ulysses_sequence_parallel_size=1": (
            f"plugrl's critic splits sequences over the actor's sequence-parallel groups: "
            f"{from_actor}"
        ),
    }


def test_older_verls_micro_batches_per_step_become_per_device(plugrl_plugin_manager):
    conversion = convert(
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=32",
        "critic.ppo_micro_batch_size=2",
        "critic.ulysses_sequence_parallel_size=1",
    )
    assert conversion.recipe["actor"]["ppo_micro_batch_size_per_gpu"] == 4  # 16 over 8 / 2
    assert conversion.recipe["actor"]["log_prob_micro_batch_size_per_gpu"] == 8
    assert (
        "line 5: actor_rollout_ref.actor.ppo_micro_batch_size=16 is per step; over 4 "
        "data-parallel ranks verl made it actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"
    ) in conversion.notes
    assert unmapped(conversion, "invalid") == {
        "critic.ppo_micro_batch_size=2": (
            "verl divides it by the 8 data-parallel ranks, which leaves none"
        )
    }


def test_a_micro_batch_per_step_and_per_device_keeps_the_per_device_one(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.actor.ppo_micro_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    )
    assert conversion.recipe["actor"]["ppo_micro_batch_size_per_gpu"] == 2
    assert unmapped(conversion) == {
        "actor_rollout_ref.actor.ppo_micro_batch_size=16": (
            "the script also sets actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, which "
            "verl uses"
        )
    }


def test_switches_of_verls_own_machinery(plugrl_plugin_manager):
    conversion = convert(
        "trainer.use_legacy_worker_impl=disable",
        "actor_rollout_ref.model.use_shm=False",
        "critic.model.use_shm=True",
    )
    assert unmapped(conversion) == {
        "trainer.use_legacy_worker_impl=disable": (
            "verl's choice between its own worker implementations; plugrl has one per backend"
        ),
        "actor_rollout_ref.model.use_shm=False": (
            "plugrl reads the model from model.path; it does not copy it to shared memory first"
        ),
        "critic.model.use_shm=True": (
            "plugrl reads the model from model.path; it does not copy it to shared memory first"
        ),
    }


def test_lora_keys_map_and_their_loading_switches_drop(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.model.lora_rank=32",
        "actor_rollout_ref.model.lora_alpha=32",
        "actor_rollout_ref.model.target_modules=all-linear",
        "actor_rollout_ref.model.exclude_modules='.*visual.*'",
        "actor_rollout_ref.model.use_shm=True",
        "actor_rollout_ref.rollout.load_format=safetensors",
        "actor_rollout_ref.rollout.layered_summon=True",
    )
    # target_modules all-linear is plugrl's default too, so the recipe leaves it out
    assert conversion.recipe["model"] == {
        "lora_rank": 32,
        "lora_alpha": 32.0,
        "exclude_modules": ".*visual.*",
    }
    assert set(unmapped(conversion, "dropped")) == {
        "actor_rollout_ref.model.use_shm=True",
        "actor_rollout_ref.rollout.load_format=safetensors",
        "actor_rollout_ref.rollout.layered_summon=True",
    }
    assert unmapped(conversion) == unmapped(conversion, "dropped")


def test_lora_keys_of_the_critic_do_not_follow_the_actors(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.model.lora_rank=32",
        "critic.model.lora_rank=32",
        "critic.model.lora_alpha=16",
    )
    assert conversion.recipe["model"] == {"lora_rank": 32}
    reason = "plugrl's critic trains every weight; LoRA adapters (model.lora_rank) are the actor's"
    assert unmapped(conversion, "unknown") == {"critic.model.lora_rank=32": reason}
    assert unmapped(conversion, "dropped") == {"critic.model.lora_alpha=16": reason}
    assert unmapped(convert("critic.model.lora_rank=0"), "dropped") == {
        "critic.model.lora_rank=0": reason
    }


# ------------------------------------------------------------- verl 0.8 and after


def test_separate_async_runs_as_fully_async_with_verls_period_and_bound(plugrl_plugin_manager):
    conversion = convert(
        "trainer.use_v1=True",
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.num_warmup_batches=2",
        "trainer.v1.separate_async.parameter_sync_step=4",
        "trainer.v1.sampler.max_off_policy_threshold=3",
        "trainer.v1.sampler.max_off_policy_strategy=drop",
        "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",
        "algorithm.rollout_correction.bypass_mode=True",
        "trainer.total_training_steps=5",
        "trainer.test_freq=2",
    )
    assert conversion.recipe["scheduler"] == {
        "name": "fully_async",
        "staleness_threshold": 1.0,
        "trigger_parameter_sync_step": 4,
        "use_rollout_log_probs": True,
        "max_version_lag": 2,
    }
    assert conversion.recipe["rollout"] == {"colocate": False, "n_gpus_per_node": 2}
    assert conversion.recipe["trainer"]["total_training_steps"] == 20
    assert conversion.recipe["trainer"]["test_freq"] == 8
    assert "train_batch_size" not in conversion.recipe.get("data", {})
    assert set(unmapped(conversion)) == set(unmapped(conversion, "dropped"))
    assert any("scheduler.max_version_lag 2, the strict bound" in c for c in conversion.comments)
    validation = validate(conversion.recipe, get_plugin_manager(), check_files=False)
    assert validation.error is None


def test_separate_async_left_at_verls_defaults(plugrl_plugin_manager):
    conversion = convert(
        "trainer.v1.trainer_mode=separate_async",
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    )
    scheduler = conversion.recipe["scheduler"]
    assert scheduler["trigger_parameter_sync_step"] == 4 and scheduler["max_version_lag"] == 7
    assert any(
        "(verl's defaults, not set by the script: parameter_sync_step 4, num_warmup_batches 1, "
        "max_off_policy_threshold 8, max_off_policy_strategy drop)" in note
        for note in conversion.notes
    )


def test_separate_async_with_a_batch_verl_refuses(plugrl_plugin_manager):
    conversion = convert(
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.parameter_sync_step=2",
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    )
    assert unmapped(conversion, "invalid") == {
        "data.train_batch_size=16": "verl's separate_async requires data.train_batch_size = "
        "parameter_sync_step 2 x actor.ppo_mini_batch_size 4"
    }


def test_the_wait_strategy_is_reported_with_how_plugrl_differs(plugrl_plugin_manager):
    conversion = convert(
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.sampler.max_off_policy_strategy=wait",
        "trainer.v1.sampler.max_off_policy_threshold=4",
    )
    reason = unmapped(conversion, "unknown")["trainer.v1.sampler.max_off_policy_strategy=wait"]
    assert "plugrl has no such dropless bound" in reason
    assert "scheduler.max_version_lag 3 bounds it by dropping instead" in reason
    assert "max_version_lag" not in conversion.recipe["scheduler"]


def test_colocate_async_runs_as_sync_and_says_so(plugrl_plugin_manager):
    conversion = convert(
        "trainer.use_v1=True",
        "trainer.v1.trainer_mode=colocate_async",
        "trainer.v1.colocate_async.num_warmup_batches=1",
        "trainer.v1.sampler.max_off_policy_threshold=4",
        "trainer.v1.separate_async.parameter_sync_step=2",
    )
    assert "scheduler" not in conversion.recipe
    unknown = unmapped(conversion, "unknown")
    assert unknown["trainer.v1.trainer_mode=colocate_async"].startswith(
        "plugrl has no asynchronous mode on shared devices"
    )
    assert set(unknown) == {
        "trainer.v1.trainer_mode=colocate_async",
        "trainer.v1.colocate_async.num_warmup_batches=1",
        "trainer.v1.sampler.max_off_policy_threshold=4",
    }
    assert unmapped(conversion, "dropped")["trainer.v1.separate_async.parameter_sync_step=2"] == (
        "a setting of verl's separate_async trainer; the script runs colocate_async"
    )


def test_the_sync_v1_trainer_is_the_sync_scheduler(plugrl_plugin_manager):
    conversion = convert(
        "trainer.use_v1=True",
        "trainer.v1.trainer_mode=sync",
        "trainer.v1.sampler.max_off_policy_strategy=drop",
        "transfer_queue.enable=True",
    )
    assert "scheduler" not in conversion.recipe
    assert set(unmapped(conversion)) == set(unmapped(conversion, "dropped"))


def test_model_engine_chooses_the_backend(plugrl_plugin_manager):
    megatron = convert("model_engine=megatron", "actor_rollout_ref.model.use_remove_padding=True")
    assert megatron.recipe["actor"]["backend"] == "megatron"
    assert unmapped(megatron) == {
        "actor_rollout_ref.model.use_remove_padding=True": "plugrl's megatron backend always "
        "runs the packed layout, where no token attends to padding: the same log-probs either way"
    }
    dp = convert("model_engine=dp")
    assert dp.recipe.get("actor", {}).get("backend", "fsdp2") == "fsdp2" and dp.unmapped == []


@pytest.mark.parametrize(
    ("choice", "own_key"),
    [
        ("model_engine=veomni", "actor_rollout_ref.actor.veomni.router_replay.mode=R3"),
        (
            "actor_rollout_ref.actor.strategy=fsdp_turbo",
            (
                "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.ulysses_parallel_size=2"
            ),
        ),
    ],
)
def test_fsdp2_like_engines_train_with_fsdp2_and_say_so(plugrl_plugin_manager, choice, own_key):
    conversion = convert(choice, own_key)
    assert conversion.recipe.get("actor", {}).get("backend", "fsdp2") == "fsdp2"
    # the choice of engine is reported, not lost; a setting of its own that changes what is
    # trained (router replay) is
    assert "the recipe trains with actor.backend fsdp2" in unmapped(conversion, "dropped")[choice]
    assert set(unmapped(conversion, "plugin")) == {own_key}


def test_settings_of_fsdp2_like_engines_that_train_the_same(plugrl_plugin_manager):
    veomni = convert(
        "model_engine=veomni",
        "actor_rollout_ref.actor.veomni.expert_parallel_size=8",
        "actor_rollout_ref.actor.veomni.attn_implementation=flash_attention_2",
        "actor_rollout_ref.actor.veomni.moe_implementation=fused_triton",
        "actor_rollout_ref.actor.veomni.enable_full_shard=True",
    )
    assert set(unmapped(veomni)) == set(unmapped(veomni, "dropped"))
    assert "shards every expert's weights over all ranks" in "".join(unmapped(veomni).values())
    partial = convert(
        "model_engine=veomni", "actor_rollout_ref.actor.veomni.enable_full_shard=False"
    )
    assert set(unmapped(partial, "plugin")) == {
        "actor_rollout_ref.actor.veomni.enable_full_shard=False"
    }
    titan = convert(
        "model_engine=torchtitan",
        "actor_rollout_ref.actor.torchtitan.param_offload=True",
        "actor_rollout_ref.actor.torchtitan.tensor_parallel_size=2",
        "actor_rollout_ref.actor.optim.min_lr_factor=1.0",
    )
    assert titan.recipe["actor"]["param_offload"] is True
    assert set(unmapped(titan, "plugin")) == {
        "actor_rollout_ref.actor.torchtitan.tensor_parallel_size=2"
    }
    assert "min_lr_factor=1.0" in "".join(unmapped(titan, "dropped"))
    assert set(unmapped(convert("actor_rollout_ref.actor.optim.min_lr_factor=0.1"), "unknown")) == {
        "actor_rollout_ref.actor.optim.min_lr_factor=0.1"
    }


def test_infrastructure_settings_are_dropped_with_their_reason(plugrl_plugin_manager):
    conversion = convert(
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,2]",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.contents=[cpu,cuda]",
        "actor_rollout_ref.rollout.data_parallel_size=4",
        "actor_rollout_ref.rollout.expert_parallel_size=32",
        "actor_rollout_ref.rollout.cudagraph_capture_sizes=[8,16]",
        "actor_rollout_ref.actor.fsdp_config.forward_prefetch=True",
        "actor_rollout_ref.model.enable_activation_offload=True",
        "actor_rollout_ref.nccl_timeout=7200",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model]",
        "+actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
        "data.dataloader_num_workers=8",
        "actor_rollout_ref.actor.megatron.use_megatron_fsdp=True",
        "actor_rollout_ref.model.use_liger=True",
        "reward_model.use_reward_loop=True",
        "reward_model.num_workers=8",
    )
    dropped = unmapped(conversion, "dropped")
    assert set(unmapped(conversion)) == set(dropped)
    assert "records and changes nothing that is trained" in dropped["global_profiler.tool=torch"]
    assert "the same samples" in dropped["actor_rollout_ref.rollout.expert_parallel_size=32"]
    assert "stops the run with a timeout error" in dropped["actor_rollout_ref.nccl_timeout=7200"]
    # another buffer dtype than verl's default would change the numbers: not dropped
    lower = convert(
        "+actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True",
        "actor_rollout_ref.actor.optim.exp_avg_dtype=bf16",
    )
    assert (
        "exp_avg_dtype=bf16"
        in unmapped(lower, "unknown")[
            "+actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True"
        ]
    )
    other = convert("+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=bf16")
    assert set(unmapped(other, "unknown")) == {
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=bf16"
    }


def test_megatron_bridge_is_dropped_without_lora_and_min_lr_is_a_ratio(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.actor.megatron.vanilla_mbridge=False",
        "actor_rollout_ref.actor.optim.lr=2e-6",
        "actor_rollout_ref.actor.optim.min_lr=1e-6",
    )
    assert (
        "the same weights"
        in unmapped(conversion, "dropped")["actor_rollout_ref.actor.megatron.vanilla_mbridge=False"]
    )
    assert conversion.recipe["actor"]["optim"]["min_lr_ratio"] == pytest.approx(0.5)
    lora = convert(
        "actor_rollout_ref.actor.megatron.vanilla_mbridge=False",
        "actor_rollout_ref.model.lora_rank=8",
    )
    assert "actor_rollout_ref.actor.megatron.vanilla_mbridge=False" not in unmapped(lora, "dropped")


def test_paths_and_run_names_the_script_cannot_give_are_placeholders(plugrl_plugin_manager):
    conversion = convert(
        "data.train_files=$RAY_DATA_HOME/data/train.parquet",
        "trainer.experiment_name=run_$(date +%s)",
        "data.train_batch_size=$BATCH",
    )
    assert conversion.recipe["data"]["train_files"] == ["<RAY_DATA_HOME>/data/train.parquet"]
    assert conversion.recipe["trainer"]["experiment_name"] == "run_$(date +%s)"
    assert [p.override for p in conversion.placeholders] == [
        "data.train_files=<RAY_DATA_HOME>/data/train.parquet",
        "trainer.experiment_name=run_$(date +%s)",
    ]
    assert "a path to fill in" in conversion.placeholders[0].reason
    assert "only labels the run" in conversion.placeholders[1].reason
    # a setting that is not a path or a label stays unresolved: not clean
    assert set(unmapped(conversion, "unresolved")) == {"data.train_batch_size=$BATCH"}
    assert any("Fill in before running: data.train_files" in c for c in conversion.comments)


def test_the_reward_block_of_verl_0_8(plugrl_plugin_manager):
    conversion = convert(
        "reward.num_workers=4",
        "reward.reward_manager.name=naive",
        "reward.reward_model.enable=True",
        "reward.reward_model.enable_resource_pool=False",
        "reward.reward_model.model_path=/m/rm",
        "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.rollout.tensor_model_parallel_size=1",
        "reward.reward_model.rollout.gpu_memory_utilization=0.6",
        "reward.reward_model.rollout.prompt_length=2048",
        "reward.sandbox_fusion.url=null",
    )
    assert conversion.recipe["reward"] == {"manager": "reward_model", "model": {"path": "/m/rm"}}
    assert set(unmapped(conversion)) == set(unmapped(conversion, "dropped"))
    sharded = convert(
        "reward.reward_model.enable=True",
        "reward.reward_model.rollout.tensor_model_parallel_size=2",
    )
    assert unmapped(sharded, "unknown") == {
        "reward.reward_model.rollout.tensor_model_parallel_size=2": (
            "plugrl's reward model is not sharded: each of its workers holds it whole"
        )
    }


def test_nested_lora_keys(plugrl_plugin_manager):
    conversion = convert(
        "actor_rollout_ref.model.lora.rank=16",
        "actor_rollout_ref.model.lora.alpha=32",
        "actor_rollout_ref.model.lora.target_modules=[q_proj,v_proj]",
        "actor_rollout_ref.model.lora.merge=True",
        "actor_rollout_ref.model.lora.dropout=0.0",
        "critic.model.lora.rank=0",
    )
    model = conversion.recipe["model"]
    assert (model["lora_rank"], model["lora_alpha"]) == (16, 32.0)
    assert model["target_modules"] == ["q_proj", "v_proj"]
    assert conversion.recipe["rollout"]["lora_sync"] == "merged"
    assert set(unmapped(conversion)) == set(unmapped(conversion, "dropped"))


def test_lora_merge_is_lora_sync(plugrl_plugin_manager):
    """verl's lora.merge=False loads the adapters alone into the engine: plugrl's adapters,
    which only vllm takes; on hf the recipe keeps auto (merged weights) and says why."""
    rank = "actor_rollout_ref.model.lora_rank=8"
    vllm = convert(
        rank, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.lora.merge=False"
    )
    assert vllm.recipe["rollout"]["lora_sync"] == "adapters"
    assert "actor_rollout_ref.model.lora.merge=False" not in unmapped(vllm)
    hf = convert(rank, "actor_rollout_ref.model.lora.merge=False")
    assert "lora_sync" not in hf.recipe.get("rollout", {})
    assert unmapped(hf, "dropped")["actor_rollout_ref.model.lora.merge=False"] == (
        "the hf engine takes no LoRA adapters apart from its weights, so rollout.lora_sync "
        "stays auto: merged weights (rollout.engine=vllm takes the adapters alone)"
    )
    no_lora = convert("actor_rollout_ref.model.lora.merge=True")
    assert "lora_sync" not in no_lora.recipe.get("rollout", {})
    assert unmapped(no_lora, "dropped") == {
        "actor_rollout_ref.model.lora.merge=True": "no LoRA adapters to merge (lora_rank is 0)"
    }


def test_the_uv_launcher_and_vision_keys_in_the_report(stand_ins):
    before = (
        'LAUNCH=(python3)\nif [ "${DEVICE:-gpu}" = gpu ]; then\n'
        "    LAUNCH=(uv run --frozen --extra vllm python3)\nfi\n"
    )
    text = (
        before
        + '"${LAUNCH[@]}" -m verl.trainer.main_ppo \\\n'
        + " \\\n".join(
            [
                '    ray_kwargs.ray_init.runtime_env.py_executable="uv run --frozen --extra vllm"',
                "    data.image_key=images",
                "    data.image_patch_size=16",
                "    data.video_key=videos",
                "    data.return_multi_modal_inputs=False",
                "    actor_rollout_ref.actor.freeze_vision_tower=True",
                "    actor_rollout_ref.rollout.name=vllm",
                "    +actor_rollout_ref.rollout.engine_kwargs.vllm"
                ".disable_mm_preprocessor_cache=True",
                "    +actor_rollout_ref.rollout.engine_kwargs.vllm.limit_mm_per_prompt.image=2",
            ]
        )
    )
    conversion = convert_script(text + "\n", "run.sh", plugins=get_plugin_manager())
    assert unmapped(conversion, "dropped")[
        "ray_kwargs.ray_init.runtime_env.py_executable=uv run --frozen --extra vllm"
    ].startswith("the interpreter Ray starts verl's workers with")
    validation = validate(conversion.recipe, get_plugin_manager(), check_files=False)
    lines = report(conversion, validation, "run.yaml")
    # data.image_key=images is plugrl's default: mapped, and nothing to write
    assert "data.image_key=images" not in {item.override for item in conversion.unmapped}
    assert conversion.recipe["actor"]["freeze_vision_tower"] is True
    # vLLM takes images: its multimodal arguments are the engine's, the old cache switch in
    # vLLM 0.32's spelling
    assert conversion.recipe["rollout"]["engine_kwargs"] == {
        "mm_processor_cache_gb": 0,
        "limit_mm_per_prompt": {"image": 2},
    }
    assert any("mm_processor_cache_gb=0" in note for note in conversion.notes)
    dropped = unmapped(conversion, "dropped")
    assert dropped["data.image_patch_size=16"].startswith(
        "verl resizes each image to a multiple of this patch size before its processor; "
        "plugrl's processor resizes by the model's own patch size"
    )
    assert dropped["data.return_multi_modal_inputs=False"].startswith(
        "plugrl computes each row's image inputs once"
    )
    # so is data.video_key=videos; another column is written
    assert "data.video_key=videos" not in {item.override for item in conversion.unmapped}
    assert not any("data.video_key" in line for line in lines)
    clips = convert_script(
        "python3 -m verl.trainer.main_ppo data.video_key=clips\n",
        "run.sh",
        plugins=get_plugin_manager(),
    )
    assert clips.recipe["data"]["video_key"] == "clips"
    assert 'line 2: if [ "${DEVICE:-gpu}" = gpu ] is true' in conversion.notes


def test_offload_policy_is_the_fsdp2_offload(plugrl_plugin_manager):
    both = convert(
        "actor_rollout_ref.actor.fsdp_config.offload_policy=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    )
    assert both.recipe["actor"]["param_offload"] is True
    assert both.unmapped == []
    # alone it disagrees with plugrl's default, which the report says it keeps
    alone = convert("actor_rollout_ref.actor.fsdp_config.offload_policy=True")
    assert (
        "FSDP2's CPU-offload policy"
        in (unmapped(alone, "dropped")["actor_rollout_ref.actor.fsdp_config.offload_policy=True"])
    )


def test_entropy_memory_savings_are_dropped_with_an_entropy_bonus_too(plugrl_plugin_manager):
    """plugrl's log-probs compute the entropy a chunk at a time and recompute each chunk's
    softmax in the backward, so verl's switches for that change nothing, bonus or not."""
    conversion = convert(
        "actor_rollout_ref.actor.entropy_coeff=0.001",
        "actor_rollout_ref.actor.entropy_checkpointing=True",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
        "actor_rollout_ref.model.use_fused_kernels=True",
    )
    assert conversion.recipe["actor"]["entropy_coeff"] == 0.001
    dropped = unmapped(conversion, "dropped")
    assert (
        "recomputes each chunk's" in dropped["actor_rollout_ref.actor.entropy_checkpointing=True"]
    )
    assert (
        "a chunk of tokens at a time"
        in dropped["actor_rollout_ref.actor.entropy_from_logits_with_chunking=True"]
    )
    assert (
        "writes the gradient over the logits"
        in dropped["actor_rollout_ref.model.use_fused_kernels=True"]
    )
