"""Batch generation over files (`biglm generate RUN --input prompts.jsonl --output answers.jsonl`): a JSONL of prompts
in, a JSONL of answers out, resumable by row id.

An input row has an ``id``, a ``prompt`` or chat ``messages``, and optionally any `DecodingConfig` field for that row;
its settings come from `config.model_decoding`, as at every entry point, so its answer is the one `biglm generate`
writes for that prompt with those settings. The whole input is checked first: a malformed row is reported as
``FILE:LINE: what is wrong`` and nothing is generated. An output row holds the answer and its counts as the server
reports them (``id``, ``text``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``calls``).

Layers: `read_rows` (the file, checked) -> `prepare_rows` (settings and token ids) -> `plan_batches` (settings groups
in order of first appearance, input order within each) -> `BatchAnswerer` (greedy rows: one `generate_ids` call over
left-padded prompts; sampled rows: an `engine.DecodeEngine`) -> `generate_file` (lock, resume, write, progress). The
job holds ``OUTPUT.lock`` and writes rows in that one fixed order, so a re-run drops a partial last line, runs the
batches not yet written and ends with the same file, byte for byte; ``OUTPUT.meta.json`` (`output_record`) records
the model's weights and the settings, and a re-run with others is refused (`check_record`). The answering is a
`Backend`: `local_backend` here, or a cluster backend (Ray Data) while reading, resuming and writing stay on the driver.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .api import _check_model, cut_at_stop
from .chat import check_messages, render_chat
from .config import FIELDS, DecodingConfig, model_decoding
from .decoding import generate_ids, left_pad
from .engine import DecodeEngine

ROW_KEYS = ("id", "prompt", "messages")
MAX_ERRORS = 20  # errors listed before the rest are counted


class BatchInputError(ValueError):
    """The input or output file is unusable; the message names each problem as ``FILE:LINE: what is wrong``."""


@dataclass
class BatchRow:
    """One input row: where it was read, its id, its prompt (or chat messages) and its own decoding fields."""

    line: int
    id: str | int
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    decoding: dict[str, Any] = field(default_factory=dict)
    # set by `prepare_rows`
    config: DecodingConfig | None = None
    prompt_ids: list[int] = field(default_factory=list)


@dataclass
class BatchReport:
    """What `generate_file` did: rows in the input, already in the output, written now, and the time it took."""

    rows: int
    done_before: int
    written: int
    batches: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0


def id_key(row_id: Any) -> str:
    """An id as one comparable key (1 and "1" are different ids, as in JSON)."""
    return json.dumps(row_id)


def _errors(where: str, problems: list[tuple[int, str]]) -> BatchInputError:
    lines = [f"{where}:{line}: {what}" for line, what in problems[:MAX_ERRORS]]
    if len(problems) > MAX_ERRORS:
        lines.append(f"{where}: ... and {len(problems) - MAX_ERRORS} more")
    return BatchInputError("\n".join(lines))


def read_rows(path: str | Path) -> list[BatchRow]:
    """The rows of a JSONL prompts file, or a `BatchInputError` listing every malformed row as ``FILE:LINE: ...``.

    Blank lines are skipped. Decoding fields are checked for name and type here (unknown names refused); whether
    they fit together with the job's options and the model is `prepare_rows`' check."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # (a byte-order mark some editors write is not a row)
    except FileNotFoundError:
        raise BatchInputError(f"{path}: no such file (--input: a JSONL file, one prompt object per line)") from None
    except UnicodeDecodeError as e:
        raise BatchInputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    rows: list[BatchRow] = []
    problems: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as e:
            problems.append((n, f"not valid JSON ({e.msg} at column {e.colno})"))
            continue
        row, what = _parse_row(obj, n)
        if row is None:
            problems.append((n, what))
            continue
        key = id_key(row.id)
        if key in first_line:
            problems.append((n, f"duplicate id {key} (first on line {first_line[key]}): ids must be unique"))
            continue
        first_line[key] = n
        rows.append(row)
    if problems:
        raise _errors(str(path), problems)
    if not rows:
        raise BatchInputError(f"{path}: no rows (expected one JSON object per line with an id and a prompt)")
    return rows


