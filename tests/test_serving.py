"""`biglm serve`: a real uvicorn server on a loopback port, called with the official `openai` client.

What must hold: completions and a streamed chat completion are the answers of
`biglm.generation.api.generate` with the same settings and seed (the chunks concatenate to the
whole answer); bad requests get a 4xx with OpenAI's error JSON and the server keeps serving; a
client that disconnects mid-stream cancels its engine request.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")

from biglm.checkpoint import load_model  # noqa: E402
from biglm.generation.api import generate  # noqa: E402
from biglm.generation.chat import render_chat  # noqa: E402
from biglm.serving.app import ServeSettings, TextStream, create_app  # noqa: E402
from biglm.serving.cli import BiglmServer, main  # noqa: E402

NAME = "tiny-biglm"
PROMPTS = ["To be, or not to be, that is", "ROMEO: My lord"]


@pytest.fixture(scope="module")
def served(checkpoint):
    model, tok = load_model(checkpoint)
    app = create_app(model=model, tokenizer=tok, settings=ServeSettings(model_name=NAME, max_batch_rows=8,
                                                                        max_queue=16))
    server = BiglmServer(app, port=0).start()
    url = f"http://127.0.0.1:{server.port}"
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield SimpleNamespace(model=model, tok=tok, app=app, url=url, client=client)
    server.stop()


def _wait(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _healthy(url: str) -> dict:
    r = httpx.get(url + "/health")
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("settings", [
    dict(max_tokens=12, temperature=0.9, top_p=0.95, seed=3, steps=5),  # sampled Mask-Predict
    dict(max_tokens=12, strategy="confidence", block_length=4, seed=1),  # greedy, semi-autoregressive blocks
])
def test_completions_equal_generate(served, settings):
    extra = {k: settings[k] for k in ("steps", "strategy", "block_length") if k in settings}
    openai_args = {k: v for k, v in settings.items() if k not in extra}
    out = served.client.completions.create(model=NAME, prompt=PROMPTS, extra_body=extra, **openai_args)
    cfg = {("max_new_tokens" if k == "max_tokens" else k): v for k, v in settings.items()}
    # each prompt is its own engine request with its own seeded generator: compare one prompt at a time
    want = [generate(served.model, served.tok, [p], **cfg)[0] for p in PROMPTS]
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == want
    assert all(c.finish_reason in ("stop", "length") for c in out.choices)
    prompt_tokens = sum(len(served.tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS)
    assert out.usage.prompt_tokens == prompt_tokens
    assert out.usage.total_tokens == prompt_tokens + out.usage.completion_tokens
    assert out.model == NAME and out.object == "text_completion"


def test_streamed_chat_equals_generate(served):
    messages = [{"role": "system", "content": "You answer in verse."},
                {"role": "user", "content": "Who is the king?"}]
    settings = dict(max_new_tokens=16, strategy="confidence", block_length=4, temperature=0.7, seed=11)
    stream = served.client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=16, temperature=0.7, seed=11, stream=True,
        stream_options={"include_usage": True}, extra_body={"strategy": "confidence", "block_length": 4})
    chunks = list(stream)
    want = generate(served.model, served.tok, [render_chat(served.tok, messages)], **settings)[0]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == want
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and chunks[-2].choices[0].finish_reason == finals[0]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 0
    # non-streamed: the same answer in one message
    whole = served.client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, temperature=0.7,
                                                  seed=11, extra_body={"strategy": "confidence", "block_length": 4})
    assert whole.choices[0].message.content == want and whole.choices[0].message.role == "assistant"


def _biglm_generate(checkpoint, prompt: str, capsys, **flags) -> str:
    from conftest import biglm_generate_answer

    return biglm_generate_answer(checkpoint, prompt, capsys, **flags)


def test_openai_client_equals_the_biglm_generate_command(served, checkpoint, capsys):
    """The official client's completion and streamed chat completion are what `biglm generate` prints for the
    same settings and seed (the chat prompt rendered with the model's chat template)."""
    flags = dict(max_new_tokens=12, strategy="confidence", block_length=4, temperature=0.8, top_p=0.9, seed=4)
    extra = {"strategy": "confidence", "block_length": 4}
    sampling = dict(max_tokens=12, temperature=0.8, top_p=0.9, seed=4)
    text = served.client.completions.create(model=NAME, prompt=PROMPTS[0], extra_body=extra, **sampling)
    assert text.choices[0].text == _biglm_generate(checkpoint, PROMPTS[0], capsys, **flags)
    messages = [{"role": "user", "content": "Speak, friend."}]
    stream = served.client.chat.completions.create(model=NAME, messages=messages, stream=True, extra_body=extra,
                                                   **sampling)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == _biglm_generate(checkpoint, render_chat(served.tok, messages), capsys, **flags)


def test_speculative_completion_equals_the_biglm_generate_command(served, checkpoint, capsys):
    """A request with ``draft_length`` runs speculative decoding in the engine: greedy, the completion is what one
    token per call writes (`biglm generate --strategy confidence --block_length 1 --block_cache append`, no drafts:
    the answer speculative decoding promises, not the speculative path compared with itself); sampled with a seed,
    what `biglm generate` prints with the same flags. Streamed chunks add up to it, and /health's ``stats.positions``
    grows by the positions its calls computed (generate_ids' count less the prompt's pass)."""
    from biglm.generation import DecodingConfig, generate_ids

    one_per_call = _biglm_generate(checkpoint, PROMPTS[0], capsys, max_new_tokens=12, strategy="confidence",
                                   block_length=1, block_cache="append")
    for flags in (dict(max_new_tokens=12, strategy="confidence", draft_length=2),
                  dict(max_new_tokens=12, strategy="confidence", draft_length=2, temperature=0.9, seed=6)):
        extra = {k: flags[k] for k in ("strategy", "draft_length")}
        sampling = {"max_tokens": 12, **{k: flags[k] for k in ("temperature", "seed") if k in flags}}
        with pytest.warns(UserWarning, match="approximation"):  # a paper model, as `biglm generate` warns too
            want = _biglm_generate(checkpoint, PROMPTS[0], capsys, **flags)
        if "seed" not in flags:  # greedy: one token per call's answer, whoever wrote it
            assert want == one_per_call
        before = _healthy(served.url)["stats"].get("positions", 0)  # (none before the first step)
        text = served.client.completions.create(model=NAME, prompt=PROMPTS[0], extra_body=extra, **sampling)
        after = _healthy(served.url)["stats"]["positions"]
        assert text.choices[0].text == want
        ids = served.tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
        cfg = DecodingConfig(**{k: v for k, v in flags.items()})
        with pytest.warns(UserWarning, match="approximation"):
            alone = generate_ids(served.model, torch.tensor([ids]), config=cfg,
                                 suppress_ids=range(len(served.tok), served.model.config.vocab_size))
        assert after - before == alone.positions - len(ids) > 0
        streamed = served.client.completions.create(model=NAME, prompt=PROMPTS[0], extra_body=extra, stream=True,
                                                    **sampling)
        assert "".join(c.choices[0].text for c in streamed) == want


def test_n_choices_and_stop(served):
    out = served.client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=10, temperature=1.0, seed=5,
                                           n=3, extra_body={"steps": 4})
    texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    # choice j samples with seed + j
    assert texts == [generate(served.model, served.tok, [PROMPTS[0]], max_new_tokens=10, temperature=1.0,
                              seed=5 + j, steps=4)[0] for j in range(3)]
    full = served.client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=16).choices[0].text
    assert len(full) > 4
    stop = full[2:4]
    cut = served.client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=16, stop=[stop]).choices[0]
    assert cut.text == full[:full.find(stop)] and cut.finish_reason == "stop"
    streamed = served.client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=16, stop=[stop],
                                                stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut.text


