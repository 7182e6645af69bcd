"""`biglm eval --suite heldout`: held-out masked loss / fill-in accuracy at the BiGLM setting and the chain
perplexity of held-out continuations, checked against computing them by hand, and a trained model beats a
random one on them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.cli import main as cli
from biglm.data.mixture import TokenDataset
from biglm.data.tokenizer import load_tokenizer
from biglm.objective import apply_masks, draw_masks, get_objective, make_generator
from biglm.scoring.estimators import score_requests
from biglm.scoring.heldout import continuation_requests, heldout_metrics, run_heldout


def _model(data, seed=0):
    tok = load_tokenizer(data / "tok")
    torch.manual_seed(seed)
    cfg = BiGLMConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, max_position_embeddings=128)
    return BiGLMForMaskedLM(cfg).eval(), tok


def test_metrics_equal_a_hand_computation(synthetic_data):
    model, _ = _model(synthetic_data)
    shards = synthetic_data / "shards"
    got = heldout_metrics(model, data=shards, windows=6, seq_len=32, docs=10, context_tokens=16,
                          continuation_tokens=8, seed=3, batch_size=4)
    # by hand: the same six windows, masks from the same seeded draw, dense logits, one window at a time
    ds = TokenDataset(shards, split="val")
    pattern = draw_masks(6, 32, get_objective("biglm"), generator=make_generator(seed=3, step=0, rank=0, device="cpu"),
                         device="cpu", vocab_size=model.config.vocab_size)
    ce_sum = hits = count = 0.0
    with torch.no_grad():
        for w in range(6):
            win = torch.from_numpy(ds.read(w * 32, 32))[None]
            b = apply_masks(win, pattern.rows(torch.tensor([w])), mask_token_id=model.config.mask_token_id)
            logits = model(b.input_ids, prefix_len=b.prefix_len).logits[0]
            sel = b.labels[0] != -100
            ce_sum += float(torch.nn.functional.cross_entropy(logits[sel], b.labels[0][sel], reduction="sum"))
            hits += float((logits[sel].argmax(-1) == b.labels[0][sel]).sum())
            count += float(sel.sum())
    assert got["masked_tokens"] == count
    assert got["masked_loss"] == pytest.approx(ce_sum / count, rel=1e-5)
    assert got["fill_acc"] == pytest.approx(hits / count, abs=1e-9)
    # continuation: first half -> second half of the first ten documents, chain rule
    reqs = continuation_requests(ds, docs=10, context_tokens=16, continuation_tokens=8)
    assert len(reqs) == 10 and all(1 <= len(c) <= 8 and 1 <= len(x) <= 16 for x, c in reqs)
    ll = sum(l for l, _ in score_requests(model, reqs, estimator="chain"))
    n = sum(len(c) for _, c in reqs)
    assert got["cont_nll"] == pytest.approx(-ll / n, rel=1e-6)
    assert got["cont_ppl"] == pytest.approx(math.exp(-ll / n), rel=1e-6)
    for key in ("masked_loss_stderr", "cont_nll_stderr"):
        assert 0 < got[key] < 10
    assert got["fill_acc_stderr"] >= 0  # a random model may hit no masked token at all


def test_the_first_half_really_precedes_the_second(synthetic_data):
    ds = TokenDataset(synthetic_data / "shards", split="val")
    doc = [int(t) for t in ds.readers[0].doc(0)][:-1]  # without its EOS
    (ctx, cont), = continuation_requests(ds, docs=1, context_tokens=1000, continuation_tokens=1000)
    assert ctx + cont == doc and len(ctx) == len(doc) // 2


def test_trained_model_beats_a_random_one_and_cli_writes_lm_eval_layout(synthetic_data, tmp_path, capsys):
    from biglm.training import Trainer, TrainConfig
    from biglm.training.distributed import DistInfo

    run = tmp_path / "run"
    cfg = TrainConfig(name="t", out_dir=str(run), preset="tiny", data={str(synthetic_data / "shards"): 1.0},
                      tokenizer=str(synthetic_data / "tok"), seq_len=32, micro_batch=8, global_batch=8, steps=60,
                      lr=3e-3, min_lr=3e-4, warmup_steps=5, log_every=100, eval_every=0, save_every=60)
    Trainer(cfg, info=DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")),
            echo=lambda s: None).train()
    assert cli(["eval", "--suite", "heldout", "--heldout_data", str(synthetic_data / "shards"), "--model_args",
                f"pretrained={run}", "--heldout_windows", "8", "--heldout_seq_len", "32", "--heldout_docs", "12",
                "--output_path", str(tmp_path / "eval"), "--device", "cpu"]) == 0
    assert "cont_ppl" in capsys.readouterr().out
    trained = json.loads((tmp_path / "eval" / "heldout.json").read_text())["results"]["heldout"]
    random_model, _ = _model(synthetic_data)
    rnd = heldout_metrics(random_model, data=synthetic_data / "shards", windows=8, seq_len=32, docs=12)
    assert trained["masked_loss,none"] < rnd["masked_loss"] - 1.0
    assert trained["cont_ppl,none"] < 0.5 * rnd["cont_ppl"]
    assert trained["fill_acc,none"] > rnd["fill_acc"] + 0.04  # 60 steps: ~8% vs ~0%
    assert set(trained) >= {"masked_loss,none", "masked_loss_stderr,none", "cont_ppl,none", "fill_acc_stderr,none"}


@pytest.mark.parametrize("extra, needle", [
    ([], "needs --heldout_data"),
    (["--heldout_data", "/nonexistent"], "no such folder"),
    (["--heldout_data", "{data}", "--heldout_windows", "1"], "--heldout_windows=1 must be >= 2"),
    (["--heldout_data", "{data}", "--limit", "5"], "do not apply to --suite heldout"),
])
def test_bad_heldout_options_are_refused_before_loading(synthetic_data, checkpoint, capsys, extra, needle):
    extra = [e.replace("{data}", str(synthetic_data / "shards")) for e in extra]
    assert cli(["eval", "--suite", "heldout", "--model_args", f"pretrained={checkpoint}", *extra]) == 2
    assert needle in capsys.readouterr().err


def test_heldout_options_elsewhere_and_a_foreign_vocabulary_are_refused(synthetic_data, checkpoint, capsys):
    assert cli(["eval", "--tasks", "piqa", "--model_args", f"pretrained={checkpoint}", "--heldout_docs", "5"]) == 2
    assert "only applies with --suite heldout" in capsys.readouterr().err
    # the checkpoint's tokenizer (300 tokens) is not the one the shards were written with (384)
    assert cli(["eval", "--suite", "heldout", "--heldout_data", str(synthetic_data / "shards"), "--model_args",
                f"pretrained={checkpoint}", "--device", "cpu"]) == 2
    assert "vocab" in capsys.readouterr().err.lower()
