from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_configure(config):
    """Under pytest-xdist (``-n N``, what scripts/quickstart.sh runs) each worker computes on its share of the cores,
    so N workers do not each start a thread per core."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config, items):
    # Ray's tests last: its in-process driver leaves gRPC and event-loop threads behind after ray.shutdown, and a
    # process forked later from this many-threaded one can hang in a lock a thread held at the fork (seen once in CI
    # as a forked child of pytest stuck in a futex during test_suite's lm-eval run, which forks for its environment
    # report)
    items.sort(key=lambda item: Path(str(item.fspath)).name == "test_ray.py")  # stable: the rest keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (it sits beside the repository in CI)")
    return SHARED_DATA


REAL_GGUF = REPO.parent / "shared" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


_REAL_GGUF_READER: list = []


@contextlib.contextmanager
def real_gguf_read_once():
    """Within it, `gguf.GGUFReader` of `REAL_GGUF` (read-only) is one reader a session: `biglm convert` and
    transformers' GGUF loading each parse the file's header again for config, tokenizer and weights (its 49k-token
    vocabulary and merges: ~5 s a parse, five a conversion, three more for transformers' own model), the same
    bytes each time. Any other file or mode gets its own reader, as without it. And transformers builds gguf's
    tensor-name table (a pure function of the architecture and layer count, ~10 ms) once for each of the model's
    ~400 modules: within it, once."""
    import functools

    import gguf

    real, real_names = gguf.GGUFReader, gguf.get_tensor_name_map

    def reader(path, mode="r"):
        if mode != "r" or Path(path).resolve() != REAL_GGUF.resolve():
            return real(path, mode)
        if not _REAL_GGUF_READER:
            _REAL_GGUF_READER.append(real(path, mode))
        return _REAL_GGUF_READER[0]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real, real_names


@pytest.fixture(scope="session")
def real_smol(tmp_path_factory) -> Path:
    """The shipped SmolLM2-135M-Instruct converted once per session (shift on, the text read causally: `biglm
    convert`'s defaults)."""
    from biglm.checkpoint.convert import convert_checkpoint

    if not REAL_GGUF.is_file():
        pytest.skip(f"the real SmolLM2 GGUF file is not at {REAL_GGUF}")
    with real_gguf_read_once():
        return convert_checkpoint(REAL_GGUF, tmp_path_factory.mktemp("real") / "smol", shift=True, causal=True,
                                  log=lambda s: None)


@pytest.fixture(scope="session")
def real_invariant(real_smol):
    """`real_smol` loaded once per session in the batch-invariant mode: bfloat16, ``batch_invariant=True`` (its linear
    layers measured on one thread, the thread count the tests run with; the load's measurement costs ~10 s). The tests
    only read it."""
    from biglm.checkpoint import load_model

    torch.set_num_threads(1)
    return load_model(real_smol, dtype=torch.bfloat16, batch_invariant=True)


@pytest.fixture(scope="session", autouse=True)
def lm_eval_builtin_tasks_indexed_once():
    """lm-eval's `TaskManager` walks the ~15k YAML files of its own installed tasks folder (~10 s) each time it is
    built, and each in-process `biglm eval` builds one: that folder, unchanged while the tests run, is indexed once
    per session and each build gets its own copy of the entries. Every other folder (the tests' YAMLs, biglm's
    suite folders) is read on each build, as before; the merge (later folders override earlier ones) is lm-eval's."""
    try:
        import lm_eval.tasks
        from lm_eval.tasks._index import TaskIndex
    except ImportError:
        yield
        return
    import dataclasses
    import logging

    builtin = Path(lm_eval.tasks.__file__).resolve().parent
    real_build = TaskIndex.__dict__["build"]
    read: dict[bool, dict] = {}

    def build(paths, *, resolve_includes=True):
        index = {}
        for root in paths:
            if Path(root).resolve() == builtin:
                if resolve_includes not in read:
                    read[resolve_includes] = real_build.__func__([root], resolve_includes=resolve_includes)
                path_index = {k: dataclasses.replace(e, tags=set(e.tags)) for k, e in read[resolve_includes].items()}
            else:
                path_index = real_build.__func__([root], resolve_includes=resolve_includes)
            for name, entry in path_index.items():  # lm-eval's merge, its warning included
                if name in index:
                    logging.getLogger("lm_eval.tasks._index").warning(
                        "Task '%s' from %s overrides existing task from %s", name, entry.yaml_path,
                        index[name].yaml_path)
                index[name] = entry
        return index

    TaskIndex.build = staticmethod(build)
    try:
        yield
    finally:
        TaskIndex.build = real_build


@pytest.fixture
def tiny_config():
    from biglm import BiGLMConfig

    return BiGLMConfig.from_preset("tiny", attn_backend="eager")


def synthetic_corpus(n_docs: int = 400, seed: int = 0) -> list[str]:
    """Deterministic English-like documents from a small grammar: no files, no Python-version dependence."""
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird", "the river", "our city"]
    verbs = ["sees", "likes", "follows", "finds", "remembers", "paints", "crosses", "visits"]
    objects = ["the garden", "a red house", "the long road", "a quiet lake", "the market", "an open window"]
    tails = ["in the morning", "after the rain", "every day", "with great care", "before dinner", "at night"]
    docs = []
    for _ in range(n_docs):
        sentences = [f"{rng.choice(subjects).capitalize()} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(tails)}."
                     for _ in range(rng.randint(3, 9))]
        docs.append(" ".join(sentences))
    return docs


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory):
    """A 384-token tokenizer (ROOT/tok) and train/val shards (ROOT/shards) of `synthetic_corpus()`."""
    from biglm.data import prepare, train_tokenizer

    root = tmp_path_factory.mktemp("synthetic_data")
    docs = synthetic_corpus()
    (root / "corpus.txt").write_text("\n\n".join(docs))
    train_tokenizer(texts=docs, vocab_size=384, out_dir=str(root / "tok"))
    prepare(sources=[str(root / "corpus.txt")], tokenizer=str(root / "tok"), out_dir=root / "shards", val_docs=40,
            workers=1, progress=False)
    return root


def save_random_model(out: Path, tok, **config) -> Path:
    """A random BiGLM of the ``tiny`` preset (``config`` overrides its fields) for tokenizer ``tok``, seeded with 0,
    saved with the tokenizer as a Hugging Face directory ``out``."""
    from biglm import BiGLMConfig, BiGLMForMaskedLM

    torch.manual_seed(0)
    cfg = BiGLMConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, **config)
    BiGLMForMaskedLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    """A random tiny BiGLM (256-token window) with a small byte-level BPE tokenizer, saved as a HF directory."""
    from biglm.data.tokenizer import train_tokenizer

    src = SHARED_DATA / "pretrain" / "tinyshakespeare" / "input.txt"
    text = src.read_text()[:20000].split("\n\n") if src.is_file() else ["the quick brown fox jumps over the lazy dog"] * 50
    tok = train_tokenizer(texts=text, vocab_size=300)
    return save_random_model(tmp_path_factory.mktemp("ckpt"), tok)


