"""The `biglm` command dispatcher and the small commands."""

from __future__ import annotations

import pytest

from biglm.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"  {name}" in out


def test_unknown_command(capsys):
    assert main(["train-gpt"]) == 2
    assert "unknown command 'train-gpt'" in capsys.readouterr().err


def test_presets_prints_counts(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    # SmolLM-sized counts for vocab 49152 (tied embeddings): 134.5M and 361.8M
    assert "biglm-136m" in out and "134.5M" in out and "361.8M" in out


def test_recipes_lists_the_paper(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    for name in ("table1-biglm", "table1-mlm", "table8-alpha-0.3", "table2-wsd-syndata", "biglm-3.5b"):
        assert name in out


def test_pretrain_help_and_bad_option(capsys):
    assert main(["pretrain", "--help"]) == 0
    assert "--global_batch" in capsys.readouterr().out
    assert main(["pretrain", "table1-biglm", "--no_such_field", "3"]) == 2
    assert "unknown option --no_such_field" in capsys.readouterr().err
    assert main(["pretrain", "no-such-recipe"]) == 2
    assert "unknown recipe" in capsys.readouterr().err


def test_generate_refuses_an_output_that_is_a_folder_before_loading(tmp_path, capsys):
    """`biglm generate --input X --output RUN_DIR` ended in IsADirectoryError's traceback after loading the model
    (issue 37 item 7: nothing is written into a folder, a run's above all)."""
    import json

    (tmp_path / "in.jsonl").write_text(json.dumps({"id": 1, "prompt": "the cat"}) + "\n")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "no-model"), "--input", str(tmp_path / "in.jsonl"), "--output",
                 str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--output {run} is a folder" in err, err
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"]


# ------------------------------------------------------------------ issue 50 item 7: first steps
def test_a_misspelt_command_gets_the_nearest_one(capsys):
    assert main(["pretrian"]) == 2
    assert "unknown command 'pretrian'; did you mean 'pretrain'?" in capsys.readouterr().err


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    import biglm

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"biglm {version('biglm')}" == f"biglm {biglm.__version__}"


def test_a_warning_is_one_line_without_its_source(monkeypatch, capsys):
    """A library's UserWarning reached the console as Python prints it: file, line number and the line of code."""
    import warnings

    import biglm.cli_presets

    def warns(argv):
        warnings.warn("the first thing\n   went  wrong", UserWarning)
        warnings.warn_explicit("a future change", FutureWarning, "/x/site-packages/torch/nn/modules/module.py", 7)
        return 0

    monkeypatch.setattr(biglm.cli_presets, "main", warns)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["presets"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "[biglm] warning: the first thing went wrong",
        "[biglm] warning: FutureWarning: a future change (torch)"]
    assert warnings.showwarning.__module__ == "warnings"  # the command's formatter is gone after it


def test_a_plain_ctrl_c_in_a_command_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C outside a training loop (whose `TrainingInterrupted` carries its own status): exit 130, one line."""
    import biglm.cli_presets

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(biglm.cli_presets, "main", interrupted)
    try:
        code = main(["presets"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left `biglm` as a KeyboardInterrupt (a traceback, exit 1)")
    assert code == 130
    assert capsys.readouterr().err.strip() == "[biglm] interrupted"
