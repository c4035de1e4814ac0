"""The batch a run passes between parts, and the tokenizer and dataset helpers plugins share."""

from plugrl.data.batch import Batch, left_pad, response_attention_mask
from plugrl.data.dataset import PromptLoader, collate, load_tokenizer, truncate
from plugrl.data.hf_loading import quiet_hf_loading
from plugrl.data.rollout_batch import build_rollout_batch

__all__ = [
    "Batch",
    "PromptLoader",
    "build_rollout_batch",
    "collate",
    "left_pad",
    "load_tokenizer",
    "quiet_hf_loading",
    "response_attention_mask",
    "truncate",
]