def test_models_and_health(served):
    models = served.client.models.list()
    assert [m.id for m in models.data] == [NAME]
    body = _healthy(served.url)
    assert body["status"] == "ok" and body["model"] == NAME


def _errors(url: str) -> dict[tuple[str, str, str], float]:
    """/metrics' ``biglm_errors_total``: (status, code, param) -> count."""
    import re

    text = httpx.get(url + "/metrics").text
    assert "# TYPE biglm_errors_total counter" in text
    return {m[:3]: float(m[3]) for m in re.findall(
        r'^biglm_errors_total\{status="(\d+)",code="([^"]*)",param="([^"]*)"\} (\S+)$', text, re.M)}


def _error(r) -> dict:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("body,status,param", [
    ("{not json", 400, None),
    ({"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ({"prompt": "hi", "max_tokens": 100_000}, 400, "max_tokens"),
    ({"prompt": "hi there", "max_tokens": 254}, 400, "prompt"),  # fits alone, not beside the prompt
    ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "hi", "steps": -1}, 400, "steps"),
    ({"prompt": "hi", "steps": 10**9}, 400, "steps"),
    ({"prompt": "", "max_tokens": 4}, 400, "prompt"),
    ({"prompt": [], "max_tokens": 4}, 400, "prompt"),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "hi", "strategy": "beam"}, 400, "strategy"),
    ({"prompt": "hi", "threshold": 2}, 400, "threshold"),
    ({"prompt": "hi", "block_length": 0}, 400, "block_length"),
    ({"prompt": "hi", "draft_length": 2}, 400, "strategy"),  # speculative decoding is confidence decoding's
    ({"prompt": "hi", "strategy": "confidence", "draft_length": 2, "steps": 4}, 400, "steps"),
    ({"prompt": "hi", "strategy": "confidence", "draft_length": 2, "draft_accept": 0.5, "temperature": 1}, 400,
     "draft_accept"),  # below 1: greedy only
    ({"prompt": "hi", "draft_accept": 0.5}, 400, "draft_accept"),
    ({"prompt": "hi", "logprobs": 2}, 400, "logprobs"),  # unsupported: refused, not ignored
    ({"max_tokens": 4}, 400, "prompt"),
    ({"prompt": "hi", "n": 0}, 400, "n"),
])
def test_bad_completion_requests(served, body, status, param):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    r = httpx.post(served.url + "/v1/completions", **kw)
    assert r.status_code == status, r.text
    assert _error(r)["param"] == param


@pytest.mark.parametrize("messages", [[], "hello", [{"role": "wizard", "content": "hi"}],
                                      [{"role": "user", "content": 3}], [{"role": "system", "content": "only"}]])
