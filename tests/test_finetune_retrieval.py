"""Retrieval fine-tuning (DESIGN §9, issue 8 item 4): bi-encoder, InfoNCE, BEIR evaluation, ST export.

The learnability test uses pairs a random model cannot match: each query names a made-up word and its
document a *different* made-up word (a fixed random pairing; the tokenizer makes each word one token),
so nothing lexical links a pair and only contrastive training can. The tests run on one thread: on a busy
2-core machine two threads spin against the other jobs (~10x slower for this tiny model).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.config import ConfigError
from biglm.data import train_tokenizer
from biglm.finetune.tasks.retrieval import (BiGLMBiEncoder, RetrievalSettings, RetrievalTask, info_nce, mean_pool,
                                      pad_batch)

pytest.importorskip("ir_measures")

N_PAIRS = 100
CHANCE_NDCG10 = 100 * sum(1 / math.log2(r + 1) for r in range(1, 11)) / N_PAIRS  # one relevant doc among 100: 4.5


def _words(syllables: list[str], n: int, rng: random.Random) -> list[str]:
    words = sorted({a + b for a in syllables for b in syllables})
    rng.shuffle(words)
    return words[:n]


def write_beir(root: Path, *, n: int = N_PAIRS, seed: int = 0) -> list[str]:
    """A BEIR folder of ``n`` query -> document pairs (train and test qrels both judge all of them); returns
    every text, for training a tokenizer."""
    rng = random.Random(seed)
    q_words = _words(["ba", "ke", "lo", "mi", "nu", "po", "ri", "sa", "tu", "ve", "zo"], n, rng)
    d_words = _words(["dag", "fen", "gol", "hix", "jur", "kaw", "lym", "mox", "nep", "qid", "wes"], n, rng)
    subjects = ["The cell", "A protein", "The patient", "Our model", "The sample", "A receptor"]
    verbs = ["binds", "reduces", "predicts", "follows", "measures", "alters"]
    objects = ["the signal", "a pathway", "the outcome", "the dose", "an enzyme", "the response"]
    corpus, queries = [], []
    for i in range(n):
        filler = " ".join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}."
                          for _ in range(rng.randint(1, 3)))
        corpus.append({"_id": f"d{i}", "title": f"Report {rng.randint(1, 999)}",
                       "text": f"{filler} Its code is {d_words[i]}."})
        queries.append({"_id": f"q{i}", "text": f"Which report has the code of {q_words[i]}?"})
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    qrels = "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(n))
    for split in ("train", "test"):
        (root / "qrels" / f"{split}.tsv").write_text(qrels)
    texts = [f"{r['title']} {r['text']}" for r in corpus] + [r["text"] for r in queries]
    return texts


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    root = tmp_path_factory.mktemp("beir")
    texts = write_beir(root / "data")
    tok = train_tokenizer(texts=texts * 2, vocab_size=1000, out_dir=root / "tok")  # every made-up word one token
    return root / "data", tok


def tiny_model(tok, seed: int = 0) -> BiGLMForMaskedLM:
    torch.manual_seed(seed)
    config = BiGLMConfig.from_preset("tiny", vocab_size=len(tok), attn_backend="sdpa", hidden_dropout=0.0,
                                     attention_dropout=0.0)
    return BiGLMForMaskedLM(config)


def make_task(folder: Path, tok, **overrides) -> RetrievalTask:
    task = RetrievalTask(RetrievalSettings(data=str(folder), max_length=64, **overrides), name="toy")
    task.prepare(tok)
    return task


def train_contrastive(task: RetrievalTask, model: torch.nn.Module, *, epochs: int, batch: int = 20,
                      lr: float = 3e-3) -> list[float]:
    """A plain AdamW loop over the task's features (the fine-tuning loop's job in real runs)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    features = list(task.train_features())
    rng = random.Random(0)
    losses = []
    model.train()
    for _ in range(epochs):
        rng.shuffle(features)
        for i in range(0, len(features), batch):
            b = task.collate(features[i:i + batch], device=torch.device("cpu"))
            loss = task.loss(model, b) / b["num_items"]
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    model.eval()
    return losses


