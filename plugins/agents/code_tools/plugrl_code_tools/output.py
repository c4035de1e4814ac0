"""What the model reads of a run of its code: the output, cut to a length, and how it ended."""

from __future__ import annotations


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters and marked as cut; whether it was cut."""
    if len(text) <= limit:
        return text, False
    return f"{text[:limit]}\n[output cut to its first {limit} characters]", True


def describe_run(stdout: str, stderr: str, ending: str | None) -> str:
    """The result text: the standard output, the standard error after it, and a last line
    saying how the run ended when it did not end well (``ending``)."""
    parts = [part.rstrip("\n") for part in (stdout, stderr) if part]
    if ending:
        parts.append(f"[{ending}]")
    return "\n".join(parts) if parts else "[no output]"
