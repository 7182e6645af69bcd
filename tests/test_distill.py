"""`biglm data distill`: prompts cut from sources in turn, a teacher's greedy answers (an autoregressive model through
transformers, or a biglm model one token per call) written row by row and resumed after a kill, and prompt + answer
tokenised into the shards `biglm pretrain --data` reads; bad input refused in one line before any generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from biglm.training.distill import DistillError, distill, prompt_rows

TEXT = ["the quick brown fox jumps over the lazy dog", "a small tokenizer for a small model", "pack my box with five"] * 20
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=5000.0, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def tok():
    from biglm.data.tokenizer import train_tokenizer

    return train_tokenizer(texts=TEXT, vocab_size=300)


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tok) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, **SHAPE)
    out = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _sources(root: Path) -> list[str]:
    a, b = root / "a.txt", root / "b.txt"
    a.write_text("\n\n".join(["one two three four five six", "short", "the quick brown fox jumps over the lazy dog",
                              "pack my box with five dozen jugs"]))
    b.write_text("\n\n".join(["a small tokenizer for a small model again", "the lazy dog sleeps all day long"]))
    return [str(a), str(b)]


def test_prompt_rows_take_the_sources_in_turn_after_skip_docs(tmp_path):
    sources = _sources(tmp_path)
    rows = prompt_rows(sources, docs=10, prompt_words=4)
    assert rows == [{"id": "text-0", "prompt": "one two three four"}, {"id": "text-1", "prompt": "a small tokenizer for"},
                    {"id": "text-2", "prompt": "the quick brown fox"}, {"id": "text-3", "prompt": "the lazy dog sleeps"},
                    {"id": "text-4", "prompt": "pack my box with"}]  # "short" has no word after a prompt: skipped
    assert [r["prompt"] for r in prompt_rows(sources, docs=2, prompt_words=4, skip_docs=1)] == [
        "the quick brown fox", "the lazy dog sleeps"]
    chat = prompt_rows(sources[1:], docs=1, prompt_words=4, chat=True)
    assert chat == [{"id": "chat-0", "messages": [{"role": "user", "content": "a small tokenizer for a small model again"}]}]


def _greedy(llama: Path, tok, prompt: str, n: int) -> list[int]:
    """The source's own greedy answer, one row, no padding, no cache: the reference the batched teacher must equal."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32).eval()
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
            if nxt == tok.eos_token_id:
                break
            out.append(nxt)
    return out


def test_an_autoregressive_teacher_writes_its_greedy_text_into_shards_and_a_killed_run_resumes(tmp_path, llama, tok):
    from biglm.data.shards import ShardReader

    sources, out = _sources(tmp_path), tmp_path / "distilled"
    kw = dict(sources=sources, tokenizer=str(llama), docs=5, prompt_words=4, max_new_tokens=6, batch_size=2,
              progress=False, echo=lambda s: None)
    manifest = distill(str(llama), out, **kw)
    rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [a["id"] for a in answers] == [r["id"] for r in rows] and len(rows) == 5
    for row, answer in zip(rows, answers):  # batched with left padding, as the source alone writes it (float32)
        assert answer["text"] == tok.decode(_greedy(llama, tok, row["prompt"], 6), skip_special_tokens=True)
    texts = [json.loads(line)["text"] for line in (out / "text.jsonl").read_text().splitlines()]
    assert texts == [r["prompt"] + a["text"] for r, a in zip(rows, answers)]
    reader = ShardReader(out / manifest["shards"][0]["file"])
    assert [tok.decode(reader.doc(i)[:-1].tolist()) for i in range(len(reader))] == texts  # each doc then </s>

    # a kill mid-write: the last answer cut in half, nothing after it; the rerun writes the same answers
    first = (out / "answers.jsonl").read_bytes()
    lines = first.splitlines(keepends=True)
    (out / "answers.jsonl").write_bytes(b"".join(lines[:3]) + lines[3][:10])
    for f in [out / "text.jsonl", out / "manifest.json", *out.glob("*.bin")]:
        f.unlink()
    distill(str(llama), out, **kw)
    assert (out / "answers.jsonl").read_bytes() == first

    with pytest.raises(DistillError, match="prompts of another distillation"):
        distill(str(llama), out, **{**kw, "docs": 3})


def test_a_biglm_teacher_writes_what_one_token_per_call_writes(tmp_path, tok):
    from conftest import save_random_model

    from biglm.checkpoint.loading import load_model
    from biglm.generation import generate

    teacher = save_random_model(tmp_path / "teacher", tok, prefix_attention="blocks", prefix_block_lengths=[1, 4])
    out = tmp_path / "distilled"
    distill(str(teacher), out, sources=_sources(tmp_path), docs=3, prompt_words=4, max_new_tokens=5, progress=False,
            echo=lambda s: None)
    model, mtok = load_model(teacher)
    rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    want = generate(model, mtok, [r["prompt"] for r in rows], strategy="confidence", block_length=1, steps=5,
                    max_new_tokens=5, draft_length=0)
    assert [json.loads(line)["text"] for line in (out / "answers.jsonl").read_text().splitlines()] == want


