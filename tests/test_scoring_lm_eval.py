"""The lm-eval adapter (`biglm` model) and the `biglm eval` launcher, end to end on a tiny checkpoint."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import yaml

pytest.importorskip("lm_eval", reason="lm-eval is the `eval` extra")

from biglm.scoring import cli, score_requests  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_EVAL = REPO.parent / "shared" / "data" / "eval"


def _instances(pairs):
    from lm_eval.api.instance import Instance

    return [Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i) for i, p in enumerate(pairs)]


def test_adapter_groups_contexts_and_matches_estimator(checkpoint, monkeypatch):
    from biglm.integrations.lm_eval.adapter import BiGLMLM

    lm = BiGLMLM.create_from_arg_string(f"pretrained={checkpoint},scorer=chain", {"batch_size": "auto", "device": "cpu"})
    calls = []
    real = lm.model.encode_prefix
    monkeypatch.setattr(lm.model, "encode_prefix", lambda ids, attention_mask=None: calls.append(ids.shape[0]) or real(ids, attention_mask))
    pairs = [("Question: where is the king?\nAnswer:", c) for c in (" in the castle", " at sea", " dead")]
    pairs += [("The queen said", c) for c in (" no.", " yes.")]
    out = lm.loglikelihood(_instances(pairs))
    assert sum(calls) == 2  # two distinct contexts, each encoded once for all its choices
    assert all(isinstance(ll, float) and isinstance(g, bool) for ll, g in out)
    # the adapter's numbers are the estimator's on the HFLM-style split with the </s> document prefix
    ctx, cont = lm._encode_pair(*pairs[0])
    assert ctx[0] == lm.tokenizer.eos_token_id
    assert lm.tokenizer.decode(cont) == " in the castle"
    (ref, _), = score_requests(lm.model, [(ctx, cont)], estimator="chain")
    assert out[0][0] == pytest.approx(ref, abs=1e-5)
    with pytest.raises(ValueError, match="empty continuation"):
        lm.loglikelihood(_instances([("ctx", "")]))
    from lm_eval.api.instance import Instance

    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("To be or not to be, that is the question.",), 0)])
    assert rolling[0] < 0


def _copa_yaml(tmp: Path) -> Path:
    import lm_eval.tasks

    builtin = Path(lm_eval.tasks.__file__).parent / "super_glue" / "copa" / "default.yaml"
    doc = {"include": str(builtin), "task": "copa_local", "dataset_path": "json", "dataset_name": None,
           "dataset_kwargs": {"data_files": {"validation": str(SHARED_EVAL / "aps__super_glue/copa/validation.jsonl")}},
           "training_split": None}
    d = tmp / "tasks"
    d.mkdir()
    (d / "copa_local.yaml").write_text(yaml.safe_dump(doc))
    return d


def test_launcher_end_to_end(checkpoint, tmp_path, shared_data, capsys):
    out = tmp_path / "out"
    rc = cli.main(["--model_args", f"pretrained={checkpoint},scorer=one-pass", "--tasks", "copa_local",
                   "--include_path", str(_copa_yaml(tmp_path)), "--limit", "8", "--output_path", str(out),
                   "--device", "cpu"])
    assert rc == 0
    files = list(out.rglob("results_*.json"))
    assert len(files) == 1
    res = json.loads(files[0].read_text())["results"]["copa_local"]
    assert 0.0 <= res["acc,none"] <= 1.0 and "acc_stderr,none" in res
    config = json.loads(files[0].read_text())["config"]
    assert config["model"] == "biglm" and config["biglm_scorer"] == "one-pass" and config["biglm_score_cache"] is None
    assert "biglm scorer: one-pass\n" in capsys.readouterr().out


def test_suite_skips_missing_and_prints_table(checkpoint, tmp_path, shared_data, capsys):
    """The whole --suite path on a data dir holding only PIQA: the rest is reported missing by path."""
    data = tmp_path / "eval"
    (data / "baber__piqa").mkdir(parents=True)
    shutil.copy(SHARED_EVAL / "baber__piqa" / "validation.jsonl", data / "baber__piqa" / "validation.jsonl")
    rc = cli.main(["--suite", "paper", "--data-dir", str(data), "--model_args", f"pretrained={checkpoint},scorer=one-pass",
                   "--limit", "4", "--device", "cpu", "--output_path", str(tmp_path / "out")])
    assert rc == 0
    captured = capsys.readouterr()
    assert f"data file not found: {data / 'allenai__ai2_arc' / 'ARC-Challenge' / 'test.jsonl'}" in captured.err
    table = captured.out[captured.out.index("| ARC-E"):].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    row = [c.strip() for c in table[2].strip("|").split("|")]
    assert header[:3] == ["ARC-E", "ARC-C", "PIQA"] and "Avg" in header and header[-1] == "LAMBADA"
    assert row[header.index("ARC-C")] == "—" and row[header.index("PIQA")] != "—"
    assert row[header.index("Avg")] == row[header.index("PIQA")]  # the only task that ran


def test_suite_yamls_on_shared_data(tmp_path, shared_data):
    tasks, missing = cli.write_suite_yamls(data_dir=shared_data / "eval", out_dir=tmp_path)
    ran = {t.column for t in tasks}
    assert {"ARC-E", "PIQA", "WinoG", "LogiQA", "SIQA", "BoolQ", "MMLU", "LAMBADA"} <= ran
    # whatever is absent here (held-out sets vary) is named by the file it looked for, and nothing else is
    assert not ran & set(missing)
    for column, path in missing.items():
        assert path.endswith(".jsonl") and not Path(path).exists(), (column, path)
    piqa = yaml.safe_load((tmp_path / "piqa_local.yaml").read_text())
    assert piqa["include"].endswith("lm_eval/tasks/piqa/piqa.yaml") and Path(piqa["include"]).is_absolute()
    assert piqa["training_split"] is None and piqa["dataset_path"] == "json"
    assert len(yaml.safe_load((tmp_path / "_mmlu_local.yaml").read_text())["task"]) == 57
    with pytest.raises(FileNotFoundError, match="no task of suite"):
        cli.write_suite_yamls(data_dir=tmp_path / "empty", out_dir=tmp_path / "y")


def test_suite_table_layout():
    results = {"results": {"piqa_local": {"acc,none": 0.5, "acc_norm,none": 0.6},
                           "arc_easy_local": {"acc,none": 0.4, "acc_norm,none": 0.9},
                           "mmlu_local": {"acc,none": 0.25}}}
    header, row = cli.suite_table(results)
    assert row[header.index("PIQA")] == "60.0"  # acc_norm for PIQA
    assert row[header.index("ARC-E")] == "40.0"  # acc for ARC-E
    assert row[header.index("Avg")] == "50.0"  # MMLU is shown but not averaged
    assert row[header.index("MMLU")] == "25.0" and row[header.index("HellaS")] == "—"


def test_missing_checkpoint_message(tmp_path, capsys):
    rc = cli.main(["--model_args", f"pretrained={tmp_path / 'nope'}", "--tasks", "piqa"])
    assert rc == 2
    assert f"no model at {tmp_path / 'nope'}" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="no model at"):
        cli.run_suite(tmp_path / "nope", data_dir=tmp_path)


def _gen(requests):
    from lm_eval.api.instance import Instance

    return [Instance("generate_until", {}, (ctx, kw), i) for i, (ctx, kw) in enumerate(requests)]


@pytest.fixture(scope="module")
def lm(checkpoint):
    from biglm.integrations.lm_eval.adapter import BiGLMLM

    return BiGLMLM(pretrained=str(checkpoint), device="cpu")


def _spy_decoder(monkeypatch) -> list:
    """Record (DecodingConfig, prompt ids per row) as they reach `decoding.generate_ids`, then decode as usual."""
    import biglm.generation.api as api

    seen = []
    real = api.generate_ids

    def spy(model, ids, mask, *, config, **kwargs):
        seen.append((config, [row[m.bool()].tolist() for row, m in zip(ids, mask)]))
        return real(model, ids, mask, config=config, **kwargs)

    monkeypatch.setattr(api, "generate_ids", spy)
    return seen


def test_generate_until(lm):
    reqs = _gen([("Once upon a time", {"until": ["\n"], "max_gen_toks": 6})])
    (text,) = lm.generate_until(reqs)
    assert isinstance(text, str) and "\n" not in text


def test_generate_until_honours_gen_kwargs(lm, monkeypatch):
    seen = _spy_decoder(monkeypatch)
    calls = []
    hook = lm.model.register_forward_hook(lambda *_: calls.append(1))  # one per answer pass (encode_prefix is not)
    try:
        lm.generate_until(_gen([("The king", {"until": ["\n"], "max_gen_toks": 6, "do_sample": True, "temperature": 0.7,
                                              "top_k": 5, "top_p": 0.9, "steps": 3, "seed": 5})]))
        sampled = seen[-1][0]
        assert len(calls) == 3  # steps from gen_kwargs: 3 model calls, no more, no fewer
        lm.generate_until(_gen([("The king", {"until": ".", "max_gen_toks": 8, "do_sample": False, "temperature": 0.7,
                                              "steps": 4, "early_stop": True, "top_k": 0})]))
        greedy = seen[-1][0]
        lm.generate_until(_gen([("The king", {"max_gen_toks": 4, "do_sample": True, "strategy": "confidence",
                                              "block_length": 2, "length_beam": 2})]))
        default_t = seen[-1][0]
    finally:
        hook.remove()
    assert (sampled.temperature, sampled.top_k, sampled.top_p, sampled.steps, sampled.seed) == (0.7, 5, 0.9, 3, 5)
    assert (sampled.max_new_tokens, sampled.stop, sampled.early_stop) == (6, ["\n"], False)  # early stop is opt-in
    assert sampled.strategy == "mask-predict"
    # do_sample=False is greedy whatever the temperature; top_k=0 is "no top-k" (HF)
    assert (greedy.temperature, greedy.early_stop, greedy.steps, greedy.stop, greedy.top_k) == (0.0, True, 4, ["."], None)
    # do_sample=True without a temperature samples at HF's default 1.0
    assert (default_t.temperature, default_t.strategy, default_t.block_length, default_t.length_beam) == (1.0, "confidence", 2, 2)


def test_generate_until_refuses_unknown_and_contradictory_gen_kwargs(lm, monkeypatch):
    seen = _spy_decoder(monkeypatch)
    good = ("The king", {"until": ["\n"], "max_gen_toks": 4})
    with pytest.raises(ValueError, match=r"unsupported gen_kwargs 'num_beams'; accepted: until, max_gen_toks, do_sample"):
        lm.generate_until(_gen([good, ("The king", {"until": ["\n"], "num_beams": 4})]))
    with pytest.raises(ValueError, match="do_sample=True with temperature=0 contradict"):
        lm.generate_until(_gen([("The king", {"do_sample": True, "temperature": 0.0})]))
    with pytest.raises(ValueError, match="steps=0 must be >= 1"):
        lm.generate_until(_gen([("The king", {"steps": 0})]))
    with pytest.raises(ValueError, match="early_stop applies to mask-predict only"):
        lm.generate_until(_gen([("The king", {"strategy": "threshold", "early_stop": True})]))
    assert seen == []  # every request is checked before the first one is generated


def test_model_args_set_default_decoding(checkpoint, monkeypatch):
    from biglm.integrations.lm_eval.adapter import BiGLMLM

    lm = BiGLMLM.create_from_arg_string(f"pretrained={checkpoint},steps=4,early_stop=true,temperature=0.5,max_gen_toks=5,"
                                        "seed=9", {"device": "cpu"})
    assert (lm.decoding.steps, lm.decoding.early_stop, lm.decoding.temperature, lm.decoding.seed) == (4, True, 0.5, 9)
    seen = _spy_decoder(monkeypatch)
    lm.generate_until(_gen([("The king", {"until": ["\n"]}), ("The king", {"early_stop": False, "do_sample": True})]))
    base, override = sorted((c for c, _ in seen), key=lambda c: c.early_stop, reverse=True)
    assert (base.steps, base.early_stop, base.temperature, base.max_new_tokens, base.stop) == (4, True, 0.5, 5, ["\n"])
    assert (override.early_stop, override.temperature, override.steps) == (False, 0.5, 4)  # do_sample keeps 0.5
    with pytest.raises(ValueError, match="biglm model_args: top_p=2.0 must lie in"):
        BiGLMLM(pretrained=str(checkpoint), device="cpu", top_p=2.0)
    with pytest.raises(ValueError, match=r"unknown model_args early_stopp \(did you mean early_stop\?\)"):
        BiGLMLM.create_from_arg_string(f"pretrained={checkpoint},early_stopp=true", {"device": "cpu"})


@pytest.mark.parametrize("context", ["Question: where is the king?\nAnswer: ", "The queen said\n\n", "",
                                     "To be or not to be, that is the question. " * 20])
def test_generate_until_conditions_like_loglikelihood(checkpoint, monkeypatch, context):
    """The ids the model is conditioned on are the same for generate_until and loglikelihood: the </s>
    prefix, trailing whitespace moved out, the same left truncation to the window."""
    from biglm.integrations.lm_eval.adapter import BiGLMLM

    lm = BiGLMLM(pretrained=str(checkpoint), device="cpu", max_length=48, scorer="one-pass")
    prefixes = []
    real = lm.model.encode_prefix
    monkeypatch.setattr(lm.model, "encode_prefix",
                        lambda ids, attention_mask=None: prefixes.append(ids[0].tolist()) or real(ids, attention_mask))
    continuation = " the crown is his and he shall wear it"
    ctx_ids, cont_ids = lm._encode_pair(context, continuation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the long context is truncated, with a warning, on both paths
        lm.loglikelihood(_instances([(context, continuation)]))
        scored = prefixes[-1]
        seen = _spy_decoder(monkeypatch)
        lm.generate_until(_gen([(context, {"until": ["\n"], "max_gen_toks": len(cont_ids), "steps": 2})]))
    (_, (prompt,)), = seen
    assert prompt == scored  # exactly what loglikelihood scores the continuation against
    assert prefixes[-1] == prompt  # and what the model's prefix cache was built from
    if len(ctx_ids) + len(cont_ids) <= 48:
        assert prompt == ctx_ids and prompt[0] == lm.tokenizer.eos_token_id
        assert lm.tokenizer.decode(prompt[1:]) == context.rstrip()
    else:
        assert len(prompt) == 48 - len(cont_ids) and prompt == ctx_ids[-len(prompt):]  # cut from the left


def test_prefix_token_auto_follows_how_the_model_was_made(checkpoint, tmp_path, caplog):
    """``prefix_token=auto``: a BiGLM trained by biglm gets ``</s>`` before every context (its documents follow one);
    a model converted from an AR checkpoint (shift_logits) gets nothing, as lm-eval's hf model scores its source, and
    an empty context alone gets BOS (EOS without one, as HFLM); a tokenizer with a chat template is said once."""
    from transformers import AutoTokenizer

    from biglm.integrations.lm_eval.adapter import BiGLMLM
    from biglm.model import BiGLMConfig, BiGLMForMaskedLM

    lm = BiGLMLM(pretrained=str(checkpoint), device="cpu")
    eos = lm.tokenizer.eos_token_id
    assert lm.prefix_token == "eos" and lm._encode_pair("the cat", " sat")[0][0] == eos
    shifted = tmp_path / "shifted"
    cfg = BiGLMConfig.from_pretrained(checkpoint)
    cfg.shift_logits = True
    BiGLMForMaskedLM.from_pretrained(checkpoint, config=cfg).save_pretrained(shifted)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok.save_pretrained(shifted)
    with caplog.at_level("WARNING"):
        conv = BiGLMLM(pretrained=str(shifted), device="cpu")
    assert conv.prefix_token == "none"
    ctx, _ = conv._encode_pair("the cat", " sat")
    assert ctx == conv._encode("the cat")  # nothing before the context
    bos = lm.tokenizer.bos_token_id
    assert conv._encode_pair("", "the cat")[0] == [eos if bos is None else bos]  # HFLM's: BOS, else EOS
    assert sum("chat template" in r.message for r in caplog.records) == 1
    assert BiGLMLM(pretrained=str(shifted), device="cpu", prefix_token="eos").prefix_ids == [eos]


def test_scorer_auto_is_append_for_a_model_trained_on_blocks_of_one(checkpoint, tmp_path):
    """``scorer=auto`` (the default): ``append`` for a biglm-blocks model whose training drew prefix blocks of 1 (one
    row per answer) and for a model converted from an AR checkpoint (shift_logits), ``chain`` for every other BiGLM
    (a paper model, a blocks model without blocks of 1); a scorer given by name is kept."""
    from biglm.integrations.lm_eval.adapter import BiGLMLM
    from biglm.model import BiGLMConfig, BiGLMForMaskedLM

    assert BiGLMLM(pretrained=str(checkpoint), device="cpu").scorer == "chain"  # a paper (bidirectional) model
    for lengths, want in (([1, 8], "append"), ([8, 16], "chain")):
        out = tmp_path / f"blocks-{lengths[0]}"
        cfg = BiGLMConfig.from_pretrained(checkpoint)
        cfg.prefix_attention, cfg.prefix_block_lengths = "blocks", lengths
        BiGLMForMaskedLM.from_pretrained(checkpoint, config=cfg).save_pretrained(out)
        for f in checkpoint.glob("tokenizer*"):
            (out / f.name).write_bytes(f.read_bytes())
        assert BiGLMLM(pretrained=str(out), device="cpu").scorer == want
        assert BiGLMLM(pretrained=str(out), device="cpu", scorer="one-pass").scorer == "one-pass"
    shifted = tmp_path / "shifted"
    cfg = BiGLMConfig.from_pretrained(checkpoint)
    cfg.shift_logits = True
    BiGLMForMaskedLM.from_pretrained(checkpoint, config=cfg).save_pretrained(shifted)
    for f in checkpoint.glob("tokenizer*"):
        (shifted / f.name).write_bytes(f.read_bytes())
    # converted from an AR checkpoint: append, under the cache its decoding runs (exact: the prefix re-encoded), which
    # block_cache in model_args changes for generate_until and the scorer alike; the results say which
    lm = BiGLMLM(pretrained=str(shifted), device="cpu")
    assert lm.scorer == "append" and lm.get_model_info() == {"biglm_scorer": "append", "biglm_score_cache": "exact"}
    lm = BiGLMLM(pretrained=str(shifted), device="cpu", block_cache="append")
    assert lm.get_model_info()["biglm_score_cache"] == "append" and lm.decoding.block_cache == "append"
    blocks = BiGLMLM(pretrained=str(tmp_path / "blocks-1"), device="cpu")
    assert blocks.get_model_info() == {"biglm_scorer": "append", "biglm_score_cache": "append"}


@pytest.mark.parametrize("bad, said", [("scorer=foo", "scorer='foo'"), ("scorer=blocks,score_block=0", "score_block=0"),
                                       ("scorr=chain", "did you mean scorer")])
def test_bad_model_args_are_one_line(checkpoint, capsys, bad, said):
    """A --model_args value the adapter refuses ends `biglm eval` in one line (exit 2), never lm-eval's traceback."""
    assert cli.main(["--model_args", f"pretrained={checkpoint},{bad}", "--tasks", "arc_easy"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("biglm eval:")]
    assert len(err) == 1 and said in err[0]


def test_a_causal_conversion_scores_what_lm_evals_hf_model_scores_on_its_source(tmp_path):
    """`biglm convert`'s model (the text read causally, the shift) through lm-eval's interface: every request's
    log-likelihood and greedy flag are those lm-eval's own `hf` model gives its source (float32, 1e-4), with
    ``scorer=auto``; and the cost is one pass per request, context and continuation read causally together, as
    lm-eval's `hf` model reads them (counted, not timed)."""
    import torch
    from lm_eval.models.huggingface import HFLM
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from biglm.checkpoint.convert import convert_checkpoint
    from biglm.integrations.lm_eval.adapter import BiGLMLM

    texts = ["the quick brown fox jumps over the lazy dog", "where is the king? in the castle, at sea", "pack my box"] * 20
    backend = Tokenizer(models.BPE())  # a Llama-style byte-level BPE without a mask or pad token (convert adds them)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=290, special_tokens=["<s>", "</s>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    # pad = EOS as SmolLM2's: conversion adds the mask token alone, which scoring never counts as text
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=5000.0,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    src, out = tmp_path / "src", tmp_path / "biglm"
    LlamaForCausalLM(cfg).float().save_pretrained(src)
    tok.save_pretrained(src)
    convert_checkpoint(src, out, shift=True, causal=True, log=lambda s: None)
    pairs = [("Question: where is the king?\nAnswer:", c) for c in (" in the castle", " at sea", " dead")]
    pairs += [("The queen said", c) for c in (" no.", " yes, the quick brown fox")] + [("", "the lazy dog")]
    hf = HFLM(pretrained=str(src), device="cpu", dtype="float32", batch_size=4)
    ref = hf.loglikelihood(_instances(pairs))
    lm = BiGLMLM(pretrained=str(out), device="cpu", dtype="float32")
    assert lm.scorer == "append" and lm.get_model_info()["biglm_score_cache"] == "append"
    calls = []
    hook = lm.model.model.register_forward_pre_hook(
        lambda _m, args, kw: calls.append((kw.get("prefix_cache") is not None, tuple(args[0].shape))), with_kwargs=True)
    try:
        got = lm.loglikelihood(_instances(pairs))
    finally:
        hook.remove()
    for (ll, greedy), (ref_ll, ref_greedy) in zip(got, ref):
        assert ll == pytest.approx(ref_ll, abs=1e-4) and greedy == ref_greedy
    assert not any(cached for cached, _ in calls)  # no context cache copied into every choice's row
    assert sum(shape[0] for _, shape in calls) == len(pairs)  # one causal pass per request, as lm-eval's hf model
