"""Warm start: a short supervised fine-tune so the model writes the task's format, and the
accuracy check that says how much room it leaves for reinforcement learning."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from plugrl_tools.quickstart.arithmetic import Problem, score
from plugrl_tools.quickstart.progress import Progress

RUNNING_LOSS_STEPS = 10
"""Steps the loss shown in the warm start's progress is averaged over."""
GENERATION_BATCH_SIZE = 128
"""Prompts per ``model.generate`` call when measuring accuracy."""


def render_prompt(tokenizer: Any, question: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )


@attrs.frozen
class FineTuneStats:
    steps: int
    first_loss: float
    last_loss: float
    seconds: float


def supervised_fine_tune(
    model: Any,
    tokenizer: Any,
    examples: Sequence[tuple[str, str]],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> FineTuneStats:
    """Train on (question, response) pairs with the loss on response tokens only (the
    response ends with the eos token, so the model learns to stop). Progress, with the loss
    averaged over the last :data:`RUNNING_LOSS_STEPS` steps, goes to stderr (see
    :class:`~plugrl_tools.quickstart.progress.Progress`)."""
    eos = tokenizer.eos_token
    sequences: list[tuple[list[int], list[bool]]] = []
    for question, response in examples:
        prompt_ids = tokenizer(render_prompt(tokenizer, question), add_special_tokens=False)
        response_ids = tokenizer(response + eos, add_special_tokens=False)
        ids = prompt_ids["input_ids"] + response_ids["input_ids"]
        trained = [False] * len(prompt_ids["input_ids"]) + [True] * len(response_ids["input_ids"])
        sequences.append((ids, trained))
    return train_on_sequences(
        model, tokenizer, sequences, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed
    )


def train_on_sequences(
    model: Any,
    tokenizer: Any,
    sequences: Sequence[tuple[list[int], list[bool]]],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> FineTuneStats:
    """Train on token sequences with the loss on the tokens marked ``True`` only (a
    conversation's model turns: not its prompt, nor the tool results between turns)."""
    import torch

    pad_id = tokenizer.pad_token_id

    def loss_of(chunk: list[tuple[list[int], list[bool]]]) -> Any:
        width = max(len(ids) for ids, _ in chunk)
        input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (ids, trained) in enumerate(chunk):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(ids)] = torch.where(
                torch.tensor(trained), torch.tensor(ids), torch.tensor(-100)
            )
            attention_mask[row, : len(ids)] = 1
        return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss

    return fine_tune(
        model, sequences, loss_of, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed
    )


def fine_tune(
    model: Any,
    examples: Sequence[Any],
    loss_of: Callable[[list[Any]], Any],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> FineTuneStats:
    """AdamW over ``examples`` for ``epochs`` epochs, shuffled by ``seed``, in batches of
    ``batch_size`` whose loss is ``loss_of(batch)``: a linear warm-up over the first tenth
    of the steps, then a cosine down to a tenth of ``lr``; gradients clipped at norm 1.
    Progress, with the loss averaged over the last :data:`RUNNING_LOSS_STEPS` steps, goes to
    stderr. The model is left in eval mode."""
    import time

    import torch

    start = time.perf_counter()
    total_steps = epochs * math.ceil(len(examples) / batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, total_steps // 10)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    rng = random.Random(seed)
    model.train()
    losses: list[float] = []
    progress = Progress("warm start", total_steps, "steps")
    for _epoch in range(epochs):
        order = list(range(len(examples)))
        rng.shuffle(order)
        for begin in range(0, len(order), batch_size):
            loss = loss_of([examples[i] for i in order[begin : begin + batch_size]])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
            recent = losses[-RUNNING_LOSS_STEPS:]
            progress.update(loss=sum(recent) / len(recent))
    progress.close()
    model.eval()
    return FineTuneStats(
        steps=len(losses),
        first_loss=losses[0] if losses else math.nan,
        last_loss=losses[-1] if losses else math.nan,
        seconds=time.perf_counter() - start,
    )


def generate_responses(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    *,
    max_new_tokens: int = 48,
    batch_size: int = GENERATION_BATCH_SIZE,
    temperature: float = 0.0,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[str]:
    """Responses with ``model.generate`` (greedy at temperature 0), left-padded batches; each
    batch done advances ``progress``."""
    import torch

    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    responses: list[str] = []
    for begin in range(0, len(questions), batch_size):
        prompts = [render_prompt(tokenizer, q) for q in questions[begin : begin + batch_size]]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
        with torch.no_grad():
            output = model.generate(
                **encoded,
                max_new_tokens=max_new_tokens,
                **(sampling if temperature > 0 else {"do_sample": False}),
            )
        new_tokens = output[:, encoded["input_ids"].shape[1] :]
        responses += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        if progress is not None:
            progress.update()
    return responses


def accuracy(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Problem],
    *,
    temperature: float = 0.0,
    seed: int = 0,
    progress: Progress | None = None,
) -> float:
    """Fraction of problems whose response ends with the right ``Answer:`` line."""
    responses = generate_responses(
        model,
        tokenizer,
        [p.question for p in problems],
        temperature=temperature,
        seed=seed,
        progress=progress,
    )
    scores = [score(r, str(p.answer)) for r, p in zip(responses, problems, strict=True)]
    return sum(scores) / max(1, len(scores))
