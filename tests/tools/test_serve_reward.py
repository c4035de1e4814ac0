"""``plugrl serve reward`` as a real server process, queried over HTTP in both schemas."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from plugrl.errors import PlugrlError
from plugrl_tools.serve import load_scorer

PLUGRL = [sys.executable, "-m", "plugrl_tools.cli"]

SCORER = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "hang" in solution_str:
        time.sleep(60)
    if "raise" in solution_str:
        raise ZeroDivisionError("division by zero")
    if solution_str.startswith("wait:"):  # until the test creates the file, a minute at most
        import pathlib
        release = pathlib.Path(solution_str[len("wait:"):])
        release.with_suffix(".started").touch()
        for _ in range(1200):
            if release.exists():
                break
            time.sleep(0.05)
        solution_str = "4"
    answer = solution_str.strip()
    return {"score": float(answer == str(ground_truth)), "acc": answer == str(ground_truth),
            "pred": answer}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_log(scorer: Path) -> Path:
    """What the server of the ``served`` fixture prints, beside its scorer file."""
    return scorer.parent / "server.log"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, scorer file) of ``plugrl serve reward`` running the SCORER file."""
    yield from serve(tmp_path_factory.mktemp("served"), "--timeout-s", "2")


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """(base URL, scorer file) of a server with a long timeout and small request limits."""
    yield from serve(
        tmp_path_factory.mktemp("limited"),
        "--timeout-s",
        "60",
        "--max-body-bytes",
        "100000",
        "--max-samples",
        "50",
    )


