"""Kernel limits on a process, and a launcher that applies them before it runs a program.

This module imports nothing but the standard library, so that it also runs as a script with
``python -I -S``: a program started through it (``python -I -S limits.py LIMITS STATUS_FD
PROGRAM ARGS...``) pays for no import of plugrl. The launcher moves into a new network
namespace when asked (Linux: an unprivileged user namespace grants the right to make one),
applies the limits, writes what became of the network to ``STATUS_FD`` (``isolated`` or
``not isolated: <why>``), and replaces itself with the program.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResourceLimits:
    """Kernel limits (``setrlimit``) on a process and the processes it starts; ``None``
    leaves a limit as it is. Limits the platform lacks are skipped."""

    cpu_s: int | None = None
    """CPU seconds (RLIMIT_CPU): then the kernel kills the process (SIGXCPU, then SIGKILL)."""
    memory_mb: int | None = None
    """Address space in MiB (RLIMIT_AS): allocations beyond it fail (``MemoryError``)."""
    file_size_mb: int | None = None
    """Largest file the process may write, in MiB (RLIMIT_FSIZE; beyond it, SIGXFSZ)."""
    max_processes: int | None = None
    """Processes and threads the process may start (RLIMIT_NPROC). The kernel counts every
    process of the user, so the limit is set to the user's count now plus this (in a user
    namespace of its own, on Linux 5.14 and later, the count starts afresh); the kernel does
    not apply it to root."""

    def apply(self, running: int | None = None) -> None:
        """Set the limits on this process; ``running`` is the count RLIMIT_NPROC starts from
        (default: :func:`user_tasks`)."""
        import resource

        mib = 1024 * 1024
        wanted = [
            ("RLIMIT_CPU", self.cpu_s),
            ("RLIMIT_AS", self.memory_mb * mib if self.memory_mb is not None else None),
            ("RLIMIT_FSIZE", self.file_size_mb * mib if self.file_size_mb is not None else None),
            (
                "RLIMIT_NPROC",
                (user_tasks() if running is None else running) + self.max_processes
                if self.max_processes is not None
                else None,
            ),
        ]
        for name, value in wanted:
            limit = getattr(resource, name, None)
            if value is None or limit is None:
                continue
            _, hard = resource.getrlimit(limit)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(limit, (value, value))


def user_tasks() -> int:
    """The processes and threads this user runs now, as RLIMIT_NPROC counts them (Linux; 0
    elsewhere)."""
    uid, count = os.getuid(), 0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
    return count


def isolate_network() -> str:
    """Move this process into a new, empty network namespace (no interface but a loopback
    that is down); ``"isolated"`` (``"isolated, user namespace"`` when it took a user
    namespace of its own), or ``"not isolated: <why>"`` where the kernel refuses."""
    if not sys.platform.startswith("linux"):
        return f"not isolated: no network namespaces on {sys.platform}"
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:
        return f"not isolated: {exc}"
    uid, gid = os.getuid(), os.getgid()
    # a user namespace first, where an unprivileged user may make a network namespace; then,
    # where user namespaces are refused (some containers), a network namespace alone (root)
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
        # keep the same ids inside, so files keep their owner
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with contextlib.suppress(OSError), open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        return "isolated, user namespace"
    if libc.unshare(_CLONE_NEWNET) == 0:
        return "isolated"
    return f"not isolated: unshare refused ({os.strerror(ctypes.get_errno())})"


def launch(argv: list[str]) -> None:
    """The launcher: ``argv`` is ``[LIMITS_JSON, STATUS_FD, PROGRAM, ARGS...]``, the JSON
    holding :class:`ResourceLimits`' fields and ``isolate_network`` (true or false)."""
    options, status_fd = json.loads(argv[0]), int(argv[1])
    # counted before a user namespace, where the other processes' owners are unmapped
    running = user_tasks()
    network = isolate_network() if options.pop("isolate_network", False) else "not asked"
    if network == "isolated, user namespace" and _kernel_at_least(5, 14):
        running = 1  # the namespace counts its own processes, this one so far
        network = "isolated"
    ResourceLimits(**options).apply(running)
    os.write(status_fd, network.removesuffix(", user namespace").encode())
    os.close(status_fd)
    os.execv(argv[2], argv[2:])


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        found = tuple(int(part) for part in os.uname().release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


if __name__ == "__main__":
    launch(sys.argv[1:])
