"""Tiny models and tokenizers, built here from a seed: nothing is downloaded.

:func:`save_tiny_model` writes a Hugging Face folder that ``AutoTokenizer`` and
``AutoModelForCausalLM`` load offline: a byte-level BPE tokenizer with a ChatML chat template
and a freshly initialised Qwen2-architecture model (by default about 4M parameters). The same
arguments write the same tokenizer and the same weights. :func:`make_tiny_tokenizer` and
:func:`make_tiny_model` build the two in memory. :func:`save_tiny_reward_model` writes the
same tokenizer with a sequence-classification head on the model instead of the language-model
head: a reward model that scores a whole text with one number.

transformers reloads a folder whose model type is ``qwen2`` as ``Qwen2Tokenizer``, which builds
its own normalizer and pre-tokenizer (NFC, Qwen2's split regex, byte level) instead of reading
them from ``tokenizer.json``. A BPE trained with any other pipeline has merges that the reloaded
tokenizer applies to differently split text, and ids change after a save and reload; so the BPE
is trained with exactly that pipeline, and the tokenizer is built by ``Qwen2Tokenizer`` itself.

The quickstart's tokenizer and model are built by these functions: what they build for given
arguments is part of the quickstart's results.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

MIN_TOKENIZER_VOCAB = 256 + len(SPECIAL_TOKENS)
"""Every byte and the special tokens: the smallest vocabulary a tiny tokenizer can have."""

# ChatML, as Qwen2 chat models use it; the response ends with <|im_end|> (the eos token).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

GENERAL_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. Answer the question, then stop.",
    "Please reason step by step, and put your final answer on the last line.",
    "Hello, world! How are you today? I am fine, thank you.",
    "system\nuser\nassistant\n",
)
"""Text every tiny tokenizer learns from besides the caller's, so that ordinary words,
punctuation and the chat roles get merges whatever the task's text is."""

DTYPES = ("float32", "bfloat16", "float16")


def make_tiny_tokenizer(texts: Iterable[str] | None = None, *, vocab_size: int = 512) -> Any:
    """A byte-level BPE trained on ``texts`` and :data:`GENERAL_TEXTS`, as a
    ``Qwen2Tokenizer`` with a ChatML chat template: ``<|im_end|>`` is the eos token,
    ``<|endoftext|>`` pads, ``<|im_start|>`` opens a turn. Every byte is a token, so any text
    encodes, and ids survive a ``save_pretrained`` / ``AutoTokenizer.from_pretrained`` round trip.

    ``texts`` defaults to :data:`GENERAL_TEXTS` four more times (so that their words are whole
    tokens). ``vocab_size`` (at least 259: the 256 bytes and 3 special tokens) is an upper
    bound: training stops early when no pair of tokens occurs twice more, so ``len(tokenizer)``
    may be smaller (381 for the default text). The same arguments give the same tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.trainers import BpeTrainer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    if vocab_size < MIN_TOKENIZER_VOCAB:
        raise ValueError(
            f"vocab_size must be at least {MIN_TOKENIZER_VOCAB} (256 bytes and "
            f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size}"
        )
    corpus = list(GENERAL_TEXTS) * 4 if texts is None else list(texts)
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
        special_tokens=list(SPECIAL_TOKENS),
        # every byte stays encodable, whatever the corpus holds
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([*corpus, *GENERAL_TEXTS], trainer)
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


def make_tiny_model(
    tokenizer: Any = None,
    *,
    seed: int = 0,
    vocab_size: int | None = None,
    hidden_size: int = 256,
    intermediate_size: int = 1024,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    weight_std: float | None = None,
    dtype: str = "float32",
    model_type: str = "qwen2",
    **config: Any,
) -> Any:
    """A freshly initialised causal language model (``AutoModelForCausalLM.from_config``): the
    same arguments give the same weights, and the process's random state is left as it was.

    * ``tokenizer``: the model's vocabulary is ``len(tokenizer)`` (unless ``vocab_size`` says
      more: rows no token uses, as real checkpoints pad theirs) and its eos and pad tokens are
      the tokenizer's; generation stops at the eos token or the pad token. Without one,
      ``vocab_size`` is required.
    * sizes: the defaults (hidden 256, MLP 1024, 4 layers, 4 query heads sharing 2 key/value
      heads, positions up to 512, input and output embeddings tied) are the quickstart's.
    * ``weight_std``: ``None`` keeps transformers' initialisation, whose logits are nearly
      flat (every row of a batch then samples alike and runs to the length limit), with norm
      scales at one and biases at zero. A number re-draws every weight matrix (embeddings and
      projections) from a normal distribution of that spread and adds noise of that spread to
      every vector (norm scales, biases), seeded by ``seed``: responses vary with the context
      (0.15 for the default sizes), and no weight sits at a value that would hide a
      computation that skips it.
    * ``dtype``: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
    * ``model_type`` and ``config``: any model type transformers knows and any field of its
      config (``attn_implementation="sdpa"``, ``head_dim``, ``rope_parameters``, ...)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = _build_tiny_model(
        AutoModelForCausalLM,
        tokenizer,
        seed=seed,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        weight_std=weight_std,
        dtype=dtype,
        model_type=model_type,
        **config,
    )
    if tokenizer is not None:
        model.generation_config = GenerationConfig(
            eos_token_id=[model.config.eos_token_id, model.config.pad_token_id],
            pad_token_id=model.config.pad_token_id,
            do_sample=False,
        )
    return model


