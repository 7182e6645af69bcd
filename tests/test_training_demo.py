"""The built-in run's closing report (`biglm.training.demo`): the model's hidden-word ranks beside the unigram
baseline's, on held-out text; context-decided examples; fill-ins whose context asks for one word."""

from __future__ import annotations

import torch

from biglm.training.demo import RARE_RANK, demo_report, fill_ins, hidden_word_test


class _Oracle(torch.nn.Module):
    """Scores the true token of every position highest (it is handed the unmasked windows)."""

    def __init__(self, truth: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.truth, self.vocab = truth, vocab

    def forward(self, ids, doc_ids=None, logits_positions=None):
        gold = self.truth.flatten()[logits_positions]
        logits = torch.zeros(len(gold), self.vocab).scatter(1, gold[:, None], 5.0)
        return type("Out", (), {"logits": logits})()


def _tokenizer(synthetic_data):
    from biglm.data.tokenizer import load_tokenizer

    return load_tokenizer(str(synthetic_data / "tok"))


def test_hidden_word_test_ranks_gold_tokens_against_the_unigram(synthetic_data):
    tok = _tokenizer(synthetic_data)
    ids = tok(["The cat sees the garden in the morning. A dog likes the market after the rain."] * 4,
              return_tensors="pt", add_special_tokens=False)["input_ids"]
    vocab = len(tok)
    logp = -0.01 * torch.arange(vocab, dtype=torch.float64)  # token t is the unigram's (t+1)-th guess
    common = int(ids[0, 1])
    logp[common] = 1.0  # ... but this one is its first
    test = hidden_word_test(_Oracle(ids, vocab), tok, [ids], unigram=logp, rate=0.5, seed=0)
    hidden = len(test.model.ranks)
    assert hidden > 0 and test.windows == 4
    assert test.model.summary()["first"] == 100.0 and set(test.model.ranks) == {1}
    for rank, prob in zip(test.unigram.ranks, test.unigram.probs):
        assert (rank == 1) == (abs(prob - torch.e) < 1e-4)
    assert len(test.rare_model) == test.rare_found == sum(r > RARE_RANK for r in test.unigram.ranks) > 0
    assert test.rare_unigram == [r for r in test.unigram.ranks if r > RARE_RANK] and set(test.rare_model) == {1}
    assert all("[" in e and "]" in e for e in test.examples)


def test_demo_report_shows_what_a_trained_model_learned(synthetic_data, tmp_path, capsys):
    """A short run on the synthetic grammar: the report's hidden-word test puts the model above the unigram."""
    from biglm.training import Trainer, get_recipe
    from biglm.training.config import ModelArgs
    from biglm.training.distributed import DistInfo

    cfg = get_recipe("default")
    cfg.data, cfg.tokenizer, cfg.out_dir = {str(synthetic_data / "shards"): 1.0}, str(synthetic_data / "tok"), str(tmp_path)
    cfg.steps, cfg.warmup_steps, cfg.log_every, cfg.eval_every, cfg.save_every, cfg.eval_windows = 150, 10, 500, 150, 150, 32
    cfg.seq_len, cfg.global_batch, cfg.micro_batch = 64, 16, 16
    cfg.model = ModelArgs(num_hidden_layers=2, hidden_size=96, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=256, max_position_embeddings=128)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(cfg, info=DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")),
                          echo=lambda s: None)
        result = trainer.train()
        capsys.readouterr()
        demo_report(trainer, result)
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "validation loss" in out and "below the baseline" in out
    assert "hidden words in held-out text" in out and "fill-ins where the context asks for one word" in out
    from biglm.data.tokenizer import load_tokenizer
    from biglm.training.data import unigram_log_probs

    logp = unigram_log_probs(cfg, vocab_size=len(trainer.tokenizer), fingerprint=trainer.data_fingerprint)
    test = hidden_word_test(trainer.raw_model, trainer.tokenizer, [w for _, w in trainer.val_windows], unigram=logp,
                            doc_ids=trainer._doc_ids)
    m, u = test.model.summary(), test.unigram.summary()
    assert m["first"] > u["first"] + 10 and m["median_rank"] < u["median_rank"], (m, u)
    rows = fill_ins(trainer.raw_model, load_tokenizer(str(synthetic_data / "tok")),
                    [("The old man crosses the long road after the <mask>.", "rain")], unigram=logp)
    assert len(rows) == 1 and len(rows[0][0]) == 3
