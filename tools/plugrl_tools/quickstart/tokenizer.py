"""A small byte-level BPE tokenizer trained here, saved as a Qwen2 tokenizer.

transformers reloads a folder whose model type is ``qwen2`` as ``Qwen2Tokenizer``, which
builds its own normalizer and pre-tokenizer (NFC, Qwen2's split regex, byte level) instead of
reading them from ``tokenizer.json``. Training with any other pipeline would give merges that
the reloaded tokenizer applies to differently split text, and ids would change after a save and
reload. So the BPE is trained with exactly that pipeline, and the saved tokenizer is built by
``Qwen2Tokenizer`` itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# ChatML, as Qwen2 chat models use it; the response ends with <|im_end|> (the eos token).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Text besides the task's, so that ordinary words and punctuation get merges too.
GENERAL_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. Answer the question, then stop.",
    "Please reason step by step, and put your final answer on the last line.",
    "Hello, world! How are you today? I am fine, thank you.",
    "system\nuser\nassistant\n",
]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> Any:
    """Train a byte-level BPE on ``texts`` and return it as a ``Qwen2Tokenizer`` with a chat
    template; ``<|im_end|>`` is the eos token and ``<|endoftext|>`` pads."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.trainers import BpeTrainer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        # every byte stays encodable, whatever the corpus holds
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([*texts, *GENERAL_TEXT], trainer)
    trained = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(merge) for merge in trained["merges"]],
        unk_token=PAD_TOKEN,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
