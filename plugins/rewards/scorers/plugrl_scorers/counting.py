"""The vision quickstart's counting task (data source ``plugrl/counting``).

Scored as the arithmetic quickstart is (:mod:`plugrl_scorers.arithmetic`: the last line that
opens with ``Answer:`` holds the ground-truth integer), and the row's picture file
(``extra_info.image``, relative to its parquet file's folder) is passed on as ``image``, so
that each line of the samples dump names the picture the response is about.
"""

from __future__ import annotations

from typing import Any

from plugrl_scorers.arithmetic import compute_score as score_answer


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, Any]:
    """The arithmetic scorer's ``score``, ``acc`` and ``pred``, and the row's ``image``."""
    result = score_answer(data_source, solution_str, ground_truth, extra_info)
    image = extra_info.get("image") if isinstance(extra_info, dict) else None
    return {**result, "image": None if image is None else str(image)}
