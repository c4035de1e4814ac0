"""The vision quickstart's assets: pictures drawn from a seed, rows in verl's multimodal
layout that a run reads, the warm start's prompts equal to the run's, the scorer naming each
row's picture, and the progress plot showing the pictures."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from plugrl_tools.quickstart import counting
from plugrl_tools.quickstart.counting import BACKGROUND, CELL, GRID, Scene

KWARGS = {"num_warm_start": 60, "num_train": 40, "num_val": 20, "many_fraction": 0.7}


def occupied_cells(scene: Scene) -> set[int]:
    """The cells of the drawn picture holding any pixel other than the field's."""
    picture = counting.draw(scene)
    cells = set()
    for cell in range(GRID * GRID):
        row, column = divmod(cell, GRID)
        box = (column * CELL, row * CELL, (column + 1) * CELL, (row + 1) * CELL)
        colours = picture.crop(box).getcolors(CELL * CELL)
        if colours != [(CELL * CELL, BACKGROUND)]:
            cells.add(cell)
    return cells


def test_splits_are_deterministic_disjoint_and_as_many_as_asked():
    splits = counting.make_splits(3, **KWARGS)
    assert splits == counting.make_splits(3, **KWARGS)
    assert splits != counting.make_splits(4, **KWARGS)
    assert [len(splits.warm_start), len(splits.train), len(splits.val)] == [60, 40, 20]
    every = [*splits.warm_start, *splits.train, *splits.val]
    assert len(set(every)) == len(every), "no picture is in two splits"
    assert sum(scene.many for scene in splits.val) == 14
    assert sum(scene.many for scene in splits.train) == 28
    assert {scene.count for scene in every} == set(range(1, counting.MAX_SHAPES + 1))
    with pytest.raises(ValueError, match=r"many_fraction must be within \[0, 1\], got 1.5"):
        counting.make_splits(0, **{**KWARGS, "many_fraction": 1.5})


def test_a_picture_shows_its_count_of_shapes_each_in_its_cell():
    splits = counting.make_splits(0, **KWARGS)
    for scene in splits.val:
        assert occupied_cells(scene) == {shape.cell for shape in scene.shapes}
        assert len(occupied_cells(scene)) == scene.count
    scene = splits.val[0]
    assert counting.draw(scene).size == (GRID * CELL, GRID * CELL)
    assert counting.png_bytes(scene) == counting.png_bytes(scene)


def test_warm_start_labels_many_shapes_one_short_at_the_given_rate():
    scenes = counting.make_splits(0, **{**KWARGS, "num_warm_start": 600}).warm_start
    examples = counting.warm_start_examples(scenes, 0, miscount_probability=0.65)
    assert examples == counting.warm_start_examples(scenes, 0, miscount_probability=0.65)
    short = 0
    for scene, response in examples:
        if response != counting.answer_text(scene.count):
            assert scene.many and response == counting.answer_text(scene.count - 1)
            short += 1
    many = sum(scene.many for scene in scenes)
    assert 0.55 < short / many < 0.75


def test_rows_follow_verls_multimodal_layout_and_name_their_picture_files(tmp_path):
    scenes = counting.make_splits(0, **KWARGS).val[:3]
    path = counting.write_split(scenes, "val", tmp_path)
    rows = pq.read_table(path).to_pylist()
    assert rows[1] == {
        "data_source": "plugrl/counting",
        "prompt": [{"role": "user", "content": "<image>How many shapes are in the picture?"}],
        "images": [{"bytes": counting.png_bytes(scenes[1]), "path": None}],
        "ability": "counting",
        "reward_model": {"style": "rule", "ground_truth": str(scenes[1].count)},
        "extra_info": {
            "split": "val",
            "index": 1,
            "many": scenes[1].many,
            "image": "images/val/00001.png",
        },
    }
    for row in rows:
        assert (tmp_path / row["extra_info"]["image"]).read_bytes() == row["images"][0]["bytes"]


