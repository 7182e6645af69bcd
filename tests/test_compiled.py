"""`load_model(compile=True)` / `--compile`: each decoder layer under `torch.compile` (dynamic shapes). The agreement
with the eager path on a trained model's decodes is measured on the real SmolLM2 in tests/test_convert.py; here the
switch itself: what it changes in the model, and that the commands take it and write what the eager path writes."""

from __future__ import annotations

import pytest
import torch

from biglm.model.packed import PackedLinear


def test_compile_replaces_packing_and_keeps_the_state_dict(checkpoint):
    """The compiled model's layers run compiled graphs (dynamo captures one on the first call, one per layer at
    most, and none for the eager model), without the prepacked kernels, under the same parameter names."""
    from torch._dynamo.utils import counters

    from biglm.checkpoint import load_model

    eager, _ = load_model(checkpoint, pack=True)
    compiled, _ = load_model(checkpoint, pack=True, compile=True)
    assert any(isinstance(m, PackedLinear) for m in eager.modules())
    assert not any(isinstance(m, PackedLinear) for m in compiled.modules())  # the prepacked kernels do not compile
    assert compiled.state_dict().keys() == eager.state_dict().keys()  # in place: names unchanged
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        want = eager(ids, prefix_len=3).logits
        assert counters["stats"]["unique_graphs"] == 0  # the eager model compiles nothing
        got = compiled(ids, prefix_len=3).logits
    graphs = counters["stats"]["unique_graphs"]
    assert 0 < graphs <= len(compiled.model.layers), graphs  # its layers ran as captured graphs
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("extra", [[], ["--block_length", "4", "--steps", "4"]])
def test_generate_compile_writes_what_eager_writes(checkpoint, capsys, extra):
    from biglm.cli import main

    torch._dynamo.reset()
    args = ["generate", str(checkpoint), "--prompt", "the quick brown", "--prompt", "to be or",
            "--max_new_tokens", "8", "--strategy", "confidence", *extra]
    assert main(args) == 0
    eager = capsys.readouterr().out
    assert main([*args, "--compile"]) == 0
    assert capsys.readouterr().out == eager


def test_serve_compile_answers_what_eager_serves(checkpoint):
    """`biglm serve --compile`: the served model's layers are compiled, and a completion is the eager server's."""
    import openai

    from biglm.serving.cli import BiglmServer, ServeArgs, build_app

    torch._dynamo.reset()
    texts = []
    for compile in (False, True):
        app = build_app(ServeArgs(checkpoint=str(checkpoint), device="cpu", compile=compile), given=[])
        layers = app.state.scheduler.engine.model.model.layers
        server = BiglmServer(app, port=0).start()
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0,
                                   timeout=120)
            texts.append(client.completions.create(model=app.state.settings.model_name, prompt="the quick brown",
                                                   max_tokens=8, temperature=0,
                                                   extra_body={"strategy": "confidence", "steps": 8}).choices[0].text)
        finally:
            server.stop()
        assert all((layer._compiled_call_impl is not None) == compile for layer in layers)
    assert texts[1] == texts[0]