def _parse_row(obj: Any, line: int) -> tuple[BatchRow | None, str]:
    if not isinstance(obj, dict):
        return None, f"a row must be a JSON object, got {type(obj).__name__}"
    if "id" not in obj:
        return None, 'no "id": give each row a unique string or integer id'
    row_id = obj["id"]
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
        return None, f'"id" must be a string or an integer, got {json.dumps(row_id)}'
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        return None, ('neither "prompt" nor "messages": give one' if not has_prompt
                      else 'both "prompt" and "messages": give one')
    if has_prompt and not isinstance(obj["prompt"], str):
        return None, f'"prompt" must be a string, got {type(obj["prompt"]).__name__}'
    unknown = sorted(k for k in obj if k not in ROW_KEYS and k not in FIELDS)
    if unknown:
        return None, (f"unknown field(s) {', '.join(unknown)}: a row holds id, prompt or messages, and decoding "
                      f"options ({', '.join(FIELDS)})")
    decoding = {k: obj[k] for k in FIELDS if k in obj}
    try:
        DecodingConfig().override(**decoding)  # names and types; the combination is checked with the job's options
        messages = check_messages(obj["messages"]) if has_messages else None
    except ValueError as e:
        return None, str(e)
    return BatchRow(line=line, id=row_id, prompt=obj.get("prompt"), messages=messages, decoding=decoding), ""


def job_options(config: DecodingConfig | Mapping[str, Any] | None) -> dict[str, Any]:
    """The options a job sets under every row: a mapping of explicitly given fields (as the CLI passes them), or
    every field of a `DecodingConfig` (as Python's `generate(config=...)` takes one), or none."""
    if config is None:
        return {}
    if isinstance(config, DecodingConfig):
        return {name: getattr(config, name) for name in FIELDS}
    return dict(config)


def prepare_rows(model: torch.nn.Module, tokenizer, rows: Sequence[BatchRow], *, where: str,
                 config: DecodingConfig | Mapping[str, Any] | None = None) -> None:
    """Give each row its settings (`model_decoding`: the model's saved settings, the job's options, the row's
    fields) and its prompt's token ids, as `generate` encodes them; a row that cannot be decoded raises a
    `BatchInputError` naming it. ``where`` is the input's name for the messages."""
    base = job_options(config)
    by_key: dict[str, DecodingConfig | str] = {}
    problems: list[tuple[int, str]] = []
    window = model.config.max_position_embeddings
    for row in rows:
        merged = {**base, **row.decoding}
        key = json.dumps(merged, sort_keys=True, default=str)
        if key not in by_key:
            try:
                cfg = model_decoding(model.config, merged, clear='--{name} {value} (a row: "{name}": {json})')
                _check_model(model, cfg)
                by_key[key] = cfg
            except ValueError as e:
                by_key[key] = str(e)
        cfg = by_key[key]
        if isinstance(cfg, str):
            problems.append((row.line, cfg))
            continue
        try:
            text = row.prompt if row.messages is None else render_chat(tokenizer, row.messages)
        except Exception as e:  # a model's own chat template may raise anything (jinja errors)
            problems.append((row.line, f"cannot render messages with the model's chat template: {e}"))
            continue
        if cfg.max_new_tokens >= window and text:
            problems.append((row.line, f"max_new_tokens={cfg.max_new_tokens} leaves no room for a prompt in the "
                                       f"model's window of {window} tokens"))
            continue
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        room = min(_check_model(model, cfg), window - cfg.max_new_tokens)  # (the engine keeps the whole answer)
        if len(ids) > room:  # as `generate`: the end of a prompt is what the answer continues
            warnings.warn(f"{where}:{row.line}: the prompt has {len(ids)} tokens but only {room} fit beside the "
                          f"answer: keeping its last {room}", stacklevel=2)
            ids = ids[len(ids) - room:]
        row.config, row.prompt_ids = cfg, ids
    if problems:
        raise _errors(where, problems)


def settings_key(config: DecodingConfig) -> str:
    """Rows whose settings give the same key are batched together."""
    return json.dumps({name: getattr(config, name) for name in FIELDS}, sort_keys=True)


