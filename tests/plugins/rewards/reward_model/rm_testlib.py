"""Helpers of the reward_model tests: a tiny reward model's sizes, rows as a rollout leaves
them, and scores computed by hand."""

from __future__ import annotations

import torch

from plugrl.data.batch import Batch

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

PROMPTS = ["What is 2 + 2?", "Say hello.", "Name a colour.", "Count to three."]
RESPONSES = ["4", "Hello, world! How are you today?", "Blue, I think.", "one two three"]


def rm_batch(tokenizer, prompts=PROMPTS, responses=RESPONSES, *, messages=True, width=None):
    """Rows as a rollout leaves them: right-padded responses ending in the eos token, the
    prompt's chat messages (``raw_prompt``) and its templated ids (``raw_prompt_ids``)."""
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    encoded = [tokenizer(r, add_special_tokens=False)["input_ids"] + [eos] for r in responses]
    width = width or max(len(e) for e in encoded)
    ids = torch.full((len(responses), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.long)
    for row, tokens in enumerate(encoded):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    chats = [[{"role": "user", "content": p}] for p in prompts]
    columns = {
        "data_source": ["any"] * len(responses),
        "ground_truth": [None] * len(responses),
        "raw_prompt_ids": [
            tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True)
            for c in chats
        ],
    }
    if messages:
        columns["raw_prompt"] = chats
    return Batch(tensors={"responses": ids, "response_mask": mask}, columns=columns)


def by_hand(folder, prompts=PROMPTS, responses=RESPONSES, *, max_length=None, side="right"):
    """Each conversation's score from a forward pass of one unpadded sequence."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    scores = []
    for prompt, response in zip(prompts, responses, strict=True):
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if max_length is not None and len(ids) > max_length:
            ids = ids[:max_length] if side == "right" else ids[len(ids) - max_length :]
        with torch.no_grad():
            scores.append(float(model(torch.tensor([ids])).logits[0, 0]))
    return scores
