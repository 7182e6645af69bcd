"""The built-in run's closing report (`biglm.training.demo`): the model's hidden-word ranks beside the unigram
baseline's, on held-out text; context-decided examples; fill-ins whose context asks for one word."""

from __future__ import annotations

import torch

from biglm.training.demo import RARE_RANK, SHOW, demo_report, fill_ins, hidden_word_test, is_prose

# a codec table of the built-in corpus (the report once showed five of its rows as what context decides) and prose
# of the same corpus
TABLE = "".join(f"0x{i:02X} -> CONTROL CHARACTER " for i in range(40))
PROSE = ("Return True if the path is a directory, and False otherwise. The function follows symbolic links, so "
         "a link to a directory counts as one. If the path does not exist, the answer is always False. When the "
         "caller needs to know whether the link itself exists, it should use the other function of this module, "
         "which does not follow the link and reports what is there.")


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


def test_is_prose_tells_running_text_from_tables_and_code():
    assert is_prose(PROSE) and is_prose("Split the source string by the occurrences of the pattern, returning a list "
                                        "containing the resulting substrings.")
    for text in (TABLE[:200],  # a table in capitals
                 "0x41 -> LATIN CAPITAL LETTER A 0x42 -> LATIN CAPITAL LETTER B 0x43 -> LATIN CAPITAL LETTER C",
                 "| name | value |\n|---|---|\n| size | 10 |\n| name | demo |\n| size | 12 |",  # a Markdown table
                 "the value the value the value the value the value the value",  # a row repeated
                 ">>> os.path.basename('/bar/foo')\n'foo'\n>>> y = [1, 2, 3, 1, 2, 3]",  # code
                 "import datetime import plistlib pl = dict(aString = 'Doodah', aList = ['A', 'B', 12])",
                 "Return the path."):  # too short to tell
        assert not is_prose(text), text


def test_context_decided_examples_come_from_prose_not_table_rows(synthetic_data):
    """Every hidden token of a held-out text that opens with a codec table and goes on in prose is one frequency
    cannot guess and the model ranks first: the examples shown are the first in prose, one per word, none from
    the table that comes first."""
    tok = _tokenizer(synthetic_data)
    flat = tok(TABLE + "\n\n" + PROSE, add_special_tokens=False)["input_ids"]
    ids = torch.tensor(flat[:len(flat) // 32 * 32]).view(-1, 32)
    vocab = len(tok)
    absent = [t for t in range(vocab) if t not in set(flat)][:RARE_RANK]
    logp = torch.full((vocab,), -10.0, dtype=torch.float64)
    logp[absent] = 0.0  # frequency ranks every token of the text beyond RARE_RANK
    test = hidden_word_test(_Oracle(ids, vocab), tok, [ids], unigram=logp, rate=0.5, seed=0)
    assert test.rare_found == len(test.rare_model) > 2 * SHOW  # the table's holes are candidates too
    words = [e.split("[")[1].split("]")[0] for e in test.examples]
    assert len(words) == SHOW and len(set(words)) == SHOW and test.prose_found >= SHOW, test.examples
    assert all("CONTROL" not in e and "0x" not in e and w in PROSE for e, w in zip(test.examples, words)), test.examples


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
