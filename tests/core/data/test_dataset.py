from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from plugrl.data.dataset import PromptDataset, PromptLoader, pad_token_id_of, truncate
from plugrl.errors import DataError
from plugrl.recipe import DataConfig


def verl_row(question: str, answer: str, source: str = "plugrl/arithmetic") -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"question": question},
    }


def rows(count: int, start: int = 0) -> list[dict]:
    return [
        verl_row(f"What is {i} + {i + 1}?", str(2 * i + 1)) for i in range(start, start + count)
    ]


def config(**overrides) -> DataConfig:
    values = {"max_prompt_length": 64, "train_batch_size": 4}
    values.update(overrides)
    return DataConfig(**values)


def rendered_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------ reading


def test_rows_are_rendered_with_the_chat_template_and_keep_their_fields(tokenizer, write_parquet):
    path = write_parquet(rows(3))
    dataset = PromptDataset([path], tokenizer, config())
    assert len(dataset) == 3
    record = dataset[1]
    assert list(record.prompt_ids) == rendered_ids(tokenizer, "What is 1 + 2?")
    assert tokenizer.decode(record.prompt_ids).endswith("<|im_start|>assistant\n")
    assert record.data_source == "plugrl/arithmetic"
    assert record.ground_truth == "3"
    assert record.extra_info == {"question": "What is 1 + 2?"}
    assert record.ability == "arithmetic"
    assert record.origin == f"{path} row 1"


def test_several_files_are_concatenated_in_order(tokenizer, write_parquet):
    first, second = write_parquet(rows(2)), write_parquet(rows(3, start=10))
    dataset = PromptDataset([first, second], tokenizer, config())
    assert [r.ground_truth for r in dataset.records] == ["1", "3", "21", "23", "25"]
    assert [r.index for r in dataset.records] == [0, 1, 2, 3, 4]


def test_prompt_key_chooses_the_column(tokenizer, write_parquet):
    data = [{**row, "messages": row.pop("prompt")} for row in rows(2)]
    dataset = PromptDataset([write_parquet(data)], tokenizer, config(prompt_key="messages"))
    assert list(dataset[0].prompt_ids) == rendered_ids(tokenizer, "What is 0 + 1?")


def test_a_plain_string_prompt_is_one_user_message(tokenizer, write_parquet):
    data = [{**verl_row("x", "1"), "prompt": "What is 0 + 1?"}]
    dataset = PromptDataset([write_parquet(data)], tokenizer, config())
    assert list(dataset[0].prompt_ids) == rendered_ids(tokenizer, "What is 0 + 1?")


def test_without_chat_template_the_messages_are_joined(tokenizer, write_parquet):
    data = [
        {
            **verl_row("x", "1"),
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2 + 2?"},
            ],
        }
    ]
    dataset = PromptDataset([write_parquet(data)], tokenizer, config(apply_chat_template=False))
    assert tokenizer.decode(dataset[0].prompt_ids) == "Be brief.\nWhat is 2 + 2?"


def test_missing_extra_info_and_ability_are_none(tokenizer, write_parquet):
    data = [{k: v for k, v in row.items() if k not in ("extra_info", "ability")} for row in rows(1)]
    record = PromptDataset([write_parquet(data)], tokenizer, config())[0]
    assert record.extra_info is None and record.ability is None


# ------------------------------------------------------------------------------------ errors


def test_no_files_configured(tokenizer):
    with pytest.raises(DataError, match=r"^data.train_files is empty; set it to one or more"):
        PromptDataset.train(config(), tokenizer)


def test_missing_file_names_the_path_and_the_key(tokenizer, tmp_path):
    missing = tmp_path / "nope.parquet"
    with pytest.raises(DataError) as info:
        PromptDataset([missing], tokenizer, config())
    assert str(info.value) == (
        f"data.train_files: {missing} does not exist; fix the path in data.train_files"
    )