# ---------------------------------------------------------------- learning


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_random_model_is_near_chance_and_contrastive_training_learns_the_pairs(beir):
    folder, tok = beir
    task = make_task(folder, tok)
    assert len(task.train_features()) == N_PAIRS and len(task.eval_doc_ids) == N_PAIRS
    model = task.build_model(tiny_model(tok), tok)
    assert isinstance(model, BiGLMBiEncoder)

    before = task.evaluate(model, batch_size=32, device=torch.device("cpu"))
    assert before["queries"] == N_PAIRS and before["documents"] == N_PAIRS
    assert before["ndcg@10"] < 3 * CHANCE_NDCG10, before  # chance is 4.5; nothing lexical links a pair

    losses = train_contrastive(task, model, epochs=40)  # 200 steps; nDCG@10 ~95 (86 after 100)
    after = task.evaluate(model, batch_size=32, device=torch.device("cpu"))
    assert losses[-1] < 0.5 * losses[0]
    assert after["ndcg@10"] > 90.0, after
    assert after["recall@100"] == pytest.approx(100.0)  # 100 documents: all are retrieved


# ---------------------------------------------------------------- encoding


def test_length_bucketed_encode_equals_one_text_at_a_time_in_order(beir):
    _, tok = beir
    encoder = BiGLMBiEncoder(tiny_model(tok).model, tok).eval()
    rng = random.Random(1)
    words = "the cell binds a pathway and the dose alters an enzyme response".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(23)]

    widths: list[tuple[int, int]] = []  # (rows, padded length) of each forward
    hook = encoder.model.register_forward_pre_hook(lambda m, args: widths.append(tuple(args[0].shape)))
    try:
        batched = encoder.encode(texts, batch_size=4, max_length=32)
    finally:
        hook.remove()
    single = torch.cat([encoder.encode([t], max_length=32) for t in texts])

    assert batched.shape == (len(texts), encoder.config.hidden_size)
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=0)
    torch.testing.assert_close(batched.norm(dim=1), torch.ones(len(texts)), atol=1e-5, rtol=0)
    # batched by length: each batch is padded to the longest of 4 texts of neighbouring lengths
    lengths = sorted((len(ids) for ids in tok(texts, truncation=True, max_length=32)["input_ids"]), reverse=True)
    expected = [(len(lengths[i:i + 4]), lengths[i]) for i in range(0, len(lengths), 4)]
    assert widths[:len(expected)] == expected


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [9.0, 9.0]]])  # the third position is padding
    pooled = mean_pool(hidden, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(pooled, torch.tensor([[1.0, 1.0]]) / math.sqrt(2))


def test_sentence_transformer_round_trip(beir, tmp_path):
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    folder, tok = beir
    task = make_task(folder, tok, max_corpus_docs=30)
    model = task.build_model(tiny_model(tok, seed=3), tok)
    task.export(model, tok, tmp_path / "st")

    texts = task.eval_docs[:12] + task.eval_queries[:5]
    ours = model.encode(texts, batch_size=4, max_length=64)
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    theirs = torch.as_tensor(st.encode(texts, batch_size=5))
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    assert [type(m).__name__ for m in st] == ["Transformer", "Pooling", "Normalize"]
    assert st.max_seq_length == 64
    # the same directory loads back into biglm's bi-encoder
    again = BiGLMBiEncoder.from_pretrained(tmp_path / "st").encode(texts, max_length=64)
    torch.testing.assert_close(again, ours, atol=1e-5, rtol=0)
    assert json.loads((tmp_path / "st" / "biglm_task.json").read_text())["kind"] == "retrieval"


# ---------------------------------------------------------------- loss and batches


def test_info_nce_equals_hand_computation_on_3x3():
    t = 0.5
    queries = torch.eye(3)  # so the similarity s_ij is component i of document j
    docs = torch.tensor([[0.6, 0.8, 0.0], [0.0, 0.6, 0.8], [0.8, 0.0, 0.6]])  # unit rows
    s = [[docs[j][i].item() for j in range(3)] for i in range(3)]  # s[i][j] = <q_i, d_j>

    def hand(rows: list[list[float]]) -> float:
        return sum(math.log(sum(math.exp(v / t) for v in row)) - row[i] / t for i, row in enumerate(rows))

    assert info_nce(queries, docs, temperature=t).item() == pytest.approx(hand(s), rel=1e-6)
    # query 0's third document is relevant to it too: out of its softmax
    exclude = torch.zeros(3, 3, dtype=torch.bool)
    exclude[0, 2] = True
    masked = [s[0][:2], s[1], s[2]]
    assert info_nce(queries, docs, temperature=t, exclude=exclude).item() == pytest.approx(hand(masked), rel=1e-6)
    # a hard negative is one more column for every query
    hard = torch.tensor([[0.0, 0.0, 1.0]])
    s4 = [row + [hard[0][i].item()] for i, row in enumerate(s)]
    assert info_nce(queries, torch.cat([docs, hard]), temperature=t).item() == pytest.approx(hand(s4), rel=1e-6)


def test_collate_masks_false_negatives_and_loss_matches_encode(beir, tmp_path):
    _, tok = beir
    root = tmp_path / "data"
    (root / "qrels").mkdir(parents=True)
    docs = {"a": "alpha beta", "b": "gamma delta epsilon", "c": "zeta"}
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n"
                                               for k, v in docs.items()))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": f"query {q}"}) + "\n" for q in "123"))
    # query 1 judges a and b relevant; query 2 also cites a; query 3 cites c; a zero grade is no pair
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n1\ta\t1\n1\tb\t1\n2\ta\t1\n3\tc\t1\n3\tb\t0\n")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\ta\t1\n")
    task = make_task(root, tok)
    features = task.train_features()
    assert len(features) == 4  # (1,a) (1,b) (2,a) (3,c)
    batch = task.collate(features, device=torch.device("cpu"))
    assert batch["num_items"] == 4
    # rows: queries 1, 1, 2, 3; columns: docs a, b, a, c. Not a negative: another relevant document of the row's query
    assert batch["exclude"].tolist() == [[False, True, True, False],
                                         [True, False, True, False],
                                         [True, False, False, False],
                                         [False, False, False, False]]

    model = task.build_model(tiny_model(tok), tok).eval()
    q = model.encode(["query 1", "query 1", "query 2", "query 3"], max_length=64)
    d = model.encode(["alpha beta", "gamma delta epsilon", "alpha beta", "zeta"], max_length=64)
    expected = info_nce(q, d, temperature=0.05, exclude=batch["exclude"])
    assert task.loss(model, batch).item() == pytest.approx(expected.item(), rel=1e-5)


