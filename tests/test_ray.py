"""`biglm serve --replicas` on Ray Serve and `biglm generate --input --replicas` on Ray Data, on a real local Ray
instance (one for the module, 4 logical CPUs on whatever cores the machine has), with a tiny model.

What must hold: through the Ray Serve application, the official `openai` client's completion and streamed chat
are what `biglm generate` prints for the same settings and seed; 64 concurrent requests are all answered and both
replicas served some (their /health counts); a replica killed mid-load ends each request as a completion or a
retryable 5xx within a time bound, never a hang, and the application is healthy again with 2 replicas; shutdown
drains requests in flight and refuses new ones with 503; batch
generation on Ray Data writes the local job's file, row by row, continuing a stopped job's output.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("ray")
pytest.importorskip("ray.serve")
pytest.importorskip("ray.data")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")

from biglm.checkpoint import load_model  # noqa: E402
from biglm.generation.batch import generate_file  # noqa: E402
from biglm.generation.chat import render_chat  # noqa: E402
from biglm.generation.cli import main as generate_main  # noqa: E402

pytestmark = pytest.mark.ray
NAME = "tiny-ray"
KILL_BOUND_S = 90.0  # every request in flight on a killed replica has ended by then (answered or a 5xx)


@pytest.fixture(scope="module")
def model_dir(checkpoint, tmp_path_factory) -> Path:
    """The `checkpoint` fixture's tokenizer and tiny shape with a larger init std: peaked predictions free of
    near-ties that the float rounding of a batched call could flip (as in test_generation_batch)."""
    from conftest import save_random_model

    _, tok = load_model(checkpoint, device="cpu")
    return save_random_model(tmp_path_factory.mktemp("ray-model"), tok, initializer_range=0.2)


@pytest.fixture(scope="module")
def ray_instance():
    import ray

    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(ray_instance, model_dir):
    from biglm.integrations.ray_serve import deploy
    from biglm.serving.cli import ServeArgs

    args = ServeArgs(checkpoint=str(model_dir), model_name=NAME, port=_free_port(), replicas=2, max_batch_rows=8,
                     max_queue=32, shutdown_timeout=5.0)
    deployed = deploy(args)
    client = openai.OpenAI(base_url=deployed.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield SimpleNamespace(url=deployed.url, client=client, deployed=deployed)
    deployed.delete()


def _health(url: str) -> tuple[int, dict]:
    r = httpx.get(url + "/health", timeout=30)
    return r.status_code, r.json()


def _biglm_generate(checkpoint, prompt: str, capsys, **flags) -> str:
    from conftest import biglm_generate_answer

    return biglm_generate_answer(checkpoint, prompt, capsys, device="cpu", **flags)


def test_openai_client_through_ray_serve_equals_biglm_generate(served, model_dir, capsys):
    flags = dict(max_new_tokens=12, strategy="confidence", block_length=4, temperature=0.8, top_p=0.9, seed=4)
    extra = {"strategy": "confidence", "block_length": 4}
    sampling = dict(max_tokens=12, temperature=0.8, top_p=0.9, seed=4)
    prompt = "To be, or not to be"
    text = served.client.completions.create(model=NAME, prompt=prompt, extra_body=extra, **sampling)
    assert text.choices[0].text == _biglm_generate(model_dir, prompt, capsys, **flags)
    messages = [{"role": "user", "content": "Speak, friend."}]
    stream = served.client.chat.completions.create(model=NAME, messages=messages, stream=True, extra_body=extra,
                                                   **sampling)
    chunks = [c for c in stream if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason
    _, tok = load_model(model_dir)
    want = _biglm_generate(model_dir, render_chat(tok, messages), capsys, **flags)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert served.client.models.list().data[0].id == NAME


def test_the_playground_and_its_step_stream_through_ray_serve(served):
    """--replicas serves the same app: the page at / and the step stream, which ends on the API's text."""
    from biglm.serving.playground import asset

    page = httpx.get(served.url + "/", timeout=30)
    assert page.status_code == 200 and page.content == asset("index.html")
    body = {"prompt": "To be, or not to be", "max_tokens": 8, "steps": 3}
    with httpx.stream("POST", served.url + "/v1/completions/steps", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert [e["object"] for e in events] == ["steps.start", *["steps.call"] * 3, "steps.done"]
    answer = served.client.completions.create(model=NAME, prompt=body["prompt"], max_tokens=8, extra_body={"steps": 3})
    assert events[-1]["text"] == answer.choices[0].text


def test_64_concurrent_requests_are_served_by_both_replicas(served):
    status, before = _health(served.url)
    assert status == 200 and before["status"] == "ok" and before["application"] == "RUNNING", before
    assert len(before["replicas"]) == 2 and all(r["state"] == "RUNNING" for r in before["replicas"])

    # Ray's router balances a burst on cached queue lengths, so one replica may get more than its
    # max_batch_rows + max_queue and answer the excess with its documented 429; the openai client's default
    # retries (what users run) take it to a replica with room. Every request must end answered.
    client = served.client.with_options(max_retries=4)

    def ask(i: int) -> str:
        out = client.completions.create(model=NAME, prompt=f"Request {i}:", max_tokens=8, seed=i,
                                        temperature=1.0, extra_body={"steps": 4})
        return out.choices[0].finish_reason

    with ThreadPoolExecutor(64) as pool:
        reasons = list(pool.map(ask, range(64)))
    assert len(reasons) == 64 and all(r in ("stop", "length") for r in reasons)
    _, after = _health(served.url)
    served_now = {r["id"]: r["served"] for r in after["replicas"]}
    served_before = {r["id"]: r["served"] for r in before["replicas"]}
    gained = {rid: n - served_before.get(rid, 0) for rid, n in served_now.items()}
    assert sum(gained.values()) == 64, after
    assert all(n > 0 for n in gained.values()), gained  # both replicas answered some


def test_a_killed_replica_ends_its_requests_cleanly_and_is_replaced(served):
    """(A stream already started on the killed replica is cut short; these requests are not streamed.)"""
    _, body = _health(served.url)
    victim = body["replicas"][0]

    def ask(i: int) -> tuple[str, float]:
        start = time.monotonic()
        try:
            served.client.completions.create(model=NAME, prompt=f"Load {i}:", max_tokens=48, seed=i,
                                             extra_body={"steps": 48})
            return "ok", time.monotonic() - start
        except openai.APIStatusError as e:  # a clean HTTP error: retryable when 5xx
            return f"http {e.status_code}", time.monotonic() - start
        except openai.APIConnectionError as e:
            return f"connection {type(e).__name__}", time.monotonic() - start

    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(ask, i) for i in range(32)]
        time.sleep(1.0)  # requests in flight on both replicas
        os.kill(victim["pid"], signal.SIGKILL)
        outcomes = [f.result(timeout=KILL_BOUND_S) for f in futures]
    kinds = {kind for kind, _ in outcomes}
    assert kinds <= {"ok"} | {f"http {s}" for s in range(500, 600)}, outcomes
    assert "ok" in kinds  # the other replica kept serving
    # Ray Serve replaces the dead replica: healthy again with 2 running replicas, the victim gone
    deadline = time.monotonic() + 60
    seen = set()  # (HTTP status, health status) answered by the replicas meanwhile
    while True:
        try:
            status, body = _health(served.url)
        except (httpx.HTTPError, ValueError):
            status, body = 0, {}
        seen.add((status, body.get("status")))
        replicas = body.get("replicas", [])
        if (status == 200 and len(replicas) == 2 and all(r["state"] == "RUNNING" for r in replicas)
                and victim["id"] not in {r["id"] for r in replicas}):
            break
        assert time.monotonic() < deadline, (status, body)
        time.sleep(0.5)
    assert served.client.completions.create(model=NAME, prompt="Again", max_tokens=4).choices[0].finish_reason
    # while one replica was replaced the other served: degraded, still 200 (a load balancer keeps the service)
    assert not {answer for answer in seen if answer[1] == "degraded" and answer[0] != 200}, seen


