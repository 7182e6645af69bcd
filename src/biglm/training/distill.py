"""Distillation data: a teacher model writes the text a model adapts on.

Why: a model's mask slots draft the tokens after the next one (speculative decoding, `generation.speculative`), and a
draft counts only when it is the token one-token-per-call decoding writes there. Trained on a corpus, slot k learns
the corpus's many possible continuations k tokens ahead; trained on text the teacher wrote greedily, slot k's target
is exactly the token the teacher writes k steps later (sequence-level distillation, as Medusa's self-distillation
and consistency-trained Jacobi decoding), and the next-token slot learns the teacher's own choice. A model converted
from an autoregressive checkpoint is its own best teacher: `biglm convert`'s output decodes one token per call
exactly as the source does, so no corpus beyond the prompts is needed (DESIGN: "the AR source writes the text the
BiGLM adapts on").

`distill` runs in three resumable stages inside ``out`` (a stage whose output is complete is not run again; the
teacher's settings are recorded in ``distill.json``, which `blocks-adapt` reads: `auto_draft_tree_every`):
1. ``prompts.jsonl``: continuation prompts (the first ``prompt_words`` words of documents of text sources, taken in
   turn from each source after its first ``skip_docs``) and any rows of ``input`` (`biglm generate --input`'s
   format: a prompt or chat messages);
2. ``answers.jsonl``: the teacher's answers, greedy unless ``temperature``: an autoregressive teacher (the GGUF or
   transformers model a biglm model was converted from) through transformers' ``generate``, written batch by batch
   and resumed by row id after a kill (`answer_autoregressive`); a biglm teacher one token per call (``strategy
   confidence, block_length 1, draft_length 0``) by the batch generator (`generation.batch.generate_file`);
3. ``text.jsonl`` (each prompt with its answer; a chat row rendered by the teacher's chat template with the answer as
   the assistant's turn), tokenised by `data.prepare` into the token shards ``biglm pretrain --data`` reads.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TEACHER_DECODING = {"strategy": "confidence", "block_length": 1, "draft_length": 0, "temperature": 0.0}
"""How a biglm teacher writes: greedy, one token per call (its own exact text)."""


class DistillError(ValueError):
    """Bad input to `distill`, found before any generation."""


def autoregressive_teacher(teacher: str) -> bool:
    """Whether ``teacher`` names an autoregressive model transformers loads (a GGUF file, a folder holding one, a
    transformers folder of another model type, a hub id) rather than a biglm model or run."""
    path = Path(teacher)
    if path.is_file():
        return path.suffix.lower() == ".gguf"
    if path.is_dir():
        config = path / "config.json"
        if config.is_file():
            return json.loads(config.read_text()).get("model_type") != "biglm"
        return len(list(path.glob("*.gguf"))) == 1
    return True  # a hub id (transformers says in one line when it is none)


RECORD = "distill.json"
"""The teacher settings a distilled folder was written with (``teacher``, ``temperature``, ...)."""

AUTO_DRAFT_TREE_EVERY = 2
"""Draft-tree steps of an adaptation on a teacher's greedy text (`ObjectiveConfig.draft_tree_every` -1): every second
step (they raised the model's first-draft acceptance there, and not on a corpus: docs/LOG.md)."""


def greedy_teacher_text(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a teacher's greedy text, as `distill` writes it (its record says temperature 0)."""
    record = Path(folder) / RECORD
    if not record.is_file():
        return False
    try:
        return float(json.loads(record.read_text()).get("temperature", -1)) == 0.0
    except (ValueError, AttributeError):
        return False


def auto_draft_tree_every(folders: Sequence[str], *, frozen_text: bool = False) -> int:
    """`ObjectiveConfig.draft_tree_every` -1 resolved for training data ``folders``: `AUTO_DRAFT_TREE_EVERY` when every
    one is a teacher's greedy text (its next tokens exactly: what the draft slots are checked against), every step
    with ``frozen_text`` (a causal conversion's mask adapters: drafting is what they add),
    else 0 (on a corpus the slots' targets are its many continuations, where draft-tree steps did not raise
    acceptance)."""
    if not folders or not all(greedy_teacher_text(f) for f in folders):
        return 0
    return 1 if frozen_text else AUTO_DRAFT_TREE_EVERY


def prompt_rows(sources: Sequence[str], *, docs: int, prompt_words: int, skip_docs: int = 0, chat: bool = False,
                text_field: str = "text", txt_mode: str = "paragraph") -> list[dict[str, Any]]:
    """Up to ``docs`` prompt rows, taken in turn from each source (so every source is represented) after its first
    ``skip_docs`` documents (e.g. a prepared set's val documents). Continuation rows (``{"id": "text-i", "prompt"}``)
    are the first ``prompt_words`` words of each document of more words (something follows them); ``chat`` rows
    (``{"id": "chat-i", "messages"}``) are each document whole as a user's turn."""
    from biglm.data.sources import iter_documents

    def prompts(spec: str):
        for text in itertools.islice(iter_documents(spec, text_field=text_field, txt_mode=txt_mode), skip_docs, None):
            words = text.split()
            if chat:
                yield {"messages": [{"role": "user", "content": text}]}
            elif len(words) > prompt_words:
                yield {"prompt": " ".join(words[:prompt_words])}

    streams = [prompts(spec) for spec in sources]
    rows: list[dict[str, Any]] = []
    kind = "chat" if chat else "text"
    while streams and len(rows) < docs:
        for stream in list(streams):
            row = next(stream, None)
            if row is None:
                streams.remove(stream)
            elif len(rows) < docs:
                rows.append({"id": f"{kind}-{len(rows)}", **row})
    return rows


def _write_jsonl_atomic(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with open(path, "rb") as f:
        data = f.read()
    return [json.loads(line) for line in data[:data.rfind(b"\n") + 1].decode("utf-8").splitlines() if line.strip()]


def _resolve(teacher: str):
    from biglm.checkpoint.source import resolve_source

    try:
        return resolve_source(teacher)
    except ValueError as e:
        raise DistillError(f"--teacher {e}") from None


def answer_autoregressive(teacher: str, rows: Sequence[dict[str, Any]], answers: Path, *, max_new_tokens: int,
                          batch_size: int, temperature: float = 0.0, seed: int = 0, no_repeat_ngram: int = 0,
                          progress: bool = True) -> int:
    """Answers of an autoregressive ``teacher`` (transformers' ``generate``, its KV cache) to ``rows``: greedy, or
    sampled at ``temperature`` (each batch seeded from ``seed`` and its first row's place, so a resumed run draws
    what the whole one would), never repeating an n-gram of ``no_repeat_ngram`` tokens (0: no limit; transformers'
    ``no_repeat_ngram_size``), appended to ``answers`` batch by batch (flushed and synced; rows already there are
    skipped, a partial last line dropped). Returns the rows written now."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = _resolve(teacher)
    kw = where.load_kwargs()
    tok = AutoTokenizer.from_pretrained(where.location, **kw)
    model = AutoModelForCausalLM.from_pretrained(where.location, dtype=torch.float32, **kw).eval()
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    done = {a["id"] for a in _read_jsonl(answers)}
    if answers.is_file():  # a kill may have cut the last line short: keep whole lines only
        data = answers.read_bytes()
        os.truncate(answers, data.rfind(b"\n") + 1)
    bar = tqdm(total=len(rows), initial=len(done), unit="row", desc="teacher", disable=not progress)
    written = 0
    with open(answers, "ab") as f:
        for s in range(0, len(rows), batch_size):
            batch = rows[s:s + batch_size]
            if all(r["id"] in done for r in batch):
                continue
            texts = [r["prompt"] if "messages" not in r else
                     tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True) for r in batch]
            ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
            width = max(map(len, ids))
            input_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
            attention = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
            sampling = {"do_sample": False, "no_repeat_ngram_size": no_repeat_ngram}
            if temperature > 0:
                torch.manual_seed(seed * 1_000_003 + s)
                sampling.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            with torch.no_grad():
                out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                                     pad_token_id=pad, **sampling)
            lines = []
            for r, new in zip(batch, out[:, width:].tolist()):
                if r["id"] in done:  # a batch a kill cut short runs again whole: its rows keep their first answer
                    continue
                ended = tok.eos_token_id in new
                new = new[:new.index(tok.eos_token_id)] if ended else new
                lines.append({"id": r["id"], "text": tok.decode(new, skip_special_tokens=True),
                              "finish_reason": "stop" if ended else "length", "completion_tokens": len(new)})
            f.write("".join(json.dumps(a, ensure_ascii=False) + "\n" for a in lines).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(lines))
            written += len(lines)
    bar.close()
    return written


def distill(teacher: str, out: str | os.PathLike[str], *, sources: Sequence[str] = (),
            chat_sources: Sequence[str] = (), input: str | None = None, tokenizer: str | None = None,
            docs: int = 1024, chat_docs: int = 256, prompt_words: int = 32, skip_docs: int = 0,
            max_new_tokens: int = 96, batch_size: int = 16, temperature: float = 0.0, seed: int = 0,
            no_repeat_ngram: int = 0,
            val_docs: int = 0, text_field: str = "text",
            chat_field: str = "text", txt_mode: str = "paragraph", progress: bool = True, echo=print) -> dict[str, Any]:
    """Write a prepared data folder ``out`` of the teacher's text (module docstring); returns its manifest.
    ``tokenizer``: the student's, for the shards (default: a biglm teacher's own; required for an autoregressive
    teacher, whose tokenizer lacks the mask token). ``temperature`` 0: the teacher's greedy text; above 0 sampled
    (seeded by ``seed``); ``no_repeat_ngram`` > 0: the autoregressive teacher never repeats an n-gram that long (a
    small model's greedy text loops, and a model adapted on loops loops more)."""
    from biglm.data.prepare import prepare
    from biglm.data.tokenizer import load_tokenizer
    from biglm.generation.batch import read_rows
    from biglm.generation.chat import render_chat

    if not sources and not chat_sources and not input:
        raise DistillError("no prompts: give text SOURCES (continuation prompts), --chat_sources and/or --input")
    for name, value, low in (("docs", docs, 1), ("chat_docs", chat_docs, 1), ("prompt_words", prompt_words, 1),
                             ("max_new_tokens", max_new_tokens, 1), ("batch_size", batch_size, 1),
                             ("skip_docs", skip_docs, 0), ("val_docs", val_docs, 0)):
        if value < low:
            raise DistillError(f"--{name} {value}: must be >= {low}")
    if no_repeat_ngram < 0:
        raise DistillError(f"--no_repeat_ngram {no_repeat_ngram}: must be >= 0 (0: no limit)")
    if no_repeat_ngram and not autoregressive_teacher(teacher):
        raise DistillError("--no_repeat_ngram applies to an autoregressive teacher (transformers' generate); a biglm "
                           "teacher writes one token per call's own text")
    if not 0.0 <= temperature < float("inf"):
        raise DistillError(f"--temperature {temperature}: must be a number >= 0 (0: greedy)")
    autoregressive = autoregressive_teacher(teacher)
    if autoregressive:
        _resolve(teacher)  # a wrong path is said now, before anything is written
        if not tokenizer:
            raise DistillError(f"--teacher {teacher} is an autoregressive model: give --tokenizer, the student's (e.g. "
                               "`biglm convert`'s output folder), so the shards carry its mask and pad tokens")
    if not autoregressive and (Path(teacher) / "config.json").is_file():
        config = json.loads((Path(teacher) / "config.json").read_text())
        if config.get("shift_logits") and config.get("prefix_attention") == "bidirectional":
            raise DistillError(f"--teacher {teacher} is a model converted from an autoregressive checkpoint and not "
                               "adapted: its decoding reads the prompt both ways, which its weights never saw; give "
                               "the source it was converted from (the .gguf file or transformers folder) as --teacher")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DistillError(f"--out {out} is a file: give a folder (a new one, or one this command wrote, to resume it)")
    student_tok = load_tokenizer(tokenizer or teacher)
    rows = prompt_rows(sources, docs=docs, prompt_words=prompt_words, skip_docs=skip_docs, text_field=text_field,
                       txt_mode=txt_mode) if sources else []
    if sources and not rows:
        raise DistillError(f"no document of {', '.join(sources)} has more than --prompt_words {prompt_words} words "
                           f"after the first --skip_docs {skip_docs}: lower them")
    if chat_sources:
        rows += prompt_rows(chat_sources, docs=chat_docs, prompt_words=prompt_words, skip_docs=skip_docs, chat=True,
                            text_field=chat_field, txt_mode=txt_mode)
    if input:
        rows += [{"id": f"input-{r.id}", **({"prompt": r.prompt} if r.messages is None else {"messages": r.messages})}
                 for r in read_rows(input)]
    out.mkdir(parents=True, exist_ok=True)
    prompts_path, answers_path, text_path = out / "prompts.jsonl", out / "answers.jsonl", out / "text.jsonl"
    if prompts_path.is_file() and _read_jsonl(prompts_path) != rows:
        raise DistillError(f"{out}: holds the prompts of another distillation (other sources, --docs, --prompt_words, "
                           "--skip_docs or --input): use another --out, or delete this one to start over")
    if not prompts_path.is_file():
        _write_jsonl_atomic(prompts_path, rows)
    settings = {"teacher": str(teacher), "max_new_tokens": max_new_tokens, "batch_size": batch_size,
                "temperature": temperature, "seed": seed, "no_repeat_ngram": no_repeat_ngram}
    record = out / RECORD
    if record.is_file():
        old = json.loads(record.read_text())
        changed = [k for k in settings if old.get(k) != settings[k]]
        if changed:
            raise DistillError(f"{out}: was written with other {', '.join('--' + k for k in changed)} "
                               f"({', '.join(f'{k}={old.get(k)!r}' for k in changed)}): use another --out, or delete "
                               "this one to start over")
    else:
        _write_jsonl_atomic(record, [settings])  # one line of JSON, written whole or not at all

    if not text_path.is_file():
        t0 = time.perf_counter()
        if autoregressive:
            written = answer_autoregressive(teacher, rows, answers_path, max_new_tokens=max_new_tokens,
                                            batch_size=batch_size, temperature=temperature, seed=seed,
                                            no_repeat_ngram=no_repeat_ngram, progress=progress)
        else:
            from biglm.checkpoint.loading import load_model
            from biglm.generation.batch import generate_file

            model, teacher_tok = load_model(teacher)
            written = generate_file(model, teacher_tok, prompts_path, answers_path, progress=progress,
                                    config={**TEACHER_DECODING, "max_new_tokens": max_new_tokens,
                                            "steps": max_new_tokens, "temperature": temperature, "seed": seed},
                                    batch_size=batch_size,
                                    model_path=teacher).written
        echo(f"teacher {teacher}: {written} answers written in {time.perf_counter() - t0:.0f} s")
        answers = {a["id"]: a["text"] for a in _read_jsonl(answers_path)}
        texts = [render_chat(student_tok, [*row["messages"], {"role": "assistant", "content": answers[row["id"]]}],
                             add_generation_prompt=False) if "messages" in row else row["prompt"] + answers[row["id"]]
                 for row in rows]
        _write_jsonl_atomic(text_path, [{"text": t} for t in texts])
    return prepare(sources=[str(text_path)], tokenizer=student_tok, out_dir=out, val_docs=val_docs, workers=1,
                   progress=progress)
