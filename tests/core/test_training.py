"""The pieces training backends share (plugrl.algorithms.training), on their own."""

from __future__ import annotations

import copy
import math
import pickle
from types import SimpleNamespace

import attrs
import pytest
import torch

from plugrl.algorithms import training
from plugrl.data.batch import Batch
from plugrl.errors import RecipeError
from plugrl.parts.algorithm import LossScale
from plugrl.parts.backend import ActorConfig, OptimConfig
from plugrl.parts.rollout import RolloutConfig

# ------------------------------------------------------------------------ schedule


def test_constant_with_warmup():
    schedule = training.LRSchedule("constant", warmup_steps=4, total_steps=10)
    assert [schedule(step) for step in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_decays_to_the_floor():
    schedule = training.LRSchedule("cosine", warmup_steps=2, total_steps=12, min_lr_ratio=0.1)
    assert schedule(1) == 0.5
    assert schedule(2) == pytest.approx(1.0)
    assert schedule(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert schedule(12) == pytest.approx(0.1)
    assert schedule(20) == pytest.approx(0.1)


def test_no_warmup_starts_at_the_peak():
    assert training.LRSchedule("cosine", warmup_steps=0, total_steps=4)(0) == 1.0


def test_warmup_ratio_applies_when_steps_are_unset():
    config = OptimConfig(lr=1.0, lr_warmup_steps=-1, lr_warmup_steps_ratio=0.25)
    assert training.lr_schedule(config, total_steps=20).warmup_steps == 5
    config = OptimConfig(lr=1.0, lr_warmup_steps=3, lr_warmup_steps_ratio=0.25)
    assert training.lr_schedule(config, total_steps=20).warmup_steps == 3


def test_the_schedule_reads_kind_and_floor_from_the_config():
    config = OptimConfig(lr=1.0, lr_scheduler_type="cosine", min_lr_ratio=0.2, lr_warmup_steps=0)
    assert training.lr_schedule(config, total_steps=8) == training.LRSchedule("cosine", 0, 8, 0.2)


def test_the_schedule_survives_a_lambda_lr_checkpoint():
    """LambdaLR saves a callable object's __dict__: the schedule must have one."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = training.LRSchedule("cosine", 2, 10, 0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    optimizer.step()
    scheduler.step()
    state = scheduler.state_dict()
    assert state["lr_lambdas"] == [vars(schedule)]
    assert pickle.loads(pickle.dumps(schedule)) == schedule


def test_adamw_takes_the_config():
    config = OptimConfig(lr=3e-4, betas=[0.8, 0.9], weight_decay=0.05)
    optimizer = training.adamw([torch.nn.Parameter(torch.zeros(2))], config)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (3e-4, (0.8, 0.9), 0.05)


def _per_tensor_adamw(params: list[torch.nn.Parameter], config: OptimConfig) -> torch.optim.AdamW:
    """torch's Python loop over the tensors: what a CPU got before the fused kernel."""
    return torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=tuple(config.betas),
        weight_decay=config.weight_decay,
        foreach=False,
    )


def _parameters(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(33, 17), (17,), (5, 3, 2), ()]
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]


def _steps(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], count: int) -> None:
    generator = torch.Generator().manual_seed(11)
    for _ in range(count):
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()


def test_adamw_runs_the_fused_kernel_and_updates_as_the_per_tensor_loop_does():
    config = OptimConfig(lr=1e-2, weight_decay=0.1)
    fused_params, loop_params = _parameters(0), _parameters(0)
    fused = training.adamw(fused_params, config)
    assert fused.param_groups[0]["fused"] is True
    _steps(fused, fused_params, 3)
    _steps(_per_tensor_adamw(loop_params, config), loop_params, 3)
    for after, expected, before in zip(fused_params, loop_params, _parameters(0), strict=True):
        torch.testing.assert_close(after, expected, rtol=0, atol=1e-6)
        assert not torch.equal(after, before)


def test_adamw_falls_back_to_foreach_where_no_fused_kernel_is_used():
    on_meta = [torch.nn.Parameter(torch.zeros(2, device="meta"))]
    assert training.adamw_implementation(on_meta) == {"foreach": True}
    assert training.adamw_implementation([]) == {"foreach": True}
    group = training.adamw(on_meta, OptimConfig()).param_groups[0]
    assert (group["fused"], group["foreach"]) == (None, True)


