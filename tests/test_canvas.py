"""The canvas of an answer as it decodes (`biglm.generation.canvas`) and `biglm generate --show`.

What must hold: the recorder's frames are the decode's own calls (one per call, the last one the answer), each slot's
state says what that call did (Mask-Predict re-masks n_t = floor(N(T-t)/T) slots at call t; confidence decoding
writes one token a call; speculative decoding's accepted drafts and written tokens add up, a rejected draft differs
from the token the call wrote there), and each token's confidence is its probability when written. `--show` redraws
the canvas in place on a terminal (a pseudo-terminal here: cursor-up and erase-line sequences, one frame per call)
and leaves stdout byte for byte what the plain run prints.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
import warnings

import pytest
import torch

from biglm.checkpoint import load_model
from biglm.generation import DecodingConfig, generate_ids
from biglm.generation.canvas import STATES, CanvasRecorder
from biglm.generation.decoding import mask_predict_count

PROMPT = "To be, or not to be, that is"


@pytest.fixture(scope="module")
def tiny(checkpoint):
    model, tok = load_model(checkpoint)
    ids = torch.tensor([tok(PROMPT, add_special_tokens=False)["input_ids"]])
    return model, tok, ids


def _record(model, ids, **config):
    rec = CanvasRecorder(model.config.mask_token_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # speculative decoding on a paper model warns that it approximates
        out = generate_ids(model, ids, config=DecodingConfig(**config), on_step=rec)
    return rec.frames, out


def _common(frames, out):
    """What every decode's frames hold: one per call, numbered 1.., states known, a token wherever a slot is not
    masked, and the last frame's tokens the answer's."""
    assert [f.call for f in frames] == list(range(1, out.steps + 1))
    for f in frames:
        (row,) = f.rows
        assert set(row.states) <= set(STATES)
        for tok, state, conf in zip(row.tokens, row.states, row.confidence):
            assert state in ("masked", "remasked") if tok is None else state != "masked"
            assert (conf is None) == (tok is None)
    last = frames[-1].rows[0]
    n = int(out.candidate_length[0])
    assert last.tokens[:n] == out.tokens[0, :n].tolist()


def test_mask_predict_frames_remask_n_t_slots(tiny):
    model, _, ids = tiny
    N, T = 12, 4
    frames, out = _record(model, ids, max_new_tokens=N, steps=T)
    _common(frames, out)
    assert frames[0].rows[0].states == ["new"] * N
    for t, f in enumerate(frames[1:], start=1):
        states = f.rows[0].states
        assert states.count("remasked") == mask_predict_count(length=N, step=t, steps=T)
        assert states.count("remasked") + states.count("kept") == N
    # a kept token's confidence is the one it was written with; a re-written one's is this call's
    for before, after in zip(frames, frames[1:]):
        for s, state in enumerate(after.rows[0].states):
            if state == "kept":
                assert after.rows[0].confidence[s] == before.rows[0].confidence[s]
                assert after.rows[0].tokens[s] == before.rows[0].tokens[s]


def test_confidence_frames_write_one_token_a_call_with_its_probability(tiny):
    model, _, ids = tiny
    N = 10
    frames, out = _record(model, ids, max_new_tokens=N, strategy="confidence")
    _common(frames, out)
    for t, f in enumerate(frames, start=1):
        row = f.rows[0]
        assert row.states.count("new") == 1 and row.new_tokens == 1 and row.written == t
        assert row.states.count("masked") == N - t
    # the confidence shown is the probability the answer's token had when written (greedy: token_logprobs)
    last = frames[-1].rows[0]
    assert last.confidence == pytest.approx(out.token_logprobs[0, :N].exp().tolist(), rel=1e-5)


def test_speculative_frames_count_accepted_drafts_and_name_rejected_ones(tiny):
    model, _, ids = tiny
    frames, out = _record(model, ids, max_new_tokens=16, strategy="confidence", draft_length=3, draft_ngram=2)
    _common(frames, out)
    written, saw_draft = 0, False
    for f in frames:
        row = f.rows[0]
        accepted, new = row.states.count("accepted"), row.states.count("new")
        assert new <= 1 and row.written == written + accepted + new
        assert row.new_tokens == accepted + new
        for s, draft in enumerate(row.rejected):
            if draft is not None:
                saw_draft = True
                assert row.states[s] != "accepted" and draft != row.tokens[s]  # greedy: the model wrote otherwise
        saw_draft |= accepted > 0
        written = row.written
    assert saw_draft  # drafts were checked (n-gram drafts of the text so far)
    assert frames[-1].rows[0].confidence[:written] == pytest.approx(
        out.token_logprobs[0, :written].exp().tolist(), rel=1e-5)


def test_frames_of_a_batch_and_a_length_beam_name_their_rows(tiny):
    model, tok, _ = tiny
    ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"][:4] for p in (PROMPT, "ROMEO: My lord")])
    frames, out = _record(model, ids, max_new_tokens=8, steps=3, length_beam=2)
    assert [(r.prompt, r.length) for r in frames[0].rows] == [(0, 8), (0, 4), (1, 8), (1, 4)]
    assert all(len(r.tokens) == r.length for r in frames[-1].rows)
    assert len(frames) == out.steps


@pytest.mark.parametrize("config", [dict(max_new_tokens=10, steps=4),
                                    dict(max_new_tokens=10, strategy="confidence", draft_length=2, draft_ngram=2)])
def test_the_engine_records_the_frames_a_lone_decode_records(tiny, config):
    """A request's ``on_step`` in the server's engine, batched beside another request, sees the canvases that
    `generate_ids` alone records (float32: the same tokens and states), one per call the engine reports."""
    from biglm.generation.engine import DecodeEngine

    model, tok, ids = tiny
    alone, _ = _record(model, ids, **config)
    engine = DecodeEngine(model, max_batch_rows=4)
    rec = CanvasRecorder(model.config.mask_token_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.submit("other", tok("ROMEO: My lord", add_special_tokens=False)["input_ids"],
                      DecodingConfig(max_new_tokens=6, steps=3))
        engine.submit("drawn", ids[0].tolist(), DecodingConfig(**config), on_step=rec)
        finished = {}
        while len(finished) < 2:
            finished.update({e.request_id: e for e in engine.step() if e.finished})
    assert len(rec.frames) == finished["drawn"].steps <= len(alone)  # (the engine may end at a settled EOS)
    for a, b in zip(alone, rec.frames):
        assert (a.call, a.rows[0].tokens, a.rows[0].states, a.rows[0].rejected) == (
            b.call, b.rows[0].tokens, b.rows[0].states, b.rows[0].rejected)
        unset = lambda confidence: [-1.0 if c is None else c for c in confidence]  # noqa: E731
        assert unset(a.rows[0].confidence) == pytest.approx(unset(b.rows[0].confidence), rel=1e-4)


def _pty_run(argv: list[str], env: dict) -> tuple[int, bytes, str]:
    """Run ``argv`` with stderr on a pseudo-terminal: (exit code, stdout bytes, what the terminal received)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    received: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed its end
                return
            if not chunk:
                return
            received.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    out, _ = proc.communicate(timeout=240)
    reader.join(10)
    os.close(master)
    return proc.returncode, out, b"".join(received).decode("utf-8", "replace")


