"""``single_turn``: one response to the row's prompt, as a run without agents samples it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugrl.api.agents import AgentLoop, Session, Trajectory
from plugrl.api.data import MULTIMODAL_COLUMN
from plugrl_agent_loops.tool import image_arguments


class SingleTurnLoop(AgentLoop):
    """The row's ``raw_prompt_ids`` (with its images, for a vision-language model) and one
    sampled response of up to ``data.max_response_length`` tokens."""

    async def run(self, row: Mapping[str, Any], session: Session) -> Trajectory:
        prompt_ids = list(row["raw_prompt_ids"])
        images = row.get(MULTIMODAL_COLUMN)
        start = Trajectory(prompt_ids=prompt_ids, image_inputs=[] if images is None else [images])
        completion = await session.generate(
            prompt_ids, session.max_response_length, **image_arguments(start)
        )
        return Trajectory(
            prompt_ids=prompt_ids,
            response_ids=list(completion.token_ids),
            loss_mask=[1] * len(completion.token_ids),
            log_probs=list(completion.log_probs),
            token_versions=list(completion.token_versions),
            finish_reason=completion.finish_reason,
            weight_version=completion.weight_version,
            turn_ends=[len(completion.token_ids) - 1] if completion.token_ids else [],
            num_turns=1,
            image_inputs=start.image_inputs,
        )