def test_hard_negatives_add_one_document_per_pair(beir, tmp_path):
    folder, tok = beir
    negatives = tmp_path / "neg.tsv"
    # q0's first listed negative is its own positive (skipped); q1 has one; d999 would be unknown
    negatives.write_text("query-id\tcorpus-id\tscore\nq0\td0\t0\nq0\td5\t0\nq1\td7\t0\n")
    task = make_task(folder, tok, hard_negatives=str(negatives), max_train_pairs=4)
    batch = task.collate(task.train_features(), device=torch.device("cpu"))
    assert batch["doc_input_ids"].shape[0] == 4 + 2
    assert task.describe()["hard_negatives"] == 2
    negatives.write_text("query-id\tcorpus-id\tscore\nq0\td999\t0\n")
    with pytest.raises(ValueError, match="d999"):
        make_task(folder, tok, hard_negatives=str(negatives))


def test_bad_settings_are_refused_before_work(beir):
    folder, tok = beir
    with pytest.raises(ConfigError, match="--task.data"):
        RetrievalTask(RetrievalSettings())
    with pytest.raises(ConfigError, match="temperature"):
        RetrievalTask(RetrievalSettings(data=str(folder), temperature=0.0))
    task = RetrievalTask(RetrievalSettings(data=str(folder), max_length=512))
    task.prepare(tok)
    with pytest.raises(ConfigError, match="max_position_embeddings 256"):
        task.build_model(tiny_model(tok), tok)


def test_pad_batch_right_pads():
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
