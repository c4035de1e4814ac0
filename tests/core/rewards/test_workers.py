"""The worker pool: deadlines, crashed workers, and no processes left behind."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from plugrl.errors import PluginError
from plugrl.parts.scoring import FileFunction, Scorer
from plugrl.rewards.workers import Call, Outcome, PoolSizing, ProcessPool

BEHAVIOURS = """
import os
import time

def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        while True:
            time.sleep(1)
    if solution_str == "spin":
        while True:
            pass
    if solution_str == "raise":
        raise ValueError("cannot parse " + ground_truth)
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "pid":
        return {"score": 0.0, "pid": os.getpid()}
    if solution_str == "wait":  # a remote check, a sandbox: the core idles meanwhile
        time.sleep(0.2)
        return {"score": 1.0, "pid": os.getpid()}
    if solution_str == "compute":
        start = time.process_time()
        while time.process_time() - start < 0.2:
            pass
        return {"score": 1.0, "pid": os.getpid()}
    if solution_str.startswith("together "):  # hang, noting whether another hangs meanwhile
        folder = solution_str[len("together "):]
        with open(os.path.join(folder, str(os.getpid())), "w"):
            pass
        while True:
            for name in os.listdir(folder):
                if name.isdigit() and int(name) != os.getpid() and alive(int(name)):
                    with open(os.path.join(folder, "overlapped"), "w"):
                        pass
            time.sleep(0.01)
    if solution_str.startswith("spawn "):
        import subprocess
        child = subprocess.Popen(["sleep", "300"])
        with open(solution_str[len("spawn "):], "w") as file:
            file.write(str(child.pid))
        while True:
            time.sleep(1)
    return float(solution_str == ground_truth)
"""


@pytest.fixture
def scorer(scorer_file):
    return Scorer.wrap(FileFunction(str(scorer_file(BEHAVIOURS)), "compute_score"), "behaviours")


@pytest.fixture
def pool():
    pools = []

    def make(workers=1, max_workers=None):
        pools.append(ProcessPool(workers, max_workers))
        return pools[-1]

    yield make
    for p in pools:
        p.close()


def call(scorer, text, timeout=60.0):
    """A call of ``scorer`` on ``text``; the default timeout only catches a hang, as a loaded
    machine takes seconds for the 0.2 s of CPU a "compute" call spends. Tests of timeouts give
    their own."""
    sample = {"data_source": "d", "solution_str": text, "ground_truth": "a", "extra_info": None}
    return Call(scorer, sample, timeout)


def gone(pid: int) -> bool:
    """The process no longer exists: not running and not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_hung_samples_cost_their_timeout_and_the_rest_still_score(scorer, pool):
    workers = pool(1)
    texts = ["a", "hang", "b", "spin", "a"]
    outcomes = workers.run([[call(scorer, t, timeout=0.5) for t in texts]])[0]
    assert [o.status for o in outcomes] == ["ok", "timeout", "ok", "timeout", "ok"]
    assert [o.value[0] for o in outcomes if o.ok] == [1.0, 0.0, 1.0]
    assert outcomes[1].message == "took over 0.5 s (reward.timeout_s)"
    # each hung sample cost its own timeout: its worker killed once and replaced once, the
    # samples after it scored by the replacement
    assert workers.killed == 2
    assert workers.started == 3


def test_a_killed_worker_is_reaped(scorer, pool):
    workers = pool(1)
    first = workers.run([[call(scorer, "pid")]])[0][0].value[1]["pid"]
    outcomes = workers.run([[call(scorer, "hang", timeout=0.3), call(scorer, "pid")]])[0]
    second = outcomes[1].value[1]["pid"]
    assert outcomes[0].status == "timeout"
    assert second != first
    assert gone(first)  # killed and waited for: no zombie


