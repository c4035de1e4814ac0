"""Parameter, gradient and optimizer-state memory of the fsdp2 actor: LoRA against training
every weight, from the models' shapes (built on the meta device: nothing is allocated or
downloaded).

The models are the quickstart's (4M parameters, 512-token vocabulary) and one shaped like
Qwen2.5-0.5B. The adapters are put on exactly as the backend puts them
(:func:`plugrl_fsdp2.lora.wrap`). Bytes counted, over all ranks together (FSDP2 divides each
by the rank count):

* weights as the backend holds them: float32 for trained ones (under mixed precision, the
  default with ``model.dtype`` bfloat16, too), ``model.dtype`` for a LoRA actor's frozen base;
* gradients, float32, of the trained parameters only;
* AdamW's two moments, float32, of the trained parameters only;
* the reference model a KL term needs, in ``model.dtype``: built when every weight trains,
  not with LoRA (the actor computes reference log-probs with its adapters off).

    python bench/bench_lora_memory.py [--rank 32] [--alpha 64] [--target-modules all-linear]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

QWEN2_5_0_5B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}
"""The shapes of Qwen2.5-0.5B(-Instruct)'s config.json."""


def quickstart_shapes() -> dict[str, Any]:
    from plugrl_tools.quickstart.model import QUICKSTART_MODEL_SIZES

    return {**QUICKSTART_MODEL_SIZES, "vocab_size": 512}


def meta_model(shapes: dict[str, Any]) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(Qwen2Config(**shapes), dtype=torch.float32)


def counts(shapes: dict[str, Any], lora: dict[str, Any] | None) -> tuple[int, int]:
    """(trained, frozen) parameter counts of the actor; ``lora`` the model keys of LoRA."""
    model = meta_model(shapes)
    if lora is not None:
        from plugrl.recipe import ModelConfig, Recipe
        from plugrl_fsdp2.lora import wrap

        model = wrap(model, Recipe(model=ModelConfig(**lora)), load_adapter=False)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    return trained, frozen


def memory(trained: int, frozen: int, *, reference: int, dtype_bytes: int) -> dict[str, int]:
    """Bytes of each part; ``dtype_bytes`` the size of ``model.dtype``, which frozen weights
    and the reference model are held in."""
    fp32 = 4
    return {
        "weights": trained * fp32 + frozen * dtype_bytes,
        "gradients": trained * fp32,
        "optimizer": 2 * trained * fp32,
        "reference": reference * dtype_bytes,
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:10.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--alpha", type=float, default=64)
    parser.add_argument("--target-modules", default="all-linear")
    args = parser.parse_args()
    lora = {"lora_rank": args.rank, "lora_alpha": args.alpha, "target_modules": args.target_modules}
    models = {"quickstart (4M)": quickstart_shapes(), "Qwen2.5-0.5B shape": QWEN2_5_0_5B}
    for name, shapes in models.items():
        full_trained, _ = counts(shapes, None)
        lora_trained, lora_frozen = counts(shapes, lora)
        # model.dtype: float32 in the quickstart, bfloat16 for the larger model
        dtype_bytes = 4 if name.startswith("quickstart") else 2
        full = memory(full_trained, 0, reference=full_trained, dtype_bytes=dtype_bytes)
        adapted = memory(lora_trained, lora_frozen, reference=0, dtype_bytes=dtype_bytes)
        print(
            f"\n{name}: {full_trained:,} parameters; LoRA rank {args.rank} on "
            f"{args.target_modules}: {lora_trained:,} trained "
            f"({lora_trained / full_trained:.2%})"
        )
        print(f"{'':24}{'full':>14}{'LoRA':>14}{'LoRA / full':>14}")
        for part in ("weights", "gradients", "optimizer", "reference"):
            ratio = adapted[part] / full[part] if full[part] else float("nan")
            print(f"{part:24}{_mib(full[part]):>14}{_mib(adapted[part]):>14}{ratio:14.3f}")
        total_full = sum(full.values()) - full["reference"]
        total_lora = sum(adapted.values()) - adapted["reference"]
        print(
            f"{'weights+grads+optimizer':24}{_mib(total_full):>14}{_mib(total_lora):>14}"
            f"{total_lora / total_full:14.3f}   ({total_full:,} B against {total_lora:,} B)"
        )
        print(
            f"{'... with a KL reference':24}{_mib(sum(full.values())):>14}"
            f"{_mib(sum(adapted.values())):>14}"
            f"{sum(adapted.values()) / sum(full.values()):14.3f}"
        )


if __name__ == "__main__":
    main()