def test_adamw_keeps_its_kernel_when_it_loads_state_saved_by_the_per_tensor_loop():
    config = OptimConfig(lr=1e-2)
    loop_params = _parameters(0)
    loop = _per_tensor_adamw(loop_params, config)
    _steps(loop, loop_params, 2)
    resumed_params = [torch.nn.Parameter(param.detach().clone()) for param in loop_params]
    resumed = training.adamw(resumed_params, config)
    # a copy: a state dict holds the optimizer's own moment tensors
    resumed.load_state_dict(copy.deepcopy(loop.state_dict()))
    assert (resumed.param_groups[0]["fused"], resumed.param_groups[0]["foreach"]) == (True, False)
    _steps(resumed, resumed_params, 1)
    _steps(loop, loop_params, 1)
    for after, expected in zip(resumed_params, loop_params, strict=True):
        torch.testing.assert_close(after, expected, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------ mini-batches


@attrs.define(kw_only=True)
class WithOwnKey(ActorConfig):
    own_key: int = 3


def test_backend_config_keeps_the_values_and_adds_the_backends_keys():
    plain = ActorConfig(ppo_epochs=2, optim=OptimConfig(lr=0.5))
    converted = training.backend_config(plain, WithOwnKey)
    assert isinstance(converted, WithOwnKey)
    assert (converted.ppo_epochs, converted.optim.lr, converted.own_key) == (2, 0.5, 3)
    already = WithOwnKey(own_key=9)
    assert training.backend_config(already, WithOwnKey) is already


def test_mini_batch_rows_are_the_ranks_share():
    config = ActorConfig(ppo_mini_batch_size=4)
    assert training.mini_batch_rows(config, n=2, dp_size=2, num_rows=8) == 4
    assert training.mini_batch_rows(config, n=2, dp_size=1, num_rows=16) == 8


def test_mini_batch_rows_name_the_key_and_the_fix():
    config = ActorConfig(ppo_mini_batch_size=3)
    with pytest.raises(RecipeError) as info:
        training.mini_batch_rows(config, n=1, dp_size=2, num_rows=6)
    assert str(info.value) == (
        "actor.ppo_mini_batch_size: ppo_mini_batch_size x rollout.n = 3 sequences per optimizer "
        "step cannot be split evenly over 2 data-parallel ranks; make it a multiple of 2"
    )
    with pytest.raises(RecipeError, match="a rank got 8 sequences, not a multiple of its"):
        training.mini_batch_rows(config, n=1, dp_size=1, num_rows=8)


def test_fixed_micro_batches_cover_rows_in_order():
    assert training.fixed_micro_batches(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert training.fixed_micro_batches(4, None) == [[0, 1, 2, 3]]
    assert training.fixed_micro_batches(0, 2) == []


def test_check_single_step():
    training.check_single_step(epochs=1, num_rows=8, mini_rows=8)
    for epochs, mini_rows in ((2, 8), (1, 4)):
        with pytest.raises(RecipeError, match="compute_log_prob first") as info:
            training.check_single_step(epochs=epochs, num_rows=8, mini_rows=mini_rows)
        assert info.value.key == "actor.reuse_on_policy_log_prob"


class Objective:
    def __init__(self, needs_ref=False, needs_entropy=False):
        self.needs_ref, self.needs_entropy = needs_ref, needs_entropy


def update_batch(rows=4, **extra):
    columns = {name: torch.zeros(rows, 3) for name in training.SEQUENCE_COLUMNS}
    columns |= {"response_mask": torch.ones(rows, 3), "advantages": torch.zeros(rows, 3)}
    return Batch(columns | extra)


RECIPE = SimpleNamespace(rollout=RolloutConfig(n=1, do_sample=True, temperature=0.6))


def test_policy_update_names_what_the_update_reads():
    config = ActorConfig(ppo_mini_batch_size=4)
    batch = update_batch(old_log_probs=torch.zeros(4, 3))
    update = training.policy_update(batch, Objective(), config, RECIPE, 1, by="the x update")
    assert update == training.PolicyUpdate(
        temperature=0.6, entropy_in_loss=False, derives_old_log_probs=False
    )
    assert not update.with_entropy
    with pytest.raises(KeyError, match="the x update needs batch columns ref_log_prob;"):
        training.policy_update(
            batch, Objective(needs_ref=True), config, RECIPE, 1, by="the x update"
        )
    batch.pop("advantages")
    with pytest.raises(KeyError, match="the x update needs batch columns advantages;"):
        training.policy_update(batch, Objective(), config, RECIPE, 1, by="the x update")
    entropy = training.policy_update(
        update_batch(old_log_probs=torch.zeros(4, 3)),
        Objective(needs_entropy=True),
        config,
        RECIPE,
        1,
        by="x",
    )
    assert entropy.entropy_in_loss and entropy.with_entropy


def test_without_old_log_probs_the_update_derives_them_in_one_step():
    update = training.policy_update(
        update_batch(), Objective(), ActorConfig(ppo_mini_batch_size=4), RECIPE, 1, by="x"
    )
    assert update.derives_old_log_probs and update.with_entropy and not update.entropy_in_loss
    micro_batch = update_batch(rows=2)
    log_prob = torch.randn(2, 3, requires_grad=True)
    update.derive_old_log_probs(micro_batch, log_prob)
    assert torch.equal(micro_batch["old_log_probs"], log_prob)
    assert not micro_batch["old_log_probs"].requires_grad
    two_steps = ActorConfig(ppo_mini_batch_size=2)
    with pytest.raises(RecipeError, match="4 sequences on this rank in mini-batches of 2"):
        training.policy_update(update_batch(), Objective(), two_steps, RECIPE, 1, by="x")


def rows_of(batches):
    return [batch["row"].tolist() for batch in batches]


def flat(mini_batches):
    return [row for rows in mini_batches for row in rows]


def test_mini_batches_in_order_without_shuffle():
    batch = Batch({"row": torch.arange(6)})
    got = rows_of(training.mini_batches(batch, 2, epochs=2, shuffle=False, seed=0, update_step=5))
    assert got == [[0, 1], [2, 3], [4, 5]] * 2


def test_shuffled_mini_batches_depend_on_seed_step_and_epoch_only():
    batch = Batch({"row": torch.arange(12)})

    def draw(seed, update_step):
        return rows_of(
            training.mini_batches(
                batch, 4, epochs=2, shuffle=True, seed=seed, update_step=update_step
            )
        )

    first = draw(7, 3)
    assert first == draw(7, 3)
    assert first != draw(7, 4) and first != draw(8, 3)
    epoch_one, epoch_two = first[:3], first[3:]
    assert sorted(flat(epoch_one)) == sorted(flat(epoch_two)) == list(range(12))
    assert epoch_one != epoch_two
    # the order of an epoch is its own generator's permutation
    generator = torch.Generator().manual_seed(7 + 1_000_003 * 3 + 1)
    assert flat(epoch_two) == torch.randperm(12, generator=generator).tolist()


def test_loss_scale_counts_tokens_and_non_empty_responses():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    recipe = SimpleNamespace(data=SimpleNamespace(max_response_length=16))
    config = ActorConfig(loss_scale_factor=4096)
    scale = training.all_reduced_loss_scale(mask, config, recipe, 1, torch.device("cpu"))
    assert scale == LossScale(
        num_tokens=3, num_seqs=2, dp_size=1, max_response_length=16, loss_scale_factor=4096
    )


# ------------------------------------------------------------------------ log-probs


def test_sampling_temperature():
    sampling = RolloutConfig(do_sample=True, temperature=0.7)
    greedy = RolloutConfig(do_sample=False, temperature=0.7)
    batch = Batch({"x": torch.zeros(1)})
    assert training.sampling_temperature(batch, sampling) == 0.7
    assert training.sampling_temperature(batch, greedy) == 1.0
    batch.meta["temperature"] = 0.5
    assert training.sampling_temperature(batch, greedy) == 0.5
    batch.meta["temperature"] = 0.0
    assert training.sampling_temperature(batch, sampling) == 1.0


def reference(logits, responses, attention_mask, temperature):
    log_softmax = torch.log_softmax(logits / temperature, dim=-1)
    used = logits.shape[1]
    log_prob = log_softmax.gather(-1, responses[:, :used, None])[..., 0]
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    mask = attention_mask[:, -responses.shape[1] :][:, :used]
    pad = responses.shape[1] - used
    return (
        torch.nn.functional.pad(log_prob * mask, (0, pad)),
        torch.nn.functional.pad(entropy * mask, (0, pad)),
    )


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_response_log_probs_match_log_softmax(entropy_grad):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 11, generator=generator, requires_grad=True)
    responses = torch.randint(0, 11, (3, 5), generator=generator)
    attention_mask = torch.ones(3, 7, dtype=torch.long)
    attention_mask[0, -2:] = 0  # a shorter response: zeros there
    micro_batch = Batch({"responses": responses, "attention_mask": attention_mask})
    log_prob, entropy = training.response_log_probs(
        logits, micro_batch, 0.8, with_entropy=True, entropy_grad=entropy_grad
    )
    expected_log_prob, expected_entropy = reference(logits, responses, attention_mask, 0.8)
    torch.testing.assert_close(log_prob, expected_log_prob)
    torch.testing.assert_close(entropy, expected_entropy)
    assert log_prob.shape == (3, 5) and (log_prob[:, 4] == 0).all() and (log_prob[0, 3:] == 0).all()
    assert log_prob.requires_grad
    assert entropy.requires_grad == entropy_grad
    without, none = training.response_log_probs(logits, micro_batch, 0.8, with_entropy=False)
    assert none is None and torch.equal(without, log_prob)


def test_the_metric_entropy_is_computed_in_slices_that_equal_the_whole(monkeypatch):
    logits = torch.randn(3, 5, 11)
    log_norm = torch.logsumexp(logits, dim=-1)
    whole = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    monkeypatch.setattr(training, "ENTROPY_SLICE_TOKENS", 4)  # 15 tokens: 4 slices
    sliced = training.entropy_for_metrics(logits.requires_grad_(), log_norm)
    assert torch.equal(sliced, whole)
    assert not sliced.requires_grad


def test_log_prob_rows_put_each_micro_batch_in_its_rows():
    batch = Batch({"responses": torch.zeros(4, 2, dtype=torch.long)})
    rows = training.LogProbRows(batch, with_entropy=True)
    rows.put([2, 0], torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.ones(2, 2))
    result = rows.result()
    assert result["log_probs"].tolist() == [[3.0, 4.0], [0.0, 0.0], [1.0, 2.0], [0.0, 0.0]]
    assert result["entropys"][:, 0].tolist() == [1.0, 0.0, 1.0, 0.0]
    without = training.LogProbRows(batch, with_entropy=False)
    without.put([1], torch.ones(1, 2), None)
    assert list(without.result()) == ["log_probs"]


# ------------------------------------------------------------------------ export


def test_a_staged_folder_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    (target / "stale.bin").write_text("old")
    with training.staged_folder(target) as staging:
        assert staging.parent == tmp_path and staging.name.startswith(".export.")
        (staging / "new.bin").write_text("new")
        assert (target / "stale.bin").exists()  # nothing changes before the block ends
    assert [p.name for p in tmp_path.iterdir()] == ["export"]
    assert [p.name for p in target.iterdir()] == ["new.bin"]


def test_a_failed_staged_folder_leaves_the_old_one(tmp_path):
    target = tmp_path / "nested" / "export"
    with pytest.raises(RuntimeError, match="disk full"), training.staged_folder(target) as staging:
        (staging / "half.bin").write_text("half")
        raise RuntimeError("disk full")
    assert list((tmp_path / "nested").iterdir()) == []


def test_an_export_killed_midway_leaves_staging_that_the_next_one_removes(tmp_path):
    target = tmp_path / "hf_model"
    target.mkdir()
    (target / "model.safetensors").write_text("previous export")
    # kill -9 in the middle of the write: its staging folders stay, empty or half-written
    (tmp_path / ".hf_model.k3_9xq2a").mkdir()
    (tmp_path / ".hf_model.0abcdefg").mkdir()
    (tmp_path / ".hf_model.0abcdefg" / "model.safetensors").write_text("half")
    (tmp_path / ".hf_model.old.zz1y2x3w" / "hf_model").mkdir(parents=True)
    # what is not a staging folder of this target stays
    keep = [".hf_model_2.k3_9xq2a", ".hf_model.notes", ".other.k3_9xq2a", "hf_model.k3_9xq2a"]
    for name in keep:
        (tmp_path / name).mkdir()
    (tmp_path / ".hf_model.abcd1234").write_text("a file, not a staging folder")
    with training.staged_folder(target) as staging:
        (staging / "model.safetensors").write_text("new export")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["hf_model", ".hf_model.abcd1234", *keep]
    )
    assert (target / "model.safetensors").read_text() == "new export"