def test_close_leaves_no_worker_processes(scorer, pool):
    workers = pool(3)
    workers.run([[call(scorer, "a")] for _ in range(3)])
    pids = workers.pids()
    assert len(pids) == 3
    workers.close()
    assert workers.pids() == []
    assert all(gone(pid) for pid in pids)


def test_an_exception_is_an_error_outcome_naming_it(scorer, pool):
    outcome = pool(1).run([[call(scorer, "raise")]])[0][0]
    assert outcome.status == "error"
    assert outcome.message.startswith("ValueError: cannot parse a (at reward.py:")


def test_a_worker_that_dies_fails_only_its_sample(scorer, pool):
    outcomes = pool(1).run([[call(scorer, "exit"), call(scorer, "a")]])[0]
    assert outcomes[0].status == "error"
    assert outcomes[0].message == "the scoring worker process died (exit code 3) during this sample"
    assert outcomes[1].ok and outcomes[1].value[0] == 1.0


def test_tasks_spread_over_workers_and_keep_order(scorer, pool):
    workers = pool(2)
    tasks = [[call(scorer, "pid") for _ in range(3)], [call(scorer, "pid") for _ in range(3)]]
    outcomes = workers.run(tasks)
    assert [len(t) for t in outcomes] == [3, 3]
    pids = {o.value[1]["pid"] for task in outcomes for o in task}
    assert len(pids) == 2  # both workers were used


def test_parallel_hangs_overlap(scorer, pool, tmp_path):
    """Two hung samples in two workers cost one timeout, not two: they hang at the same
    time, each killed once."""
    workers = pool(2)
    hang = f"together {tmp_path}"
    outcomes = workers.run([[call(scorer, hang, 3.0)], [call(scorer, hang, 3.0)]])
    assert [task[0].status for task in outcomes] == ["timeout", "timeout"]
    assert (tmp_path / "overlapped").exists(), "the second hang started after the first ended"
    assert workers.killed == 2


def test_a_function_the_worker_cannot_import(pool, tmp_path):
    path = tmp_path / "once.py"
    path.write_text("def compute_score(solution_str, ground_truth):\n    return 1.0\n")
    scorer = Scorer.wrap(FileFunction(str(path), "compute_score"), "once")
    path.unlink()  # the driver checked it, then it went away
    with pytest.raises(PluginError) as error:
        pool(1).run([[call(scorer, "a")]])
    assert str(error.value).startswith(
        "a scoring worker process could not load the reward functions: RecipeError: "
        "reward.custom_function.path: reward function file"
    )


def running(pid: int) -> bool:
    """Alive and not a zombie (a dead orphan may wait for a reaper that never comes)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


DRIVER = """
import sys, threading, time
from plugrl.rewards.workers import Call, Outcome, PoolSizing, ProcessPool
from plugrl.parts.scoring import FileFunction, Scorer

scorer = Scorer.wrap(FileFunction(sys.argv[1], "compute_score"), "behaviours")
pool = ProcessPool(1)
sample = {"data_source": "d", "solution_str": "hang", "ground_truth": "a", "extra_info": None}
threading.Thread(target=pool.run, args=([[Call(scorer, sample, 600.0)]],), daemon=True).start()
time.sleep(1.0)
print(pool.pids()[0], flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_workers_die_with_a_driver_that_dies(scorer_file, tmp_path):
    path = scorer_file(BEHAVIOURS)
    (tmp_path / "driver.py").write_text(DRIVER)
    # the driver exits abruptly (no close, no atexit) while its worker is stuck in a sample
    driver = subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = int(driver.stdout.readline())
    driver.wait(30)
    driver.stdout.close()
    deadline = time.monotonic() + 5
    while running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(worker)


def test_a_timed_out_call_leaves_no_process_it_started(scorer, pool, tmp_path):
    """A scoring function that starts a child process and hangs: the child is killed with
    the worker, not left running after the run."""
    pid_file = tmp_path / "child.pid"
    workers = pool(1)
    (outcome,) = workers.run([[call(scorer, f"spawn {pid_file}", 2.0)]])[0]
    assert outcome.status == "timeout"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child), "the child of the timed-out scoring function still runs"