def test_bad_chat_messages(served, messages):
    r = httpx.post(served.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert _error(r)["param"] == "messages"


def test_server_keeps_serving_after_errors(served):
    for _ in range(3):
        assert httpx.post(served.url + "/v1/completions", content=b"\xff\xfe", headers={"content-type":
                                                                                     "application/json"}).status_code == 400
    assert httpx.get(served.url + "/v1/nowhere").status_code == 404
    _healthy(served.url)
    assert served.client.completions.create(model=NAME, prompt="Hello", max_tokens=4).choices[0].finish_reason


def test_disconnect_mid_stream_cancels(served, monkeypatch):
    scheduler = served.app.state.scheduler
    engine = scheduler.engine
    before = scheduler.stats["cancelled"]
    step = engine.step

    def slow_step():  # 250 steps of at least 20 ms: the answer cannot finish before the client leaves
        time.sleep(0.02)
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    gone = _errors(served.url).get(("499", "client_disconnected", ""), 0)
    body = {"model": NAME, "prompt": "The", "max_tokens": 250, "steps": 250, "stream": True}
    with httpx.Client(timeout=30) as c, c.stream("POST", served.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert _wait(lambda: engine.num_running == 1)
        time.sleep(0.1)
    # the client is gone: the engine request is cancelled long before its 250 steps
    assert _wait(lambda: scheduler.in_flight == 0 and engine.num_running == 0 and engine.num_waiting == 0,
                 timeout=3.0), (scheduler.in_flight, engine.num_running)
    assert scheduler.stats["cancelled"] == before + 1
    assert _errors(served.url)[("499", "client_disconnected", "")] == gone + 1  # /metrics counts the client's leaving
    _healthy(served.url)


def test_a_client_gone_before_its_whole_answer_cancels_it(served, monkeypatch):
    """A non-streamed request whose client leaves (a client-side timeout closes the connection) is cancelled in the
    engine at once: the server hears the disconnect on the connection (`app._gone`), it does not poll for it."""
    scheduler = served.app.state.scheduler
    engine = scheduler.engine
    cancelled, gone = scheduler.stats["cancelled"], scheduler.stats["disconnects"]
    step = engine.step

    def slow_step():  # 250 steps of at least 20 ms: the answer cannot finish before the client leaves
        time.sleep(0.02)
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    body = {"model": NAME, "prompt": "The", "max_tokens": 250, "steps": 250}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
    assert _wait(lambda: scheduler.in_flight == 0 and engine.num_running == 0 and engine.num_waiting == 0,
                 timeout=3.0), (scheduler.in_flight, engine.num_running)
    assert scheduler.stats["cancelled"] == cancelled + 1 and scheduler.stats["disconnects"] == gone + 1
    assert _errors(served.url)[("499", "client_disconnected", "")] == gone + 1  # (every disconnect so far)
    _healthy(served.url)


def test_text_stream_holds_back_what_may_change(served):
    tok = served.tok
    ids = tok("Hello world, dear friend", add_special_tokens=False)["input_ids"]
    stream = TextStream(tok, eos_id=served.model.config.eos_token_id, stop=["dear"])
    pieces = [stream.update(ids[:k]) for k in range(len(ids) + 1)]
    assert stream.finish_reason == "stop" and "".join(pieces) == stream.text == "Hello world, "
    assert not any("de" in p for p in pieces)


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    assert main(["--help"]) == 0
    assert main([]) == 2
    assert main([str(tmp_path / "missing")]) == 2
    assert "no model at" in capsys.readouterr().err
    assert main([str(tmp_path), "--port", "70000"]) == 2
    assert main([str(tmp_path), "--max_batch_rows", "0"]) == 2
    assert main([str(tmp_path), "--decoding.steps", "0"]) == 2
    capsys.readouterr()
    assert main([str(tmp_path), "--max_prompt_chars", "0"]) == 2
    assert "--max_prompt_chars 0 must be >= 1" in capsys.readouterr().err
    assert main([str(tmp_path), "--threads", "0"]) == 2
    assert "--threads 0: must be >= 1" in capsys.readouterr().err
    assert main([str(tmp_path), "--threads", "2", "--replicas", "2"]) == 2
    assert "--replica_cpus" in capsys.readouterr().err
    for bad in ("-1", "inf"):
        assert main([str(tmp_path), "--prompt_cache_mb", bad]) == 2
        assert "--prompt_cache_mb" in capsys.readouterr().err


def test_cpu_threads_leave_a_core_to_the_front_end():
    from biglm.serving.cli import ServeArgs, cpu_threads

    args = ServeArgs(checkpoint="m", device="cpu")
    assert [cpu_threads(args, cores=n) for n in (1, 2, 16)] == [1, 1, 15]
    assert cpu_threads(ServeArgs(checkpoint="m", device="cpu", threads=2), cores=2) == 2


def test_serve_decodes_a_fine_tuned_model_with_its_saved_settings_as_generate_does(checkpoint, tmp_path, capsys):
    """A fine-tuned model's saved decoding settings (answer length, steps, length beam) are the server's defaults, as
    they are `biglm generate`'s (one function, `model_decoding`); a flag given explicitly still wins in both."""
    from biglm.config import given_options, parse_cli
    from biglm.generation.cli import GenerateArgs, cli_decoding
    from biglm.generation.config import DecodingConfig
    from biglm.serving.cli import ServeArgs, build_app

    model, tok = load_model(checkpoint)
    saved = {"max_new_tokens": 9, "steps": 3, "length_beam": 2}  # none of them DecodingConfig's default
    model.config.task_specific_params = {"seq2seq": {**saved, "source_template": "{source}"}}
    tuned = tmp_path / "tuned"
    model.save_pretrained(tuned)
    tok.save_pretrained(tuned)
    app = build_app(ServeArgs(checkpoint=str(tuned), device="cpu"), given=[])
    assert app.state.settings.defaults == DecodingConfig(**saved)
    server = BiglmServer(app, port=0).start()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0,
                               timeout=60)
        name = app.state.settings.model_name
        for prompt in PROMPTS:  # a request that leaves the options out: the model's saved settings
            served = client.completions.create(model=name, prompt=prompt).choices[0].text
            assert served == _biglm_generate(tuned, prompt, capsys)
            assert served == generate(model, tok, [prompt])[0]  # generate() without a config: the model's too
            assert served != generate(model, tok, [prompt], config=DecodingConfig())[0]  # not the plain defaults
        chat = [{"role": "user", "content": "Speak, friend."}]
        served = client.chat.completions.create(model=name, messages=chat).choices[0].message.content
        assert served == _biglm_generate(tuned, render_chat(tok, chat), capsys)
    finally:
        server.stop()
    # explicit options over the saved ones: `biglm serve --decoding.steps 5` = `biglm generate --steps 5`
    serve_argv = [str(tuned), "--decoding.steps", "5", "--device", "cpu"]
    given = list(given_options(ServeArgs, serve_argv)["decoding"])
    served_cfg = build_app(parse_cli(ServeArgs, serve_argv, prog="biglm serve", positionals=("checkpoint",)),
                           given=given).state.settings.defaults
    gen_argv = [str(tuned), "--prompt", "x", "--steps", "5"]
    gen_cfg = cli_decoding(parse_cli(GenerateArgs, gen_argv, prog="biglm generate", positionals=("checkpoint",)),
                           gen_argv, model)
    assert served_cfg == gen_cfg == DecodingConfig(**{**saved, "steps": 5})
    # a default value given explicitly is an override too (not mistaken for "left out")
    gen_argv = [str(tuned), "--prompt", "x", "--length_beam", "1"]
    assert cli_decoding(parse_cli(GenerateArgs, gen_argv, prog="biglm generate", positionals=("checkpoint",)),
                        gen_argv, model).length_beam == 1


class _Tokenizer:
    """A served model's tokenizer with hooks: ``on_call`` runs before each tokenization (a slow or failing one),
    ``on_decode`` before each decode; ``calls`` counts tokenizations."""

    def __init__(self, tok, *, on_call=None, on_decode=None) -> None:
        self._tok, self._on_call, self._on_decode, self.calls = tok, on_call, on_decode, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self._on_call is not None:
            self._on_call()
        return self._tok(*args, **kwargs)

    def decode(self, *args, **kwargs):
        if self._on_decode is not None:
            self._on_decode()
        return self._tok.decode(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._tok)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def _server_with(served, tokenizer, **settings) -> BiglmServer:
    app = create_app(model=served.model, tokenizer=tokenizer, settings=ServeSettings(model_name=NAME, **settings))
    return BiglmServer(app, port=0).start()


def test_a_long_prompt_is_tokenized_off_the_event_loop_and_bounded_before(served):
    """A prompt just under ``max_prompt_chars`` whose tokenization takes 3 s (a slow tokenizer) does not hold up
    /health; one over the bound is refused (400 naming the limit and the option) without being tokenized, in
    completions and chat alike. The default bound is 32 characters per position of the model's window."""
    import threading

    tokenizing = threading.Event()

    def slow() -> None:
        tokenizing.set()
        time.sleep(3.0)

    tok = _Tokenizer(served.tok, on_call=slow)
    server = _server_with(served, tok, max_prompt_chars=1000)
    url = f"http://127.0.0.1:{server.port}"
    try:
        result = {}
        long = threading.Thread(target=lambda: result.update(r=httpx.post(
            url + "/v1/completions", json={"prompt": "a b " * 249 + "end", "max_tokens": 4}, timeout=30)))
        long.start()
        assert tokenizing.wait(10)
        start = time.monotonic()
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        assert time.monotonic() - start < 1.0  # not the 3 s the tokenizer still takes
        long.join(30)
        assert result["r"].status_code == 400 and _error(result["r"])["code"] == "context_length_exceeded"
        assert "tokens and max_tokens=4" in _error(result["r"])["message"]  # tokenized, then refused for its tokens
        calls = tok.calls
        for path, body, param in [("/v1/completions", {"prompt": "x" * 1001}, "prompt"),
                                  ("/v1/completions", {"prompt": ["ok", "x" * 1001]}, "prompt"),
                                  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 600},
                                                                         {"role": "user", "content": "y" * 401}]},
                                   "messages")]:
            r = httpx.post(url + path, json={**body, "max_tokens": 4}, timeout=30)
            assert r.status_code == 400, r.text
            error = _error(r)
            assert error["param"] == param and error["code"] == "context_length_exceeded"
            assert "1001 characters" in error["message"] and "(1000: `biglm serve --max_prompt_chars`" in error["message"]
        assert tok.calls == calls  # refused before tokenizing
    finally:
        server.stop()
    window = served.model.config.max_position_embeddings
    r = httpx.post(served.url + "/v1/completions", json={"prompt": "x" * (32 * window + 1), "max_tokens": 4})
    assert r.status_code == 400 and f"({32 * window}: `biglm serve --max_prompt_chars`" in _error(r)["message"]