def test_validation_files_are_named_as_such(tokenizer, tmp_path):
    missing = tmp_path / "val.parquet"
    with pytest.raises(DataError, match=r"^data.val_files: .*val.parquet does not exist"):
        PromptDataset.validation(config(val_files=[str(missing)]), tokenizer)
    assert PromptDataset.validation(config(), tokenizer) is None


def test_unreadable_file(tokenizer, tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_text("this is not parquet")
    with pytest.raises(DataError) as info:
        PromptDataset([path], tokenizer, config())
    message = str(info.value)
    assert message.startswith(f"data.train_files: cannot read {path} as parquet (")
    assert message.endswith("point data.train_files at parquet files in verl's schema")
    assert "\n" not in message


def test_a_folder_is_not_a_file(tokenizer, tmp_path):
    with pytest.raises(DataError, match=r"is a folder; list its parquet files in data.train_files"):
        PromptDataset([tmp_path], tokenizer, config())


def test_missing_prompt_column_names_the_column_and_the_key(tokenizer, write_parquet):
    data = [{k: v for k, v in row.items() if k != "prompt"} for row in rows(2)]
    path = write_parquet(data)
    with pytest.raises(DataError) as info:
        PromptDataset([path], tokenizer, config())
    assert str(info.value) == (
        f"{path} has no column 'prompt' (it has data_source, ability, reward_model, extra_info); "
        "set data.prompt_key to the column with the chat messages"
    )


def test_missing_data_source_column(tokenizer, write_parquet):
    path = write_parquet([{k: v for k, v in r.items() if k != "data_source"} for r in rows(1)])
    with pytest.raises(DataError, match=r"has no column 'data_source' .*names the reward function"):
        PromptDataset([path], tokenizer, config())


def test_missing_reward_model_column(tokenizer, write_parquet):
    path = write_parquet([{k: v for k, v in r.items() if k != "reward_model"} for r in rows(1)])
    with pytest.raises(
        DataError, match=r"has no column 'reward_model' .*with a ground_truth field"
    ):
        PromptDataset([path], tokenizer, config())


def test_missing_ground_truth_names_the_row(tokenizer, write_parquet):
    data = rows(3)
    data[2]["reward_model"] = {"style": "rule", "ground_truth": None}
    path = write_parquet(data)
    with pytest.raises(DataError) as info:
        PromptDataset([path], tokenizer, config())
    assert str(info.value) == (
        f"{path} row 2: no reward_model.ground_truth; every row needs reward_model: "
        "{ground_truth: ...}, the answer its reward function checks"
    )


def test_empty_data_source_names_the_row(tokenizer, write_parquet):
    data = rows(2)
    data[1]["data_source"] = ""
    with pytest.raises(DataError, match=r"row 1: data_source is ''; every row needs the name"):
        PromptDataset([write_parquet(data)], tokenizer, config())


def test_malformed_prompt_names_the_row_and_the_fix(tokenizer, write_parquet):
    data = rows(2)
    for row in data:
        row["prompt"] = [{"role": "user", "text": "no content key"}]
    path = write_parquet(data)
    with pytest.raises(DataError) as info:
        PromptDataset([path], tokenizer, config())
    message = str(info.value)
    assert message.startswith(f"{path} row 0: column 'prompt' must hold chat messages")
    assert message.endswith("set data.prompt_key to the column with the messages")


def test_empty_file(tokenizer, write_parquet, tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist(rows(1)).slice(0, 0), path)
    with pytest.raises(DataError) as info:
        PromptDataset([path], tokenizer, config())
    assert str(info.value) == (
        f"data.train_files: {path} hold no rows; point data.train_files at files with prompts"
    )


def test_overlong_prompt_with_truncation_error_names_row_length_limit_and_keys(
    tokenizer, write_parquet
):
    data = rows(3)
    data[1]["prompt"] = [{"role": "user", "content": "What is " + "1 + " * 40 + "1?"}]
    path = write_parquet(data)
    length = len(rendered_ids(tokenizer, data[1]["prompt"][0]["content"]))
    with pytest.raises(DataError) as info:
        PromptDataset([path], tokenizer, config(max_prompt_length=40))
    assert str(info.value) == (
        f"{path} row 1: prompt is {length} tokens, over data.max_prompt_length=40; raise "
        "data.max_prompt_length, set data.truncation to left, right or middle, or set "
        "data.filter_overlong_prompts=true"
    )


def test_tokenizer_without_chat_template(tokenizer, write_parquet):
    import copy

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    with pytest.raises(
        DataError, match=r"tokenizer has no chat template .*apply_chat_template=false"
    ):
        PromptDataset([write_parquet(rows(1))], plain, config())


# -------------------------------------------------------------------------------- truncation


@pytest.mark.parametrize(
    ("mode", "limit", "expected"),
    [
        ("left", 4, [6, 7, 8, 9]),
        ("right", 4, [0, 1, 2, 3]),
        ("middle", 4, [0, 1, 8, 9]),
        ("middle", 5, [0, 1, 7, 8, 9]),
        ("middle", 1, [9]),
        ("left", 20, list(range(10))),
    ],
)
def test_truncate(mode, limit, expected):
    assert truncate(range(10), limit, mode) == expected


def test_truncate_rejects_unknown_modes():
    with pytest.raises(ValueError, match="'sideways' is not one of error, left, right, middle"):
        truncate(range(10), 4, "sideways")


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_dataset_truncates_overlong_prompts(tokenizer, write_parquet, mode):
    data = rows(2)
    data[0]["prompt"] = [{"role": "user", "content": "What is " + "1 + " * 40 + "1?"}]
    full = rendered_ids(tokenizer, data[0]["prompt"][0]["content"])
    dataset = PromptDataset(
        [write_parquet(data)], tokenizer, config(max_prompt_length=24, truncation=mode)
    )
    assert list(dataset[0].prompt_ids) == truncate(full, 24, mode)
    assert len(dataset[0].prompt_ids) == 24
    assert list(dataset[1].prompt_ids) == rendered_ids(tokenizer, "What is 1 + 2?")


def test_filter_overlong_prompts_drops_them_and_renumbers(tokenizer, write_parquet):
    data = rows(4)
    data[1]["prompt"] = [{"role": "user", "content": "What is " + "1 + " * 40 + "1?"}]
    dataset = PromptDataset(
        [write_parquet(data)], tokenizer, config(max_prompt_length=24, filter_overlong_prompts=True)
    )
    assert [r.ground_truth for r in dataset.records] == ["1", "5", "7"]
    assert [r.index for r in dataset.records] == [0, 1, 2]
    assert dataset.num_filtered == 1


def test_filtering_every_prompt_is_an_error(tokenizer, write_parquet):
    with pytest.raises(DataError) as info:
        PromptDataset(
            [write_parquet(rows(3))],
            tokenizer,
            config(max_prompt_length=2, filter_overlong_prompts=True),
        )
    assert str(info.value) == (
        "data.train_files: all 3 prompts are longer than data.max_prompt_length=2; raise it or "
        "set data.filter_overlong_prompts=false with a data.truncation mode"
    )


# -------------------------------------------------------------------------------- the loader


@pytest.fixture
def dataset(tokenizer, write_parquet):
    data = rows(10)
    # prompts of different lengths, so left padding shows
    data[3]["prompt"] = [{"role": "user", "content": "What is 3 + 4? Think first."}]
    return PromptDataset([write_parquet(data)], tokenizer, config())


def test_batches_are_left_padded_with_masks_and_columns(dataset, tokenizer):
    pad = pad_token_id_of(tokenizer)
    loader = PromptLoader(dataset, 4, pad_token_id=pad, shuffle=False)
    batch = loader.next_batch()
    prompts, mask = batch["prompts"], batch["prompt_attention_mask"]
    longest = len(dataset[3].prompt_ids)
    assert prompts.shape == mask.shape == (4, longest)
    assert prompts.dtype == mask.dtype == torch.long
    for row in range(4):
        ids = list(dataset[row].prompt_ids)
        assert prompts[row, longest - len(ids) :].tolist() == ids
        assert (prompts[row, : longest - len(ids)] == pad).all()
        assert mask[row].tolist() == [0] * (longest - len(ids)) + [1] * len(ids)
        assert batch["raw_prompt_ids"][row] == ids
    assert list(batch["uid"]) == ["0-0", "0-1", "0-2", "0-3"]
    assert list(batch["index"]) == [0, 1, 2, 3]
    assert list(batch["ground_truth"]) == ["1", "3", "5", "7"]
    assert list(batch["data_source"]) == ["plugrl/arithmetic"] * 4
    assert batch["extra_info"][0] == {"question": "What is 0 + 1?"}
    assert list(batch["ability"]) == ["arithmetic"] * 4
    # the messages before any template, for a reward model that renders them its own way
    assert batch["raw_prompt"][0] == [{"role": "user", "content": "What is 0 + 1?"}]
    assert batch["raw_prompt"][3] == [{"role": "user", "content": "What is 3 + 4? Think first."}]
    assert batch.meta["epoch"] == 0


def test_training_loader_drops_the_last_partial_batch_and_reshuffles_each_epoch(dataset):
    loader = PromptLoader(dataset, 4, pad_token_id=0, shuffle=True, seed=3)
    assert len(loader) == 2
    epoch0 = [list(b["index"]) for b in loader]
    epoch1 = [list(b["index"]) for b in loader]
    assert len(epoch0) == len(epoch1) == 2
    assert len(set(epoch0[0] + epoch0[1])) == 8
    assert epoch0 != epoch1
    assert loader.epoch == 1
    # the same seed gives the same order; another seed another
    again = PromptLoader(dataset, 4, pad_token_id=0, shuffle=True, seed=3)
    assert [list(b["index"]) for b in again] == epoch0
    other = PromptLoader(dataset, 4, pad_token_id=0, shuffle=True, seed=4)
    assert [list(b["index"]) for b in other] != epoch0


def test_uids_are_unique_across_epochs(dataset):
    loader = PromptLoader(dataset, 5, pad_token_id=0, shuffle=True, seed=0)
    uids = [uid for _ in range(4) for uid in loader.next_batch()["uid"]]
    assert len(uids) == len(set(uids)) == 20
    assert {uid.split("-")[0] for uid in uids} == {"0", "1"}


def test_resumed_loader_gives_exactly_the_same_next_batches(dataset):
    original = PromptLoader(dataset, 3, pad_token_id=0, shuffle=True, seed=7)
    for _ in range(4):  # into the second epoch (3 batches per epoch)
        original.next_batch()
    state = original.state_dict()
    expected = [original.next_batch() for _ in range(5)]

    resumed = PromptLoader(dataset, 3, pad_token_id=0, shuffle=True, seed=7)
    resumed.load_state_dict(state)
    for want in expected:
        got = resumed.next_batch()
        assert list(got["uid"]) == list(want["uid"])
        assert torch.equal(got["prompts"], want["prompts"])
        assert got.meta == want.meta
    assert resumed.state_dict() == original.state_dict()


def test_resuming_mid_epoch_iterates_the_rest_of_that_epoch(dataset):
    loader = PromptLoader(dataset, 3, pad_token_id=0, shuffle=True, seed=1)
    full_epoch = [list(b["uid"]) for b in PromptLoader(dataset, 3, pad_token_id=0, seed=1)]
    loader.next_batch()
    resumed = PromptLoader(dataset, 3, pad_token_id=0, shuffle=True, seed=1)
    resumed.load_state_dict(loader.state_dict())
    assert [list(b["uid"]) for b in resumed] == full_epoch[1:]


def test_loading_state_of_other_data_is_an_error(dataset):
    loader = PromptLoader(dataset, 3, pad_token_id=0)
    with pytest.raises(DataError) as info:
        loader.load_state_dict({"epoch": 1, "position": 3, "num_prompts": 99})
    assert str(info.value) == (
        "the checkpoint's data loader was over 99 prompts, data.train_files now has 10; resume "
        "with the same data files (and filtering) or start fresh with trainer.resume_mode=disable"
    )


def test_validation_loader_keeps_file_order_and_the_last_partial_batch(dataset, tokenizer):
    loader = PromptLoader.for_validation(dataset, config(val_batch_size=4), pad_token_id=0)
    batches = list(loader)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert np.concatenate([b["index"] for b in batches]).tolist() == list(range(10))
    assert batches[0]["uid"][0] == "val-0-0"
    everything = PromptLoader.for_validation(dataset, config(), pad_token_id=0)
    assert [len(b) for b in everything] == [10]


def test_for_training_reads_the_data_section(dataset):
    loader = PromptLoader.for_training(
        dataset, config(train_batch_size=5, shuffle=False, seed=9), pad_token_id=0
    )
    assert (loader.batch_size, loader.shuffle, loader.seed, loader.drop_last) == (5, False, 9, True)
    assert list(loader.next_batch()["index"]) == [0, 1, 2, 3, 4]


def test_batch_larger_than_the_dataset_is_an_error(dataset):
    with pytest.raises(DataError) as info:
        PromptLoader(dataset, 11, pad_token_id=0)
    assert str(info.value) == (
        "data.train_batch_size=11 is more than the 10 prompts of data.train_files; lower "
        "data.train_batch_size or add prompts"
    )


def test_pad_token_falls_back_to_eos():
    class NoPad:
        pad_token_id = None
        eos_token_id = 7

    class Neither:
        pad_token_id = None
        eos_token_id = None

    assert pad_token_id_of(NoPad()) == 7
    with pytest.raises(DataError, match=re.escape("neither a pad nor an eos token")):
        pad_token_id_of(Neither())


def test_build_loaders_reads_train_and_val_files(tokenizer, write_parquet):
    from plugrl.data.dataset import build_loaders

    data = config(
        train_files=[str(write_parquet(rows(6)))],
        val_files=[str(write_parquet(rows(3)))],
        train_batch_size=2,
    )
    train, val = build_loaders(data, tokenizer)
    assert len(train) == 3 and train.drop_last and train.shuffle
    assert val is not None and [len(b) for b in val] == [3]
    train_only, no_val = build_loaders(config(train_files=data.train_files), tokenizer)
    assert no_val is None and len(train_only.dataset) == 6


def test_load_tokenizer_from_model_or_tokenizer_path(tokenizer, tmp_path):
    from plugrl.data.dataset import load_tokenizer
    from plugrl.errors import RecipeError
    from plugrl.recipe import ModelConfig

    folder = tmp_path / "tok"
    tokenizer.save_pretrained(folder)
    loaded = load_tokenizer(
        ModelConfig(path=str(tmp_path / "elsewhere"), tokenizer_path=str(folder))
    )
    assert loaded("What is 1 + 2?")["input_ids"] == tokenizer("What is 1 + 2?")["input_ids"]
    with pytest.raises(RecipeError) as info:
        load_tokenizer(ModelConfig())
    assert str(info.value) == (
        "model.path: no tokenizer to load; set model.path to a Hugging Face model folder"
    )
    with pytest.raises(RecipeError) as info:
        load_tokenizer(ModelConfig(path=str(tmp_path / "missing")))
    assert str(info.value) == (
        f"model.path: {tmp_path / 'missing'} is not a folder; set a local Hugging Face model folder"
    )


def test_a_rows_agent_name_reaches_its_batch_and_rows_without_one_get_none(
    tokenizer, write_parquet
):
    data = rows(3)
    data[0]["agent_name"] = "tool_agent"
    data[1]["agent_name"] = None
    data[2]["agent_name"] = ""
    dataset = PromptDataset([write_parquet(data)], tokenizer, config())
    assert [r.agent_name for r in dataset.records] == ["tool_agent", None, None]
    without = PromptDataset([write_parquet(rows(1))], tokenizer, config())
    loader = PromptLoader(without, 1, pad_token_id=pad_token_id_of(tokenizer), shuffle=False)
    assert list(loader.next_batch()["agent_name"]) == [None]
