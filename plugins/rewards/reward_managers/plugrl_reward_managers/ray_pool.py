"""Scoring on Ray actors, for ``reward.manager: parallel`` with ``backend: ray``.

Same contract as :class:`~plugrl.rewards.workers.ProcessPool`: each call has its own
deadline; an actor whose call runs past it is killed (Ray ends its process) and replaced. Calls
go to idle actors only, so a call's clock starts when it is sent. The pool grows as a process
pool does, while the calls wait rather than compute (:class:`~plugrl.rewards.workers.PoolSizing`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from plugrl.api import PluginError
from plugrl.api.rewards import LOAD_TIMEOUT_S, Call, Outcome, check_pool_size, run_call


class ScoringActor:
    """The actor's class; wrapped with ``ray.remote`` at run time (see PLATFORM notes on
    pickling decorated classes)."""

    def prepare(self, scorer: Any) -> bool:
        scorer.prepare()
        return True

    def run(self, call: Call) -> Outcome:
        return run_call(call)


class RayPool:
    """``num_workers`` Ray actors (up to ``max_workers`` while the calls wait rather than
    compute) that run scoring calls under per-call deadlines."""

    def __init__(self, num_workers: int, max_workers: int | None = None) -> None:
        from plugrl.api.cluster import import_ray, init_ray

        self.sizing = check_pool_size(num_workers, max_workers)
        self.ray = ray = import_ray("reward.backend=ray")
        if not ray.is_initialized():
            init_ray(include_dashboard=False, log_to_driver=True)
        # no CPU reservation: reward actors must not wait behind the training actors that
        # hold the cluster's CPUs; their work is short and the OS shares the cores
        self.actor_class = ray.remote(num_cpus=0, max_restarts=0)(ScoringActor)
        self.num_workers = num_workers
        self.actors: list[Any] = []
        self.prepared: dict[int, set[str]] = {}
        self.killed = 0
        self.started = 0  # actors started, over the pool's life

    @property
    def target_workers(self) -> int:
        """The actors the pool runs now: ``num_workers``, or more for calls that wait."""
        return self.sizing.target()

    def _new_actor(self) -> Any:
        actor = self.actor_class.remote()
        self.actors.append(actor)
        self.started += 1
        self.prepared[id(actor)] = set()
        return actor

    def _kill(self, actor: Any) -> None:
        self.actors.remove(actor)
        self.prepared.pop(id(actor), None)
        self.ray.kill(actor, no_restart=True)

    def _prepare(self, actor: Any, scorer: Any) -> None:
        key = scorer.label
        if key in self.prepared[id(actor)]:
            return
        try:
            self.ray.get(actor.prepare.remote(scorer), timeout=LOAD_TIMEOUT_S)
        except Exception as exc:
            raise PluginError(
                f"a Ray scoring actor could not load {scorer.label}: {type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
            ) from None
        self.prepared[id(actor)].add(key)

    def run(self, tasks: Sequence[Sequence[Call]]) -> list[list[Outcome]]:
        outcomes: list[list[Outcome | None]] = [[None] * len(task) for task in tasks]
        queue = deque((t, p) for t, task in enumerate(tasks) for p in range(len(task)))
        running: dict[Any, tuple[Any, tuple[int, int], float]] = {}  # ref -> actor, key, deadline
        self.sizing.next_batch()
        for extra in self.actors[self.sizing.target() :]:
            self._kill(extra)  # the calls got busier than when it started
        idle = [a for a in self.actors]
        while queue or running:
            while queue and (idle or len(self.actors) < self.sizing.target()):
                actor = idle.pop() if idle else self._new_actor()
                task, position = queue.popleft()
                call = tasks[task][position]
                self._prepare(actor, call.scorer)
                ref = actor.run.remote(call)
                running[ref] = (actor, (task, position), time.monotonic() + call.timeout_s)
            deadline = min(d for _, _, d in running.values())
            ready, _ = self.ray.wait(
                list(running), num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            for ref in ready:
                actor, (task, position), _ = running.pop(ref)
                try:
                    outcomes[task][position] = outcome = self.ray.get(ref)
                    self.sizing.record(outcome)
                    idle.append(actor)
                except Exception as exc:  # the actor process died
                    outcomes[task][position] = Outcome(
                        "error", message=f"the Ray scoring actor died: {type(exc).__name__}"
                    )
                    self._kill(actor)
            now = time.monotonic()
            for ref, (actor, (task, position), deadline) in list(running.items()):
                if now >= deadline:
                    running.pop(ref)
                    self._kill(actor)
                    self.killed += 1
                    timeout = tasks[task][position].timeout_s
                    outcomes[task][position] = Outcome(
                        "timeout", message=f"took over {timeout:g} s (reward.timeout_s)"
                    )
        return [[o for o in task if o is not None] for task in outcomes]

    def close(self) -> None:
        for actor in list(self.actors):
            self._kill(actor)