@pytest.mark.parametrize("raw,param", [
    (r'{"prompt": "hi \ud800 there", "max_tokens": 4}', "prompt"),
    (r'{"prompt": ["fine", "\udfff"], "max_tokens": 4}', "prompt.1"),
    (r'{"prompt": "hi", "stop": ["\ud800"], "max_tokens": 4}', "stop.0"),
    (r'{"prompt": "hi", "model": "x\ud800", "max_tokens": 4}', "model"),
    (r'{"prompt": "hi", "\ud800": 1}', "body"),
    (r'{"messages": [{"role": "user", "content": "hi \ud800"}], "max_tokens": 4}', "messages.0.content"),
])
def test_lone_surrogates_are_refused_as_400(served, raw, param):
    """JSON's escape spells a lone UTF-16 surrogate, which is not Unicode text: a 400 in OpenAI's format naming
    where it is (it was a plain-text 500 from the tokenizer); a proper surrogate pair is one character and serves."""
    path = "/v1/chat/completions" if "messages" in raw else "/v1/completions"
    r = httpx.post(served.url + path, content=raw.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = _error(r)
    assert error["code"] == "invalid_unicode" and error["param"] == param and "surrogate" in error["message"]
    pair = httpx.post(served.url + "/v1/completions", content=rb'{"prompt": "hi \ud83d\ude00", "max_tokens": 4}',
                      headers={"content-type": "application/json"})
    assert pair.status_code == 200, pair.text


def test_an_unexpected_failure_is_a_500_in_the_openai_format(served):
    """Any exception a handler did not expect is answered as OpenAI's error JSON (500 ``server_error``), not as
    plain text; in a stream already started it is an error event before ``[DONE]``. The server keeps serving."""
    def fail() -> None:
        raise RuntimeError("boom")

    for hooks in ({"on_call": fail}, {"on_decode": fail}):
        server = _server_with(served, _Tokenizer(served.tok, **hooks))
        url = f"http://127.0.0.1:{server.port}"
        try:
            r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=30)
            assert r.status_code == 500, r.text
            error = _error(r)
            assert error["type"] == "server_error" and error["code"] == "internal_error"
            assert "RuntimeError" in error["message"]
            if "on_decode" in hooks:
                with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/completions", json={
                        "prompt": "hi", "max_tokens": 8, "strategy": "confidence", "block_length": 4,
                        "stream": True}) as s:
                    lines = [line for line in s.iter_lines() if line.startswith("data: ")]
                assert s.status_code == 200 and lines[-1] == "data: [DONE]"
                assert json.loads(lines[-2][6:])["error"]["code"] == "internal_error"
            # /metrics counts them, the one in a stream too
            assert _errors(url) == {("500", "internal_error", ""): 2 if "on_decode" in hooks else 1}
            assert httpx.get(url + "/health").status_code == 200
        finally:
            server.stop()


