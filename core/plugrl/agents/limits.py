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
_CLONE_NEWPID = 0x20000000


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


def user_tasks(uid: int | None = None) -> int:
    """The processes and threads the user ``uid`` (default: this process's) runs now, as
    RLIMIT_NPROC counts them (Linux; 0 elsewhere)."""
    uid, count = (os.getuid() if uid is None else uid), 0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
    return count


def isolate(network: bool, pids: bool, switch_user: bool) -> tuple[str, str]:
    """Move this process into new namespaces: a network namespace (no interface but a loopback
    that is down) when ``network``, a PID namespace when ``pids`` (the next child started is
    its init; when that init ends, the kernel kills every process in it). Returns what became
    of each, ``"isolated"`` or ``"not isolated: <why>"``; the network's says ``isolated, user
    namespace`` when a user namespace of its own was taken.

    An unprivileged user takes a user namespace first, where it may make the others; root
    makes them directly when ``switch_user`` (a user namespace that maps root alone would leave
    no other user to switch to), and first the user namespace otherwise, as where user
    namespaces are refused (some containers) root makes the others alone."""
    if not network and not pids:
        return "not asked", "not asked"
    if not sys.platform.startswith("linux"):
        return (
            f"not isolated: no network namespaces on {sys.platform}" if network else "not asked",
            f"not isolated: no PID namespaces on {sys.platform}" if pids else "not asked",
        )
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:
        return (f"not isolated: {exc}" if network else "not asked"), (
            f"not isolated: {exc}" if pids else "not asked"
        )
    uid, gid = os.getuid(), os.getgid()
    wanted = (_CLONE_NEWNET if network else 0) | (_CLONE_NEWPID if pids else 0)
    # the fullest set first; then the network alone, then the PIDs alone
    tries = [wanted]
    if network and pids:
        tries += [_CLONE_NEWNET, _CLONE_NEWPID]
    refusal = ""
    for flags in tries:
        with_user = not (switch_user and uid == 0)
        if with_user and libc.unshare(_CLONE_NEWUSER | flags) == 0:
            # keep the same ids inside, so files keep their owner
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{uid} {uid} 1"),
                ("gid_map", f"{gid} {gid} 1"),
            ):
                with contextlib.suppress(OSError), open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
            took = "isolated, user namespace"
        elif libc.unshare(flags) == 0:
            took = "isolated"
        else:
            refusal = f"not isolated: unshare refused ({os.strerror(ctypes.get_errno())})"
            continue
        return (
            (took if flags & _CLONE_NEWNET else refusal) if network else "not asked",
            ("isolated" if flags & _CLONE_NEWPID else refusal) if pids else "not asked",
        )
    return (refusal if network else "not asked"), (refusal if pids else "not asked")


def isolate_network() -> str:
    """Move this process into a new, empty network namespace; ``"isolated"`` (``"isolated,
    user namespace"`` when it took a user namespace of its own), or ``"not isolated: <why>"``
    where the kernel refuses."""
    return isolate(network=True, pids=False, switch_user=False)[0]


