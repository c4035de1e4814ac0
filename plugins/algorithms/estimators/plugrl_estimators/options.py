"""Config classes of the estimators that take options, read from
``algorithm.adv_estimator_args``.

Kept apart from the implementations so that validating a recipe or ``plugrl explain`` does not
import torch.
"""

from __future__ import annotations

import attrs

from plugrl.api import option


@attrs.define(kw_only=True)
class GAEArgs:
    """``algorithm.adv_estimator_args`` of ``gae``."""

    whiten: bool = option(
        True,
        "Whiten the advantages over the batch's response tokens (zero mean, unit variance).",
    )