def test_health_is_200_while_a_deployment_is_degraded(served):
    """A deployment hook saying "degraded" (some replicas down, this one serving) is 200, so a load balancer keeps
    the service; a hook saying nothing serves is 503."""
    async def degraded():
        return {"status": "degraded", "replicas_healthy": 1}

    async def down():
        return {"status": "unavailable", "replicas_healthy": 0}

    for hook, status in ((degraded, 200), (down, 503)):
        app = create_app(model=served.model, tokenizer=served.tok, settings=ServeSettings(model_name=NAME),
                         health=hook)
        server = BiglmServer(app, port=0).start()
        try:
            r = httpx.get(f"http://127.0.0.1:{server.port}/health")
            assert r.status_code == status and r.json()["status"] == hook.__name__.replace("down", "unavailable")
        finally:
            server.stop()


def test_a_refused_saved_setting_names_the_servers_flag(checkpoint):
    """A model's saved decoding value that an explicit option makes invalid is said to be the model's, with the
    server's own spelling of the flag that clears it (`--decoding.steps none`, not `biglm generate`'s `--steps`)."""
    from biglm.generation.config import DecodingConfig, DecodingError
    from biglm.serving.cli import ServeArgs, server_defaults

    model, _ = load_model(checkpoint)
    model.config.task_specific_params = {"seq2seq": {"steps": 10}}
    args = ServeArgs(checkpoint=str(checkpoint), device="cpu",
                     decoding=DecodingConfig(strategy="confidence", draft_length=3))
    with pytest.raises(DecodingError, match="model's saved decoding setting") as e:
        server_defaults(model.config, args, given=["strategy", "draft_length"])
    assert str(e.value).endswith("clear it with --decoding.steps none.")


def test_ignore_eos_is_accepted_and_fills_max_tokens(served):
    """``ignore_eos`` (sent by benchmark clients, accepted by vLLM): the answer runs to max_tokens."""
    r = httpx.post(served.url + "/v1/completions", json={"model": NAME, "prompt": PROMPTS[0], "max_tokens": 6,
                                                         "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 6
    assert httpx.post(served.url + "/v1/completions", json={"model": NAME, "prompt": "hi", "ignore_eos": "maybe"}
                      ).status_code == 400


def _concurrently(*calls):
    """Run ``calls`` at once (threads); their results in order (an exception is returned, not raised)."""
    import threading

    results = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_a_bad_seed_is_a_400_for_that_request_alone(served):
    """``seed: 2**70`` was an engine error (500 "Overflow when unpacking long long") for it and for the request decoded
    beside it: now `DecodingConfig` refuses it (400 naming ``seed``, the CLI's check too) and the neighbour is served.
    n choices wrap their seeds (seed + j) within the 64 bits a generator holds."""
    from biglm.generation.config import DecodingConfig, DecodingError

    good = dict(model=NAME, prompt=PROMPTS[0], max_tokens=12, temperature=0.9, seed=3)
    for seed in (2**70, 2**64, -1):
        ok, bad = _concurrently(
            lambda: served.client.completions.create(**good, extra_body={"steps": 12}),
            lambda: httpx.post(served.url + "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 12,
                                                                     "seed": seed, "steps": 12}, timeout=60))
        assert bad.status_code == 400, bad.text
        assert _error(bad)["param"] == "seed" and "2**64" in _error(bad)["message"]
        assert ok.choices[0].text == generate(served.model, served.tok, [PROMPTS[0]], max_new_tokens=12,
                                              temperature=0.9, seed=3, steps=12)[0]
        with pytest.raises(DecodingError, match="seed="):
            DecodingConfig(seed=seed)
    top = served.client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=6, temperature=1.0,
                                           seed=2**64 - 1, n=2)
    assert [c.text for c in sorted(top.choices, key=lambda c: c.index)] == [
        generate(served.model, served.tok, [PROMPTS[0]], max_new_tokens=6, temperature=1.0, seed=s)[0]
        for s in (2**64 - 1, 0)]