def test_health_is_degraded_not_down_while_some_replica_serves():
    """/health's status from Ray Serve's states: 503 ("unavailable") only when no replica runs."""
    from biglm.integrations.ray_serve import replica_health

    assert replica_health("RUNNING", ["RUNNING", "RUNNING"], wanted=2) == {"status": "ok", "replicas_healthy": 2,
                                                                           "replicas_wanted": 2}
    # one of two replicas killed: Ray Serve starts a replacement while the other serves
    assert replica_health("DEPLOYING", ["RUNNING", "STARTING"], wanted=2) == {
        "status": "degraded", "replicas_healthy": 1, "replicas_wanted": 2}
    assert replica_health("UNHEALTHY", ["RUNNING"], wanted=2)["status"] == "degraded"
    assert replica_health("RUNNING", ["RUNNING"], wanted=2)["status"] == "degraded"  # not yet listed again
    assert replica_health("DEPLOYING", ["STARTING", "STOPPING"], wanted=2) == {
        "status": "unavailable", "replicas_healthy": 0, "replicas_wanted": 2}
    assert replica_health("RUNNING", [])["status"] == "unavailable"


def test_sigterm_while_the_launcher_starts_drains_and_exits_0(model_dir, tmp_path):
    """SIGTERM to `biglm serve --replicas 1` while it deploys (Ray up, the replica starting): it finishes starting,
    shuts down and exits 0, and no process of its Ray instance is left (Ray's own handler made it exit 15, leaving
    Ray's two agents running). (One replica: the launcher waits for all it asked for alike, and a second one only
    doubled the start on a 2-core machine, ~15 s.)"""
    import subprocess
    import sys

    import psutil

    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "biglm", "serve", str(model_dir), "--replicas", "1", "--port",
                                 str(_free_port()), "--log_level", "warning", "--shutdown_timeout", "5"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        launcher, raylets = psutil.Process(proc.pid), []
        deadline = time.monotonic() + 120
        while True:  # the Serve controller runs: Ray is up and the application is being deployed
            children = {p.name(): p for p in launcher.children(recursive=True)}
            raylets = [p for name, p in children.items() if name == "raylet"] or raylets
            if "ray::ServeController" in children:
                break
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, log.read_text()[-3000:]
        assert "biglm serve: shutting down" in log.read_text()
        time.sleep(1.0)
        left = []
        for p in psutil.process_iter():  # Ray's processes of that instance: started by it, or by its raylet
            try:
                if p.ppid() == proc.pid or p.environ().get("RAY_RAYLET_PID") in {str(r.pid) for r in raylets}:
                    left.append(p.name())
            except psutil.Error:
                continue
        assert raylets and not left, left
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_killed_launchers_ray_processes_are_stopped_by_the_next(tmp_path, monkeypatch):
    """A launcher killed with `kill -9` leaves Ray's agents running: the next one stops the processes its record
    names (by pid and start time, or by the session directory on their command line; SIGKILL for one that ignores
    SIGTERM, as the agents do) and nothing else: not a cluster the user started, not a pid since reused, not the
    processes of a launcher that still runs."""
    import subprocess
    import sys

    import psutil

    from biglm.integrations import ray_cluster

    sessions = tmp_path / "sessions"
    monkeypatch.setattr(ray_cluster, "SESSIONS", sessions)
    sleeper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"

    def spawn(*argv: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", sleeper, *argv])

    def started(p: subprocess.Popen) -> float:
        return psutil.Process(p.pid).create_time()

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed_session = str(tmp_path / "ray" / "session_killed")
    agent, worker = spawn(), spawn(f"--session-dir={killed_session}")
    users, reused, live = spawn(f"--session-dir={tmp_path}/ray/session_users"), spawn(), spawn()
    procs = [agent, worker, users, reused, live]
    try:
        time.sleep(0.5)
        sessions.mkdir()
        (sessions / f"{dead.pid}.json").write_text(json.dumps({
            "launcher": [dead.pid, time.time()], "session_dir": killed_session,
            "processes": [[agent.pid, started(agent)], [reused.pid, started(reused) - 100]]}))
        me = psutil.Process()
        (sessions / f"{me.pid}.json").write_text(json.dumps({
            "launcher": [me.pid, me.create_time()], "session_dir": str(tmp_path / "ray" / "session_live"),
            "processes": [[live.pid, started(live)]]}))
        assert ray_cluster.stop_orphaned_sessions(grace=0.5) == 2
        assert agent.wait(5) is not None and worker.wait(5) is not None
        assert [p.poll() for p in (users, reused, live)] == [None, None, None]
        assert sorted(f.name for f in sessions.iterdir()) == [f"{me.pid}.json"]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_shutdown_drains_in_flight_requests_and_refuses_new_ones(served):
    """As the single-process server: on shutdown new requests get 503 while those in flight finish (200)."""
    def ask(i: int, tokens: int = 200, beam: int = 8) -> int:
        # 200 steps x 8 length candidates fill a replica's 8 rows for ~1.3 s on an idle CPU: 8 such requests keep
        # both replicas busy for several seconds, so the drain is still on when the probe arrives (on a fast machine
        # a lighter load finished first, the application was gone, and the probe met Ray's 404)
        r = httpx.post(served.url + "/v1/completions", timeout=120,
                       json={"model": NAME, "prompt": f"Long {i}:", "max_tokens": tokens, "steps": tokens,
                             "length_beam": beam})
        return r.status_code

    with ThreadPoolExecutor(10) as pool:
        long = [pool.submit(ask, i) for i in range(8)]
        time.sleep(0.5)
        closing = pool.submit(served.deployed.shutdown, 60.0)
        time.sleep(1.0)  # the replicas have read the phase; the long requests are still running
        assert pool.submit(ask, 99, 4, 1).result(timeout=60) == 503
        assert [f.result(timeout=120) for f in long] == [200] * 8
        assert closing.result(timeout=120) == 0  # none left to cancel


ROWS = [{"id": i, "prompt": p} for i, p in enumerate(["The king", "To be, or not", "My lord,", "What, my dear lady",
                                                       "Come", "And then"])]
ROWS += [{"id": "sampled", "prompt": "The king", "temperature": 1.0, "top_k": 20, "seed": 7},
         {"id": "chat", "messages": [{"role": "user", "content": "Who?"}], "steps": 3},
         {"id": "beam", "prompt": "Come", "length_beam": 2, "max_new_tokens": 10, "steps": 4}]


def test_ray_data_batch_generation_equals_the_local_job_and_resumes(ray_instance, model_dir, tmp_path, capsys):
    """`biglm generate --input --replicas 2` writes the local job's file row by row; started on the output of a
    job stopped mid-write (two batches and half a line), it ends with the uninterrupted file, byte for byte."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    model, tok = load_model(model_dir, device="cpu")
    local = tmp_path / "local.jsonl"
    generate_file(model, tok, src, local, config={"max_new_tokens": 12, "steps": 6}, batch_size=2, progress=False)
    lines = local.read_bytes().splitlines(keepends=True)
    out = tmp_path / "ray.jsonl"
    out.write_bytes(b"".join(lines[:4]) + lines[4][:7])  # stopped: 2 batches written, a third cut short
    meta = Path(f"{out}.meta.json")  # (the stopped job's record of its model and settings: the local job's)
    meta.write_bytes(Path(f"{local}.meta.json").read_bytes())
    flags = ["--max_new_tokens", "12", "--steps", "6", "--batch_size", "2", "--progress", "false"]
    assert generate_main([str(model_dir), "--input", str(src), "--output", str(out), *flags, "--replicas", "2"]) == 0
    assert "dropping a partial last line" in capsys.readouterr().err
    assert [json.loads(x) for x in out.read_bytes().splitlines()] == [json.loads(x) for x in lines]
    assert out.read_bytes() == local.read_bytes()


def test_bad_ray_options_are_refused_in_one_line(tmp_path, capsys):
    from biglm.serving.cli import main as serve_main

    def refused(main, argv: list[str], needle: str) -> None:
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err

    refused(serve_main, [str(tmp_path), "--replicas", "0"], "--replicas 0 must be >= 1")
    refused(serve_main, [str(tmp_path), "--replicas", "2", "--min_replicas", "3", "--max_replicas", "2"],
            "--min_replicas 3 exceeds --max_replicas 2")
    refused(serve_main, [str(tmp_path), "--replicas", "4", "--max_replicas", "3"], "must lie in")
    refused(serve_main, [str(tmp_path), "--max_replicas", "3"], "go with --replicas")
    refused(serve_main, [str(tmp_path), "--ray_address", "auto"], "goes with --replicas")
    refused(serve_main, [str(tmp_path), "--replicas", "1", "--ray_address", "nowhere"], "HOST:PORT")
    refused(serve_main, [str(tmp_path), "--replicas", "1", "--device", "cpu"], "--device applies to one process")
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": 1, "prompt": "x"}) + "\n")
    io = ["--input", str(src), "--output", str(tmp_path / "out.jsonl")]
    refused(generate_main, [str(tmp_path), "--prompt", "x", "--replicas", "2"], "go with --input")
    refused(generate_main, [str(tmp_path), *io, "--replicas", "2", "--replica_gpus", "-1"], "must be >= 0")


def test_unreachable_ray_address_is_refused_before_work(tmp_path, capsys):
    from biglm.integrations.ray_cluster import ClusterError, connect

    with pytest.raises(ClusterError, match="no Ray head answers there"):
        connect(f"127.0.0.1:{_free_port()}", cpus=1, gpus=0)
