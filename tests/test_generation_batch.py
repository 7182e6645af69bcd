"""Batch generation over files (`biglm generate --input --output`): answers equal `generate` prompt by prompt,
a stopped job resumes without losing or repeating a row, a finished one is left alone, bad rows are named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from biglm.checkpoint import RunDirLockedError, RunLock, load_model
from biglm.generation import generate
from biglm.generation.batch import BatchInputError, generate_file, local_backend, meta_path, read_rows
from biglm.generation.chat import render_chat
from biglm.generation.cli import main as generate_main
from biglm.generation.config import model_decoding

REPO = Path(__file__).resolve().parents[1]

ROWS = [
    {"id": "a", "prompt": "The king"},
    {"id": 2, "prompt": "To be, or not"},
    {"id": "chat", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who?"}]},
    {"id": "short", "prompt": "My lord,", "max_new_tokens": 6, "steps": 3},
    {"id": "sampled", "prompt": "The king", "temperature": 1.0, "top_k": 20, "seed": 7},
    {"id": "sampled2", "prompt": "To be, or not", "temperature": 1.0, "top_k": 20, "seed": 7},  # its batch-mate
    {"id": "conf", "prompt": "", "strategy": "confidence", "max_new_tokens": 8},
    {"id": "stop", "prompt": "And then", "stop": ["e"], "max_new_tokens": 12},
    {"id": "e", "prompt": "What, my dear lady", "steps": 3, "max_new_tokens": 6},
    {"id": "beam", "prompt": "Come", "length_beam": 2, "max_new_tokens": 10, "steps": 4},
]


@pytest.fixture(scope="module")
def peaked(checkpoint, tmp_path_factory) -> Path:
    """The `checkpoint` fixture's tokenizer and tiny shape with a larger init std: peaked predictions free of
    near-ties, whose order float rounding of a batched call could flip (as in test_generation_engine)."""
    from conftest import save_random_model

    _, tok = load_model(checkpoint, device="cpu")
    return save_random_model(tmp_path_factory.mktemp("peaked"), tok, initializer_range=0.2)


@pytest.fixture(scope="module")
def loaded(peaked):
    return load_model(peaked, device="cpu")


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _expected(model, tok, row: dict, options: dict | None = None) -> str:
    fields = {k: v for k, v in row.items() if k not in ("id", "prompt", "messages")}
    text = row["prompt"] if "prompt" in row else render_chat(tok, row["messages"])
    return generate(model, tok, [text], config=model_decoding(model.config, {**(options or {}), **fields}))[0]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_answers_equal_generate_prompt_by_prompt(loaded, tmp_path):
    """Every row, whatever shares its batch: the text `generate` gives that prompt alone with the row's settings
    (the job's options under the row's own fields); one output row per input row, ids kept."""
    model, tok = loaded
    src = _write(tmp_path / "in.jsonl", ROWS)
    options = {"steps": 5, "max_new_tokens": 16}
    report = generate_file(model, tok, src, tmp_path / "out.jsonl", config=options, batch_size=2, progress=False)
    out = _rows(tmp_path / "out.jsonl")
    assert report.written == len(ROWS) and report.done_before == 0
    assert sorted(map(json.dumps, (r["id"] for r in out))) == sorted(json.dumps(r["id"]) for r in ROWS)
    by_id = {json.dumps(r["id"]): r for r in out}
    for row in ROWS:
        got = by_id[json.dumps(row["id"])]
        assert got["text"] == _expected(model, tok, row, options), row["id"]
        assert set(got) == {"id", "text", "finish_reason", "prompt_tokens", "completion_tokens", "calls"}
    # the model calls each answer took: the steps given (Mask-Predict runs them all)
    assert by_id['"a"']["calls"] == 5 and by_id['"short"']["calls"] == 3 and by_id['"beam"']["calls"] == 4
    assert by_id['"conf"']["calls"] == 5  # the job's steps
    # per-row fields applied: answer lengths and stop strings
    assert by_id['"short"']["completion_tokens"] <= 6 and by_id['"conf"']["completion_tokens"] <= 8
    assert by_id['"a"']["completion_tokens"] <= 16 and by_id['"a"']["prompt_tokens"] > 0
    stop = by_id['"stop"']
    assert "e" not in stop["text"]
    if "e" in _expected(model, tok, {**ROWS[7], "stop": []}, options):
        assert stop["finish_reason"] == "stop"
    # the sampled row differs from the greedy one on the same prompt (its temperature was used)
    assert by_id['"sampled"']["text"] != by_id['"a"']["text"]


def test_rows_with_the_same_settings_share_batches(loaded, tmp_path):
    """Batches of at most batch_size rows, one settings group each (groups by first appearance, input order within),
    and the file in that order."""
    model, tok = loaded
    rows = [{"id": i, "prompt": f"Row {i}", **({"steps": 2} if i % 3 == 0 else {})} for i in range(8)]
    src = _write(tmp_path / "in.jsonl", rows)
    seen: list[list] = []
    inner = local_backend(model, tok)

    def spy(batches):
        seen.extend([r.id for r in b] for b in batches)
        return inner(batches)

    generate_file(model, tok, src, tmp_path / "out.jsonl", config={"max_new_tokens": 6}, batch_size=2, progress=False,
                  backend=spy)
    assert seen == [[0, 3], [6], [1, 2], [4, 5], [7]]
    assert [r["id"] for r in _rows(tmp_path / "out.jsonl")] == [0, 3, 6, 1, 2, 4, 5, 7]


def test_cli_matches_biglm_generate(peaked, tmp_path, capsys):
    checkpoint = peaked
    """`biglm generate --input` and `biglm generate --prompt` with the same flags write the same answers."""
    rows = [{"id": 1, "prompt": "The king"}, {"id": 2, "prompt": "To be, or not", "steps": 2}]
    src = _write(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    flags = ["--max_new_tokens", "12", "--steps", "4", "--device", "cpu"]
    assert generate_main([str(checkpoint), "--input", str(src), "--output", str(out), *flags,
                          "--progress", "false"]) == 0
    assert "wrote 2 rows" in capsys.readouterr().err
    answers = [r["text"] for r in _rows(out)]
    for row, answer in zip(rows, answers):
        steps = ["--steps", str(row.get("steps", 4))]  # the row's own field in place of the job's flag
        assert generate_main([str(checkpoint), "--prompt", row["prompt"], *flags[:2], *steps, *flags[4:]]) == 0
        printed = capsys.readouterr().out
        assert printed == f"### prompt 1: {row['prompt']}\n{answer}\n"


def test_stopped_job_resumes_to_the_same_file(loaded, tmp_path):
    """Stopped after two batches, with half a line of a third written (a kill mid-write): the re-run drops the
    partial line, writes only the rest, and the file equals an uninterrupted run's byte for byte; a finished
    re-run changes nothing."""
    model, tok = loaded
    src = _write(tmp_path / "in.jsonl", ROWS)
    whole = tmp_path / "whole.jsonl"
    generate_file(model, tok, src, whole, batch_size=2, progress=False, config={"max_new_tokens": 10})

    part = tmp_path / "part.jsonl"

    class Stop(Exception):
        pass

    def stop_after_two(b, answers):
        if b == 1:
            raise Stop

    with pytest.raises(Stop):
        generate_file(model, tok, src, part, batch_size=2, progress=False, config={"max_new_tokens": 10},
                      on_batch=stop_after_two)
    written = part.read_bytes()
    n = written.count(b"\n")
    assert 0 < n < len(ROWS) and whole.read_bytes().startswith(written)
    next_line = whole.read_bytes().split(b"\n")[n]
    with open(part, "ab") as f:  # a write cut short by a kill
        f.write(next_line[: len(next_line) // 2])
    notes: list[str] = []
    report = generate_file(model, tok, src, part, batch_size=2, progress=False, config={"max_new_tokens": 10},
                           echo=notes.append)
    assert report.done_before == n and report.written == len(ROWS) - n
    assert any(f"part.jsonl:{n + 1}: dropping a partial last line" in s for s in notes)
    assert part.read_bytes() == whole.read_bytes()

    stat = part.stat()
    again = generate_file(model, tok, src, part, batch_size=2, progress=False, config={"max_new_tokens": 10})
    assert again.written == 0 and again.done_before == len(ROWS)
    assert part.read_bytes() == whole.read_bytes() and part.stat().st_mtime_ns == stat.st_mtime_ns


@pytest.mark.parametrize("cut", [0.3, 0.62])
def test_a_write_cut_anywhere_resumes_to_the_same_file(loaded, tmp_path, cut):
    """An output cut at any byte (a kill in the middle of a batch's write, a row half written): the re-run runs
    that batch again and writes its missing rows only; no row lost or repeated, the file as an uninterrupted run's
    (also with another batch size, whose batched calls round alike on this model)."""
    model, tok = loaded
    src = _write(tmp_path / "in.jsonl", ROWS)
    whole = tmp_path / "whole.jsonl"
    generate_file(model, tok, src, whole, batch_size=3, progress=False)
    data = whole.read_bytes()
    for batch_size in (3, 4):
        part = tmp_path / f"part{batch_size}.jsonl"
        part.write_bytes(data[: int(len(data) * cut)])
        meta_path(part).write_bytes(meta_path(whole).read_bytes())  # written before the first row, as by the cut run
        report = generate_file(model, tok, src, part, batch_size=batch_size, progress=False, echo=lambda s: None)
        assert report.done_before + report.written == len(ROWS)
        assert part.read_bytes() == data


def test_killed_process_resumes(peaked, tmp_path):
    """A real `biglm generate --input` killed (SIGKILL) after its first flush, then run again: every row once,
    the file equal to an uninterrupted run's."""
    rows = [{"id": i, "prompt": f"The king {'and queen ' * (i % 4)}said"} for i in range(16)]
    src = _write(tmp_path / "in.jsonl", rows)
    args = [sys.executable, "-m", "biglm", "generate", str(peaked), "--input", str(src), "--batch_size", "2",
            "--steps", "16", "--max_new_tokens", "32", "--device", "cpu", "--progress", "false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "killed.jsonl"
    proc = subprocess.Popen([*args, "--output", str(out)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not (out.exists() and out.stat().st_size > 0) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the job ended before it could be killed"
    first = out.read_bytes().count(b"\n")
    assert 0 < first < len(rows)
    done = subprocess.run([*args, "--output", str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    whole = tmp_path / "whole.jsonl"  # uninterrupted, in this process: the same code
    model, tok = load_model(peaked, device="cpu")
    generate_file(model, tok, src, whole, config={"steps": 16, "max_new_tokens": 32}, batch_size=2, progress=False)
    ids = [r["id"] for r in _rows(out)]
    assert sorted(ids) == list(range(len(rows)))
    assert out.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize("line, needle", [
    ('{"id": 9, "prompt": "x"', "not valid JSON"),
    ('{"prompt": "x"}', 'no "id"'),
    ('{"id": 1, "prompt": "x"}', "duplicate id 1 (first on line 1)"),
    ('{"id": 9}', 'neither "prompt" nor "messages"'),
    ('{"id": 9, "prompt": "x", "messages": [{"role": "user", "content": "y"}]}', 'both "prompt" and "messages"'),
    ('{"id": 9, "prompt": 3}', '"prompt" must be a string'),
    ('{"id": [9], "prompt": "x"}', '"id" must be a string or an integer'),
    ('{"id": 9, "prompt": "x", "steps": "4"}', "steps='4' must be an integer"),
    ('{"id": 9, "prompt": "x", "temprature": 0.5}', "unknown field(s) temprature"),
    ('{"id": 9, "messages": [{"role": "bot", "content": "y"}]}', "role='bot'"),
    ('[1, 2]', "must be a JSON object"),
])
def test_bad_row_is_named_before_any_work(loaded, tmp_path, line, needle):
    model, tok = loaded
    src = _write(tmp_path / "in.jsonl", ['{"id": 1, "prompt": "x"}', "", line])
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(BatchInputError) as e:
            generate_file(model, tok, src, tmp_path / "out.jsonl", progress=False)
    finally:
        hook.remove()
    assert str(e.value).startswith(f"{src}:3: ") and needle in str(e.value)
    assert not calls and not (tmp_path / "out.jsonl").exists()


def test_settings_that_do_not_fit_the_model_are_named(loaded, tmp_path):
    """Checked with the job's options and the model, still before any work: every bad line listed."""
    model, tok = loaded
    src = _write(tmp_path / "in.jsonl", [{"id": 1, "prompt": "x", "strategy": "confidence"},
                                         {"id": 2, "prompt": "x", "max_new_tokens": 100000},
                                         {"id": 3, "prompt": "x", "strategy": "mask-predict"}])
    with pytest.raises(BatchInputError) as e:
        generate_file(model, tok, src, tmp_path / "out.jsonl", config={"early_stop": True}, progress=False)
    lines = str(e.value).splitlines()
    assert lines[0].startswith(f"{src}:1: early_stop applies to mask-predict only")
    assert lines[1].startswith(f"{src}:2: max_new_tokens=100000 exceeds")
    assert len(lines) == 2 and not (tmp_path / "out.jsonl").exists()


def test_cli_refuses_a_bad_row_before_loading_the_model(tmp_path, capsys):
    src = _write(tmp_path / "in.jsonl", ['{"id": 1, "prompt": "x"}', '{"id": 1, "prompt": "y"}'])
    # no model at this path: the input is checked first
    assert generate_main([str(tmp_path / "no-model"), "--input", str(src), "--output", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{src}:2: duplicate id 1" in err and "no checkpoint" not in err
    assert generate_main(["x", "--input", str(src), "--prompt", "y", "--output", "o"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert generate_main(["x", "--input", str(src)]) == 2
    assert "--input needs --output" in capsys.readouterr().err


def test_output_of_another_input_is_refused(loaded, tmp_path):
    model, tok = loaded
    src = _write(tmp_path / "in.jsonl", [{"id": 1, "prompt": "x"}])
    out = _write(tmp_path / "out.jsonl", [{"id": 5, "text": "y"}])
    with pytest.raises(BatchInputError, match=r"out.jsonl:1: id 5 is not in the input"):
        generate_file(model, tok, src, out, progress=False)
    assert read_rows(src)[0].id == 1


def test_a_second_job_on_the_same_output_is_refused(loaded, tmp_path):
    model, tok = loaded
    src = _write(tmp_path / "in.jsonl", [{"id": 1, "prompt": "x"}])
    out = tmp_path / "out.jsonl"
    code = ("import sys, time; from biglm.checkpoint import RunLock; "
            "RunLock.for_file(sys.argv[1], command='biglm generate other').acquire(); print('locked', flush=True); "
            "time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirLockedError, match=r"out.jsonl is in use by another run .*biglm generate other"):
            generate_file(model, tok, src, out, progress=False)
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    with RunLock.for_file(out):  # free again once the holder is gone
        pass
    assert generate_file(model, tok, src, out, progress=False).written == 1


def test_resume_with_another_model_or_other_settings_is_refused(loaded, peaked, checkpoint, tmp_path, capsys):
    """The model (path, config, weights fingerprint) and the job's settings are recorded in OUTPUT.meta.json before the
    first row; continuing the file with another model or other settings is refused in one line naming what differs,
    and the file is left as it was. The same weights loaded from another directory continue it."""
    import shutil

    model, tok = loaded
    src = _write(tmp_path / "in.jsonl", ROWS)
    out, options = tmp_path / "out.jsonl", {"max_new_tokens": 6, "steps": 3}
    inner, seen = local_backend(model, tok), []

    def first_batch_only(batches):  # the record is on disk before any row, then one batch is written
        for batch, answered in zip(batches, inner(batches)):
            seen.append((meta_path(out).is_file(), out.exists() and out.stat().st_size > 0))
            yield answered
            return

    with pytest.raises(RuntimeError, match="answered 1 of"):
        generate_file(model, tok, src, out, config=options, batch_size=2, progress=False, backend=first_batch_only)
    assert seen == [(True, False)]
    from biglm.generation.batch import weights_fingerprint

    record = json.loads(meta_path(out).read_text())
    assert record["model"]["path"] == str(peaked.resolve())
    other, _ = load_model(checkpoint, device="cpu")
    assert record["model"]["weights_sha256"] == weights_fingerprint(model) != weights_fingerprint(other)
    assert record["model"]["config"]["hidden_size"] == model.config.hidden_size
    assert record["decoding"]["steps"] == 3 and record["decoding"]["strategy"] == "mask-predict"
    written = out.read_bytes()
    assert written.count(b"\n") == 2 and all(set(r) >= {"id", "text"} for r in _rows(out))  # plain JSONL rows only

    with pytest.raises(BatchInputError) as e:
        generate_file(other, tok, src, out, config=options, batch_size=2, progress=False)
    said = str(e.value)
    assert said.count("\n") == 0 and said.startswith(f"{out} was written by model {peaked.resolve()} (weights sha256 ")
    assert f"this run is model {checkpoint.resolve()} (weights sha256 " in said and "pass a new --output" in said
    assert "with steps" not in said  # only what differs
    with pytest.raises(BatchInputError) as e:
        generate_file(model, tok, src, out, config={**options, "steps": 4}, progress=False)
    said = str(e.value)
    assert "with steps=3; this run is" in said and "with steps=4: pass a new --output" in said
    assert "weights sha256" not in said
    # the CLI: one line, exit 2, nothing written
    assert generate_main([str(checkpoint), "--input", str(src), "--output", str(out), "--max_new_tokens", "6",
                          "--steps", "3", "--device", "cpu", "--progress", "false"]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("biglm generate:")]
    assert len(said) == 1 and said[0].startswith(f"biglm generate: {out} was written by model ")
    assert out.read_bytes() == written

    # the same weights from another directory: the same model, the file continues to an uninterrupted run's
    moved = shutil.copytree(peaked, tmp_path / "moved")
    same, _ = load_model(moved, device="cpu")
    report = generate_file(same, tok, src, out, config=options, batch_size=2, progress=False)
    assert report.done_before == 2 and report.written == len(ROWS) - 2
    whole = tmp_path / "whole.jsonl"
    generate_file(model, tok, src, whole, config=options, batch_size=2, progress=False)
    assert out.read_bytes() == whole.read_bytes()

    # rows without a record (an older biglm's output) are not continued either
    meta_path(whole).unlink()
    with pytest.raises(BatchInputError, match=r"holds 10 rows but no whole.jsonl.meta.json"):
        generate_file(model, tok, src, whole, config=options, progress=False)


def test_a_saved_setting_refused_for_a_row_says_where_it_came_from(checkpoint, tmp_path):
    """A fine-tuned model's saved steps do not fit speculative decoding: the row is named, and the message says the
    value is the model's (from its config.json) and how to clear it, on the command line or in the row."""
    model, tok = load_model(checkpoint, device="cpu")
    model.config.task_specific_params = {"seq2seq": {"steps": 10, "max_new_tokens": 6}}
    tuned = tmp_path / "tuned"
    model.save_pretrained(tuned)
    tok.save_pretrained(tuned)
    model, tok = load_model(tuned, device="cpu")
    src = _write(tmp_path / "in.jsonl", [{"id": 1, "prompt": "x"}, {"id": 2, "prompt": "y", "steps": None}])
    options = {"strategy": "confidence", "draft_length": 2}
    with pytest.raises(BatchInputError) as e:
        generate_file(model, tok, src, tmp_path / "out.jsonl", config=options, progress=False)
    (line,) = str(e.value).splitlines()  # row 2 cleared it
    assert line.startswith(f"{src}:1: ") and "steps=10 is not an option given here but the model's saved" in line
    assert str(tuned / "config.json") in line and 'clear it with --steps none (a row: "steps": null)' in line
    with pytest.warns(UserWarning, match="approximation"):  # (a paper model: speculative decoding is approximate)
        report = generate_file(model, tok, src, tmp_path / "out.jsonl", config={**options, "steps": None},
                               progress=False)
    assert report.written == 2
    assert all(r["completion_tokens"] <= 6 for r in _rows(tmp_path / "out.jsonl"))  # the saved answer length stays
