"""The typed configuration (biglm.config) and the faults of issue 7 it fixes: every override takes
effect or is refused before any work, validation loss independent of the batch layout, data order
independent of where the run and its data live, and the room boundaries."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml

from biglm.cli import main
from biglm.config import ConfigError, apply_overrides, format_help, from_dict, parse_cli, to_dict
from biglm.objective import OBJECTIVES, ObjectiveConfig
from biglm.training import Trainer, TrainConfig, get_recipe
from biglm.training.config import ModelArgs, load_recipe_file
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ item 1: overrides
@pytest.mark.parametrize("args, expected", [
    (["--objective.alhpa", "0.3"], "unknown option --objective.alhpa; did you mean --objective.alpha (float)?"),
    (["--steps", "abc"], "--steps expects int, got 'abc'"),
    (["--model.hidden_dropot", "0.1"], "did you mean --model.hidden_dropout (float or none)?"),
    (["--schedule", "wds"], "did you mean 'wsd'?"),
    (["--objective", "mlmm"], "did you mean 'mlm'?"),
    (["--objective.alpha", "0.7"], "alpha=0.7 must lie in (0, 0.5)"),
    (["table1-biglmm"], "unknown recipe 'table1-biglmm'; did you mean 'table1-biglm'?"),
    (["--warmup_steps", "900", "--steps", "100"], "--warmup_steps 900 is more than --steps 100"),
])
def test_bad_overrides_are_refused_in_one_line_before_any_work(args, expected, tmp_path, capsys):
    assert main(["pretrain", *args, "--out_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()  # nothing was prepared or written


def test_data_override_of_the_default_recipe_takes_effect(tmp_path, capsys):
    """`biglm pretrain --data /nonexistent` used to train on the built-in corpus; now --data is the data."""
    assert main(["pretrain", "--data", "/nonexistent/shards", "--out_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "/nonexistent/shards" in err and "biglm data prepare" in err
    assert not (tmp_path / "run" / "data").exists()  # the built-in corpus was not prepared


def test_overrides_convert_by_declared_type():
    cfg = apply_overrides(TrainConfig(), ["--lr", "6e-3", "--steps", "1e3", "--model.hidden_dropout", "1e-1",
                                          "--objective.suffix_ratio", "0.1,0.9", "--tensorboard",
                                          "--data", "a,b=3", "--val-data", "[x, y]", "--peak_tflops", "none"])
    assert cfg.lr == 6e-3 and cfg.steps == 1000 and isinstance(cfg.steps, int)
    assert cfg.model == ModelArgs(hidden_dropout=0.1) and cfg.objective.suffix_ratio == (0.1, 0.9)
    assert cfg.tensorboard is True and cfg.data == {"a": 1.0, "b": 3.0} and cfg.val_data == ["x", "y"]
    assert cfg.peak_tflops is None
    with pytest.raises(ConfigError, match="--steps expects int"):
        apply_overrides(TrainConfig(), ["--steps", "10.5"])
    # a named objective, then one of its fields, in either order
    for argv in (["--objective", "mlm", "--objective.mlm_ratio", "0.2"], ["--objective.mlm_ratio", "0.2", "--objective", "mlm"]):
        obj = apply_overrides(TrainConfig(), argv).objective
        assert obj == OBJECTIVES["mlm"].replace(mlm_ratio=0.2)


def test_yaml_recipe_numbers_and_print_config_round_trip(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 6e-4\nmin_lr: 6e-5\nsteps: 300000\nobjective: {name: mlm, mlm_ratio: 2e-1}\n")
    loaded = load_recipe_file(recipe)  # YAML 1.1 alone would read 6e-4 as a string
    assert loaded.lr == 6e-4 and loaded.min_lr == 6e-5 and loaded.objective.mlm_ratio == 0.2
    (tmp_path / "bad.yaml").write_text("stepz: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown option --stepz; did you mean --steps \(int\)\?"):
        load_recipe_file(tmp_path / "bad.yaml")
    # --print_config writes a recipe that reads back to the same config
    assert main(["pretrain", "table8-alpha-0.3", "--lr", "1e-3", "--print_config"]) == 0
    (tmp_path / "printed.yaml").write_text(capsys.readouterr().out)
    expected = apply_overrides(get_recipe("table8-alpha-0.3"), ["--lr", "1e-3"])
    assert load_recipe_file(tmp_path / "printed.yaml") == expected
    assert TrainConfig.from_dict(to_dict(expected)) == expected


def test_help_shows_every_field_with_its_meaning(capsys):
    assert main(["pretrain", "--help"]) == 0
    out = capsys.readouterr().out
    for flag, text in [("--objective.alpha", "p ~ U{round(αL)"), ("--model.hidden_dropout", "dropout on the residual"),
                       ("--eval_windows", "same windows and masks"), ("--schedule ({cosine|wsd|constant}", "warm-up")]:
        assert flag in out and text in out, flag


def test_generic_parser_positionals_bools_and_hyphens(capsys):
    @dataclass
    class Args:
        model: str
        """a model directory"""
        steps: int = 4
        """model calls"""
        early_stop: bool = False
        """stop a row early"""
        objective: ObjectiveConfig = field(default_factory=lambda: OBJECTIVES["biglm"], metadata={"choices": OBJECTIVES})

    a = parse_cli(Args, ["dir", "--early-stop", "--steps=7", "--objective", "diffusion"], prog="t", positionals=("model",))
    assert (a.model, a.steps, a.early_stop, a.objective.name) == ("dir", 7, True, "diffusion")
    assert parse_cli(Args, ["dir", "--early_stop", "false"], prog="t", positionals=("model",)).early_stop is False
    for argv, msg in [([], "missing MODEL"), (["a", "b"], "unexpected argument 'b'"), (["dir", "--steps"], "--steps needs a value")]:
        with pytest.raises(SystemExit) as e:
            parse_cli(Args, argv, prog="t", positionals=("model",))
        assert e.value.code == 2 and msg in capsys.readouterr().err
    with pytest.raises(ConfigError, match="missing required option --model"):
        from_dict(Args, {})


def test_list_positional_takes_the_rest_comma_separated_as_its_help_says():
    """`biglm data prepare a.txt,b.txt c.txt`: SOURCES takes "the arguments left, each also split at commas" in --help,
    as the flag form splits."""
    @dataclass
    class Args:
        out: str
        """where"""
        sources: list[str] = field(default_factory=list)
        """sources"""

    a = parse_cli(Args, ["o", "a.txt,b.txt", "c.txt"], prog="t", positionals=("out", "sources"))
    assert a.sources == ["a.txt", "b.txt", "c.txt"]
    assert parse_cli(Args, ["o", "--sources", "a.txt,b.txt"], prog="t", positionals=("out",)).sources == ["a.txt", "b.txt"]


# ------------------------------------------------------------------ item 5: validation loss and batch layout
def _cfg(data: Path, out: Path, **kw) -> TrainConfig:
    base = dict(name="t", out_dir=str(out), preset="tiny", model=ModelArgs(max_position_embeddings=64),
                data={str(data / "shards"): 1.0}, tokenizer=str(data / "tok"), seq_len=32, micro_batch=4, global_batch=8,
                steps=4, lr=3e-3, min_lr=3e-4, warmup_steps=1, log_every=1, eval_every=2, eval_windows=12, save_every=2)
    base.update(kw)
    return TrainConfig(**base)


def test_validation_loss_does_not_depend_on_the_micro_batch(synthetic_data, tmp_path):
    losses = []
    for mb in (8, 4, 2):
        trainer = Trainer(_cfg(synthetic_data, tmp_path / f"mb{mb}", micro_batch=mb), info=SINGLE, echo=lambda s: None)
        losses.append(trainer.validate())  # the same initial weights (seeded), the same windows and masks
    assert losses[0] == pytest.approx(losses[1], rel=1e-6) and losses[0] == pytest.approx(losses[2], rel=1e-6), losses


# ------------------------------------------------------------------ item 6: data order and the run's path
def test_same_run_in_two_directories_and_with_data_elsewhere_gives_the_same_curve(synthetic_data, tmp_path):
    a = Trainer(_cfg(synthetic_data, tmp_path / "a" / "run"), info=SINGLE, echo=lambda s: None).train()
    moved_data = tmp_path / "elsewhere" / "copy"
    shutil.copytree(synthetic_data, moved_data)
    b = Trainer(_cfg(moved_data, tmp_path / "bb" / "other"), info=SINGLE, echo=lambda s: None).train()
    assert a.losses == b.losses and a.val_losses == b.val_losses


def test_a_moved_run_directory_resumes_exactly(synthetic_data, tmp_path):
    whole = Trainer(_cfg(synthetic_data, tmp_path / "whole"), info=SINGLE, echo=lambda s: None).train()

    class Killed(Exception):
        pass

    def kill_after_3(trainer, step):
        if step == 3:
            raise Killed

    data_a = tmp_path / "place_a" / "data"
    shutil.copytree(synthetic_data, data_a)
    with pytest.raises(Killed):  # dies after step 3; the step-2 checkpoint is on disk
        Trainer(_cfg(data_a, tmp_path / "place_a" / "run"), info=SINGLE, echo=lambda s: None,
                after_step=kill_after_3).train()
    shutil.move(tmp_path / "place_a", tmp_path / "place_b")  # the run and its data move elsewhere
    data_b = tmp_path / "place_b" / "data"
    resumed = Trainer(_cfg(data_b, tmp_path / "place_b" / "run"), info=SINGLE, echo=lambda s: None).train()
    assert resumed.losses == [(s, l) for s, l in whole.losses if s > 2]


# ------------------------------------------------------------------ item 8: rooms
def test_inference_rooms_do_not_import_training():
    code = ("import sys, biglm.generation, biglm.scoring, biglm.checkpoint; "
            "bad = sorted(m for m in sys.modules if m.startswith('biglm.training')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_default_run_is_a_listed_recipe(capsys):
    assert main(["recipes"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("default ")
    assert get_recipe("default").data == {"builtin": 1.0}


def test_an_unknown_flag_without_a_value_is_named_and_no_command_ignores_options(capsys):
    assert main(["pretrain", "--stepz"]) == 2
    assert "unknown option --stepz; did you mean --steps (int)?" in capsys.readouterr().err
    assert main(["tasks", "--foo", "1"]) == 2  # `biglm tasks` takes no options: refused, not ignored
    assert "unknown option --foo" in capsys.readouterr().err


# ------------------------------------------------------------------ issue 31: a device this machine lacks
def test_check_device(monkeypatch):
    from biglm.config import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for ok in (None, "auto", "cpu"):
        check_device(ok)
    with pytest.raises(ConfigError, match=r"^--device cuda:0: no CUDA GPU is visible on this machine; use --device cpu$"):
        check_device("cuda:0")
    with pytest.raises(ConfigError, match="'gpu' is not a device: use cpu, cuda or cuda:N"):
        check_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda:1")
    with pytest.raises(ConfigError, match=r"cuda:2: this machine has 2 visible CUDA GPU\(s\), cuda:0..cuda:1"):
        check_device("cuda:2")


@pytest.mark.parametrize("command", [["pretrain"], ["finetune", "mnli", "--model", "MODEL"],
                                     ["generate", "MODEL", "--prompt", "hi"], ["chat", "MODEL"], ["serve", "MODEL"],
                                     ["eval", "--model_args", "pretrained=MODEL", "--tasks", "piqa"]])
def test_device_cuda_without_a_gpu_is_one_line_for_every_command(command, tmp_path, capsys, monkeypatch):
    """Every subcommand that takes --device refuses cuda on a machine without one where its config enters (the
    shared `check_device`), in one line, before any model is read or any run directory made."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "MODEL").mkdir()
    assert main([*command, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--device cuda: no CUDA GPU is visible on this machine; use --device cpu" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MODEL"]  # no runs/ folder, no lock


def test_abstract_sequence_and_mapping_fields_are_typed():
    """`Sequence[...]` and `Mapping[...]` fields (the FLAN mixture task's) convert and refuse like list and dict."""
    from collections.abc import Mapping, Sequence

    from biglm.config import convert

    assert convert(["1", 2], Sequence[int], name="x") == [1, 2]
    assert convert({"a": "b"}, Mapping[str, str], name="m") == {"a": "b"}
    with pytest.raises(ConfigError, match="--x expects comma-separated ints, got 3"):
        convert(3, Sequence[int], name="x")


# ------------------------------------------------------------------ issue 50 item 7: first steps
def test_pretrain_with_fewer_steps_than_the_recipes_warmup_clamps_it_with_a_note(capsys):
    """`biglm pretrain --steps 3` failed: "--warmup_steps 30 is more than --steps 3" (30: the default recipe's)."""
    from biglm.training.cli import resolve_config

    notes: list[str] = []
    cfg = resolve_config(["--steps", "3"], note=notes.append)
    assert (cfg.steps, cfg.warmup_steps) == (3, 3)
    assert notes == ["[biglm] note: --warmup_steps 3, clamped to --steps: the recipe's 30 does not fit the run"]
    cfg.validate()
    assert resolve_config(["--steps", "40"], note=notes.append).warmup_steps == 30 and len(notes) == 1  # it fits
    with pytest.raises(ConfigError, match="--warmup_steps 30 is more than --steps 3"):  # the user's own is refused
        resolve_config(["--steps", "3", "--warmup_steps", "30"]).validate()

    assert main(["pretrain", "--steps", "3", "--print_config"]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["warmup_steps"] == 3 and "clamped to --steps" in err


def test_help_says_how_a_list_is_given():
    """`generate --help` said `--prompt` takes "comma-separated strs", where each --prompt is one prompt, commas kept."""
    @dataclass
    class Args:
        prompt: list[str] = field(default_factory=list, metadata={"repeatable": True})
        """text to continue"""
        tasks: list[str] = field(default_factory=list)
        """tasks"""

    text = format_help(Args, prog="t", doc=None)
    assert "--prompt (a str per --prompt: --prompt A --prompt B; commas kept, default [])" in text
    assert "--tasks (strs: a,b or [a, b] or --tasks A --tasks B, default [])" in text
    # what the help says is what the parser does
    assert parse_cli(Args, ["--prompt", "a, b", "--prompt", "c"], prog="t").prompt == ["a, b", "c"]
    for argv in (["--tasks", "a,b"], ["--tasks", "[a, b]"], ["--tasks", "a", "--tasks", "b"]):
        assert parse_cli(Args, argv, prog="t").tasks == ["a", "b"], argv


def test_generate_help_does_not_call_prompt_comma_separated(capsys):
    assert main(["generate", "--help"]) == 0
    (line,) = [l for l in capsys.readouterr().out.splitlines() if l.startswith("  --prompt ")]
    assert "comma" not in line.replace("commas kept", "") and "--prompt A --prompt B" in line