def pids_cgroup_parent() -> str | None:
    """The folder of this process's cgroup in a hierarchy with the ``pids`` controller (cgroup
    v1's ``pids``, or v2 where ``pids`` is enabled below it), when this process may make a
    cgroup there (root, or a delegated cgroup); ``None`` where there is none."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        folder: str | None = None
        if controllers == "":  # the v2 hierarchy
            for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                if os.path.exists(f"{base}/cgroup.controllers"):
                    candidate = f"{base}{path.rstrip('/')}"
                    with (
                        contextlib.suppress(OSError),
                        open(f"{candidate}/cgroup.subtree_control", encoding="utf-8") as f,
                    ):
                        if "pids" in f.read().split():
                            folder = candidate
                    break
        elif "pids" in controllers.split(","):
            folder = f"/sys/fs/cgroup/{controllers}{path.rstrip('/')}"
        if folder and os.access(folder, os.W_OK | os.X_OK):
            return folder
    return None


def join_pids_cgroup(max_processes: int) -> str:
    """Make a cgroup of its own for this process (and all it will start) that holds at most
    ``max_processes`` more processes and threads, and move into it: the cap holds for root
    too, unlike RLIMIT_NPROC. Returns the cgroup's folder, or ``"not capped: <why>"``."""
    parent = pids_cgroup_parent()
    if parent is None:
        return "not capped: no writable cgroup with the pids controller"
    # the process ids inside a PID namespace repeat: a random name
    folder = f"{parent}/plugrl-{os.urandom(6).hex()}"
    try:
        os.mkdir(folder)
        with open(f"{folder}/pids.max", "w") as f:
            f.write(str(max_processes + 1))  # this process counts
        with open(f"{folder}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.rmdir(folder)
        return f"not capped: {exc.strerror or exc}"
    return folder


def _become_namespace_init(keep_fd: int) -> None:
    """In a new PID namespace (made by :func:`isolate`), start its init and, from the init,
    the process that returns from here to run the program. This process waits outside and
    ends as the program ended; the init reaps what the program leaves and ends when the
    program does, and then the kernel kills every process left in the namespace, those that
    left the process group (``setsid``) too. ``keep_fd`` stays open in the program only."""
    import signal

    report_read, report_write = os.pipe()
    init = os.fork()
    if init:  # outside: the process the caller started and waits for
        os.close(report_write)
        os.close(keep_fd)
        _, status = os.waitpid(init, 0)
        report = os.read(report_read, 32)
        _end_as(int(report) if report.strip() else status)
    os.close(report_read)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher
    program = os.fork()
    if program == 0:
        os.close(report_write)
        return
    os.close(keep_fd)
    while True:  # the init reaps every orphan until the program itself ends
        pid, status = os.waitpid(-1, 0)
        if pid == program:
            break
    os.write(report_write, str(status).encode())
    os._exit(0)


def _end_as(status: int) -> None:
    """End this process as a process with wait status ``status`` ended."""
    import resource
    import signal

    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        with contextlib.suppress(Exception):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of its own
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def user_ids(name: str) -> tuple[int, int] | None:
    """The user and group ids of the user ``name`` (or a number), or ``None`` if unknown."""
    if name.isdigit():
        return int(name), int(name)
    try:
        with open("/etc/passwd", encoding="utf-8") as f:
            for line in f:
                fields = line.split(":")
                if len(fields) > 3 and fields[0] == name:
                    return int(fields[2]), int(fields[3])
    except (OSError, ValueError):
        pass
    return None


def _closed_to_others(path: str) -> str | None:
    """The first folder on ``path`` (resolved) that a user other than its owner cannot pass,
    or the file itself when others cannot read and run it; ``None`` when all can."""
    import stat

    parts = os.path.realpath(path).split("/")
    for end in range(2, len(parts) + 1):
        current = "/".join(parts[:end])
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return current
        wanted = stat.S_IXOTH | (stat.S_IROTH if end == len(parts) else 0)
        if mode & wanted != wanted:
            return current
    return None


def switch_user(name: str, programs: list[str]) -> str:
    """Root only: give the working folder to the user ``name`` and become that user, so
    RLIMIT_NPROC applies and the trainer's private files are out of reach. Returns
    ``"switched to <name>"`` or ``"not switched: <why>"`` (then this process stays root)."""
    ids = user_ids(name)
    if ids is None:
        return f"not switched: no user {name!r} in /etc/passwd"
    for program in programs:
        closed = _closed_to_others(program)
        if closed is not None:
            return f"not switched: {closed} is closed to other users, so {name} cannot run Python"
    uid, gid = ids
    try:
        os.chown(os.getcwd(), uid, gid)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    except OSError as exc:
        return f"not switched: {exc.strerror or exc}"
    return f"switched to {name}"


def launch(argv: list[str]) -> None:
    """The launcher: ``argv`` is ``[OPTIONS_JSON, STATUS_FD, PROGRAM, ARGS...]``, the JSON
    holding :class:`ResourceLimits`' fields and ``isolate_network``, ``isolate_processes``
    (true or false) and ``run_as`` (a user name, used when root; or null). It writes a JSON
    report to ``STATUS_FD``: ``network``, ``processes`` (the PID namespace), ``cgroup`` (its
    folder or ``not capped: ...``) and ``user``."""
    options, status_fd = json.loads(argv[0]), int(argv[1])
    network_asked = options.pop("isolate_network", False)
    pids_asked = options.pop("isolate_processes", False)
    run_as = options.pop("run_as", None)
    switching = bool(run_as) and os.geteuid() == 0
    ids = user_ids(run_as) if switching else None
    # counted before a user namespace, where the other processes' owners are unmapped
    # (the user switched to counts this process too, once it has switched)
    running = user_tasks(ids[0]) + 1 if ids else user_tasks()
    network, processes = isolate(network_asked, pids_asked, switching)
    if network == "isolated, user namespace" and _kernel_at_least(5, 14):
        running = 1  # the namespace counts its own processes, this one so far
    if processes == "isolated":
        _become_namespace_init(status_fd)
    cgroup = "not asked"
    if options.get("max_processes") is not None and os.geteuid() == 0:
        cgroup = join_pids_cgroup(options["max_processes"])
    user = switch_user(run_as, [argv[2], sys.executable]) if switching else "not asked"
    if user.startswith("not switched") and ids is not None:
        running = user_tasks()
    ResourceLimits(**options).apply(running)
    report = {
        "network": network.removesuffix(", user namespace"),
        "processes": processes,
        "cgroup": cgroup,
        "user": user,
    }
    os.write(status_fd, json.dumps(report).encode())
    os.close(status_fd)
    os.execv(argv[2], argv[2:])


def probe(run_as: str = "nobody") -> dict[str, str]:
    """What the launcher gets on this machine, as the ``python`` tool would start it (all
    mechanisms asked, ``max_processes`` 16): its report, ``network``, ``processes``,
    ``cgroup`` and ``user``, from one launch of a program that does nothing."""
    import subprocess
    import tempfile

    options = {
        "max_processes": 16,
        "isolate_network": True,
        "isolate_processes": True,
        "run_as": run_as or None,
    }
    status_read, status_write = os.pipe()
    launcher = [sys.executable, "-I", "-S", __file__, json.dumps(options), str(status_write)]
    with tempfile.TemporaryDirectory(prefix="plugrl-probe-") as folder:
        try:
            subprocess.run(
                [*launcher, sys.executable, "-I", "-S", "-c", "pass"],
                pass_fds=(status_write,),
                cwd=folder,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=60,
                check=False,
            )
        finally:
            os.close(status_write)
        with os.fdopen(status_read, "rb") as status:
            text = status.read().decode(errors="replace")
    try:
        report = {str(k): str(v) for k, v in json.loads(text or "{}").items()}
    except ValueError:
        report = {}
    cgroup = report.get("cgroup", "")
    if cgroup.startswith("/"):
        with contextlib.suppress(OSError):
            os.rmdir(cgroup)
        report["cgroup"] = "capped"
    return report


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        found = tuple(int(part) for part in os.uname().release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


if __name__ == "__main__":
    launch(sys.argv[1:])