def test_generate_show_redraws_the_canvas_in_a_terminal(checkpoint, tiny, capsys):
    from biglm.generation.cli import main

    flags = ["--max_new_tokens", "10", "--steps", "4"]
    argv = [str(checkpoint), "--prompt", PROMPT, *flags]
    capsys.readouterr()
    assert main(argv) == 0
    plain = capsys.readouterr().out
    model, _, ids = tiny
    config = {flags[i][2:]: (int(flags[i + 1]) if flags[i + 1].isdigit() else flags[i + 1])
              for i in range(0, len(flags), 2)}
    calls = generate_ids(model, ids, config=DecodingConfig(**config),
                         suppress_ids=range(len(tiny[1]), model.config.vocab_size)).steps
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40", "OMP_NUM_THREADS": "1"}
    env.pop("NO_COLOR", None)
    code, out, screen = _pty_run([sys.executable, "-m", "biglm", "generate", *argv, "--show"], env)
    assert code == 0, screen
    assert out.decode() == plain  # stdout: the plain run's text, byte for byte
    # every call drawn once, in order, each redraw going back up over the previous frame and erasing it
    drawn = [int(c) for c in re.findall(r"call (\d+)/\d+", screen)]
    assert [c for i, c in enumerate(drawn) if i == 0 or c != drawn[i - 1]] == list(range(1, calls + 1))
    frames = screen.split("\x1b[1mcall ")[1:]
    assert len(frames) >= calls
    assert all(f.rstrip("\r\n").endswith("\x1b[2K\x1b[1A\x1b[2K") or f is frames[-1] for f in frames)
    assert "\x1b[1;32m" in screen and "\x1b[1;33m" in screen  # tokens a call wrote (green), re-masked (yellow)


def test_show_refused_where_it_draws_nothing(tmp_path, capsys):
    from biglm.generation.cli import main

    assert main([str(tmp_path), "--prompt", "x", "--show", "--show_steps"]) == 2
    assert "pick one" in capsys.readouterr().err
    assert main([str(tmp_path), "--input", "a.jsonl", "--output", "b.jsonl", "--show"]) == 2
    assert "--show applies to --prompt only" in capsys.readouterr().err
