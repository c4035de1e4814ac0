"""Worker processes and event-loop threads: what the reward workers and the tool processes
are built from, for a plugin that runs work of its own in a process a timeout can kill, or
serves coroutines to other threads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.agents.processes import run_in_process
    from plugrl.loop_thread import EventLoopThread
    from plugrl.worker_processes import (
        REAP_TIMEOUT_S,
        descendants,
        die_with_parent,
        encode_message,
        kill_and_reap,
        kill_process_group,
        receive_message,
        receive_message_async,
        send_message,
        serve_worker,
        spawn_worker_process,
        worker_code,
    )

__all__ = [
    "REAP_TIMEOUT_S",
    "EventLoopThread",
    "descendants",
    "die_with_parent",
    "encode_message",
    "kill_and_reap",
    "kill_process_group",
    "receive_message",
    "receive_message_async",
    "run_in_process",
    "send_message",
    "serve_worker",
    "spawn_worker_process",
    "worker_code",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "REAP_TIMEOUT_S": ("plugrl.worker_processes", "REAP_TIMEOUT_S"),
        "EventLoopThread": ("plugrl.loop_thread", "EventLoopThread"),
        "descendants": ("plugrl.worker_processes", "descendants"),
        "die_with_parent": ("plugrl.worker_processes", "die_with_parent"),
        "encode_message": ("plugrl.worker_processes", "encode_message"),
        "kill_and_reap": ("plugrl.worker_processes", "kill_and_reap"),
        "kill_process_group": ("plugrl.worker_processes", "kill_process_group"),
        "receive_message": ("plugrl.worker_processes", "receive_message"),
        "receive_message_async": ("plugrl.worker_processes", "receive_message_async"),
        "run_in_process": ("plugrl.agents.processes", "run_in_process"),
        "send_message": ("plugrl.worker_processes", "send_message"),
        "serve_worker": ("plugrl.worker_processes", "serve_worker"),
        "spawn_worker_process": ("plugrl.worker_processes", "spawn_worker_process"),
        "worker_code": ("plugrl.worker_processes", "worker_code"),
    },
)
