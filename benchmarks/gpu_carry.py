"""What `benchmarks/gpu_all.sh` needs on a GPU machine, packed into two halves that each travel in one device call
(at most 64 MiB a call, the working tree included): the GGUF file split in two, checked by sha256 when joined there,
and the few shared-data files the run reads (text to adapt on and SQuAD prompts in half a; eval sets, WikiAuto and
Brown texts in half b).

    python benchmarks/gpu_carry.py pack ../shared/models/SmolLM2-135M-Instruct.Q4_1.gguf ../shared/data runs/gpu-carry
    #   device call 1 carries runs/gpu-carry/a, call 2 runs/gpu-carry/b (each < 58 MiB), then on the device:
    python benchmarks/gpu_carry.py join runs/gpu-carry runs/gpu/model.gguf   # sha256 checked; data: runs/gpu-carry/data
    python benchmarks/gpu_carry.py tiny-gguf runs/gpu-dry/tiny.gguf --data ../shared/data   # the dry run's model

Every failure is one line naming what is wrong (exit 1), never a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

LIMIT = 58 * 2**20  # bytes a half may hold: a device call carries 64 MiB, the working tree (~4 MiB) included
CHUNK = 2**20
# shared-data files of each half (paths under the data folder; a folder: all of it)
TEXT = ["pretrain/fineweb_edu_sample/fineweb_edu_sample.jsonl", "pretrain/wikitext2/wiki.test.raw",
        "pretrain/tinystories/TinyStories-train.head.txt", "finetune/squad_v1.1/dev-v1.1.reconstructed.json"]
EVAL = ["eval/baber__piqa", "eval/allenai__ai2_arc/ARC-Easy", "eval/allenai__sciq", "eval/allenai__winogrande",
        "finetune/wikiauto/valid.jsonl"]
BROWN_LAST = 16  # bench_exact_drafts.py reads the last Brown texts (11 a kind in gpu_decode.sh)


def fail(msg: str) -> None:
    print(f"gpu_carry.py: {msg}", file=sys.stderr)
    raise SystemExit(1)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def copy_data(data: Path, names: list[str], dest: Path) -> None:
    for name in names:
        src = data / name
        if not src.exists():
            fail(f"{src} not found: the shared data folder must hold {name}")
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
        else:
            shutil.copy2(src, target)


def wheels(dest: Path) -> None:
    """The wheel of `gguf` (what `biglm convert` reads a GGUF file with; pure Python), for a device image without it;
    a note, not a failure, where it cannot be had."""
    import importlib.metadata
    import subprocess

    try:
        spec = f"gguf=={importlib.metadata.version('gguf')}"
    except importlib.metadata.PackageNotFoundError:
        spec = "gguf"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", spec, "--no-deps", "-q", "--timeout", "20",
                           "--retries", "1", "-d", str(dest)],
                          capture_output=True, text=True)
    if proc.returncode:
        print(f"note: no {spec} wheel carried (pip download failed); the device must have gguf installed")


def pack(gguf: Path, data: Path, out: Path, *, with_wheels: bool = True) -> None:
    if not gguf.is_file():
        fail(f"{gguf}: no such GGUF file")
    if not data.is_dir():
        fail(f"{data}: no such data folder (shared/data's layout)")
    if out.exists():
        shutil.rmtree(out)
    a, b = out / "a", out / "b"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    total = gguf.stat().st_size
    half = (total + 1) // 2
    record = {"name": gguf.name, "bytes": total, "sha256": sha256(gguf), "parts": []}
    with open(gguf, "rb") as f:
        for i, folder in enumerate((a, b), start=1):
            part = folder / f"model.gguf.part{i}"
            left = half if i == 1 else total - half
            with open(part, "wb") as g:
                while left:
                    block = f.read(min(CHUNK, left))
                    g.write(block)
                    left -= len(block)
            record["parts"].append({"file": f"{folder.name}/{part.name}", "bytes": part.stat().st_size,
                                    "sha256": sha256(part)})
    for folder in (a, b):  # each half says what the whole is, whichever arrives first
        (folder / "model.gguf.json").write_text(json.dumps(record, indent=2) + "\n")
    copy_data(data, TEXT, a / "data")
    copy_data(data, EVAL, b / "data")
    brown = sorted((data / "pretrain" / "brown").glob("*.txt"))[-BROWN_LAST:]
    copy_data(data, [str(p.relative_to(data)) for p in brown], b / "data")
    if with_wheels:
        wheels(a / "wheels")
    for folder in (a, b):
        n = size(folder)
        if n > LIMIT:
            fail(f"{folder} holds {n / 2**20:.1f} MiB, over the {LIMIT / 2**20:.0f} MiB one device call carries")
        print(f"{folder}: {n / 2**20:.1f} MiB")


def join(carry: Path, out: Path) -> None:
    meta = next((p for p in (carry / "a" / "model.gguf.json", carry / "b" / "model.gguf.json") if p.is_file()), None)
    if meta is None:
        fail(f"{carry}/a and {carry}/b hold no model.gguf.json: carry both halves written by `gpu_carry.py pack`")
    record = json.loads(meta.read_text())
    for part in record["parts"]:
        p = carry / part["file"]
        if not p.is_file():
            fail(f"{p} is missing: carry {p.parent} in a device call")
        if p.stat().st_size != part["bytes"] or sha256(p) != part["sha256"]:
            fail(f"{p} does not match its sha256 (cut short in transit?): carry it again")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as g:
        for part in record["parts"]:
            with open(carry / part["file"], "rb") as f:
                shutil.copyfileobj(f, g, CHUNK)
    if sha256(out) != record["sha256"]:
        out.unlink()
        fail(f"the joined {record['name']} does not match its sha256: carry both halves again")
    merged = carry / "data"  # one data folder in shared/data's layout
    for half in ("a", "b"):
        if (carry / half / "data").is_dir():
            shutil.copytree(carry / half / "data", merged, dirs_exist_ok=True)
    print(f"{out}: {record['name']}, {record['bytes']} bytes, sha256 {record['sha256'][:12]}... checked; "
          f"data in {merged}")


SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0)
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_gguf(out: Path, data: Path) -> None:
    """A random 2-layer Llama with a 512-token byte-level BPE trained on the text of half a, laid out as llama.cpp
    writes a float32 GGUF (its tensor names, q/k rows permuted for its RoPE) with a ChatML template: the dry run's
    stand-in for SmolLM2, through the same split, join and `biglm convert`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    from biglm.checkpoint.gguf_write import write_llama_gguf

    src = data / TEXT[-1]
    if not src.is_file():
        fail(f"{src} not found: the tiny model's tokenizer is trained on it")
    texts = src.read_text(encoding="utf-8")[:300_000].split("\n")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=backend.get_vocab_size(), bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
                      **SHAPE)
    model = LlamaForCausalLM(cfg).float().eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    n = write_llama_gguf(out, model, json.loads(backend.to_str())["model"], SHAPE, specials=specials, bos_id=1,
                         eos_id=2, chat_template=CHAT)
    print(f"{out}: a tiny Llama GGUF ({n} tokens)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="split a GGUF file and copy the data into OUT/a and OUT/b")
    p.add_argument("gguf", type=Path)
    p.add_argument("data", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--no-wheels", action="store_true", help="carry no gguf wheel (the device has gguf)")
    j = sub.add_parser("join", help="reassemble CARRY/a + CARRY/b into OUT (sha256 checked), data into CARRY/data")
    j.add_argument("carry", type=Path)
    j.add_argument("out", type=Path)
    t = sub.add_parser("tiny-gguf", help="write the dry run's tiny Llama GGUF")
    t.add_argument("out", type=Path)
    t.add_argument("--data", type=Path, required=True)
    args = ap.parse_args()
    if args.command == "pack":
        pack(args.gguf, args.data, args.out, with_wheels=not args.no_wheels)
    elif args.command == "join":
        join(args.carry, args.out)
    else:
        tiny_gguf(args.out, args.data)


if __name__ == "__main__":
    main()
