"""A vision-language batch through the fsdp2 backend: the model's own M-RoPE positions and the
rows' image inputs reach its forward, padded and packed (``actor.use_remove_padding``), with
fixed and token-budget micro-batches, and give the unsharded model's log-probs, the same
entropies and the same gradients (the vision tower's too) within 1e-5."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch.distributed.tensor import DTensor

from plugrl.data.batch import Batch, left_pad
from plugrl.data.dataset import load_tokenizer
from plugrl.data.multimodal import MULTIMODAL_COLUMN, load_multimodal, model_inputs
from plugrl.errors import RecipeError
from plugrl.parts.context import DistInfo, PartContext
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import ModelConfig
from plugrl_cpu.device import CpuDevice
from plugrl_fsdp2.backend import FSDP2Backend
from tests.plugins.backends.fsdp2.fsdp2_testing import make_backend, make_recipe
from tests.plugins.backends.fsdp2.test_fsdp2_packing import EntropyBonus
from tests.plugins.models.qwen2_vl.images import png_bytes

TOLERANCE = {"atol": 1e-5, "rtol": 0}
RESPONSE_WIDTH = 5
# (question, image sizes): rows with two images, one, and none
ROWS = [
    ("Count the squares.", [(56, 56)]),
    ("Which is larger?", [(112, 56), (56, 56)]),
    ("No picture: say hello.", []),
    ("What colour?", [(56, 112)]),
    ("Same or different?", [(56, 56), (56, 56)]),
    ("Describe it briefly, please.", [(84, 84)]),
]


def vision_batch(model_dir, seed: int = 0) -> Batch:
    """Prompts with images processed by the model's processor, random responses (no vision
    token among them) of random lengths, the model's own positions, and update columns."""
    from PIL import Image

    model = ModelConfig(path=str(model_dir))
    tokenizer = load_tokenizer(model)
    multimodal = load_multimodal(model, tokenizer, get_plugin_manager())
    generator = torch.Generator().manual_seed(seed)
    prompts, inputs = [], []
    for row, (question, sizes) in enumerate(ROWS):
        images = [
            Image.open(io.BytesIO(png_bytes((40 * row, 255 - 40 * i, 90), size))).convert("RGB")
            for i, size in enumerate(sizes)
        ]
        content = multimodal.family.image_text() * len(images) + question
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        out = multimodal.processor(text=[text], images=images or None, return_tensors="pt")
        prompts.append(out["input_ids"][0].tolist())
        inputs.append({k: out[k] for k in multimodal.family.input_keys} if images else None)
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)
    rows = len(prompts)
    lengths = torch.randint(1, RESPONSE_WIDTH + 1, (rows,), generator=generator)
    responses = torch.randint(1, 381, (rows, RESPONSE_WIDTH), generator=generator)
    response_mask = (torch.arange(RESPONSE_WIDTH)[None, :] < lengths[:, None]).long()
    responses = torch.where(response_mask.bool(), responses, tokenizer.pad_token_id)
    input_ids = torch.cat([prompt_ids, responses], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    batch = Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "responses": responses,
            "response_mask": response_mask,
            "advantages": torch.randn(rows, RESPONSE_WIDTH, generator=generator) * response_mask,
            "old_log_probs": torch.zeros(rows, RESPONSE_WIDTH),
        },
        {MULTIMODAL_COLUMN: inputs},
    )
    batch["position_ids"] = multimodal.family.position_ids(input_ids, attention_mask, inputs)
    return batch


@pytest.fixture(scope="module")
def batch(tiny_vl_model):
    return vision_batch(tiny_vl_model)


def reference_log_probs(model_dir, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of the responses from the unsharded model, which computes its
    positions itself (from the image token types and grids)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    config = AutoConfig.from_pretrained(model_dir)
    ids = batch["input_ids"]
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=batch["attention_mask"],
            mm_token_type_ids=(ids == config.image_token_id).long(),
            **model_inputs(list(batch[MULTIMODAL_COLUMN])),
        ).logits
    logits = logits[:, -RESPONSE_WIDTH - 1 : -1].float()
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_probs = log_softmax.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    mask = batch["response_mask"]
    return log_probs * mask, entropy * mask


