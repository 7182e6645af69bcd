"""Ctrl-C in `biglm generate --prompt` (issue 50): each answer as far as it was written, one ``[biglm] interrupted``
line, exit code 130, no traceback; with and without ``--show`` / ``--show_steps``."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from biglm import BiGLMForMaskedLM
from biglm.generation.cli import main as generate_main

PROMPT = "The king said"


def _interrupt_at_call(monkeypatch, call: int) -> None:
    """Ctrl-C as the decode's ``call``-th model call starts (the prompt's own encoding is not one of them)."""
    forward, calls = BiGLMForMaskedLM.forward, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(BiGLMForMaskedLM, "forward", interrupted)


@pytest.mark.parametrize("show", [[], ["--show"], ["--show_steps"]])
def test_ctrl_c_prints_each_answer_so_far_one_line_and_exits_130(checkpoint, capsys, monkeypatch, show):
    argv = [str(checkpoint), "--prompt", PROMPT, "--prompt", "ROMEO:", "--strategy", "confidence",
            "--max_new_tokens", "12", "--steps", "12", "--device", "cpu", *show]
    assert generate_main(argv) == 0
    whole = capsys.readouterr().out
    _interrupt_at_call(monkeypatch, 4)  # three calls made: three of the twelve slots written in each answer
    try:
        code = generate_main(argv)
    except KeyboardInterrupt:  # (without the fix: the traceback a user saw)
        code = "KeyboardInterrupt escaped"
    out, err = capsys.readouterr()
    assert code == 130
    assert err.rstrip("\n").splitlines()[-1] == ("[biglm] interrupted after model call 3 of 12: the answers above are "
                                                "partial (_ = not written yet)")
    assert err.count("[biglm] interrupted") == 1 and "Traceback" not in err
    assert f"### prompt 1: {PROMPT}\n" in out and out.endswith("\n")
    partial = out[out.index(f"### prompt 1: {PROMPT}\n"):]  # (--show_steps printed its steps before)
    assert "### prompt 2: ROMEO:\n" in partial and partial != whole[whole.index("### prompt 1"):]  # not the finished
    if show == ["--show_steps"]:  # the canvas printed is the one the last call left, unwritten slots as _
        step = re.search(r"\[step 3/12\] prompt 1, \d+ masked: (.*?)\n\[step 3/12\] prompt 2", out, re.S).group(1)
        first = re.search(rf"### prompt 1: {PROMPT}\n(.*?)\n### prompt 2", partial, re.S).group(1)
        assert first == step.rstrip("_") and "_" in step

def test_ctrl_c_before_the_first_model_call_says_so(checkpoint, capsys, monkeypatch):
    _interrupt_at_call(monkeypatch, 1)
    try:
        code = generate_main([str(checkpoint), "--prompt", PROMPT, "--device", "cpu"])
    except KeyboardInterrupt:
        code = "KeyboardInterrupt escaped"
    out, err = capsys.readouterr()
    assert code == 130 and out == ""
    assert err.rstrip("\n").splitlines()[-1] == "[biglm] interrupted before the first model call"


def test_sigint_to_a_running_biglm_generate_exits_130_without_a_traceback(checkpoint):
    cmd = [sys.executable, "-c", "import sys; from biglm.cli import main; sys.exit(main())", "generate",
           str(checkpoint), "--prompt", PROMPT, "--max_new_tokens", "200", "--steps", "200", "--show_steps",
           "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("[step 1/200] prompt 1")  # decoding: Ctrl-C now
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.count("[biglm] interrupted") == 1
    assert err.rstrip("\n").splitlines()[-1].startswith("[biglm] interrupted after model call ")
    assert f"### prompt 1: {PROMPT}\n" in out