def plan_batches(rows: Sequence[BatchRow], *, batch_size: int) -> list[list[BatchRow]]:
    """Rows in output order, cut into batches: settings groups in order of first appearance, input order within
    each, at most ``batch_size`` rows a batch. The output is always a prefix of this order, so a resumed job that
    runs the batches not yet written (and of a batch cut short, its missing rows) writes an uninterrupted job's file."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1.")
    groups: dict[str, list[BatchRow]] = {}
    for row in rows:
        groups.setdefault(settings_key(row.config), []).append(row)
    return [group[i:i + batch_size] for group in groups.values() for i in range(0, len(group), batch_size)]


class BatchAnswerer:
    """Prepared rows in, output rows out (in the same order).

    Greedy rows of one setting (no sampler: nothing depends on what shares the batch) are one `generate_ids` call
    over their left-padded prompts, as `generate` runs a batch. Sampled rows go through a `DecodeEngine` stepped
    until the batch is done: each row has its own sampler seeded with its ``seed``, so its answer is the one it
    gets alone (in one `generate_ids` call the rows would share one random stream). Holds the model and tokenizer;
    stateless between calls, so a Ray Data backend can build one per worker and map it over batches of rows."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_batch_rows: int = 64) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.engine = DecodeEngine(model, max_batch_rows=max_batch_rows, tokenizer=tokenizer)
        self.suppress = list(range(len(tokenizer), model.config.vocab_size))  # ids the tokenizer cannot decode

    def __call__(self, rows: Sequence[BatchRow]) -> list[dict[str, Any]]:
        if not rows:
            return []
        if rows[0].config.temperature == 0.0 and len({settings_key(r.config) for r in rows}) == 1:
            return self._padded(rows)
        return self._engine(rows)

    def _padded(self, rows: Sequence[BatchRow]) -> list[dict[str, Any]]:
        cfg = self.model.config
        device = next(self.model.parameters()).device
        ids, mask = left_pad([r.prompt_ids for r in rows], pad_id=cfg.pad_token_id if cfg.pad_token_id is not None
                             else 0, device=device)
        out = generate_ids(self.model, ids, mask, config=rows[0].config, suppress_ids=self.suppress)
        cut, full = out.lengths.tolist(), out.candidate_length.tolist()
        return [self.answer(row, tokens, "stop" if n < m else "length", calls)
                for row, tokens, n, m, calls in zip(rows, out.token_lists(), cut, full, out.calls_per_row())]

    def _engine(self, rows: Sequence[BatchRow]) -> list[dict[str, Any]]:
        engine = self.engine
        need = max(r.config.length_beam for r in rows)
        if engine.max_batch_rows < need:
            engine.max_batch_rows = need  # a length beam wider than the budget still runs (one row at a time)
        finished: dict[str, tuple[list[int], str, int]] = {}
        for i, row in enumerate(rows):
            engine.submit(str(i), row.prompt_ids, row.config)
        while len(finished) < len(rows):
            for event in engine.step():
                if event.finished:
                    finished[event.request_id] = (event.token_ids, event.finish_reason, event.steps)
        return [self.answer(row, *finished[str(i)]) for i, row in enumerate(rows)]

    def answer(self, row: BatchRow, token_ids: list[int], reason: str, calls: int) -> dict[str, Any]:
        """An output row: the text `generate` returns for these tokens, the finish reason and the counts (``calls``:
        the decoding model calls the answer took, the prompt's own pass not counted)."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        if row.config.stop:
            cut = cut_at_stop(text, row.config.stop)
            reason = "stop" if len(cut) < len(text) else reason
            text = cut
        return {"id": row.id, "text": text, "finish_reason": reason, "prompt_tokens": len(row.prompt_ids),
                "completion_tokens": len(token_ids), "calls": calls}


Backend = Callable[[Sequence[Sequence[BatchRow]]], Iterable[list[dict[str, Any]]]]
"""Answers batches of prepared rows: yields each batch's output rows (in row order), batch by batch in order."""


def local_backend(model: torch.nn.Module, tokenizer, *, max_batch_rows: int = 64) -> Backend:
    """The batches answered one after another in this process, by one `BatchAnswerer`."""
    answerer = BatchAnswerer(model, tokenizer, max_batch_rows=max_batch_rows)

    def run(batches: Sequence[Sequence[BatchRow]]) -> Iterator[list[dict[str, Any]]]:
        for batch in batches:
            yield answerer(batch)

    return run


def read_done(output: str | Path, rows: Sequence[BatchRow]) -> tuple[set[str], int, int]:
    """``(ids written, bytes of whole lines, line count)`` of an existing output. A last line without its newline
    (a write cut short by a kill) is not counted: its bytes are past the returned size. A line that is not an output
    row of these ``rows`` raises a `BatchInputError` naming it."""
    output = Path(output)
    if not output.exists():
        return set(), 0, 0
    data = output.read_bytes()
    whole = data.rfind(b"\n") + 1
    ids = {id_key(r.id) for r in rows}
    done: set[str] = set()
    problems: list[tuple[int, str]] = []
    lines = data[:whole].split(b"\n")[:-1] if whole else []
    for n, raw in enumerate(lines, start=1):
        try:
            obj = json.loads(raw)
            key = id_key(obj["id"]) if isinstance(obj, dict) and "id" in obj else None
        except ValueError:
            key = None
        if key is None:
            problems.append((n, "not an output row (a JSON object with an id): choose another --output"))
        elif key not in ids:
            problems.append((n, f"id {key} is not in the input: is this the output of another input file?"))
        elif key in done:
            problems.append((n, f"id {key} written twice"))
        else:
            done.add(key)
    if problems:
        raise _errors(str(output), problems)
    return done, whole, len(lines)