def test_an_engine_error_fails_that_request_alone(served):
    """A request that fails inside the engine (its sampler cannot be seeded, its sampling meets NaN) ends alone with
    finish_reason "error"; the request decoded beside it gets the tokens it gets alone. Over HTTP: a 500
    ``engine_error`` for that request, a 200 for its neighbour, and the server keeps serving."""
    import dataclasses

    from biglm.generation import DecodingConfig, generate_ids
    from biglm.generation.engine import DecodeEngine

    ids = [served.tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    cfg = DecodingConfig(max_new_tokens=10, temperature=0.8, seed=2, steps=5)
    suppress = range(len(served.tok), served.model.config.vocab_size)
    alone = generate_ids(served.model, torch.tensor([ids[0]]), config=cfg, suppress_ids=suppress).token_lists()[0]
    for field, value in (("seed", 2**70), ("temperature", float("nan"))):
        broken = dataclasses.replace(cfg)
        object.__setattr__(broken, field, value)  # past DecodingConfig's check, as a value it misses would be
        engine = DecodeEngine(served.model, max_batch_rows=4, tokenizer=served.tok)
        engine.submit("good", ids[0], cfg)
        engine.submit("bad", ids[1], broken)
        finished = {}
        while engine.num_running or engine.num_waiting:
            finished.update({e.request_id: e for e in engine.step() if e.finished})
        assert finished["bad"].finish_reason == "error" and finished["bad"].error
        assert finished["good"].finish_reason in ("stop", "length") and finished["good"].token_ids == alone
    # over HTTP: the engine fails one request's start
    scheduler = served.app.state.scheduler
    start = scheduler.engine._start

    def failing_start(req, *args):
        if req.prompt_ids == ids[1]:
            raise RuntimeError("this request's own failure")
        return start(req, *args)

    scheduler.engine._start = failing_start
    try:
        ok, bad = _concurrently(
            lambda: served.client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=10, temperature=0.8,
                                                     seed=2, extra_body={"steps": 5}),
            lambda: httpx.post(served.url + "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 10},
                               timeout=60))
    finally:
        scheduler.engine._start = start
    assert bad.status_code == 500 and _error(bad)["code"] == "engine_error"
    assert "this request's own failure" in _error(bad)["message"]
    assert ok.choices[0].text == generate(served.model, served.tok, [PROMPTS[0]], config=cfg)[0]
    assert _healthy(served.url)["status"] == "ok" and scheduler.stats["engine_errors"] == 0


def test_openai_fields_biglm_can_honour_are_accepted(served):
    """Fields the OpenAI API defines and a client sends: the penalties at their no-op 0, ``max_completion_tokens``
    (chat's max_tokens), ``echo``, text content parts, token-id prompts; each gives the answer its plain spelling
    gives. A penalty biglm does not implement, or a non-text part, is a 400 naming the field."""
    base = dict(model=NAME, max_tokens=10, temperature=0.8, seed=7)
    plain = served.client.completions.create(prompt=PROMPTS[0], **base).choices[0].text
    zero = served.client.completions.create(prompt=PROMPTS[0], frequency_penalty=0, presence_penalty=0.0, **base)
    assert zero.choices[0].text == plain
    for name in ("frequency_penalty", "presence_penalty"):
        r = httpx.post(served.url + "/v1/completions", json={"prompt": "hi", name: 0.5})
        assert r.status_code == 400 and _error(r)["param"] == name and "send 0" in _error(r)["message"]
    # echo: the prompt, then the answer (streamed: the prompt's chunk first)
    echoed = served.client.completions.create(prompt=PROMPTS[0], echo=True, **base).choices[0].text
    assert echoed == PROMPTS[0] + plain
    stream = served.client.completions.create(prompt=PROMPTS[0], echo=True, stream=True, **base)
    assert "".join(c.choices[0].text for c in stream) == echoed
    # token ids: one prompt, or a list of them; the same answers as their text
    ids = [served.tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    assert served.client.completions.create(prompt=ids[0], **base).choices[0].text == plain
    both = served.client.completions.create(prompt=ids, **base)
    assert [c.text for c in sorted(both.choices, key=lambda c: c.index)] == [
        served.client.completions.create(prompt=p, **base).choices[0].text for p in PROMPTS]
    assert both.usage.prompt_tokens == len(ids[0]) + len(ids[1])
    vocab = served.model.config.vocab_size
    for bad in ([1, vocab], [[1, 2], [-1]]):
        r = httpx.post(served.url + "/v1/completions", json={"prompt": bad, "max_tokens": 4})
        assert r.status_code == 400 and _error(r)["param"] == "prompt" and str(vocab) in _error(r)["message"], r.text
    # chat: max_completion_tokens is max_tokens; text parts are the text, joined by newlines
    messages = [{"role": "user", "content": "Speak,\nfriend."}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "Speak,"}, {"type": "text", "text": "friend."}]}]
    want = served.client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, seed=2,
                                                 temperature=0.5).choices[0].message.content
    got = served.client.chat.completions.create(model=NAME, messages=parts, max_completion_tokens=8, seed=2,
                                                temperature=0.5)
    assert got.choices[0].message.content == want and got.usage.completion_tokens <= 8
    for body, param in (({"messages": messages, "max_completion_tokens": 100_000}, "max_completion_tokens"),
                        ({"messages": messages, "max_completion_tokens": 8, "max_tokens": 9}, "max_completion_tokens"),
                        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                         "messages")):
        r = httpx.post(served.url + "/v1/chat/completions", json=body)
        assert r.status_code == 400 and _error(r)["param"] == param, r.text


