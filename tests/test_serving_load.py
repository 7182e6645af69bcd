"""`biglm serve` under load and at its limits, on loopback with a tiny model.

- 16 concurrent clients, 320 requests (completions and chat, half of them streamed) below the
  queue bound: every one answered 200 and complete, the server healthy and empty afterwards.
- A tiny queue bound: every request is either answered completely or refused at once with 429
  (never a hang), and the server is healthy afterwards.
- A request timeout answers 408 (or an error event in a stream) and frees the engine.
- Shutdown lets an in-flight stream finish, and cancels one that outlives the grace period with
  an error event, ending the stream cleanly.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx2")

from biglm.checkpoint import load_model  # noqa: E402
from biglm.serving.app import ServeSettings, create_app  # noqa: E402
from biglm.serving.cli import BiglmServer  # noqa: E402

NAME = "tiny"


@pytest.fixture(scope="module")
def model_and_tokenizer(checkpoint):
    return load_model(checkpoint)


def _server(model_and_tokenizer, *, step_delay: float = 0.0, shutdown_timeout: float = 30.0, **settings):
    model, tok = model_and_tokenizer
    app = create_app(model=model, tokenizer=tok, settings=ServeSettings(model_name=NAME, **settings))
    if step_delay:  # a slower model: requests overlap for certain
        engine, step = app.state.scheduler.engine, app.state.scheduler.engine.step

        def slow_step():
            time.sleep(step_delay)
            return step()

        engine.step = slow_step
    return BiglmServer(app, port=0, shutdown_timeout=shutdown_timeout).start(), app


def _call(client, url: str, i: int) -> dict:
    """One request (kind chosen by ``i``); returns status, text and finish reason, or the error body."""
    chat = i % 2 == 1
    stream = i % 4 >= 2
    body = {"model": NAME, "max_tokens": 4 + i % 5, "steps": 2, "seed": i, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": f"Question {i}?"}]
    else:
        body["prompt"] = f"Line {i} of the play:"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if not stream:
        r = client.post(url + path, json=body)
        if r.status_code != 200:
            return {"status": r.status_code, "error": r.json()["error"]}
        choice = r.json()["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        return {"status": 200, "text": text, "finish_reason": choice["finish_reason"]}
    with client.stream("POST", url + path, json=body) as r:
        if r.status_code != 200:
            r.read()
            return {"status": r.status_code, "error": r.json()["error"]}
        text, reason, done = "", None, False
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            data = json.loads(line[6:])
            assert "error" not in data, data
            for c in data["choices"]:
                text += (c["delta"].get("content") or "") if chat else c["text"]
                reason = c["finish_reason"] or reason
        return {"status": 200 if done else -1, "text": text, "finish_reason": reason}


def _run_clients(url: str, *, clients: int, per_client: int, limit: float) -> list[dict]:
    def worker(k: int) -> list[dict]:
        with httpx.Client(timeout=limit) as client:
            return [_call(client, url, k * per_client + j) for j in range(per_client)]

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(worker, k) for k in range(clients)]
        return [r for f in futures for r in f.result(timeout=limit)]


def _assert_healthy_and_empty(url: str, app) -> None:
    r = httpx.get(url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    scheduler = app.state.scheduler

    def empty() -> bool:  # a cancel reaches the engine at its next turn, just after the slot frees
        return scheduler.in_flight == 0 and scheduler.engine.num_running == 0 and scheduler.engine.num_waiting == 0

    assert _waited(empty, timeout=5.0), (scheduler.in_flight, scheduler.engine.num_running)


def test_load_below_the_queue_bound(model_and_tokenizer):
    server, app = _server(model_and_tokenizer, max_batch_rows=16, max_queue=16)
    url = f"http://127.0.0.1:{server.port}"
    try:
        t0 = time.monotonic()
        results = _run_clients(url, clients=16, per_client=20, limit=40.0)
        elapsed = time.monotonic() - t0
        assert len(results) == 320
        failed = [r for r in results if r["status"] != 200]
        assert not failed, failed[:3]
        assert all(r["finish_reason"] in ("stop", "length") and isinstance(r["text"], str) for r in results)
        assert elapsed < 40.0
        # requests really shared model calls: fewer engine steps than requests x steps
        assert app.state.scheduler.stats["steps"] < 320 * 2
        _assert_healthy_and_empty(url, app)
    finally:
        server.stop()


def test_overload_is_refused_at_once(model_and_tokenizer):
    server, app = _server(model_and_tokenizer, max_batch_rows=2, max_queue=1, step_delay=0.01)
    url = f"http://127.0.0.1:{server.port}"
    try:
        results = _run_clients(url, clients=16, per_client=5, limit=30.0)
        statuses = {r["status"] for r in results}
        assert statuses <= {200, 429}, statuses
        refused = [r for r in results if r["status"] == 429]
        assert refused and len(refused) < len(results)
        assert all(r["error"]["code"] == "queue_full" and r["error"]["type"] == "rate_limit_exceeded" for r in refused)
        assert all(r["finish_reason"] in ("stop", "length") for r in results if r["status"] == 200)
        assert app.state.scheduler.stats["rejected_429"] == len(refused)
        metrics = httpx.get(url + "/metrics").text  # counted by kind
        assert f'biglm_errors_total{{status="429",code="queue_full",param=""}} {len(refused)}\n' in metrics
        _assert_healthy_and_empty(url, app)
    finally:
        server.stop()


def test_request_timeout(model_and_tokenizer):
    server, app = _server(model_and_tokenizer, request_timeout=0.3, step_delay=0.02)
    url = f"http://127.0.0.1:{server.port}"
    long = {"model": NAME, "prompt": "The", "max_tokens": 100, "steps": 100}
    try:
        r = httpx.post(url + "/v1/completions", json=long, timeout=10)
        assert r.status_code == 408 and r.json()["error"]["code"] == "request_timeout"
        with httpx.stream("POST", url + "/v1/completions", json={**long, "stream": True}, timeout=10) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["error"]["code"] == "request_timeout"
        _assert_healthy_and_empty(url, app)
        metrics = httpx.get(url + "/metrics").text  # both counted, the one in a stream too
        assert 'biglm_errors_total{status="408",code="request_timeout",param=""} 2\n' in metrics
        quick = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "steps": 1}, timeout=10)
        assert quick.status_code == 200
    finally:
        server.stop()


def _stream_in_thread(url: str, body: dict) -> tuple[threading.Thread, list[str]]:
    lines: list[str] = []

    def read() -> None:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
            lines.extend(line for line in r.iter_lines() if line.startswith("data: "))

    t = threading.Thread(target=read)
    t.start()
    return t, lines


def test_shutdown_finishes_then_cancels(model_and_tokenizer):
    chat = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "stream": True,
            "strategy": "confidence"}
    # a stream that ends within the grace period finishes normally
    server, app = _server(model_and_tokenizer, step_delay=0.02, shutdown_timeout=20.0)
    url = f"http://127.0.0.1:{server.port}"
    t, lines = _stream_in_thread(url, {**chat, "max_tokens": 30, "steps": 30})
    assert _waited(lambda: app.state.scheduler.engine.num_running == 1)
    server.stop()
    t.join(30)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")
    assert app.state.scheduler.draining
    # one that outlives the grace period is cancelled: an error event, then [DONE]; the server exits
    server, app = _server(model_and_tokenizer, step_delay=0.02, shutdown_timeout=0.3)
    url = f"http://127.0.0.1:{server.port}"
    t, lines = _stream_in_thread(url, {**chat, "max_tokens": 200, "steps": 200})
    assert _waited(lambda: app.state.scheduler.engine.num_running == 1)
    t0 = time.monotonic()
    server.stop()
    t.join(30)
    assert time.monotonic() - t0 < 3.0
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["error"]["code"] == "shutting_down"
    assert app.state.scheduler.engine.num_running == 0 and not app.state.scheduler.alive
    assert app.state.errors == {(503, "shutting_down", ""): 1}  # what /metrics says as biglm_errors_total


def _waited(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()
