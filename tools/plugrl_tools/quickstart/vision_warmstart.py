"""The vision quickstart's warm start: a short supervised fine-tune on pictures, and the greedy
accuracy that says how much room it leaves for reinforcement learning.

Prompts are made as a run makes them (the chat template rendered with the model family's
image text in place of ``<image>``, then the processor over text and picture), so the
warm-started model sees at the run's start exactly the tokens it was trained on, at the same
positions: the model computes its M-RoPE positions (each image token its place in the
picture's grid) from the token types the processor gives beside the ids. Without them a newer
transformers falls back to counting every token one by one, positions a run never uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from plugrl_tools.quickstart.counting import QUESTION, Scene, draw
from plugrl_tools.quickstart.progress import Progress
from plugrl_tools.quickstart.warmstart import FineTuneStats, fine_tune

GENERATION_BATCH_SIZE = 128
"""Pictures per ``model.generate`` call when measuring accuracy."""


@attrs.frozen
class EncodedPrompt:
    """A picture's prompt as the run encodes it: token ids (the image expanded to its tokens),
    the model's image inputs for it, and each token's type (text 0, image 1) where the
    processor gives them (a transformers whose model reads the types to place image tokens)."""

    ids: list[int]
    pixel_values: Any
    image_grid_thw: Any
    token_types: list[int] | None = None


def encode_prompts(processor: Any, image_text: str, scenes: Sequence[Scene]) -> list[EncodedPrompt]:
    """Each scene's prompt: the question rendered by the chat template with the family's
    image text for ``<image>``, then run with the picture through the processor."""
    tokenizer = processor.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION.replace("<image>", image_text)}],
        add_generation_prompt=True,
        tokenize=False,
    )
    encoded = []
    for scene in scenes:
        out = processor(
            text=[text], images=[draw(scene)], return_tensors="pt", add_special_tokens=False
        )
        types = out.get("mm_token_type_ids")
        encoded.append(
            EncodedPrompt(
                out["input_ids"][0].tolist(),
                out["pixel_values"],
                out["image_grid_thw"],
                None if types is None else types[0].tolist(),
            )
        )
    return encoded


def _model_inputs(
    prompts: Sequence[EncodedPrompt], sequences: Sequence[list[int]], pad_id: int, *, left: bool
) -> dict[str, Any]:
    """The model's inputs for a batch of sequences (each a prompt's ids, maybe followed by
    more text), padded on the left or the right: ids, attention mask, the pictures' inputs and,
    where the prompts have them, the token types (text and padding 0)."""
    import torch

    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    token_types = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, (prompt, ids) in enumerate(zip(prompts, sequences, strict=True)):
        begin = width - len(ids) if left else 0
        input_ids[row, begin : begin + len(ids)] = torch.tensor(ids)
        attention_mask[row, begin : begin + len(ids)] = 1
        if prompt.token_types is not None:
            token_types[row, begin : begin + len(prompt.ids)] = torch.tensor(prompt.token_types)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "pixel_values": torch.cat([p.pixel_values for p in prompts]),
        "image_grid_thw": torch.cat([p.image_grid_thw for p in prompts]),
    }
    if any(p.token_types is not None for p in prompts):
        inputs["mm_token_type_ids"] = token_types
    return inputs


def supervised_fine_tune(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[EncodedPrompt],
    responses: Sequence[str],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> FineTuneStats:
    """Train on (prompt, response) pairs, the loss on the response's tokens only (it ends
    with the eos token, so the model learns to stop); the vision tower trains too."""
    import torch

    pad_id = tokenizer.pad_token_id
    sequences = []
    for prompt, response in zip(prompts, responses, strict=True):
        answer = tokenizer(response + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        sequences.append((prompt, prompt.ids + answer, len(prompt.ids)))

    def loss_of(chunk: list[tuple[EncodedPrompt, list[int], int]]) -> Any:
        inputs = _model_inputs(
            [prompt for prompt, _, _ in chunk], [ids for _, ids, _ in chunk], pad_id, left=False
        )
        labels = torch.full_like(inputs["input_ids"], -100)
        for row, (_, ids, prompt_length) in enumerate(chunk):
            labels[row, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])
        return model(**inputs, labels=labels).loss

    # the text warm start's optimizer, schedule and order
    return fine_tune(
        model, sequences, loss_of, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed
    )


def generate_responses(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[EncodedPrompt],
    *,
    max_new_tokens: int,
    batch_size: int = GENERATION_BATCH_SIZE,
    progress: Progress | None = None,
) -> list[str]:
    """Greedy responses with ``model.generate``, left-padded batches; each batch done
    advances ``progress``."""
    import torch

    responses: list[str] = []
    for begin in range(0, len(prompts), batch_size):
        chunk = prompts[begin : begin + batch_size]
        inputs = _model_inputs(chunk, [p.ids for p in chunk], tokenizer.pad_token_id, left=True)
        width = inputs["input_ids"].shape[1]
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        responses += tokenizer.batch_decode(output[:, width:], skip_special_tokens=True)
        if progress is not None:
            progress.update()
    return responses