def tiny_train_config(out: Path, **kw):
    """A TrainConfig of a tiny run (2-layer ``tiny`` preset, 32-token windows, 6 steps, checkpoints every 3);
    ``kw`` gives ``data`` and overrides any field. The trainer tests' common base."""
    from biglm.training import TrainConfig
    from biglm.training.config import ModelArgs

    base = dict(name="t", out_dir=str(out), preset="tiny", model=ModelArgs(max_position_embeddings=64),
                seq_len=32, micro_batch=4, global_batch=8, steps=6, lr=3e-3, min_lr=3e-4, warmup_steps=1, log_every=1,
                eval_every=3, eval_windows=8, save_every=3, keep_last=3)
    return TrainConfig(**{**base, **kw})


def train_losses(out: Path) -> dict[int, float]:
    """step -> training loss, from a run's metrics.jsonl."""
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def biglm_generate_answer(checkpoint, prompt: str, capsys, **flags) -> str:
    """The answer `biglm generate CHECKPOINT --prompt PROMPT --FLAG VALUE...` prints for one prompt."""
    from biglm.generation.cli import main as generate_main

    argv = [str(checkpoint), "--prompt", prompt]
    for k, v in flags.items():
        argv += [f"--{k}", str(v)]
    capsys.readouterr()
    assert generate_main(argv) == 0
    out = capsys.readouterr().out
    header = f"### prompt 1: {prompt}\n"
    assert out.startswith(header) and out.endswith("\n"), out
    return out[len(header):-1]
