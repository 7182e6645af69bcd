"""The step stream (``POST /v1/completions/steps``, ``/v1/chat/completions/steps``), ``GET /v1/decoding`` and the
playground page `biglm serve` serves at ``/``, the page driven in a real headless Chromium (Selenium on the system's
chromedriver).

What must hold: the stream's last event holds the text the API answers for the same request, and as many calls as it
sent canvases (each the engine's call, numbered from 1); a refused request is refused with the API's own message; the
page's files are the package's, with nothing fetched from elsewhere; in the browser, a prompt typed and submitted is
drawn call by call, as many times as the server reports calls, ends on the API's text, can be stepped back through,
and a bad input (an empty prompt, a refused value) shows the server's message on the page.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from biglm.serving.cli import BiglmServer, ServeArgs, build_app, playground_url  # noqa: E402
from biglm.serving.playground import FILES, SLOT_FIELDS, asset  # noqa: E402

PROMPT = "To be, or not to be, that is"


@pytest.fixture(scope="module")
def served(checkpoint):
    app = build_app(ServeArgs(checkpoint=str(checkpoint), model_name="tiny"))  # what `biglm serve` runs
    server = BiglmServer(app, port=0).start()
    url = f"http://127.0.0.1:{server.port}"
    yield SimpleNamespace(app=app, url=url, client=httpx.Client(base_url=url, timeout=60))
    server.stop()


@pytest.fixture(scope="module")
def drafting(checkpoint, tmp_path_factory):
    """`biglm serve` of a drafting model (a random `biglm-blocks` model trained on blocks of 1, as `blocks-adapt`
    makes them): its default decoding is speculative (n-gram drafts), which a request naming how to decode replaces."""
    from conftest import save_random_model

    from biglm.checkpoint import load_model

    out = save_random_model(tmp_path_factory.mktemp("drafting"), load_model(checkpoint)[1],
                            prefix_attention="blocks", prefix_block_lengths=[1, 4, 8], initializer_range=0.2)
    app = build_app(ServeArgs(checkpoint=str(out), model_name="drafting"))
    assert app.state.settings.defaults.draft_length > 0  # (the drafting default)
    server = BiglmServer(app, port=0).start()
    url = f"http://127.0.0.1:{server.port}"
    yield SimpleNamespace(app=app, url=url, client=httpx.Client(base_url=url, timeout=60))
    server.stop()


def steps(served, path: str, body: dict) -> list[dict]:
    """The events of a step stream, ``[DONE]`` checked and left out."""
    with served.client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def canvases(calls: list[dict]) -> list[dict]:
    """Each call's whole canvas (its first row), rebuilt from the ``steps.call`` events as a client does: each event's
    slots written into the canvas of the call before (a row of a new length starts from a masked canvas)."""
    out, canvas = [], None
    for e in calls:
        row = e["rows"][0]
        assert row["slots"] == sorted(set(row["slots"])) and all(len(row[k]) == len(row["slots"]) for k in SLOT_FIELDS)
        n = row["length"]
        if canvas is None or len(canvas["tokens"]) != n:
            canvas = {k: ["masked" if k == "states" else None] * n for k in SLOT_FIELDS}
        canvas = {k: list(v) for k, v in canvas.items()}
        for j, s in enumerate(row["slots"]):
            for k in SLOT_FIELDS:
                canvas[k][s] = row[k][j]
        out.append({"prompt": row["prompt"], "length": n, **canvas, "written": row["written"],
                    "new_tokens": row["new_tokens"]})
    return out


def _answer(served, path: str, body: dict) -> str:
    r = served.client.post(path, json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


@pytest.mark.parametrize("settings", [
    {},  # the model's defaults
    {"max_tokens": 12, "steps": 4},  # Mask-Predict: re-masks
    {"max_tokens": 12, "strategy": "confidence", "block_length": 4, "temperature": 0.8, "seed": 3},
    {"max_tokens": 12, "strategy": "confidence", "draft_length": 3, "draft_ngram": 2},  # speculative
])
def test_step_stream_ends_on_the_apis_text_with_a_canvas_per_call(served, settings):
    body = {"prompt": PROMPT, **settings}
    events = steps(served, "/v1/completions/steps", body)
    start, calls, done = events[0], events[1:-1], events[-1]
    assert start["object"] == "steps.start" and start["model"] == "tiny"
    assert start["slots"] == settings.get("max_tokens", 64)
    assert all(e["object"] == "steps.call" for e in calls) and done["object"] == "steps.done"
    assert done["text"] == _answer(served, "/v1/completions", body)
    assert [e["call"] for e in calls] == list(range(1, done["calls"] + 1))
    assert all(len(e["rows"]) == 1 for e in calls)
    for row in canvases(calls):
        assert len(row["tokens"]) == len(row["states"]) == len(row["confidence"]) == len(row["text"]) == row["length"]
        assert row["written"] == sum(t is not None for t in row["tokens"])
        assert all((c is None) == (t is None) for c, t in zip(row["confidence"], row["tokens"]))
        assert all(0 < c <= 1 for c in row["confidence"] if c is not None)
    assert done["usage"]["completion_tokens"] == done["completion_tokens"]
    assert done["tokens_per_call"] == round(done["completion_tokens"] / done["calls"], 4)
    if settings.get("steps"):
        assert any("remasked" in row["states"] for row in canvases(calls))
    if settings.get("draft_length"):  # drafts checked: kept or named as rejected
        assert any("accepted" in row["states"] or any(row["rejected"]) for row in canvases(calls))


def _stream_bytes(served, body: dict) -> tuple[int, list[dict]]:
    with served.client.stream("POST", "/v1/completions/steps", json=body) as r:
        assert r.status_code == 200
        data = r.read()
    events = [json.loads(b[6:]) for b in data.split(b"\n\n") if b.startswith(b"data: {")]
    return len(data), events


def test_the_step_stream_sends_each_call_the_slots_it_changed(served, checkpoint):
    """Each ``steps.call`` event carries the slots its call changed, not the whole canvas: rebuilt call by call, the
    canvases are the frames a `CanvasRecorder` records on `generate_ids` for the same request, and the stream grows
    linearly with the answer (one token per call: 200 tokens cost 4x what 50 cost, not 14x as whole canvases did;
    each event stays a few hundred bytes)."""
    import torch

    from biglm.checkpoint import load_model
    from biglm.generation import DecodingConfig, generate_ids
    from biglm.generation.canvas import CanvasRecorder, token_text

    model, tok = load_model(checkpoint)
    piece = token_text(tok)
    for settings in ({"max_tokens": 16, "steps": 6}, {"max_tokens": 12, "strategy": "confidence", "block_length": 4,
                                                      "temperature": 0.8, "seed": 3}):
        events = steps(served, "/v1/completions/steps", {"prompt": PROMPT, **settings})
        recorder = CanvasRecorder(model.config.mask_token_id)
        ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
        generate_ids(model, torch.tensor([ids]), config=DecodingConfig(**events[0]["decoding"]), on_step=recorder,
                     suppress_ids=range(len(tok), model.config.vocab_size))
        rebuilt = canvases(events[1:-1])
        assert len(rebuilt) == len(recorder.frames) == events[-1]["calls"]
        assert rebuilt == [f.to_json(piece)["rows"][0] for f in recorder.frames]
    sizes = {}
    for n in (50, 200):
        body = {"prompt": PROMPT, "max_tokens": n, "ignore_eos": True, "strategy": "confidence", "block_length": 1}
        sizes[n], events = _stream_bytes(served, body)
        calls = [e for e in events if e["object"] == "steps.call"]
        assert len(calls) == n and max(len(json.dumps(e)) for e in calls) < 600
    assert sizes[200] < 4.5 * sizes[50], sizes


def test_chat_step_stream_ends_on_the_chat_apis_text(served):
    body = {"messages": [{"role": "user", "content": "Speak, friend."}], "max_tokens": 10, "steps": 3}
    events = steps(served, "/v1/chat/completions/steps", body)
    assert events[-1]["text"] == _answer(served, "/v1/chat/completions", body)
    assert events[-1]["calls"] == len(events) - 2 == 3


@pytest.mark.parametrize("body, param, message, as_api", [
    ({"prompt": ""}, "prompt", "prompt is empty", True),
    ({"prompt": PROMPT, "steps": 0}, "steps", "steps=0 must be >= 1", True),
    ({"prompt": PROMPT, "bogus": 1}, "bogus", "unknown or unsupported field", True),
    ({"prompt": PROMPT, "n": 2}, "n", "draws one answer's canvas", False),
    ({"prompt": [PROMPT, PROMPT]}, "prompt", "send one prompt", False),
    ({"prompt": PROMPT, "stream": False}, "stream", "always streams", False),
    ({"prompt": PROMPT, "logprobs": 0}, "logprobs", "not part of /v1/completions/steps", False),
])
def test_step_stream_refuses_what_the_api_refuses_in_its_words(served, body, param, message, as_api):
    r = served.client.post("/v1/completions/steps", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"]
    if as_api:  # the API's own refusal, verbatim
        assert served.client.post("/v1/completions", json=body).json()["error"] == error


def test_decoding_lists_the_request_fields_with_the_servers_defaults(served, checkpoint):
    from biglm.serving.protocol import EXTRA_FIELDS, OPENAI_FIELDS

    info = served.client.get("/v1/decoding").json()
    assert info["model"] == "tiny" and info["max_model_len"] == 256
    fields = {f["name"]: f for f in info["fields"]}
    assert set(fields) == set(OPENAI_FIELDS) | set(EXTRA_FIELDS)
    defaults = served.app.state.settings.defaults
    assert fields["max_tokens"]["default"] == defaults.max_new_tokens
    assert all(fields[n]["default"] == getattr(defaults, n) for n in fields if n != "max_tokens")
    assert fields["strategy"]["kind"] == "choice" and "mask-predict" in fields["strategy"]["choices"]
    assert fields["block_cache"]["choices"] == ["exact", "append"] and fields["block_cache"]["optional"]
    assert fields["early_stop"]["kind"] == "bool" and fields["stop"]["kind"] == "list"
    assert fields["steps"]["help"].startswith("model calls T")
    # a server's --decoding.FIELD is the default the page shows
    from biglm.generation.config import DecodingConfig

    app = build_app(ServeArgs(checkpoint=str(checkpoint), decoding=DecodingConfig(strategy="confidence",
                                                                                  max_new_tokens=20)),
                    given=["strategy", "max_new_tokens"])
    assert app.state.settings.defaults.strategy == "confidence"
    from biglm.serving.playground import decoding_fields

    shown = {f["name"]: f["default"] for f in decoding_fields(app.state.settings.defaults)}
    assert shown["strategy"] == "confidence" and shown["max_tokens"] == 20


def test_the_page_is_the_packages_files_and_fetches_nothing_elsewhere(served):
    for path in ("/", "/playground"):
        r = served.client.get(path)
        assert r.status_code == 200 and r.content == asset("index.html")
        assert r.headers["content-type"].startswith("text/html")
    for name, kind in FILES.items():
        r = served.client.get(f"/playground/{name}")
        assert r.status_code == 200 and r.content == asset(name) and r.headers["content-type"] == kind
        text = asset(name).replace(b'xmlns="http://www.w3.org/2000/svg"', b"")  # (a namespace's name, not fetched)
        assert not re.search(rb"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I), name  # no CDN, no fonts
    # the icon a browser asks for beside every page (it was a 404, an error in the console at every load)
    icon = served.client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.content == asset("favicon.svg")
    assert icon.headers["content-type"] == "image/svg+xml"
    assert b'<link rel="icon" type="image/svg+xml" href="/playground/favicon.svg">' in asset("index.html")
    r = served.client.get("/playground/secrets.txt")
    assert r.status_code == 404 and "no such file" in r.json()["error"]["message"]
    assert playground_url("0.0.0.0", 8000) == "http://127.0.0.1:8000/"
    assert playground_url("::1", 9) == "http://[::1]:9/"


def test_serve_prints_the_playground_url(checkpoint, monkeypatch, capsys):
    from biglm.serving import cli

    import torch

    monkeypatch.setattr(cli.BiglmServer, "run", lambda self: None)  # loaded, printed, not left serving
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # (this process's threads stay as they are)
    assert cli.main([str(checkpoint), "--port", "0"]) == 0
    assert "playground at http://127.0.0.1:0/" in capsys.readouterr().err


# ----- the page in a real browser

def _browser():
    """Headless Chromium through the system's chromedriver (never Selenium Manager's downloads), or a skip naming
    what is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install "
                                                                  "'biglm[browser]'")
    from selenium.webdriver.chrome.service import Service

    driver = shutil.which("chromedriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if driver is None or browser is None:
        pytest.skip("headless Chromium is not installed (as root: apt-get install chromium chromium-driver; "
                    "scripts/quickstart.sh does it)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,800"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, read by _console_errors
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def _wait(driver, state: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while driver.execute_script("return document.body.dataset.state") != state:
        assert time.monotonic() < deadline, driver.execute_script("return document.body.dataset.state")
        time.sleep(0.05)


def _console_errors(driver) -> list[str]:
    """The errors the page's console printed since the last call (a failed load of any resource is one)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _submit(driver, prompt: str) -> None:
    box = driver.find_element("id", "prompt")
    box.clear()
    box.send_keys(prompt)
    driver.find_element("id", "go").click()


def test_the_page_draws_each_call_and_ends_on_the_apis_text_in_a_browser(served, tmp_path):
    driver = _browser()
    from selenium.webdriver.common.action_chains import ActionChains
    text = lambda id_: driver.execute_script(f"return document.getElementById('{id_}').textContent")  # noqa: E731
    try:
        driver.get(served.url + "/")
        _wait(driver, "ready")
        time.sleep(0.5)  # (the icon is asked for after the page loaded)
        assert _console_errors(driver) == []  # /favicon.ico was a 404, an error at every load
        assert driver.find_element("id", "set-max_tokens").get_attribute("value") == "64"  # the defaults filled in
        assert driver.execute_script("return decodingFields()") == {}  # at the defaults: none sent, as the API's call
        _submit(driver, PROMPT)
        _wait(driver, "done")
        canvas = driver.find_element("id", "canvas")
        reported = int(driver.find_element("id", "calls").get_attribute("data-reported"))
        assert reported > 0 and int(canvas.get_attribute("data-draws")) == reported  # redrawn at every call
        assert text("answer") == _answer(served, "/v1/completions", {"prompt": PROMPT})
        slots = canvas.find_elements("css selector", ".slot")
        assert len(slots) == 64
        ActionChains(driver).move_to_element(slots[0]).perform()  # hover: the token and the model's confidence
        assert re.fullmatch(r'slot 1: ".*" · confidence 0\.\d{3} · (new|kept|remasked)', text("slot-info"), re.S)
        driver.save_screenshot(str(tmp_path / "playground.png"))
        assert (tmp_path / "playground.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # a finished answer stepped through call by call
        driver.find_element("id", "first").click()
        assert canvas.get_attribute("data-call") == "1"
        driver.find_element("id", "next").click()
        assert canvas.get_attribute("data-call") == "2"
        driver.find_element("id", "last").click()
        assert canvas.get_attribute("data-call") == str(reported)
        # bad input: the server's message on the page
        _submit(driver, "")
        _wait(driver, "error")
        assert text("error") == served.client.post("/v1/completions", json={"prompt": ""}).json()["error"]["message"]
        steps_box = driver.find_element("id", "set-steps")
        driver.find_element("css selector", "#settings-box summary").click()
        steps_box.clear()
        steps_box.send_keys("0")
        _submit(driver, PROMPT)
        _wait(driver, "error")
        sent = driver.execute_script("return decodingFields()")  # what the page sent: the field changed alone
        assert sent == {"steps": 0}
        refused = served.client.post("/v1/completions", json={"prompt": PROMPT, **sent}).json()["error"]["message"]
        assert text("error") == refused and "steps=0" in refused
        # chat: the chat API's answer
        driver.find_element("id", "reset").click()
        driver.find_element("id", "chat").click()
        _submit(driver, "Speak, friend.")
        _wait(driver, "done")
        messages = [{"role": "user", "content": "Speak, friend."}]
        assert text("answer") == _answer(served, "/v1/chat/completions", {"messages": messages})
        # stop strings: one a line, \\n a newline (the field split them at commas, trimmed, and held no newline)
        driver.find_element("id", "reset").click()
        assert len(_console_errors(driver)) == 2  # (the two refusals above, as the browser logs any 400)
        api = lambda p, body: _answer(served, "/v1/completions", {"prompt": p, **body})  # noqa: E731
        prompt = next(p for p in (PROMPT, "ROMEO: My lord", "Speak, friend.", "KING:\n", "a\nb\nc\n")
                      if "\n" in api(p, {}))  # (a prompt the random model answers with a newline)
        full = api(prompt, {})
        stop = driver.find_element("id", "set-stop")
        stop.send_keys("\\n")
        assert driver.execute_script("return decodingFields()") == {"stop": ["\n"]}
        stop.send_keys("\nzz\\\\q, ")
        assert driver.execute_script("return decodingFields()") == {"stop": ["\n", "zz\\q, "]}
        driver.find_element("id", "chat").click()  # (back to a plain prompt)
        _submit(driver, prompt)
        _wait(driver, "done")
        assert text("answer") == api(prompt, {"stop": ["\n", "zz\\q, "]}) == full[:full.index("\n")]
        assert _console_errors(driver) == []
    finally:
        driver.quit()


def test_the_page_sends_what_was_changed_in_a_browser(drafting):
    """On a drafting model the page sends the settings the user changed and nothing else, as curl with those fields
    would: choosing Mask-Predict (or changing only the block length) is answered, where sending every field shown,
    the default's drafts with it, was refused ("draft_length ... set strategy='confidence'")."""
    driver = _browser()
    from selenium.webdriver.support.ui import Select
    text = lambda id_: driver.execute_script(f"return document.getElementById('{id_}').textContent")  # noqa: E731
    api = lambda body: _answer(drafting, "/v1/completions", {"prompt": PROMPT, **body})  # noqa: E731
    try:
        driver.get(drafting.url + "/")
        _wait(driver, "ready")
        driver.find_element("css selector", "#settings-box summary").click()
        assert driver.find_element("id", "set-draft_length").get_attribute("value") != "0"  # the default's drafts
        Select(driver.find_element("id", "set-strategy")).select_by_visible_text("mask-predict")
        assert driver.execute_script("return decodingFields()") == {"strategy": "mask-predict"}
        _submit(driver, PROMPT)
        _wait(driver, "done")
        assert text("answer") == api({"strategy": "mask-predict"})
        driver.find_element("id", "reset").click()
        box = driver.find_element("id", "set-block_length")
        box.send_keys("4")
        assert driver.execute_script("return decodingFields()") == {"block_length": 4}
        _submit(driver, PROMPT)
        _wait(driver, "done")
        assert text("answer") == api({"block_length": 4})
        assert _console_errors(driver) == []
    finally:
        driver.quit()
