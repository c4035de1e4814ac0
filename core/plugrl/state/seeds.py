"""The seeds of everything a run samples, in one place.

:func:`sampling_seed` is the one place a sampling seed is made: from the run's seed, a named
:class:`Stream` (training rollout, validation, dynamic sampling's later rounds, ...), a position
in it and indices below it; :func:`derive_seed` narrows a seed to a part (a prompt, a sample),
:func:`one_sample_request_seed` undoes one narrowing, :func:`round_seed` picks a training
round's stream and :func:`mini_batch_order_seed` seeds the update's shuffling. Plain integer
arithmetic: importing it imports neither torch nor NumPy, so engines and registration modules
may use it.
"""

from __future__ import annotations

import enum

# Seeds of what a run samples. Every sampling seed of a run is derived here, from the run's
# seed (``trainer.seed``), a named stream, a position in that stream (a step, a sample's
# number) and indices below it (a round, a prompt, a sample, a turn), so a resumed run samples
# exactly what the uninterrupted one did without saving the engines' generators, and two
# purposes never draw the same randomness.

SEED_MODULUS = 2**63 - 1
"""Every derived seed is below this, the largest signed 64-bit integer."""

_MULTIPLIER = 1_000_003
_POSITION_STRIDE = 7919
"""A position of a stream is this many seeds past the one before: streams are numbered below
it, so (position, stream) pairs give distinct seeds."""


class Stream(enum.IntEnum):
    """The named streams of sampling seeds; each purpose draws from its own.

    The numbers are part of what a seed is: changing one changes what a run samples."""

    ROLLOUT = 0
    """A training step's first generation round, by step."""
    VALIDATION = 1
    """Validation, by the step it runs after (0: before training)."""
    SAMPLE_ROLLOUT = 2
    """Training samples generated one prompt at a time (the fully_async rollouter), by the
    sample's number in the run."""
    RESAMPLING = 3
    """A training step's generation rounds after its first (dynamic sampling, a scheduler
    that samples flat groups again), by step, the round's number as the first index."""
    JUDGE = 4
    """Requests to an LLM judge, by a checksum of the judge prompt, the attempt as the first
    index."""


def derive_seed(seed: int, *indices: int) -> int:
    """A seed for one part of a seeded whole (a request of a batch, a sample of a request, a
    turn of a sample), so that each part samples the same whatever else runs beside it.
    ``derive_seed(s, i, j) == derive_seed(derive_seed(s, i), j)``."""
    for index in indices:
        seed = (seed * _MULTIPLIER + _POSITION_STRIDE * (index + 1)) % SEED_MODULUS
    return seed


def sampling_seed(run_seed: int, stream: Stream, position: int, *indices: int) -> int:
    """The seed of ``stream`` at ``position`` (a step, a sample number; see :class:`Stream`),
    narrowed by ``indices`` with :func:`derive_seed`.

    A scheduler's request seed is ``sampling_seed(run_seed, stream, step)``; the engines
    narrow it by prompt, then by sample, so the seed sample ``s`` of prompt ``p`` draws with
    is ``sampling_seed(run_seed, stream, step, p, s)``."""
    if not 0 <= stream < _POSITION_STRIDE:
        raise ValueError(f"stream {stream!r} is not a number in [0, {_POSITION_STRIDE})")
    if position < 0:
        raise ValueError(f"a stream's position is counted from 0, got {position}")
    base = (run_seed * _MULTIPLIER + position * _POSITION_STRIDE + int(stream)) % SEED_MODULUS
    return derive_seed(base, *indices)


def round_seed(run_seed: int, step: int, round_index: int = 0) -> int:
    """The seed of a training step's generation round ``round_index``: the first round on
    :attr:`Stream.ROLLOUT`, every later one on :attr:`Stream.RESAMPLING`, so no round of a step
    draws what validation or another step draws."""
    if round_index < 0:
        raise ValueError(f"generation rounds are counted from 0, got {round_index}")
    if round_index == 0:
        return sampling_seed(run_seed, Stream.ROLLOUT, step)
    return sampling_seed(run_seed, Stream.RESAMPLING, step, round_index)


def one_sample_request_seed(sample_seed: int) -> int:
    """The seed of a one-sample request whose sample draws with ``sample_seed``.

    An engine draws sample ``i`` of a request seeded ``r`` with ``derive_seed(r, i)``; this
    inverts that for ``i = 0``, so one sample sent alone (an agent's turn) draws what it would
    have drawn as sample ``s`` of a batched request (``sample_seed = derive_seed(r, s)``)."""
    inverse = pow(_MULTIPLIER, -1, SEED_MODULUS)
    return ((sample_seed - _POSITION_STRIDE) * inverse) % SEED_MODULUS


def mini_batch_order_seed(run_seed: int, update_step: int, epoch: int) -> int:
    """The seed of the order a training update visits its batch's rows in epoch ``epoch``
    (``actor.shuffle``): a generator of its own, so it shares nothing with sampling."""
    return run_seed + _MULTIPLIER * update_step + epoch