def test_a_run_reads_the_rows_as_the_warm_start_encoded_them(tmp_path, tiny_vl_model):
    """The rows go through the run's dataset (placeholders checked, pictures processed), and
    each prompt's ids and pixels equal the warm start's: the warm-started model sees at the
    run's start the tokens it was trained on."""
    import torch

    from plugrl.data.dataset import PromptDataset, load_tokenizer
    from plugrl.data.multimodal import load_multimodal
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import DataConfig, ModelConfig
    from plugrl_qwen2_vl.family import IMAGE_TEXT
    from plugrl_tools.quickstart.vision_warmstart import encode_prompts

    scenes = counting.make_splits(0, **KWARGS).val[:4]
    path = counting.write_split(scenes, "train", tmp_path)
    model = ModelConfig(path=str(tiny_vl_model))
    tokenizer = load_tokenizer(model)
    multimodal = load_multimodal(model, tokenizer, get_plugin_manager())
    config = DataConfig(train_files=[str(path)], train_batch_size=4, max_prompt_length=64)
    dataset = PromptDataset.train(config, tokenizer, multimodal)
    image_id = multimodal.family.hf_config.image_token_id
    warm = encode_prompts(multimodal.processor, IMAGE_TEXT, scenes)
    for record, prompt in zip(dataset.records, warm, strict=True):
        # an 84 x 84 picture is 6 x 6 patches, 9 image tokens once merged
        assert record.multi_modal_inputs["image_grid_thw"].tolist() == [[1, 6, 6]]
        assert record.prompt_ids.count(image_id) == 9
        assert list(record.prompt_ids) == prompt.ids
        assert torch.equal(record.multi_modal_inputs["pixel_values"], prompt.pixel_values)


def test_the_counting_scorer_names_the_rows_picture():
    from plugrl_scorers.counting import compute_score

    extra = {"split": "val", "index": 7, "image": "images/val/00007.png"}
    assert compute_score("plugrl/counting", "Answer: 4", "4", extra) == {
        "score": 1.0,
        "acc": True,
        "pred": "4",
        "image": "images/val/00007.png",
    }
    assert compute_score("plugrl/counting", "Answer: 3", "4", None) == {
        "score": 0.0,
        "acc": False,
        "pred": "3",
        "image": None,
    }


def test_the_progress_plot_shows_the_validation_pictures(tmp_path):
    import yaml

    from plugrl_tools.plot import picture_rows, plot_run

    scenes = counting.make_splits(0, **KWARGS).val[:3]
    data = tmp_path / "data"
    val_file = counting.write_split(scenes, "val", data)
    run = tmp_path / "run"
    dump = run / "validation"
    dump.mkdir(parents=True)
    recipe = {"data": {"val_files": [str(val_file)]}, "trainer": {"validation_data_dir": str(dump)}}
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (run / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps({"step": step, "val-core/plugrl/counting/acc/mean@1": step / 10})
            for step in (0, 5, 10)
        )
        + "\n"
    )

    def line(index: int, pred: int) -> str:
        truth = scenes[index].count
        return json.dumps(
            {
                "response": f"Answer: {pred}",
                "score": float(pred == truth),
                "ground_truth": str(truth),
                "pred": str(pred),
                "image": counting.image_name("val", index),
            }
        )

    truth = [scene.count for scene in scenes]
    # picture 2 was miscounted at step 0 and is counted right at step 10; the others stay
    (dump / "val_0.jsonl").write_text("\n".join([line(0, truth[0]), line(1, 9), line(2, 0)]))
    (dump / "val_5.jsonl").write_text("\n".join([line(0, truth[0])]))
    (dump / "val_10.jsonl").write_text(
        "\n".join([line(0, truth[0]), line(1, 9), line(2, truth[2]), line(2, 5)])
    )
    rows, first, last = picture_rows(run)
    assert (first, last) == (0, 10)
    assert [row.image.name for row in rows] == ["00002.png", "00000.png", "00001.png"]
    assert (rows[0].first, rows[0].last, rows[0].ground_truth) == (
        "0",
        str(truth[2]),
        str(truth[2]),
    )
    assert plot_run(run).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without a validation dump there is nothing to show, and the curves are drawn alone
    (run / "recipe.yaml").write_text(yaml.safe_dump({"data": recipe["data"]}))
    assert picture_rows(run) == ([], 0, 0)
    assert plot_run(run).exists()