def test_logprobs_of_the_written_tokens(served):
    """``logprobs: 0`` (completions) and ``logprobs: true`` (chat): each written token with its log-probability
    under the model when it was written, the decode's own (`GenerationOutput.token_logprobs`); the tokens spell the
    answer; a stream's chunks carry the same list in pieces. Alternatives (``logprobs`` >= 1, ``top_logprobs``) are
    not kept: a 400 naming the field, as is echo with logprobs."""
    from biglm.generation import DecodingConfig, generate_ids

    cfg = DecodingConfig(max_new_tokens=12, temperature=0.9, seed=5, steps=6)
    ids = served.tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
    out = generate_ids(served.model, torch.tensor([ids]), config=cfg,
                       suppress_ids=range(len(served.tok), served.model.config.vocab_size))
    tokens = out.token_lists()[0]
    want = out.token_logprobs[0, :len(tokens)].tolist()
    assert all(lp <= 0 for lp in want) and len(want) == len(tokens) > 0
    args = dict(model=NAME, prompt=PROMPTS[0], max_tokens=12, temperature=0.9, seed=5, extra_body={"steps": 6})
    choice = served.client.completions.create(logprobs=0, **args).choices[0]
    lp = choice.logprobs
    assert lp.token_logprobs == pytest.approx(want, abs=1e-5)
    assert "".join(lp.tokens) == choice.text and lp.text_offset[0] == 0
    assert [list(d.values())[0] for d in lp.top_logprobs] == lp.token_logprobs
    assert served.client.completions.create(**args).choices[0].logprobs is None  # not asked: not sent
    streamed = list(served.client.completions.create(logprobs=0, stream=True, **args))
    pieces = [c.choices[0].logprobs for c in streamed if c.choices and c.choices[0].logprobs]
    assert sum((p.token_logprobs for p in pieces), []) == lp.token_logprobs
    assert sum((p.tokens for p in pieces), []) == lp.tokens
    # chat
    messages = [{"role": "user", "content": "Speak, friend."}]
    chat = served.client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, logprobs=True,
                                                 top_logprobs=0).choices[0]
    content = chat.logprobs.content
    assert "".join(t.token for t in content) == chat.message.content and all(t.logprob <= 0 for t in content)
    assert all(bytes(t.bytes).decode() == t.token for t in content)
    stream = served.client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, logprobs=True,
                                                   stream=True)
    assert [t.logprob for c in stream if c.choices and c.choices[0].logprobs
            for t in c.choices[0].logprobs.content] == [t.logprob for t in content]
    for path, body, param in (("/v1/completions", {"prompt": "hi", "logprobs": 1}, "logprobs"),
                              ("/v1/completions", {"prompt": "hi", "logprobs": 0, "echo": True}, "logprobs"),
                              ("/v1/chat/completions", {"messages": messages, "logprobs": True, "top_logprobs": 3},
                               "top_logprobs"),
                              ("/v1/chat/completions", {"messages": messages, "top_logprobs": 0}, "top_logprobs")):
        r = httpx.post(served.url + path, json=body)
        assert r.status_code == 400 and _error(r)["param"] == param, r.text


def test_an_empty_body_says_so(served):
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = httpx.post(served.url + path, content=b"", headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert "body is empty" in _error(r)["message"] and "None" not in _error(r)["message"]


def test_sigterm_drains_answering_new_requests_503(served, monkeypatch):
    """The first SIGTERM (uvicorn's signal handler, `handle_exit`) drains: the server keeps listening, a new request
    gets 503 ``shutting_down`` (it was "connection refused": uvicorn closed the socket at once), /health 503
    "draining", the request in flight finishes whole, and then the server exits."""
    import signal
    import threading

    app = create_app(model=served.model, tokenizer=served.tok, settings=ServeSettings(model_name=NAME))
    engine = app.state.scheduler.engine
    step = engine.step

    def slow_step():
        time.sleep(0.02)
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    server = BiglmServer(app, port=0, shutdown_timeout=60).start()
    url = f"http://127.0.0.1:{server.port}"
    body = {"prompt": PROMPTS[0], "max_tokens": 40, "steps": 40, "temperature": 0.5, "seed": 1}
    result = {}
    flight = threading.Thread(target=lambda: result.update(r=httpx.post(url + "/v1/completions", json=body,
                                                                        timeout=60)))
    try:
        flight.start()
        assert _wait(lambda: engine.num_running == 1)
        server.server.handle_exit(signal.SIGTERM, None)
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=10)
        assert r.status_code == 503 and _error(r)["code"] == "shutting_down"
        health = httpx.get(url + "/health", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        flight.join(60)
        assert result["r"].status_code == 200, result["r"].text
        want = generate(served.model, served.tok, [PROMPTS[0]], max_new_tokens=40, steps=40, temperature=0.5,
                        seed=1)[0]
        assert result["r"].json()["choices"][0]["text"] == want
        server._thread.join(20)
        assert not server._thread.is_alive()  # drained: the server exited by itself
    finally:
        server.stop()


def test_serve_on_a_busy_port_says_so_before_loading_the_model(checkpoint, monkeypatch, capsys):
    import socket

    from biglm.serving import cli

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli, "build_app", never)
    monkeypatch.setattr(cli, "check_model_options", never)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main([str(checkpoint), "--port", str(port), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err


def test_text_stream_logprobs_follow_the_text(served):
    """`TextStream.take_logprobs`: the tokens handed out spell the text sent so far, and once finished the answer;
    tokens past a stop string's cut are not part of it."""
    tok = served.tok
    ids = tok("Hello world, dear friend", add_special_tokens=False)["input_ids"]
    lps = [-0.1 * (k + 1) for k in range(len(ids))]
    stream = TextStream(tok, eos_id=served.model.config.eos_token_id, stop=["dear"])
    taken = []
    for k in range(1, len(ids) + 1):
        stream.update(ids[:k], lps[:k])
        taken += stream.take_logprobs()
        assert "".join(t for t, _, _ in taken) == stream.sent[:len("".join(t for t, _, _ in taken))]
    stream.finish(ids, "length", lps)
    taken += stream.take_logprobs()
    assert stream.text == "Hello world, " and "".join(t for t, _, _ in taken) == stream.text
    assert [lp for _, lp, _ in taken] == lps[:len(taken)] and len(taken) < len(ids)
    assert [o for _, _, o in taken] == [len("".join(t for t, _, _ in taken[:i])) for i in range(len(taken))]


def test_health_and_metrics_count_prompts_being_encoded(served, monkeypatch):
    """A prompt longer than the engine's ``prefill_chunk`` is encoded over several steps (chunked prefill): meanwhile
    /health says ``prefilling`` 1 (among ``running``) and /metrics the same gauge; the answer is `generate`'s."""
    engine = served.app.state.scheduler.engine
    step = engine.step

    def slow_step():
        time.sleep(0.05)
        return step()

    monkeypatch.setattr(engine, "prefill_chunk", 2)
    monkeypatch.setattr(engine, "step", slow_step)
    prompt = " ".join(PROMPTS) * 2
    assert len(served.tok(prompt)["input_ids"]) > 8 * 2  # (at least 8 steps of encoding)
    seen: dict[str, object] = {}

    def watch() -> bool:
        health = _healthy(served.url)
        if health["prefilling"] == 1 and health["running"] >= 1:
            seen["metrics"] = httpx.get(served.url + "/metrics").text
            return True
        return False

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(served.client.completions.create, model=NAME, prompt=prompt, max_tokens=6, seed=2)
        assert _wait(watch, timeout=20)
        text = answer.result().choices[0].text
    assert "biglm_requests_prefilling 1\n" in seen["metrics"] and "# TYPE biglm_requests_running gauge" in seen["metrics"]
    assert text == generate(served.model, served.tok, [prompt], max_new_tokens=6, seed=2)[0]
    assert _healthy(served.url)["prefilling"] == 0


def test_metrics_say_tokens_per_call_and_positions_per_token(served):
    """/metrics counts the tokens the finished requests wrote and the decoding calls that wrote them: tokens per call
    and positions per token are those counts' ratios (Mask-Predict at T = 4 over 8 slots: 2 tokens per call)."""
    def counters() -> dict[str, float]:
        text = httpx.get(served.url + "/metrics").text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}

    before = counters()
    out = served.client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=8, temperature=0,
                                           extra_body={"steps": 4, "ignore_eos": True})
    after = counters()
    written = after["biglm_tokens_written_total"] - before.get("biglm_tokens_written_total", 0)
    calls = after["biglm_request_calls_total"] - before.get("biglm_request_calls_total", 0)
    assert written == out.usage.completion_tokens == 8 and calls == 4
    assert after["biglm_tokens_per_call"] == round(after["biglm_tokens_written_total"]
                                                   / after["biglm_request_calls_total"], 4)
    assert after["biglm_positions_per_token"] == round(after["biglm_positions_total"]
                                                       / after["biglm_tokens_written_total"], 4)