def serve(folder: Path, *flags: str):
    path = folder / "reward.py"
    path.write_text(SCORER, encoding="utf-8")
    port = free_port()
    with server_log(path).open("w") as log:
        process = subprocess.Popen(
            [
                *PLUGRL,
                "serve",
                "reward",
                f"{path}:compute_score",
                "--port",
                str(port),
                "--workers",
                "2",
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            pytest.fail(f"plugrl serve reward exited: {server_log(path).read_text()}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("plugrl serve reward did not answer /health in 120 s")
        time.sleep(0.2)
    yield base, path
    process.send_signal(signal.SIGINT)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def post(base: str, path: str, body, timeout: float = 60) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        return httpx.post(f"{base}{path}", content=body, timeout=timeout)
    return httpx.post(f"{base}{path}", json=body, timeout=timeout)


def sample(response: str, truth: str = "4", data_source: str = "x") -> dict:
    return {
        "data_source": data_source,
        "prompt": "2 + 2 =",
        "response": response,
        "ground_truth": truth,
        "extra_info": {"index": 0},
    }


def test_health_names_the_function(served):
    base, path = served
    answer = httpx.get(f"{base}/health", timeout=10)
    assert answer.json() == {
        "status": "ok",
        "function": f"reward function 'compute_score' from {path}",
    }


def test_score_answers_plugrls_schema(served):
    base, _ = served
    answer = post(base, "/score", {"samples": [sample(" 4"), sample("5")]})
    assert answer.status_code == 200
    assert answer.json() == {
        "scores": [
            {"score": 1.0, "acc": True, "pred": "4"},
            {"score": 0.0, "acc": False, "pred": "5"},
        ]
    }


def test_get_reward_answers_openrlhfs_schema(served):
    base, _ = served
    body = {"query": ["2+2= 4", "2+2= 5"], "prompts": ["2+2=", "2+2="], "labels": ["4", "4"]}
    answer = post(base, "/get_reward", body)
    assert answer.status_code == 200
    assert answer.json() == {
        "rewards": [1.0, 0.0],
        "scores": [1.0, 0.0],
        "extra_logs": {"acc": [1.0, 0.0]},
    }


def test_a_scorer_error_is_a_500_naming_the_sample(served):
    base, _ = served
    answer = post(base, "/score", {"samples": [sample("4"), sample("raise")]})
    assert answer.status_code == 500
    assert answer.json() == {
        "error": "sample 1 (data_source 'x') failed: ZeroDivisionError: division by zero "
        "(at reward.py:8)"
    }


def test_a_sample_past_the_timeout_is_a_500_and_the_server_goes_on(served):
    base, _ = served
    answer = post(base, "/score", {"samples": [sample("hang", data_source="slow")]})
    assert answer.status_code == 500
    assert answer.json() == {
        "error": "sample 0 (data_source 'slow') timed out: took over 2 s (--timeout-s)"
    }
    assert post(base, "/score", {"samples": [sample("4")]}).json()["scores"][0]["score"] == 1.0


@pytest.mark.parametrize(
    ("path", "body", "error"),
    [
        (
            "/score",
            b"{not json",
            "the body is not JSON (Expecting property name enclosed in "
            "double quotes: line 1 column 2 (char 1))",
        ),
        ("/score", {"query": ["x"]}, 'the body must be a JSON object {"samples": [...]}'),
        (
            "/score",
            {"samples": [{"data_source": "x", "ground_truth": "4"}]},
            "sample 0 has no 'response'",
        ),
        ("/score", {"samples": ["4"]}, "sample 0 is not a JSON object"),
        (
            "/get_reward",
            {"samples": []},
            'the body must be a JSON object {"query": [...], "prompts": [...], ...}',
        ),
        (
            "/get_reward",
            {"query": ["a", "b"], "prompts": ["a"], "labels": ["1", "2"]},
            "'prompts' must be a list as long as 'query' (2)",
        ),
    ],
)
def test_malformed_requests_are_a_400_saying_what_is_wrong(served, path, body, error):
    base, _ = served
    answer = post(base, path, body)
    assert answer.status_code == 400
    assert answer.json() == {"error": error}


def wait_for_line(log: Path, text: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while text not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    return log.read_text()


def test_requests_are_not_logged_one_line_each_but_failures_are(served):
    """A run makes hundreds of requests a step: by default they print nothing, while a
    request that fails prints one line saying why."""
    base, path = served
    for _ in range(3):
        assert post(base, "/score", {"samples": [sample("4")]}).status_code == 200
    assert post(base, "/score", {"samples": "no"}).status_code == 400
    output = wait_for_line(server_log(path), "POST /score: 400")
    assert 'POST /score: 400 the body must be a JSON object {"samples": [...]}' in output, output
    assert "HTTP/1.1" not in output, output  # uvicorn's access lines


def test_access_log_turns_the_per_request_lines_on(tmp_path, monkeypatch):
    import uvicorn
    from click.testing import CliRunner

    from plugrl_tools.cli import cli

    path = tmp_path / "reward.py"
    path.write_text(SCORER, encoding="utf-8")
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: calls.append(options))
    for flags in ([], ["--access-log"]):
        result = CliRunner().invoke(cli, ["serve", "reward", str(path), "--workers", "1", *flags])
        assert result.exit_code == 0, result.output
    assert [call["access_log"] for call in calls] == [False, True]


def test_a_spec_without_a_python_file_is_one_line(tmp_path):
    with pytest.raises(PlugrlError) as caught:
        load_scorer("reward:compute_score")
    assert str(caught.value) == (
        "'reward:compute_score' is not FILE.py:function; name the Python file and, after a "
        "colon, the function (compute_score when left out)"
    )


def test_a_missing_function_says_to_name_it_after_the_colon(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(SCORER, encoding="utf-8")
    with pytest.raises(PlugrlError) as caught:
        load_scorer(f"{path}:score_it")
    assert str(caught.value) == (
        f"{path} has no function 'score_it' (it defines compute_score); name it after the "
        "colon: FILE.py:FUNCTION"
    )


def test_the_function_defaults_to_compute_score(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(SCORER, encoding="utf-8")
    assert load_scorer(str(path)).label == f"reward function 'compute_score' from {path}"


def test_without_uvicorn_the_command_says_which_extra_to_install(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(SCORER, encoding="utf-8")
    code = (
        "import sys\n"
        "sys.modules['uvicorn'] = None\n"
        "from plugrl_tools.cli import main\n"
        f"sys.argv = ['plugrl', 'serve', 'reward', {str(path)!r}]\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: plugrl serve needs uvicorn and starlette: pip install 'plugrl[serve]'"
    ]


def test_a_hanging_sample_holds_no_other_client(limited):
    """While one client's sample waits (well inside --timeout-s), another client is answered
    (the fourth drill: requests were scored one at a time, so every client waited out the
    hanging sample's timeout)."""
    import concurrent.futures

    base, path = limited
    release = path.parent / "release"
    with concurrent.futures.ThreadPoolExecutor(2) as clients:
        slow = clients.submit(post, base, "/score", {"samples": [sample(f"wait:{release}")]})
        try:
            started = release.with_suffix(".started")
            for _ in range(1200):  # until the slow sample is being scored, a minute at most
                if started.exists() or slow.done():
                    break
                time.sleep(0.05)
            assert started.exists(), slow.result().text
            for _ in range(3):
                fast = post(base, "/score", {"samples": [sample("4"), sample("5")]})
                assert fast.status_code == 200
                assert [s["score"] for s in fast.json()["scores"]] == [1.0, 0.0]
                assert not slow.done()
        finally:
            release.touch()
        assert slow.result().status_code == 200
        assert slow.result().json()["scores"][0]["score"] == 1.0


def test_a_body_over_the_limit_is_a_413(limited):
    base, _ = limited
    body = {"samples": [sample("4" * 120_000)]}
    answer = post(base, "/score", body)
    assert answer.status_code == 413
    assert answer.json()["error"].endswith(
        "bytes or more, over --max-body-bytes 100000: send fewer samples a request"
    )
    # a body sent in chunks, without a Content-Length, is cut off as it streams in
    chunks = (b'{"samples": [' + b" " * 10_000 for _ in range(20))
    answer = httpx.post(f"{base}/score", content=chunks, timeout=60)
    assert answer.status_code == 413


def test_too_many_samples_are_a_413(limited):
    base, _ = limited
    answer = post(base, "/score", {"samples": [sample("4")] * 51})
    assert answer.status_code == 413
    assert answer.json() == {
        "error": "the request has 51 samples, over --max-samples 50: send fewer samples a request"
    }
    assert post(base, "/score", {"samples": [sample("4")] * 50}).status_code == 200


def test_a_deeply_nested_body_is_a_400_in_one_line(limited):
    base, path = limited
    answer = post(base, "/score", "[" * 50_000 + "]" * 50_000)
    assert answer.status_code == 400
    assert answer.json() == {"error": "the body's JSON is nested too deeply to read"}
    output = wait_for_line(server_log(path), "nested too deeply")
    assert "Traceback" not in output, output


def test_clients_that_disconnect_before_their_body_leave_no_traceback(limited):
    base, path = limited
    port = int(base.rsplit(":", 1)[1])
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as half_open:
            half_open.sendall(
                b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"samples": ['
            )
    # the server goes on, and printed no traceback for them
    assert post(base, "/score", {"samples": [sample("4")]}).status_code == 200
    output = server_log(path).read_text()
    assert "Traceback" not in output and "Exception in ASGI" not in output, output