def test_prepare_quickstart_builds_the_vision_task(tmp_path):
    """A shortened build (400 warm-start pictures in 104 steps, 64 held out), and the warm
    start's greedy evaluation equal, answer for answer, to a run's first validation: the rows
    read back from ``val.parquet`` by the run's dataset, answered greedily by the hf engine and
    scored by the counting scorer. Trained and measured at other positions than a run's, the
    warm start answered 5 of these 64 pictures otherwise than the engine (0.484 against 0.469);
    a warm start of 200 pictures is too unsure to tell the two apart."""
    import asyncio

    from transformers import AutoModelForImageTextToText

    from plugrl.data.dataset import PromptDataset, load_tokenizer
    from plugrl.data.multimodal import load_multimodal
    from plugrl.parts.rollout import GenerationRequest, SamplingParams
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import DataConfig, ModelConfig, Recipe, TrainerConfig
    from plugrl.testing import part_context
    from plugrl_cpu.device import CpuDevice
    from plugrl_hf.config import HFRolloutConfig
    from plugrl_hf.engine import HFRolloutEngine
    from plugrl_qwen2_vl.family import IMAGE_TEXT
    from plugrl_scorers.counting import compute_score
    from plugrl_tools.quickstart import (
        VisionQuickstartSettings,
        describe,
        prepare_quickstart,
        quickstart_overrides,
    )
    from plugrl_tools.quickstart.vision_warmstart import encode_prompts, generate_responses

    settings = VisionQuickstartSettings(num_warm_start=400, num_train=8, num_val=64)
    paths = prepare_quickstart(tmp_path / "qs", seed=1, settings=settings)
    manifest = paths.manifest
    assert manifest["version"] == "vision-2" and manifest["data_source"] == "plugrl/counting"
    assert manifest["warm_start"]["steps"] == 104
    assert 150_000 < manifest["model"]["parameters"] < 200_000
    assert {p.name for p in paths.model_path.iterdir()} >= {
        "config.json",
        "preprocessor_config.json",
        "tokenizer.json",
    }
    assert pq.read_table(paths.train_file).num_rows == 8
    assert len(list((paths.val_file.parent / "images" / "val").glob("*.png"))) == 64
    assert "data.max_response_length=8" in quickstart_overrides(paths)
    assert "pictures of 4 shapes or more" in describe(paths)
    assert prepare_quickstart(tmp_path / "qs", seed=1, settings=settings) == paths, "reused"

    model = ModelConfig(path=str(paths.model_path))
    tokenizer = load_tokenizer(model)
    multimodal = load_multimodal(model, tokenizer, get_plugin_manager())
    data = DataConfig(val_files=[str(paths.val_file)], max_prompt_length=40)
    rows = PromptDataset.validation(data, tokenizer, multimodal).records
    rollout = HFRolloutConfig(dtype="float32")
    recipe = Recipe(model=model, rollout=rollout, trainer=TrainerConfig(seed=0))
    engine = HFRolloutEngine(rollout, part_context(recipe, device=CpuDevice(), tokenizer=tokenizer))
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=settings.max_response_length)

    async def answers():
        return await asyncio.gather(
            *(
                engine.generate_request(
                    GenerationRequest(
                        request_id=str(index),
                        prompt_ids=row.prompt_ids,
                        params=greedy,
                        multi_modal_inputs=row.multi_modal_inputs,
                    )
                )
                for index, row in enumerate(rows)
            )
        )

    responses = [
        tokenizer.decode(c.token_ids, skip_special_tokens=True) for (c,) in asyncio.run(answers())
    ]
    truths = [row.ground_truth for row in rows]
    scores = [
        compute_score("plugrl/counting", r, t)["score"]
        for r, t in zip(responses, truths, strict=True)
    ]
    assert sum(scores) / len(scores) == paths.warm_start_accuracy

    scenes = counting.make_splits(
        1, num_warm_start=400, num_train=8, num_val=64, many_fraction=settings.many_fraction
    ).val
    warm = AutoModelForImageTextToText.from_pretrained(paths.model_path).eval()
    prompts = encode_prompts(multimodal.processor, IMAGE_TEXT, scenes)
    assert generate_responses(warm, tokenizer, prompts, max_new_tokens=8) == responses


