"""A test-local judge: a rollout engine plugin that answers "Rating: [[N]]" by what the
response says, so parsing, normalisation, retries and failures are checked exactly; and a
score parser with options."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import attrs

import plugrl
from plugrl.config import option
from plugrl.parts.rollout import Completion, GenerationRequest, RolloutConfig, RolloutEngine

RATINGS = {"good": 8, "bad": 2, "fine": 5}
"""A response holding one of these words is rated so."""


@attrs.define(kw_only=True)
class ScriptedJudgeConfig(RolloutConfig):
    """The scripted engine's own rollout key."""

    prefix: str = option("", "Text written before the rating.")


class ScriptedJudge(RolloutEngine):
    """Rates by keyword. ``mumble``: an unreadable answer when greedy, a rating of 5 when
    sampled (a retry); ``never``: always unreadable; ``explode``: the request fails."""

    requests: ClassVar[list[tuple[str, Any, Any]]] = []
    """(prompt text, sampling parameters, engine config) of every request, in order."""

    async def generate_request(self, request: GenerationRequest) -> list[Completion]:
        tokenizer = self.context.tokenizer
        prompt = tokenizer.decode(list(request.prompt_ids), skip_special_tokens=True)
        ScriptedJudge.requests.append((prompt, request.params, self.config))
        response = prompt.split("A:", 1)[1] if "A:" in prompt else prompt
        if "explode" in response:
            raise RuntimeError("the judge ran out of memory")
        rating = next((n for word, n in RATINGS.items() if word in response), None)
        if "never" in response or ("mumble" in response and request.params.temperature == 0):
            text = "hmm, hard to say"
        else:
            text = f"{self.config.prefix}Rating: [[{rating if rating is not None else 5}]]"
        ids = tokenizer.encode(text, add_special_tokens=False)
        return [
            Completion(
                token_ids=ids,
                log_probs=[0.0] * len(ids),
                finish_reason="stop",
                request_id=request.request_id,
            )
        ]


@attrs.define(kw_only=True)
class ScaledArgs:
    factor: float = option(1.0, "Multiplies the number found.")


def scaled(text: str, factor: float) -> float | None:
    found = re.findall(r"\d+", text)
    return float(found[-1]) * factor if found else None


@plugrl.hookimpl
def register_rollout_engines(register):
    register("scripted_judge", ScriptedJudge, config=ScriptedJudgeConfig)


@plugrl.hookimpl
def register_judge_parsers(register):
    register("scaled", scaled, config=ScaledArgs)