def test_an_export_killed_between_its_renames_gets_the_previous_folder_back(tmp_path):
    target = tmp_path / "hf_model"
    retired = tmp_path / ".hf_model.old.q1w2e3r4" / "hf_model"
    retired.mkdir(parents=True)
    (retired / "model.safetensors").write_text("previous export")
    (tmp_path / ".hf_model.a1s2d3f4").mkdir()  # the finished staging folder, never renamed
    with pytest.raises(RuntimeError, match="out of memory"), training.staged_folder(target):
        raise RuntimeError("out of memory")
    assert [p.name for p in tmp_path.iterdir()] == ["hf_model"]
    assert (target / "model.safetensors").read_text() == "previous export"


def test_tokenizer_files_come_from_the_first_folder_that_has_them(tmp_path):
    first, second, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    for folder in (first, second, out):
        folder.mkdir()
    (first / "tokenizer.json").write_text("first")
    (second / "tokenizer.json").write_text("second")
    (second / "vocab.txt").write_text("second")
    (second / "weights.bin").write_text("not a tokenizer file")
    training.copy_tokenizer_files(out, [None, first, "", second])
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "vocab.txt"]
    assert (out / "tokenizer.json").read_text() == "first"


def test_rows_to_run_keep_the_rows_with_a_gradient_in_order():
    without = torch.tensor([False, True, False, True, True])
    assert training.rows_to_run(without, [5, 9, 2, 1, 3], count=2) == [0, 2]


def test_rows_to_run_top_up_with_the_shortest_rows_without_a_gradient():
    without = torch.tensor([False, True, False, True, True])
    assert training.rows_to_run(without, [5, 9, 2, 1, 3], count=4) == [0, 2, 3, 4]
    assert training.rows_to_run(torch.ones(3, dtype=torch.bool), [4, 2, 2], count=1) == [1]