def _build_tiny_model(
    auto_class: Any,
    tokenizer: Any = None,
    *,
    seed: int = 0,
    vocab_size: int | None = None,
    hidden_size: int = 256,
    intermediate_size: int = 1024,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    weight_std: float | None = None,
    dtype: str = "float32",
    model_type: str = "qwen2",
    **config: Any,
) -> Any:
    """``auto_class.from_config`` of the tiny config (see :func:`make_tiny_model`)."""
    import torch
    from transformers import AutoConfig

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if weight_std is not None and not weight_std > 0:
        raise ValueError(f"weight_std must be a positive number or None, got {weight_std}")
    if tokenizer is None and vocab_size is None:
        raise ValueError("make_tiny_model needs a tokenizer or a vocab_size")
    if tokenizer is not None and vocab_size is not None and vocab_size < len(tokenizer):
        raise ValueError(
            f"vocab_size {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens"
        )
    fields: dict[str, Any] = {
        "vocab_size": vocab_size if vocab_size is not None else len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_dropout": 0.0,
    }
    if tokenizer is not None:
        fields.update(
            bos_token_id=None,
            eos_token_id=tokenizer.convert_tokens_to_ids(tokenizer.eos_token),
            pad_token_id=tokenizer.pad_token_id,
        )
    fields.update(config)
    model_config = AutoConfig.for_model(model_type, **fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto_class.from_config(model_config, dtype=getattr(torch, dtype))
    if weight_std is not None:
        spread_weights(model, weight_std, seed)
    return model


def spread_weights(model: Any, weight_std: float, seed: int) -> None:
    """Re-draw every weight matrix of ``model`` (embeddings and projections) from a normal
    distribution of spread ``weight_std`` and add noise of that spread to every vector (norm
    scales, biases), from a generator seeded by ``seed``: the same arguments give the same
    weights, and the process's random state is not touched. Transformers' own
    initialisation gives nearly flat logits, under which every response looks alike."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.empty_like(parameter).normal_(0.0, weight_std, generator=generator)
            if parameter.dim() >= 2:
                parameter.copy_(noise)
            else:
                parameter.add_(noise)


def save_tiny_model(
    folder: str | Path,
    *,
    seed: int = 0,
    texts: Iterable[str] | None = None,
    tokenizer_vocab_size: int = 512,
    **model_options: Any,
) -> Path:
    """Write a tiny tokenizer and model to ``folder`` (created if needed) as a Hugging Face
    folder and return its path: :func:`make_tiny_tokenizer` of ``texts`` and
    ``tokenizer_vocab_size``, then :func:`make_tiny_model` of that tokenizer, ``seed`` and
    ``model_options`` (sizes, ``vocab_size``, ``weight_std``, ``dtype``, ...). The same
    arguments write the same files."""
    tokenizer = make_tiny_tokenizer(texts, vocab_size=tokenizer_vocab_size)
    model = make_tiny_model(tokenizer, seed=seed, **model_options)
    path = Path(folder)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_tiny_reward_model(
    tokenizer: Any,
    *,
    seed: int = 0,
    num_labels: int = 1,
    weight_std: float | None = 0.15,
    **model_options: Any,
) -> Any:
    """A freshly initialised sequence-classification model
    (``AutoModelForSequenceClassification.from_config``, ``Qwen2ForSequenceClassification`` by
    default): ``num_labels`` scores per text, read at the last token that is not the pad
    token (the model's ``pad_token_id`` is the tokenizer's, so batches may be padded). The
    other arguments are :func:`make_tiny_model`'s; ``weight_std`` defaults to 0.15 so that
    different texts get clearly different scores. The same arguments give the same weights."""
    from transformers import AutoModelForSequenceClassification

    return _build_tiny_model(
        AutoModelForSequenceClassification,
        tokenizer,
        seed=seed,
        weight_std=weight_std,
        num_labels=num_labels,
        **model_options,
    )


def save_tiny_reward_model(
    folder: str | Path,
    *,
    seed: int = 0,
    texts: Iterable[str] | None = None,
    tokenizer_vocab_size: int = 512,
    **model_options: Any,
) -> Path:
    """Write a tiny reward model to ``folder`` (created if needed) as a Hugging Face folder and
    return its path: :func:`make_tiny_tokenizer` of ``texts`` and ``tokenizer_vocab_size``
    (with its ChatML chat template and pad token), then :func:`make_tiny_reward_model` of that
    tokenizer, ``seed`` and ``model_options`` (``num_labels``, sizes, ``weight_std``,
    ``dtype``, ...). The same arguments write the same files; nothing is downloaded."""
    tokenizer = make_tiny_tokenizer(texts, vocab_size=tokenizer_vocab_size)
    model = make_tiny_reward_model(tokenizer, seed=seed, **model_options)
    path = Path(folder)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
