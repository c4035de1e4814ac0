"""The vision quickstart's warm start: a short supervised fine-tune on pictures, and the greedy
accuracy that says how much room it leaves for reinforcement learning.

Prompts are made as a run makes them (the chat template rendered with the model family's
image text in place of ``<image>``, then the processor over text and picture), so the
warm-started model sees at the run's start exactly the tokens it was trained on.
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
    """A picture's prompt as the run encodes it: token ids (the image expanded to its tokens)
    and the model's image inputs for it."""

    ids: list[int]
    pixel_values: Any
    image_grid_thw: Any


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
        encoded.append(
            EncodedPrompt(out["input_ids"][0].tolist(), out["pixel_values"], out["image_grid_thw"])
        )
    return encoded


def _image_inputs(prompts: Sequence[EncodedPrompt]) -> dict[str, Any]:
    import torch

    return {
        "pixel_values": torch.cat([p.pixel_values for p in prompts]),
        "image_grid_thw": torch.cat([p.image_grid_thw for p in prompts]),
    }


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
        width = max(len(ids) for _, ids, _ in chunk)
        input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (_, ids, prompt_length) in enumerate(chunk):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])
            attention_mask[row, : len(ids)] = 1
        return model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            **_image_inputs([prompt for prompt, _, _ in chunk]),
        ).loss

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
        width = max(len(p.ids) for p in chunk)
        input_ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, prompt in enumerate(chunk):
            input_ids[row, width - len(prompt.ids) :] = torch.tensor(prompt.ids)
            attention_mask[row, width - len(prompt.ids) :] = 1
        with torch.no_grad():
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                **_image_inputs(chunk),
            )
        responses += tokenizer.batch_decode(output[:, width:], skip_special_tokens=True)
        if progress is not None:
            progress.update()
    return responses