def test_map_gives_one_outcome_per_call_in_order_and_the_pool_closes_itself(scorer):
    texts = ["a", "hang", "raise", "b", "a"]
    with ProcessPool(2) as workers:
        outcomes = workers.map([call(scorer, text, timeout=0.5) for text in texts])
        pids = workers.pids()
    assert [outcome.status for outcome in outcomes] == ["ok", "timeout", "error", "ok", "ok"]
    assert [outcome.value for outcome in outcomes if outcome.ok] == [
        (1.0, {}),
        (0.0, {}),
        (1.0, {}),
    ]
    assert outcomes[2].message.startswith("ValueError: cannot parse a")
    assert workers.workers == [] and all(gone(pid) for pid in pids)


def test_a_plugrl_folder_in_the_working_folder_is_not_imported(scorer, pool, tmp_path, monkeypatch):
    # a checkout, or anything else named plugrl, where the run is started: `python -c` would
    # put the working folder first on the worker's import path
    impostor = tmp_path / "work" / "plugrl"
    impostor.mkdir(parents=True)
    (impostor / "__init__.py").write_text("raise ImportError('the wrong plugrl was imported')\n")
    monkeypatch.chdir(impostor.parent)
    outcomes = pool(1).run([[call(scorer, "a"), call(scorer, "b")]])[0]
    assert [(o.status, o.value[0]) for o in outcomes] == [("ok", 1.0), ("ok", 0.0)]