def test_a_reply_that_is_not_streamed_hears_only_its_finishing_event():
    """The scheduler hands a non-streamed request (``Job.final_only``) its finishing event alone: no per-call event
    crosses to the event loop, where 32 running requests would cost 32 wake-ups and text decodings per call. A
    streamed request still hears every call."""
    import threading

    from biglm.generation.engine import EngineEvent
    from biglm.serving.scheduler import Job, Scheduler

    class Engine:  # three calls per request, then its end
        def __init__(self):
            self.live, self.num_waiting = {}, 0

        @property
        def num_running(self):
            return len(self.live)

        def submit(self, rid, ids, config):
            self.live[rid] = 0

        def cancel(self, rid):
            self.live.pop(rid, None)

        def step(self):
            out = []
            for rid in list(self.live):
                self.live[rid] += 1
                done = self.live[rid] == 3
                out.append(EngineEvent(rid, [self.live[rid]], [self.live[rid]], done, "length" if done else None,
                                       self.live[rid]))
                if done:
                    del self.live[rid]
            return out

    from biglm.generation import DecodingConfig

    heard, ended = {"whole": [], "streamed": []}, threading.Event()
    scheduler = Scheduler(Engine(), max_in_flight=4)
    scheduler.start()
    try:
        def sink(item):
            heard[item.request_id].append(item)
            if all(h and h[-1].finished for h in heard.values()):
                ended.set()

        scheduler.admit([Job("whole", [1], DecodingConfig(), final_only=True), Job("streamed", [1], DecodingConfig())],
                        sink)
        assert ended.wait(10)
    finally:
        scheduler.stop()
    assert [e.steps for e in heard["whole"]] == [3] and heard["whole"][0].token_ids == [3]
    assert [e.steps for e in heard["streamed"]] == [1, 2, 3]


def test_metrics_count_errors_by_kind(served):
    """/metrics' ``biglm_errors_total`` counts the errors answered by status, code and the request field named (never
    a name the client made up: an unknown field counts under ``param=""``), in Prometheus' text format."""
    before = _errors(served.url)
    for body in ({"prompt": "hi", "max_tokens": 0}, {"prompt": "hi", "steps": -1}, {"prompt": "hi", "steps": 10**9},
                 {"prompt": "hi", "made_up_field": 1}, {"model": "gpt-4", "prompt": "hi"}, {"prompt": 5}):
        assert httpx.post(served.url + "/v1/completions", json=body).status_code in (400, 404)
    assert httpx.get(served.url + "/v1/nowhere").status_code == 404
    after = _errors(served.url)
    grown = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert grown == {("400", "invalid_value", "max_tokens"): 1, ("400", "invalid_value", "steps"): 2,
                     ("400", "unknown_field", ""): 1, ("404", "model_not_found", "model"): 1,
                     ("400", "invalid_value", "prompt"): 1, ("404", "", ""): 1}
