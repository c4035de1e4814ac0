"""Worker processes and event-loop threads: what the reward workers and the tool processes
are built from, for a plugin that runs work of its own in a process a timeout can kill, or
serves coroutines to other threads."""

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