META_SUFFIX = ".meta.json"  # OUTPUT.meta.json: the model and settings that write OUTPUT (`output_record`)
# model config keys that say how this process loaded the model, not which model it is
_LOAD_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "attn_backend")


def meta_path(output: str | Path) -> Path:
    """Where the record of an output's model and settings lies: ``OUTPUT.meta.json`` beside it (the output itself
    stays plain JSONL, one answer a line, for pandas or datasets)."""
    output = Path(output)
    return output.with_name(output.name + META_SUFFIX)


def weights_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over the model's tensors as they run (name, dtype, shape, bytes; about a second per GB on a CPU core):
    what tells two models apart, whatever directory they were loaded from."""
    digest, hashed = hashlib.sha256(), {}
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach()
        key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        if key in hashed:  # a tied weight (the output projection and the embedding): named, not hashed twice
            digest.update(f"{name} = {hashed[key]}\n".encode())
            continue
        hashed[key] = name
        digest.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
        digest.update(t.reshape(-1).contiguous().view(torch.uint8).cpu().numpy())
    return digest.hexdigest()


def output_record(model: torch.nn.Module, config: DecodingConfig | Mapping[str, Any] | None, *,
                  model_path: str | Path | None = None) -> dict[str, Any]:
    """What an output file's rows depend on besides the input: the model (where it was loaded from, its weights'
    fingerprint and dtype, its config) and the job's decoding settings (the defaults under the model's saved settings
    under the job's options, `model_decoding`'s order; a row's own fields override them and sit in the input).
    Written to `meta_path` before the first row; a resume that differs is refused (`check_record`)."""
    mc = model.config
    path = model_path if model_path is not None else getattr(mc, "name_or_path", "") or ""
    settings = dataclasses.asdict(model_decoding(mc, job_options(config)))  # the model's own default included
    record = {
        "about": "the model and decoding settings this file's rows were written with (biglm generate --input); a "
                 "row's own fields in the input override these settings",
        "model": {"path": str(Path(path).resolve()) if path else None,
                  "weights_sha256": weights_fingerprint(model),
                  "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                  "config": {k: v for k, v in sorted(mc.to_dict().items()) if k not in _LOAD_KEYS}},
        "decoding": settings,
    }
    return json.loads(json.dumps(record, default=str))  # as read back from the file (tuples as lists)


def check_record(output: Path, record: dict[str, Any], *, rows_written: int) -> bool:
    """Whether `meta_path` (``output``'s record) must be written now: True when no row is written yet. Raises a
    `BatchInputError` in one line when the rows there were written by another model or with other settings than
    ``record`` says (naming what differs), or when rows exist without a record to say which."""
    meta = meta_path(output)
    if not rows_written:
        return True
    fresh = f"pass a new --output, or delete {output} and {meta.name} to start over"
    try:
        old = json.loads(meta.read_text(encoding="utf-8"))
        old_model, old_settings = old["model"], old["decoding"]
    except FileNotFoundError:
        raise BatchInputError(f"{output} holds {rows_written} rows but no {meta.name} saying which model and decoding "
                              f"settings wrote them (written by an older biglm, or the record was removed): "
                              f"{fresh}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise BatchInputError(f"{meta}: not a readable record of {output}'s model and settings ({e}): "
                              f"{fresh}") from None
    new_model, new_settings = record["model"], record["decoding"]
    config_keys = sorted(k for k in {*old_model.get("config", {}), *new_model["config"]}
                         if old_model.get("config", {}).get(k) != new_model["config"].get(k))
    same_model = (old_model.get("weights_sha256") == new_model["weights_sha256"]
                  and old_model.get("dtype") == new_model["dtype"] and not config_keys)
    fields = [name for name in FIELDS if old_settings.get(name) != new_settings.get(name)]
    if same_model and not fields:  # (the same weights loaded from another directory are the same model)
        return False

    def said(m: dict[str, Any], settings: dict[str, Any]) -> str:
        text = f"model {m.get('path')}"
        if not same_model:
            parts = [f"weights sha256 {str(m.get('weights_sha256'))[:12]}", f"dtype {m.get('dtype')}"]
            parts += [f"{k}={json.dumps((m.get('config') or {}).get(k))}" for k in config_keys[:3]]
            text += f" ({', '.join(parts)})"
        if fields:
            text += " with " + ", ".join(f"{name} unset" if settings.get(name) is None
                                         else f"{name}={json.dumps(settings[name])}" for name in fields)
        return text

    raise BatchInputError(f"{output} was written by {said(old_model, old_settings)}; this run is "
                          f"{said(new_model, new_settings)}: {fresh}")


def _write_record(path: Path, record: dict[str, Any]) -> None:
    """``record`` as JSON at ``path``, atomically (a temporary file moved into place, both synced)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def generate_file(
    model: torch.nn.Module,
    tokenizer,
    input: str | Path,
    output: str | Path,
    *,
    config: DecodingConfig | Mapping[str, Any] | None = None,
    batch_size: int = 16,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    on_batch: Callable[[int, list[dict[str, Any]]], None] | None = None,
    backend: Backend | None = None,
    model_path: str | Path | None = None,
) -> BatchReport:
    """Answer every row of the JSONL ``input`` into the JSONL ``output`` (see the module docstring).

    Args:
        model, tokenizer: a `BiGLMForMaskedLM` in eval mode and its tokenizer (`checkpoint.load_model`).
        input: the prompts file; output: the answers file (created, or continued where a run stopped).
        config: the job's decoding options under each row's own fields: a mapping of the options given explicitly
            (the CLI's flags; the rest take the model's saved settings), or a whole `DecodingConfig` (as
            `generate(config=...)`); default: the model's settings.
        batch_size: rows decoded together (rows of one settings group).
        progress: show a progress bar on stderr.
        echo: where notes go (a dropped partial line; default: stderr).
        on_batch: called with (batch number, its output rows) after each batch is written and flushed.
        backend: answers the batches (default: `local_backend`, here, on the model's device).
        model_path: where the model was loaded from, for the output's record (default: its config's name_or_path).

    Returns:
        A `BatchReport`. Raises `BatchInputError` for a malformed input row or an output of another job (other
        ids, or rows written by another model or with other settings than ``OUTPUT.meta.json`` records),
        `checkpoint.RunDirLockedError` when another job holds the output, all before any generation.
    """
    from ..checkpoint.lock import RunLock

    input, output = Path(input), Path(output)
    echo = echo or (lambda s: print(s, file=sys.stderr))
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1.")
    if output.resolve() == input.resolve():
        raise BatchInputError(f"{output}: the output is the input file: choose another --output")
    rows = read_rows(input)
    prepare_rows(model, tokenizer, rows, where=str(input), config=config)
    record = output_record(model, config, model_path=model_path)
    start = time.perf_counter()
    with RunLock.for_file(output, echo=echo):
        done, size, nlines = read_done(output, rows)
        new_record = check_record(output, record, rows_written=len(done))  # before anything is changed
        # the batches of an uninterrupted run, so a resumed one makes the same model calls (a batched call rounds
        # differently from a smaller one, which may flip a near-tie); a batch cut short by a kill runs again whole
        batches = [b for b in plan_batches(rows, batch_size=batch_size) if any(id_key(r.id) not in done for r in b)]
        if output.exists() and output.stat().st_size != size:  # a kill cut the last write short
            echo(f"[biglm] {output}:{nlines + 1}: dropping a partial last line left by a stopped run")
            os.truncate(output, size)
        if not batches:
            return BatchReport(rows=len(rows), done_before=len(done), written=0, batches=0, seconds=0.0)
        if backend is None:
            backend = local_backend(model, tokenizer,
                                    max_batch_rows=batch_size * max(r.config.length_beam for r in rows))
        if new_record:  # the record first: a row is never on disk without the model and settings that wrote it
            _write_record(meta_path(output), record)
        bar = _progress(total=len(rows), initial=len(done), enabled=progress)
        written, b = 0, -1
        try:
            with open(output, "ab") as f:
                for b, (batch, answered) in enumerate(zip(batches, backend(batches))):
                    if [a["id"] for a in answered] != [r.id for r in batch]:  # the file must stay in plan order
                        raise RuntimeError(f"the backend answered batch {b} out of order or incompletely")
                    answers = [a for a in answered if id_key(a["id"]) not in done]
                    f.write("".join(json.dumps(a, ensure_ascii=False) + "\n" for a in answers).encode("utf-8"))
                    f.flush()
                    os.fsync(f.fileno())
                    written += len(answers)
                    bar.update(len(answers))
                    if on_batch is not None:
                        on_batch(b, answers)
            if b + 1 != len(batches):
                raise RuntimeError(f"the backend answered {b + 1} of {len(batches)} batches")
        finally:
            bar.close()
    return BatchReport(rows=len(rows), done_before=len(done), written=written, batches=len(batches),
                       seconds=time.perf_counter() - start)


def _progress(*, total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="row", desc="generating", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True)
