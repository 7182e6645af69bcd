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
from biglm.serving.playground import FILES, asset  # noqa: E402

PROMPT = "To be, or not to be, that is"


@pytest.fixture(scope="module")
def served(checkpoint):
    app = build_app(ServeArgs(checkpoint=str(checkpoint), model_name="tiny"))  # what `biglm serve` runs
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
    for e in calls:
        (row,) = e["rows"]
        assert len(row["tokens"]) == len(row["states"]) == len(row["confidence"]) == len(row["text"]) == row["length"]
        assert row["written"] == sum(t is not None for t in row["tokens"])
        assert all((c is None) == (t is None) for c, t in zip(row["confidence"], row["tokens"]))
        assert all(0 < c <= 1 for c in row["confidence"] if c is not None)
    assert done["usage"]["completion_tokens"] == done["completion_tokens"]
    assert done["tokens_per_call"] == round(done["completion_tokens"] / done["calls"], 4)
    if settings.get("steps"):
        assert any("remasked" in e["rows"][0]["states"] for e in calls)
    if settings.get("draft_length"):  # drafts checked: kept or named as rejected
        assert any("accepted" in e["rows"][0]["states"] or any(e["rows"][0]["rejected"]) for e in calls)


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
        assert not re.search(rb"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", asset(name), re.I), name  # no CDN, no fonts
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
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def _wait(driver, state: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while driver.execute_script("return document.body.dataset.state") != state:
        assert time.monotonic() < deadline, driver.execute_script("return document.body.dataset.state")
        time.sleep(0.05)


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
        sent = driver.execute_script("return decodingFields()")  # what the page sent: every field, steps 0
        assert sent["steps"] == 0
        refused = served.client.post("/v1/completions", json={"prompt": PROMPT, **sent}).json()["error"]["message"]
        assert text("error") == refused and "steps=0" in refused
        # chat: the chat API's answer
        driver.find_element("id", "reset").click()
        driver.find_element("id", "chat").click()
        _submit(driver, "Speak, friend.")
        _wait(driver, "done")
        messages = [{"role": "user", "content": "Speak, friend."}]
        assert text("answer") == _answer(served, "/v1/chat/completions", {"messages": messages})
    finally:
        driver.quit()
