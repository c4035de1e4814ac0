"""The process that holds a reward model: the driver (``reward.placement: local``) or a Ray
actor (``ray``). It gets token ids, already templated and truncated, and returns one score per
sequence.

The class is plain and importable: Ray wraps it at run time (``ray.remote(...)(RewardModelRunner)``)
rather than pickling a decorated class by value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PADDING_SIDES = ("right", "left")


class RewardModelRunner:
    """A sequence-classification model in eval mode, without gradients, scoring micro-batches.

    ``device_type`` is the torch device type of the process's device (``"cuda"``, ``"npu"``,
    ``"cpu"``); the model uses its first device, which is the one Ray gave an actor. With
    ``offload`` the weights stay in CPU memory and move to the device only for a call (on a
    CPU device there is nowhere else for them to be, so it changes nothing).
    """

    def __init__(
        self,
        path: str,
        *,
        dtype: str,
        device_type: str,
        pad_token_id: int,
        score_index: int = 0,
        offload: bool = False,
        trust_remote_code: bool = False,
    ) -> None:
        import inspect

        import torch
        from transformers import AutoModelForSequenceClassification

        from plugrl.api.data import quiet_hf_loading

        with quiet_hf_loading():
            model = AutoModelForSequenceClassification.from_pretrained(
                path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
            )
        # the model finds each sequence's last token by the pad id; without one it refuses
        # batches of more than one sequence
        model.config.pad_token_id = pad_token_id
        model.eval()
        model.requires_grad_(False)
        self.model = model
        # decoder models take positions (which left padding needs); encoders have none
        self.takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        self.device = torch.device(device_type, 0) if device_type != "cpu" else torch.device("cpu")
        self.pad_token_id = pad_token_id
        self.score_index = score_index
        self.offload = offload and self.device.type != "cpu"
        if not self.offload:
            self.model.to(self.device)

    def ready(self) -> bool:
        """True once the model is loaded (a Ray actor's constructor has run)."""
        return True

    def score(
        self, micro_batches: Sequence[Sequence[Sequence[int]]], padding_side: str = "right"
    ) -> list[list[float]]:
        """The scores of each micro-batch's sequences (lists of token ids), in order."""
        import torch

        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be right or left, got {padding_side!r}")
        if self.offload:
            self.model.to(self.device)
        try:
            with torch.inference_mode():
                return [self._forward(batch, padding_side) for batch in micro_batches]
        finally:
            if self.offload:
                self.model.to("cpu")
                getattr(torch, self.device.type).empty_cache()

    def _forward(self, sequences: Sequence[Sequence[int]], padding_side: str) -> list[float]:
        import torch

        if not sequences:
            return []
        width = max(len(ids) for ids in sequences)
        input_ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, ids in enumerate(sequences):
            if padding_side == "right":
                input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, : len(ids)] = 1
            else:
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, width - len(ids) :] = 1
        inputs = {
            "input_ids": input_ids.to(self.device),
            "attention_mask": attention_mask.to(self.device),
        }
        if self.takes_positions:
            # positions count real tokens only, so left padding does not shift them
            inputs["position_ids"] = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
            inputs["position_ids"] = inputs["position_ids"].to(self.device)
        output = self.model(**inputs)
        logits: Any = output.logits
        return logits[:, self.score_index].float().cpu().tolist()
