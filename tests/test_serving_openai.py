"""`biglm serve` as OpenAI's and vLLM's clients call it: the fields and shapes current SDKs and curl send, answered as
OpenAI (or, where OpenAI has no rule, vLLM) answers them; and ``usage`` after a stop string.

What must hold: the ``developer`` role is the ``system`` role; ``response_format: {"type": "text"}`` and
``store: false`` are their no-ops (a JSON answer or a stored one is a 400 naming the field); ``stream: null`` is not
streamed while ``"yes"`` or ``1`` is a 400; ``stream_options`` without ``stream: true`` is a 400; a request without
``max_tokens`` whose prompt leaves less than the default gets the rest of the window; a JSON body sent with curl's
default content type is read as JSON; a non-string prompt's error names ``prompt``; and when a stop string ends an
answer, ``usage`` and the log-probabilities count the tokens one token per call writes, however many a call wrote.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")

from biglm.checkpoint import load_model  # noqa: E402
from biglm.serving.app import ServeSettings, create_app  # noqa: E402
from biglm.serving.cli import BiglmServer, ServeArgs, build_app  # noqa: E402

NAME = "tiny-biglm"
PROMPT = "To be, or not to be, that is"
ONE_PER_CALL = {"strategy": "confidence", "block_length": 1, "draft_length": 0}  # what drafting must equal


def _serve(app):
    server = BiglmServer(app, port=0).start()
    url = f"http://127.0.0.1:{server.port}"
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    return server, SimpleNamespace(app=app, url=url, client=client)


@pytest.fixture(scope="module")
def served(checkpoint):
    model, tok = load_model(checkpoint)
    server, out = _serve(create_app(model=model, tokenizer=tok, settings=ServeSettings(model_name=NAME)))
    out.tok = tok
    yield out
    server.stop()


@pytest.fixture(scope="module")
def drafting(checkpoint, tmp_path_factory):
    """`biglm serve` of a random drafting model (`biglm-blocks`, trained on blocks of 1 as `blocks-adapt` makes
    them): its default decoding is speculative, with n-gram drafts."""
    from conftest import save_random_model

    out = save_random_model(tmp_path_factory.mktemp("drafting"), load_model(checkpoint)[1],
                            prefix_attention="blocks", prefix_block_lengths=[1, 4, 8], initializer_range=0.2)
    app = build_app(ServeArgs(checkpoint=str(out), model_name=NAME))
    assert app.state.settings.defaults.draft_length > 0
    server, served = _serve(app)
    yield served
    server.stop()


def _error(r) -> dict:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def _post(served, path: str, body: dict, **kw):
    return httpx.post(served.url + path, json=body, timeout=60, **kw)


def test_the_developer_role_is_the_system_role(served):
    """Current SDKs send the instructions as ``developer``: the same answer as ``system`` (it was a 400)."""
    def ask(role: str, **kw):
        messages = [{"role": role, "content": "You answer in verse."}, {"role": "user", "content": "Who is the king?"}]
        return served.client.chat.completions.create(model=NAME, messages=messages, max_tokens=12, **kw)

    system = ask("system").choices[0].message.content
    assert ask("developer").choices[0].message.content == system
    assert "".join(c.choices[0].delta.content or "" for c in ask("developer", stream=True) if c.choices) == system
    events = [json.loads(line[6:]) for line in httpx.post(
        served.url + "/v1/chat/completions/steps", timeout=60,
        json={"messages": [{"role": "developer", "content": "You answer in verse."},
                           {"role": "user", "content": "Who is the king?"}], "max_tokens": 12}).text.splitlines()
              if line.startswith("data: {")]
    assert events[-1]["text"] == system


def test_response_format_text_and_store_false_are_accepted_and_json_is_refused(served):
    messages = [{"role": "user", "content": "Speak, friend."}]
    plain = served.client.chat.completions.create(model=NAME, messages=messages, max_tokens=8)
    same = served.client.chat.completions.create(model=NAME, messages=messages, max_tokens=8,
                                                 response_format={"type": "text"}, store=False)
    assert same.choices[0].message.content == plain.choices[0].message.content
    text = served.client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8)
    assert served.client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8, extra_body={
        "response_format": {"type": "text"}}).choices[0].text == text.choices[0].text  # (vLLM takes it here too)
    for body, param, code in (({"response_format": {"type": "json_object"}}, "response_format", "unsupported_value"),
                              ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                               "response_format", "unsupported_value"),
                              ({"response_format": "text"}, "response_format", "invalid_value"),
                              ({"store": True}, "store", "unsupported_value")):
        r = _post(served, "/v1/chat/completions", {"messages": messages, **body})
        assert r.status_code == 400 and (_error(r)["param"], _error(r)["code"]) == (param, code), r.text
    with pytest.raises(openai.BadRequestError, match="writes text only"):
        served.client.chat.completions.create(model=NAME, messages=messages, response_format={"type": "json_object"})


def test_stream_null_is_not_streamed_and_a_non_boolean_is_a_400(served):
    """``stream: null`` is OpenAI's default (one JSON answer); ``"yes"`` or ``1`` is not a boolean: a 400 naming
    ``stream`` (both were streamed). The step stream takes null as left out."""
    body = {"prompt": PROMPT, "max_tokens": 6}
    whole = _post(served, "/v1/completions", body).json()["choices"][0]["text"]
    r = _post(served, "/v1/completions", {**body, "stream": None})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    assert r.json()["choices"][0]["text"] == whole
    for bad in ("yes", 1, "true", 0):
        for path in ("/v1/completions", "/v1/completions/steps"):
            r = _post(served, path, {**body, "stream": bad})
            assert r.status_code == 400 and _error(r)["param"] == "stream", (bad, r.text)
    r = _post(served, "/v1/completions", {**body, "echo": "yes"})
    assert r.status_code == 400 and _error(r)["param"] == "echo"
    r = _post(served, "/v1/completions/steps", {**body, "stream": None})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")


def test_stream_options_go_with_stream_true(served):
    """OpenAI refuses ``stream_options`` on a request that is not streamed (it was accepted and ignored)."""
    for extra in ({}, {"stream": False}, {"stream": None}):
        r = _post(served, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, **extra,
                                              "stream_options": {"include_usage": True}})
        assert r.status_code == 400 and _error(r)["param"] == "stream_options", r.text
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        served.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                              stream_options={"include_usage": True})
    chunks = list(served.client.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, stream=True,
                                                   stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens >= 0


def test_without_max_tokens_a_long_prompt_gets_the_rest_of_the_window(served):
    """As vLLM answers: a request that leaves ``max_tokens`` out has the server's default answer length, or the rest
    of the model's window where its prompt leaves less (it was a 400); a ``max_tokens`` it names must still fit, and
    a prompt that fills the window is still a 400."""
    window = served.app.state.scheduler.engine.model.config.max_position_embeddings  # 256; the default is 64
    prompt = [5, 6, 7, 8] * 59  # 236 token ids: 20 left
    out = served.client.completions.create(model=NAME, prompt=prompt, extra_body={"ignore_eos": True, "steps": 4})
    assert out.usage.completion_tokens == window - len(prompt) == 20 and out.choices[0].finish_reason == "length"
    events = [json.loads(line[6:]) for line in _post(served, "/v1/completions/steps", {"prompt": prompt}).text
              .splitlines() if line.startswith("data: {")]
    assert events[0]["slots"] == 20 and events[0]["decoding"]["max_new_tokens"] == 20
    short = served.client.completions.create(model=NAME, prompt=prompt[:8], extra_body={"ignore_eos": True,
                                                                                       "steps": 4})
    assert short.usage.completion_tokens == 64  # the default where it fits
    both = served.client.completions.create(model=NAME, prompt=[prompt, prompt[:8]],
                                            extra_body={"ignore_eos": True, "steps": 4})  # each its own rest
    assert both.usage.completion_tokens == 20 + 64
    for body, param in (({"prompt": prompt, "max_tokens": 21}, "prompt"), ({"prompt": [5] * window}, "prompt")):
        r = _post(served, "/v1/completions", body)
        assert r.status_code == 400 and _error(r)["param"] == param and _error(r)["code"] == "context_length_exceeded"
    from biglm.generation.chat import render_chat

    words = ""
    while len(served.tok(render_chat(served.tok, [{"role": "user", "content": words}]))["input_ids"]) < window - 30:
        words += "the king "
    chat = served.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": words}],
                                                 extra_body={"ignore_eos": True, "steps": 4})
    assert chat.usage.total_tokens == window and chat.usage.completion_tokens < 64


def test_a_json_body_sent_with_curls_default_content_type_is_read_as_json(served):
    """``curl -d '{...}'`` sends ``application/x-www-form-urlencoded``: the body is still the API's JSON (it was
    refused as "the body must be a JSON object"); a body that is no JSON is refused as such."""
    body = {"prompt": PROMPT, "max_tokens": 6}
    want = _post(served, "/v1/completions", body).json()["choices"][0]["text"]
    for kind in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"content-type": kind} if kind else {}
        r = httpx.post(served.url + "/v1/completions", content=json.dumps(body).encode(), headers=headers, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want, (kind, r.text)
    r = httpx.post(served.url + "/v1/completions", content=b"prompt=hi&max_tokens=4",
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and _error(r)["code"] == "invalid_json"


@pytest.mark.parametrize("prompt, got", [(5, "an integer"), (["a", 5], "an array of neither"), ({"a": 1}, "an object"),
                                         (None, "null"), (1.5, "a number")])
def test_a_prompt_of_another_type_names_the_prompt(served, prompt, got):
    """The error of a prompt that is neither text nor token ids names ``prompt`` (it named pydantic's union member,
    ``prompt.str``) and says what a prompt may be."""
    r = _post(served, "/v1/completions", {"prompt": prompt, "max_tokens": 4})
    assert r.status_code == 400 and _error(r)["param"] == "prompt", r.text
    assert _error(r)["message"] == f"prompt must be str, list[str], list[int] or list[list[int]], got {got}."
    r = _post(served, "/v1/completions", {"prompt": "x", "stream": True, "stream_options": {"include_usage": "maybe"}})
    assert r.status_code == 400 and _error(r)["param"] == "stream_options.include_usage", r.text


def _usage_and_logprobs(served, body: dict) -> tuple[str, int, int]:
    out = _post(served, "/v1/completions", {"prompt": PROMPT, "max_tokens": 40, "logprobs": 0, **body}).json()
    choice = out["choices"][0]
    return choice["text"], out["usage"]["completion_tokens"], len(choice["logprobs"]["tokens"])


def test_usage_after_a_stop_string_counts_what_one_token_per_call_writes(drafting):
    """A speculative call keeps several drafts at once, so it can write tokens past the stop string that ends the
    answer; ``usage`` and the log-probabilities count the tokens up to the one that completes the stop string, as
    one token per call writes them (they counted up to 4 more). Streamed, the usage chunk says the same."""
    def written() -> float:  # the tokens the engine wrote, from /metrics
        lines = httpx.get(drafting.url + "/metrics").text.splitlines()
        return float(next(line.split()[1] for line in lines if line.startswith("biglm_tokens_written_total ")))

    full, n, _ = _usage_and_logprobs(drafting, {})
    assert n == 40 and full == _usage_and_logprobs(drafting, ONE_PER_CALL)[0]
    past = 0
    for k in range(2, len(full) - 2, 3):
        stop = full[k:k + 2]
        if "\ufffd" in stop:  # (part of a character: its text changes as the next token completes it)
            continue
        before = written()
        speculative = _usage_and_logprobs(drafting, {"stop": [stop]})
        past += written() - before - speculative[1]  # the tokens drafted past the stop
        assert speculative == _usage_and_logprobs(drafting, {"stop": [stop], **ONE_PER_CALL}), stop
        chunks = list(drafting.client.completions.create(model=NAME, prompt=PROMPT, max_tokens=40, stop=[stop],
                                                         stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens == speculative[1]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == speculative[0]
    assert past > 0  # (calls did write past a stop string: the case this test is about)