def test_a_module_on_pythonpath_reaches_the_worker(pool, tmp_path, monkeypatch):
    """A reward module importable through PYTHONPATH: the worker finds it by name, from a
    working folder that holds a plugrl folder too."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "lab_reward.py").write_text(
        "def compute_score(solution_str, ground_truth):\n"
        "    return float(solution_str == ground_truth)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.syspath_prepend(str(site))  # as the driver started with it would have it
    import lab_reward

    (tmp_path / "work" / "plugrl").mkdir(parents=True)
    (tmp_path / "work" / "plugrl" / "__init__.py").write_text("raise ImportError('wrong')\n")
    monkeypatch.chdir(tmp_path / "work")
    scorer = Scorer.wrap(lab_reward.compute_score, "lab")
    outcomes = pool(1).run([[call(scorer, "a"), call(scorer, "b")]])[0]
    assert [(o.status, o.value[0]) for o in outcomes] == [("ok", 1.0), ("ok", 0.0)]


# ------------------------------------------------------------------------------ pool size


def test_a_call_reports_its_time_and_how_much_of_it_used_a_core(scorer, pool):
    waits, computes = pool(1).run([[call(scorer, "wait"), call(scorer, "compute")]])[0]
    assert waits.wall_s >= 0.2 and computes.wall_s >= 0.2
    assert waits.busy_s < 0.5 * waits.wall_s  # asleep, not on a core
    assert computes.busy_s >= 0.2  # its CPU time, and any wait for a core besides


def test_quick_calls_count_as_computing_unmeasured(scorer, monkeypatch):
    # two readings of the busy clock cost about as much as a call under QUICK_CALL_S
    from plugrl.rewards import workers

    sleeps = call(scorer, "wait")
    monkeypatch.setattr(workers, "QUICK_CALL_S", 3600.0)  # every call is quick
    outcome, _, busy_mark = workers._run_timed(sleeps, time.perf_counter(), None)
    assert outcome.ok and outcome.busy_s == outcome.wall_s >= 0.2
    assert busy_mark is None  # so the next call is not measured either
    monkeypatch.setattr(workers, "QUICK_CALL_S", 0.0)  # none is
    outcome, _, busy_mark = workers._run_timed(sleeps, time.perf_counter(), None)
    assert outcome.busy_s == outcome.wall_s  # unmeasured from its start: counted as busy
    assert busy_mark is not None
    outcome, _, _ = workers._run_timed(sleeps, time.perf_counter(), busy_mark)
    assert outcome.busy_s < 0.5 * outcome.wall_s  # measured: it slept


def test_sizing_keeps_the_base_until_calls_are_measured_to_wait():
    sizing = PoolSizing(base=2, maximum=32)
    assert sizing.busy_fraction is None and sizing.target() == 2
    sizing.record(Outcome("ok", wall_s=1.0, busy_s=1.0))
    assert sizing.target() == 2  # compute-bound: as many as the cores
    sizing.record(Outcome("ok", wall_s=1.0, busy_s=0.0))
    assert sizing.busy_fraction == 0.5 and sizing.target() == 4
    for _ in range(8):
        sizing.record(Outcome("ok", wall_s=1.0, busy_s=0.0))
    assert sizing.target() == 20  # 2 cores / 0.1
    sizing.record(Outcome("ok", wall_s=100.0, busy_s=0.0))
    assert sizing.target() == 32  # at most the maximum
    # neither timeouts nor errors are measured
    sizing.record(Outcome("timeout", message="took over 1 s"))
    sizing.record(Outcome("error", message="ValueError"))
    assert sizing.target() == 32


def test_sizing_follows_the_latest_batches():
    sizing = PoolSizing(base=1, maximum=8)
    sizing.record(Outcome("ok", wall_s=4.0, busy_s=0.0))
    assert sizing.target() == 8
    for _ in range(3):  # the scorer now computes: older batches weigh half each time
        sizing.next_batch()
        sizing.record(Outcome("ok", wall_s=4.0, busy_s=4.0))
    assert sizing.busy_fraction == pytest.approx(14 / 15)
    assert sizing.target() == 1


def test_a_fixed_pool_never_grows():
    sizing = PoolSizing(base=2, maximum=2)
    sizing.record(Outcome("ok", wall_s=10.0, busy_s=0.0))
    assert sizing.target() == 2


def test_pool_sizes_are_checked():
    with pytest.raises(ValueError, match=r"^num_workers must be >= 1, got 0$"):
        ProcessPool(0)
    with pytest.raises(ValueError, match=r"^max_workers must be >= num_workers 4, got 2$"):
        ProcessPool(4, max_workers=2)


def test_a_pool_grows_while_calls_wait_and_shrinks_when_they_compute(scorer, pool, caplog):
    workers = pool(1, max_workers=4)
    tasks = [[call(scorer, "wait")] for _ in range(8)]
    with caplog.at_level(logging.INFO, logger="plugrl.rewards"):
        workers.run(tasks)
        outcomes = workers.run(tasks)
    assert all(task[0].ok for task in outcomes)
    assert workers.target_workers == 4 and len(workers.workers) == 4
    assert len({task[0].value[1]["pid"] for task in outcomes}) == 4
    grew = [r.getMessage() for r in caplog.records if "workers score at once" in r.getMessage()]
    assert len(grew) == 1
    assert grew[0].endswith(
        "of their time waiting (I/O, a remote service, a sleep), not computing; 4 workers "
        "score at once to keep 1 cores busy (at most reward.max_workers=4)"
    )
    # the same scorer now computes: the pool goes back to one worker
    computing = [[call(scorer, "compute")] for _ in range(4)]
    for _ in range(4):
        workers.run(computing)
    assert workers.target_workers == 1
    workers.run([[call(scorer, "a")]])
    assert len(workers.workers) == 1


def test_a_pool_of_compute_bound_calls_stays_at_its_base(scorer, pool):
    workers = pool(1, max_workers=4)
    for _ in range(2):
        outcomes = workers.run([[call(scorer, "compute")] for _ in range(4)])
    assert all(task[0].ok for task in outcomes)
    assert workers.started == 1 and workers.target_workers == 1