BATCHINGS = {
    "padded, 2 rows per micro-batch": {
        "use_remove_padding": False,
        "ppo_micro_batch_size_per_gpu": 2,
    },
    "packed, 2 rows per micro-batch": {
        "use_remove_padding": True,
        "ppo_micro_batch_size_per_gpu": 2,
    },
    "padded, token budget": {
        "use_remove_padding": False,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 80,
    },
    "packed, token budget": {
        "use_remove_padding": True,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 80,
    },
}


@pytest.fixture(scope="module")
def backends(tiny_vl_model):
    return {
        name: make_backend(make_recipe(tiny_vl_model, ppo_mini_batch_size=6, **options))
        for name, options in BATCHINGS.items()
    }


def test_log_probs_and_entropy_are_the_models_own_in_every_layout(tiny_vl_model, batch, backends):
    expected_log_probs, expected_entropy = reference_log_probs(tiny_vl_model, batch)
    assert int(batch["attention_mask"].sum(1).max()) > 40  # the budget cuts micro-batches
    for name, backend in backends.items():
        out = backend.compute_log_prob(batch, calculate_entropy=True)
        torch.testing.assert_close(out["log_probs"], expected_log_probs, **TOLERANCE, msg=name)
        torch.testing.assert_close(out["entropys"], expected_entropy, **TOLERANCE, msg=name)


def test_the_images_change_the_log_probs(batch, backends):
    """Not a text-only forward in disguise: other pixels give other log-probs."""
    backend = backends["packed, token budget"]
    other = batch.copy()
    other[MULTIMODAL_COLUMN] = [
        None if row is None else {**row, "pixel_values": row["pixel_values"].flip(0)}
        for row in batch[MULTIMODAL_COLUMN]
    ]
    mask = batch["response_mask"].bool()
    first = backend.compute_log_prob(batch)["log_probs"][mask]
    second = backend.compute_log_prob(other)["log_probs"][mask]
    assert (first - second).abs().max() > 1e-3


def _update_gradients(backend, batch):
    gradients = {}
    step = backend._clip_and_step

    def capture(grad_clip):
        for name, parameter in backend.model.named_parameters():
            grad = parameter.grad
            if grad is not None:
                full = grad.full_tensor() if isinstance(grad, DTensor) else grad
                gradients[name] = full.clone()
        return step(grad_clip)

    backend._clip_and_step = capture
    try:
        metrics = backend.update_policy(batch.copy(), EntropyBonus())
    finally:
        backend._clip_and_step = step
    return gradients, metrics