def test_bad_input_is_refused_in_one_line_before_any_generation(tmp_path, llama, capsys):
    from biglm.cli import main

    sources = _sources(tmp_path)
    cases = [  # (arguments, words the one line must hold)
        ([*sources, "--out", str(tmp_path / "o1")], "missing --teacher"),
        (["--teacher", str(llama), "--out", str(tmp_path / "o2")], "no prompts"),
        ([*sources, "--teacher", str(llama), "--out", str(tmp_path / "o3")], "give --tokenizer"),
        ([*sources, "--teacher", str(tmp_path / "nowhere"), "--tokenizer", str(llama), "--out", str(tmp_path / "o4")],
         "no such file or directory"),
        ([*sources, "--teacher", str(llama), "--tokenizer", str(llama), "--out", str(tmp_path / "o5"),
          "--prompt_words", "50"], "more than --prompt_words 50 words"),
        ([*sources, "--teacher", str(llama), "--tokenizer", str(llama), "--out", str(tmp_path / "o6"), "--docs", "0"],
         "--docs 0: must be >= 1"),
    ]
    for args, words in cases:
        capsys.readouterr()
        assert main(["data", "distill", *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (args, err)
    assert not any((tmp_path / f"o{i}" / "answers.jsonl").exists() for i in range(1, 7))


def test_a_converted_model_that_was_not_adapted_is_refused_as_a_teacher(tmp_path, llama):
    from biglm.checkpoint.convert import convert_checkpoint

    conv = convert_checkpoint(llama, tmp_path / "conv", shift=True, log=lambda s: None)
    with pytest.raises(DistillError, match="give the source it was converted from"):
        distill(str(conv), tmp_path / "o", sources=_sources(tmp_path), progress=False)


def test_a_sampled_teacher_is_seeded_per_batch_so_a_resumed_run_draws_the_same_and_other_settings_are_refused(
        tmp_path, llama, tok):
    sources = _sources(tmp_path)
    kw = dict(sources=sources, tokenizer=str(llama), docs=5, prompt_words=4, max_new_tokens=8, batch_size=2,
              temperature=1.0, seed=3, progress=False, echo=lambda s: None)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    distill(str(llama), whole, **kw)
    distill(str(llama), cut, **kw)
    assert (whole / "answers.jsonl").read_bytes() == (cut / "answers.jsonl").read_bytes()
    greedy = distill(str(llama), tmp_path / "greedy", **{**kw, "temperature": 0.0})
    assert greedy and (tmp_path / "greedy" / "answers.jsonl").read_bytes() != (whole / "answers.jsonl").read_bytes()
    lines = (cut / "answers.jsonl").read_bytes().splitlines(keepends=True)  # killed after its first batch (2 rows)
    (cut / "answers.jsonl").write_bytes(b"".join(lines[:2]))
    for f in [cut / "text.jsonl", cut / "manifest.json", *cut.glob("*.bin")]:
        f.unlink()
    distill(str(llama), cut, **kw)
    assert (cut / "answers.jsonl").read_bytes() == (whole / "answers.jsonl").read_bytes()
    with pytest.raises(DistillError, match="other --temperature"):
        distill(str(llama), cut, **{**kw, "temperature": 0.5})


def test_no_repeat_ngram_answers_are_transformers_own_and_refused_for_a_biglm_teacher(tmp_path, llama, tok):
    from transformers import AutoModelForCausalLM

    sources = _sources(tmp_path)
    kw = dict(sources=sources, tokenizer=str(llama), docs=3, prompt_words=4, max_new_tokens=12, batch_size=1,
              progress=False, echo=lambda s: None)
    distill(str(llama), tmp_path / "nr", **kw, no_repeat_ngram=2)
    model = AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32).eval()
    rows = [json.loads(line) for line in (tmp_path / "nr" / "prompts.jsonl").read_text().splitlines()]
    answers = [json.loads(line)["text"] for line in (tmp_path / "nr" / "answers.jsonl").read_text().splitlines()]
    for row, answer in zip(rows, answers):
        ids = torch.tensor([tok(row["prompt"], add_special_tokens=False)["input_ids"]])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             no_repeat_ngram_size=2, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
        out = out[:out.index(tok.eos_token_id)] if tok.eos_token_id in out else out
        assert answer == tok.decode(out, skip_special_tokens=True)
        pairs = list(zip(out, out[1:]))
        assert len(pairs) == len(set(pairs))  # no bigram twice
    with pytest.raises(DistillError, match="must be >= 0"):
        distill(str(llama), tmp_path / "bad", **kw, no_repeat_ngram=-1)