def language_model_positions(model) -> list:
    """Records the M-RoPE positions (``[3, B, L]``) of each forward of the language model, as
    its rotary embedding receives them."""
    rotary = next(
        module
        for name, module in model.named_modules()
        if name.endswith("rotary_emb") and "visual" not in name
    )
    seen = []
    rotary.register_forward_pre_hook(lambda _module, args: seen.append(args[1].clone()))
    return seen


def test_the_warm_start_trains_and_evaluates_at_the_runs_positions(tiny_vl_model):
    """The warm start's supervised pass and its greedy evaluation place the image tokens where
    a run does (the model family's M-RoPE positions, which the hf engine and the trainer use):
    a warm start at other positions measures, and hands the run, a model the run then reads
    differently."""
    import torch
    from transformers import AutoModelForImageTextToText

    from plugrl.data.dataset import load_tokenizer
    from plugrl.data.multimodal import load_multimodal
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import ModelConfig
    from plugrl_qwen2_vl.family import IMAGE_TEXT
    from plugrl_tools.quickstart.vision_warmstart import (
        encode_prompts,
        generate_responses,
        supervised_fine_tune,
    )

    model_config = ModelConfig(path=str(tiny_vl_model))
    tokenizer = load_tokenizer(model_config)
    multimodal = load_multimodal(model_config, tokenizer, get_plugin_manager())
    family = multimodal.family
    scenes = counting.make_splits(0, **KWARGS).val[:3]
    prompts = encode_prompts(multimodal.processor, IMAGE_TEXT, scenes)
    inputs = [{"image_grid_thw": p.image_grid_thw} for p in prompts]
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model).eval()
    seen = language_model_positions(model)

    # answers of different lengths: the shorter rows are padded on the right
    answers = ["Answer: 3", "Answer: 12345", "Answer: 4"]
    supervised_fine_tune(
        model, tokenizer, prompts, answers, epochs=1, batch_size=3, lr=1e-4, seed=0
    )
    (trained,) = seen
    for row, prompt in enumerate(prompts):
        answer = tokenizer(answers[row] + tokenizer.eos_token, add_special_tokens=False)
        ids = torch.tensor([prompt.ids + answer["input_ids"]])
        expected = family.position_ids(ids, torch.ones_like(ids), [inputs[row]])[0]
        # rows are shuffled by the seed: find this row's positions by their length
        got = [p[:, : ids.shape[1]] for p in trained.unbind(1)]
        assert any(torch.equal(p, expected) for p in got), (row, expected, got)
    assert trained[0, 0, :20].tolist() != list(range(20)), "the image tokens are on a grid"

    seen.clear()
    generate_responses(model, tokenizer, prompts, max_new_tokens=2)
    prefill, first_step = seen[0], seen[1]
    ids = torch.tensor([p.ids for p in prompts])
    expected = family.position_ids(ids, torch.ones_like(ids), inputs).permute(1, 0, 2)
    assert torch.equal(prefill, expected)
    # the first generated token continues after the prompt's largest position
    assert torch.equal(first_step[:, :, 0], expected.amax(dim=2) + 1)