def test_updates_have_the_same_losses_and_gradients_in_every_layout(batch, backends):
    """Last: the update changes each backend's weights. The training forwards raise no
    warning of FSDP2's about views among the model's outputs (the vision tower's per-picture
    embeddings, which the backend never reads)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = {name: _update_gradients(backend, batch) for name, backend in backends.items()}
    views = [str(w.message) for w in caught if "returned a view tensor" in str(w.message)]
    assert not views, views[0]
    expected_gradients, expected_metrics = results.pop("padded, 2 rows per micro-batch")
    vision = [name for name in expected_gradients if ".visual." in name]
    assert vision and all(expected_gradients[name].abs().sum() > 0 for name in vision)
    for name, (gradients, metrics) in results.items():
        assert gradients.keys() == expected_gradients.keys()
        for parameter in gradients:
            torch.testing.assert_close(
                gradients[parameter],
                expected_gradients[parameter],
                **TOLERANCE,
                msg=f"{name}: {parameter}",
            )
        for metric in ("actor/loss", "actor/entropy_bonus"):
            assert metrics[metric] == pytest.approx(expected_metrics[metric], abs=1e-5), name


SEQUENCE_PARALLEL_ROWS = [2, 2, 0, 1, 3, 4]
"""The rows the sequence-parallel ranks train on, two per micro-batch: the first micro-batch has
no image (the ranks run the vision tower on the dummy image), the others one or two per row."""

SEQUENCE_PARALLEL_LAYOUTS = {"padded": False, "packed": True}


def sequence_parallel_results(model_dir, dist_info: DistInfo, sp: int, packed: bool) -> dict:
    """Log-probs and entropies of :data:`SEQUENCE_PARALLEL_ROWS`, then one update's gradients
    (full) and metrics, from an actor whose sequences split over ``sp`` ranks."""
    from pathlib import Path

    recipe = make_recipe(
        Path(model_dir),
        ppo_mini_batch_size=6,
        ppo_micro_batch_size_per_gpu=2,
        use_remove_padding=packed,
        ulysses_sequence_parallel_size=sp,
    )
    backend = make_backend(recipe, dist=dist_info, plugins=get_plugin_manager())
    rows = vision_batch(model_dir).select(SEQUENCE_PARALLEL_ROWS)
    scored = backend.compute_log_prob(rows, calculate_entropy=True)
    gradients, metrics = _update_gradients(backend, rows)
    return {"scored": scored, "gradients": gradients, "metrics": metrics}


@pytest.mark.slow
def test_two_sequence_parallel_ranks_compute_what_one_rank_does(tiny_vl_model, two_ranks):
    """Ulysses with images: each rank runs the vision tower on all the micro-batch's images
    and its language model on its half of the tokens; log-probs, entropies and gradients (the
    vision tower's included) equal one padded rank's, padded and packed, with a micro-batch
    without images among them."""
    from plugrl_fsdp2.batching import left_align

    rows = vision_batch(tiny_vl_model).select(SEQUENCE_PARALLEL_ROWS)
    assert rows[MULTIMODAL_COLUMN][0] is None and rows[MULTIMODAL_COLUMN][1] is None
    widths = [
        left_align(rows["attention_mask"][i : i + 2], RESPONSE_WIDTH).columns.shape[1]
        for i in (0, 2, 4)
    ]
    assert any(width % 2 for width in widths)  # some micro-batch pads before it splits
    expected = sequence_parallel_results(tiny_vl_model, DistInfo(), 1, packed=False)
    vision = [name for name in expected["gradients"] if ".visual." in name]
    assert vision and all(expected["gradients"][name].abs().sum() > 0 for name in vision)
    for rank in (0, 1):
        got = torch.load(two_ranks / f"sequence-parallel-rank{rank}.pt", weights_only=True)
        for layout, result in got.items():
            where = f"rank {rank}, {layout}"
            for name in ("log_probs", "entropys"):
                torch.testing.assert_close(
                    result["scored"][name], expected["scored"][name], **TOLERANCE, msg=where
                )
            assert result["gradients"].keys() == expected["gradients"].keys(), where
            for name, gradient in expected["gradients"].items():
                torch.testing.assert_close(
                    result["gradients"][name], gradient, **TOLERANCE, msg=f"{where}: {name}"
                )
            for metric in ("actor/loss", "actor/entropy_bonus", "actor/grad_norm"):
                assert result["metrics"][metric] == pytest.approx(
                    expected["metrics"][metric], abs=1e-5
                ), where


def test_the_batch_positions_are_m_rope_not_token_counts(batch):
    positions = batch["position_ids"]
    counted = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    assert positions.shape == (len(batch), 3, batch["input_ids"].shape[1])
    image_rows = [i for i, row in enumerate(batch[MULTIMODAL_COLUMN]) if row is not None]
    text_row = next(i for i, row in enumerate(batch[MULTIMODAL_COLUMN]) if row is None)
    for row in image_rows:
        assert not torch.equal(positions[row, 1], counted[row])
    attended = batch["attention_mask"][text_row].bool()
    for k in range(3):  # a row without images: plain token counts in all three
        assert torch.equal(positions[text_row, k][attended], counted[text_row][attended])


def test_freeze_vision_tower_trains_the_language_model_alone(tiny_vl_model, batch):
    recipe = make_recipe(
        tiny_vl_model, ppo_mini_batch_size=6, use_remove_padding=True, freeze_vision_tower=True
    )
    backend = make_backend(recipe, plugins=get_plugin_manager())
    before = {name: tensor.clone() for name, tensor in backend.named_weights()}
    gradients, _ = _update_gradients(backend, batch)
    after = dict(backend.named_weights())
    vision = [name for name in before if ".visual." in name]
    language = [name for name in before if ".language_model." in name]
    assert vision and language
    assert all(torch.equal(before[name], after[name]) for name in vision)
    assert any(not torch.equal(before[name], after[name]) for name in language)
    assert gradients and not any(".visual." in name for name in gradients)
    trainable = {id(p) for group in backend.optimizer.param_groups for p in group["params"]}
    visual = [p for n, p in backend.model.named_parameters() if ".visual." in n]
    assert visual and not any(id(p) in trainable for p in visual)


def test_freeze_vision_tower_refuses_a_text_model(tiny_task):
    recipe = make_recipe(tiny_task.model, freeze_vision_tower=True)
    context = PartContext(
        recipe=recipe, role="actor", device=CpuDevice(), plugins=get_plugin_manager()
    )
    with pytest.raises(RecipeError, match=r"actor\.freeze_vision_tower: Qwen2ForCausalLM is not"):
        FSDP2Backend(recipe.actor, context).setup(10)


def two_rank_worker(rank: int, model_dir: str, port: int, out: str) -> None:
    """One of two ranks, for both two-rank tests (one spawn): first as two data-parallel ranks,
    where rank 0's row has an image and rank 1's has none, both compute log-probs and take an
    update step, padded then packed, which only finishes when rank 1 runs the vision tower
    too; then as one sequence-parallel group (:func:`sequence_parallel_results`)."""
    import datetime
    from pathlib import Path

    from plugrl.cluster.distributed import init_process_group
    from tests.support import spawned_rank

    torch.set_num_threads(1)
    dist_info = DistInfo(rank=rank, world_size=2)
    init_process_group(
        CpuDevice(), dist_info, "127.0.0.1", port, timeout=datetime.timedelta(seconds=120)
    )
    with spawned_rank():
        mine = vision_batch(model_dir).select([0] if rank == 0 else [2])
        assert (mine[MULTIMODAL_COLUMN][0] is None) == (rank == 1)
        for packed in (False, True):
            recipe = make_recipe(Path(model_dir), ppo_mini_batch_size=2, use_remove_padding=packed)
            backend = make_backend(recipe, dist=dist_info, plugins=get_plugin_manager())
            log_probs = backend.compute_log_prob(mine)["log_probs"]
            metrics = backend.update_policy(mine.copy(), EntropyBonus())
            torch.save(
                {"log_probs": log_probs, "grad_norm": metrics["actor/grad_norm"]},
                Path(out) / f"rank{rank}-packed{int(packed)}.pt",
            )
        # videos: rank 0's row has one, rank 1's none; both run the tower for the images (a
        # dummy image each) and again for the videos (rank 1 on the dummy video)
        from tests.plugins.backends.fsdp2.test_fsdp2_video import video_batch

        folder = Path(out) / f"videos-rank{rank}"
        folder.mkdir()
        videos = video_batch(model_dir, folder).select([0] if rank == 0 else [3])
        for packed in (False, True):
            recipe = make_recipe(Path(model_dir), ppo_mini_batch_size=2, use_remove_padding=packed)
            backend = make_backend(recipe, dist=dist_info, plugins=get_plugin_manager())
            log_probs = backend.compute_log_prob(videos)["log_probs"]
            torch.save(
                {"log_probs": log_probs}, Path(out) / f"videos-rank{rank}-packed{int(packed)}.pt"
            )
        sequence_parallel = {
            layout: sequence_parallel_results(model_dir, dist_info, 2, packed)
            for layout, packed in SEQUENCE_PARALLEL_LAYOUTS.items()
        }
        torch.save(sequence_parallel, Path(out) / f"sequence-parallel-rank{rank}.pt")


@pytest.fixture(scope="module")
def two_ranks(tiny_vl_model, tmp_path_factory):
    """The folder of what each of two spawned ranks computed (:func:`two_rank_worker`)."""
    import torch.multiprocessing as mp

    from plugrl.cluster.distributed import free_port

    out = tmp_path_factory.mktemp("two-ranks")
    mp.spawn(
        two_rank_worker,
        args=(str(tiny_vl_model), free_port(), str(out)),
        nprocs=2,
        join=True,
    )
    return out


@pytest.mark.slow
def test_a_rank_without_images_runs_the_vision_tower_with_the_others(
    tiny_vl_model, batch, two_ranks
):
    expected, _ = reference_log_probs(tiny_vl_model, batch)
    for packed in (0, 1):
        for rank, row in ((0, 0), (1, 2)):
            result = torch.load(two_ranks / f"rank{rank}-packed{packed}.pt", weights_only=True)
            where = f"rank {rank}, packed {packed}"
            torch.testing.assert_close(
                result["log_probs"][0], expected[row], **TOLERANCE, msg=where
            )
            assert result["grad_norm"] > 0, where


@pytest.mark.slow
def test_a_rank_without_videos_runs_the_vision_tower_on_a_dummy_video(
    tiny_vl_model, two_ranks, tmp_path
):
    from tests.plugins.backends.fsdp2.test_fsdp2_video import (
        reference_log_probs as video_reference,
    )
    from tests.plugins.backends.fsdp2.test_fsdp2_video import video_batch

    expected = video_reference(tiny_vl_model, video_batch(tiny_vl_model, tmp_path))
    for packed in (0, 1):
        for rank, row in ((0, 0), (1, 3)):
            result = torch.load(
                two_ranks / f"videos-rank{rank}-packed{packed}.pt", weights_only=True
            )
            torch.testing.assert_close(
                result["log_probs"][0], expected[row], **TOLERANCE, msg=f"rank {rank}, {packed}"
            )


@pytest.mark.parametrize("freeze", [False, True], ids=["whole model", "language model"])
def test_lora_adapters_train_a_vision_language_model(tiny_vl_model, batch, freeze):
    """LoRA on every linear layer: the model's log-probs at the start (the adapters add
    nothing yet), adapters in the vision tower and the language model, and with
    freeze_vision_tower the vision tower's adapters frozen too."""
    recipe = make_recipe(
        tiny_vl_model,
        ppo_mini_batch_size=6,
        use_remove_padding=True,
        freeze_vision_tower=freeze,
        gradient_checkpointing=True,
        model={"lora_rank": 4, "lora_alpha": 8, "target_modules": "all-linear"},
    )
    backend = make_backend(recipe, plugins=get_plugin_manager())
    expected, _ = reference_log_probs(tiny_vl_model, batch)
    torch.testing.assert_close(backend.compute_log_prob(batch)["log_probs"], expected, **TOLERANCE)
    gradients, metrics = _update_gradients(backend, batch)
    assert metrics["actor/grad_norm"] > 0
    assert all("lora_" in name for name in gradients)
    # at the start B is zero, so only the B matrices get a gradient
    vision = [name for name in gradients if ".visual." in name and "lora_B" in name]
    language = [name for name in gradients if ".language_model." in name and "lora_B" in name]
    assert language and all(gradients[name].abs().sum() > 0 for name in language)
    if freeze:
        assert not [name for name in gradients if ".visual." in name]
    else:
        assert vision and all(gradients[name].abs().sum() > 0 for name in vision)
