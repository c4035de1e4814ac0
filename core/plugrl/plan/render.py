"""A plan for people (a table per device kind and phase) and for scripts (JSON)."""

from __future__ import annotations

import json

from plugrl.plan.terms import GIB, Plan

PHASE_TITLES = {"generate": "generate", "log_prob": "log-prob", "update": "update"}


def gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def verdict(plan: Plan) -> str:
    """One line: fits, or which phase lacks how much, or no device memory to judge by."""
    worst = plan.worst()
    if worst is None:
        return "nothing estimated"
    if plan.device_memory is None:
        return (
            f"peak {gib(worst.peak)} ({worst.devices} devices, {PHASE_TITLES[worst.phase]}); "
            "no device memory to judge by: give --device-memory 80GiB"
        )
    if plan.fits:
        return (
            f"fits: peak {gib(worst.peak)} of {gib(plan.device_memory)} "
            f"({worst.devices} devices, {PHASE_TITLES[worst.phase]}), "
            f"{gib(worst.margin or 0)} left"
        )
    largest = worst.largest_term()
    term = f"; largest term: {largest.role} {largest.name} {gib(largest.bytes)}" if largest else ""
    return (
        f"does not fit: {worst.devices} devices, {PHASE_TITLES[worst.phase]} phase needs "
        f"{gib(worst.peak)} of {gib(plan.device_memory)}, {gib(-(worst.margin or 0))} over{term}"
    )


def render_table(plan: Plan) -> str:
    """The plan as text: per device kind, per phase, each term with its size, then the
    verdict, the unestimated roles and the suggestions."""
    lines = [f"model {plan.model}: {plan.parameters / 1e9:.2f}B parameters"]
    if plan.device_memory is not None:
        lines[0] += f"; device memory {gib(plan.device_memory)}"
    name_width = max([len(f"{t.role} {t.name}") for p in plan.phases for t in p.terms] + [20])
    for estimate in plan.phases:
        if not estimate.terms:
            continue
        status = ""
        if estimate.fits is not None:
            status = "  fits" if estimate.fits else f"  DOES NOT FIT ({gib(-estimate.margin)} over)"
        instant = f", worst instant: {estimate.worst_instant}" if estimate.worst_instant else ""
        lines.append("")
        lines.append(
            f"[{estimate.devices} devices] {PHASE_TITLES[estimate.phase]}: peak "
            f"{gib(estimate.peak)}{instant}{status}"
        )
        for term in estimate.terms:
            label = f"{term.role} {term.name}"
            when = f" [{term.instant}]" if term.instant else ""
            lines.append(f"  {label:<{name_width}} {gib(term.bytes):>12}  {term.note}{when}")
    if plan.unestimated:
        lines.append("")
        for missing in plan.unestimated:
            lines.append(
                f"unestimated: {missing.role} ({missing.plugin} reports no memory terms; "
                f"on the {missing.devices} devices, not counted above)"
            )
    lines.append("")
    lines.append(verdict(plan))
    if plan.suggestions:
        lines.append("changes that fit, each alone:")
        for suggestion in plan.suggestions:
            lines.append(
                f"  {suggestion.override:<45} peak {gib(suggestion.peak)}  ({suggestion.reason})"
            )
    for note in plan.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def render_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=1)
