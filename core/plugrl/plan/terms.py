"""The memory plan's data: a term, a phase's estimate on one device, the whole plan.

A run's device memory is estimated per **phase**: ``generate`` (the engines sample, weights
reach them first), ``log_prob`` (old and reference log-probs, no gradient) and ``update``
(forward, backward, optimizer step). A colocated engine sleeps while the trainer runs and the
trainer's transient buffers are gone while the engine runs, so phases are never added up: the
peak of a device is the largest phase. A phase is its **persistent** terms (held through the
whole phase) plus its **worst instant**: the terms of one instant (``instant`` set: the
backward, the optimizer step, the weight push) are added together, and the largest instant
counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

PHASES: tuple[str, ...] = ("generate", "log_prob", "update")
"""The phases of a step, in order."""

ROLES: tuple[str, ...] = ("actor", "ref", "critic", "rollout", "reward_model", "judge")
"""The roles a plugin may be asked to estimate (see the ``estimate_memory`` hook)."""

GIB = 1024**3
MIB = 1024**2

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


_UNITS = {
    "": GIB,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": MIB,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": GIB,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_memory(text: str) -> int:
    """Bytes from a size like ``80GiB``, ``80GB``, ``141 GB`` or ``80`` (GiB)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a memory size; write it like 80GiB, 80GB or 80 (GiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (``bfloat16`` -> 2)."""
    return DTYPE_BYTES[dtype]


def _phases(value: str | Iterable[str]) -> tuple[str, ...]:
    phases = (value,) if isinstance(value, str) else tuple(value)
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise ValueError(f"unknown phase {unknown[0]!r}; phases are {', '.join(PHASES)}")
    return phases


@attrs.frozen
class MemoryTerm:
    """One buffer (or a set of alike buffers) on one device of a role.

    ``bytes`` is per device. ``phases`` are those it occupies the device in. ``instant`` is
    None for memory held through each of those phases; a name (``backward``, ``optimizer
    step``, ``weight push``) for memory held only at that moment of the phase: terms of the
    same instant add up, and a phase counts its largest instant. ``caveat``, when set, says
    why this buffer may be larger than the same step needs elsewhere (another framework's
    fused kernel, say); the plan says it beside its verdict when the term is part of a peak
    that does not fit, so a plan never silently disagrees with a run that fits there.
    """

    name: str
    bytes: int
    phases: tuple[str, ...] = attrs.field(converter=_phases)
    role: str
    note: str = ""
    instant: str | None = None
    caveat: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bytes": self.bytes,
            "gib": round(self.bytes / GIB, 3),
            "phases": list(self.phases),
            "role": self.role,
            "instant": self.instant,
            "note": self.note,
            "caveat": self.caveat,
        }


@attrs.frozen
class PhaseEstimate:
    """One phase on one kind of device: its terms, its peak, and the verdict."""

    devices: str
    """Which devices: ``trainer`` (the training ranks, and the engines when colocated),
    ``rollout`` (engines on devices of their own), ``reward_model``."""
    phase: str
    persistent: tuple[MemoryTerm, ...]
    instants: dict[str, tuple[MemoryTerm, ...]]
    device_memory: int | None

    @property
    def worst_instant(self) -> str | None:
        if not self.instants:
            return None
        return max(self.instants, key=lambda name: sum(t.bytes for t in self.instants[name]))

    @property
    def peak(self) -> int:
        held = sum(t.bytes for t in self.persistent)
        worst = self.worst_instant
        return held + (sum(t.bytes for t in self.instants[worst]) if worst else 0)

    @property
    def terms(self) -> tuple[MemoryTerm, ...]:
        """The terms that make the peak: the persistent ones and the worst instant's."""
        worst = self.worst_instant
        return self.persistent + (self.instants[worst] if worst else ())

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits the device; None when the device's memory is not known."""
        return None if self.device_memory is None else self.peak <= self.device_memory

    @property
    def margin(self) -> int | None:
        """Device memory left at the peak (negative: how much is missing)."""
        return None if self.device_memory is None else self.device_memory - self.peak

    def largest_term(self) -> MemoryTerm | None:
        return max(self.terms, key=lambda t: t.bytes, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "phase": self.phase,
            "peak_bytes": self.peak,
            "peak_gib": round(self.peak / GIB, 3),
            "worst_instant": self.worst_instant,
            "fits": self.fits,
            "margin_bytes": self.margin,
            "persistent": [t.to_dict() for t in self.persistent],
            "instants": {k: [t.to_dict() for t in v] for k, v in self.instants.items()},
        }


@attrs.frozen
class Unestimated:
    """A role whose plugin reported no terms: listed, never guessed."""

    role: str
    plugin: str
    devices: str

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "plugin": self.plugin, "devices": self.devices}


@attrs.frozen
class Suggestion:
    """A change that makes every phase fit: the recipe override and the peak it gives."""

    override: str
    peak: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        peak = round(self.peak / GIB, 3)
        return {"override": self.override, "peak_gib": peak, "why": self.reason}


@attrs.frozen
class Plan:
    """The estimate of a recipe: every phase on every kind of device, and what was not
    estimated."""

    model: str
    parameters: int
    phases: tuple[PhaseEstimate, ...]
    unestimated: tuple[Unestimated, ...] = ()
    device_memory: int | None = None
    notes: tuple[str, ...] = ()
    suggestions: tuple[Suggestion, ...] = ()

    @property
    def fits(self) -> bool | None:
        """True when every phase fits; None when the device memory is not known."""
        verdicts = [p.fits for p in self.phases]
        if any(v is None for v in verdicts):
            return None
        return all(verdicts)

    def worst(self) -> PhaseEstimate | None:
        """The phase with the least memory left (the largest peak when memory is unknown)."""
        if not self.phases:
            return None
        return max(self.phases, key=lambda p: p.peak - (p.device_memory or 0))

    def phase(self, devices: str, phase: str) -> PhaseEstimate:
        for estimate in self.phases:
            if estimate.devices == devices and estimate.phase == phase:
                return estimate
        raise KeyError(f"{devices}/{phase}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "parameters": self.parameters,
            "device_memory_bytes": self.device_memory,
            "fits": self.fits,
            "phases": [p.to_dict() for p in self.phases],
            "unestimated": [u.to_dict() for u in self.unestimated],
            "suggestions": [s.to_dict() for s in self.suggestions],
            "notes": list(self.notes),
        }


def phase_estimates(
    terms_by_devices: dict[str, Sequence[MemoryTerm]], device_memory: int | None
) -> tuple[PhaseEstimate, ...]:
    """Group terms into one :class:`PhaseEstimate` per device kind and phase."""
    estimates = []
    for devices, terms in terms_by_devices.items():
        for phase in PHASES:
            present = [t for t in terms if phase in t.phases and t.bytes > 0]
            persistent = tuple(t for t in present if t.instant is None)
            instants: dict[str, list[MemoryTerm]] = {}
            for term in present:
                if term.instant is not None:
                    instants.setdefault(term.instant, []).append(term)
            estimates.append(
                PhaseEstimate(
                    devices=devices,
                    phase=phase,
                    persistent=persistent,
                    instants={k: tuple(v) for k, v in instants.items()},
                    device_memory=device_memory,
                )
            )
    return tuple(estimates)
