"""`biglm report`: figures, tables and the HTML page from runs written directly (metrics.jsonl, the saved
configuration, eval results in lm-eval's layout), and from a real tiny `biglm pretrain` run."""

from __future__ import annotations

import base64
import json
import re
import statistics
from pathlib import Path

import pytest

from biglm.cli import main as biglm_main
from biglm.objective import OBJECTIVES
from biglm.report import ReportError, build_report
from biglm.training.trainer import flops_per_token

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------- synthetic runs
def write_run(root: Path, name: str, *, steps: int = 100, schedule: str = "wsd", anneal_fraction: float = 0.2,
              corpus: str = "data/corpus-a", tokenizer: str = "tok-A", seed: int = 0, hidden: int = 64,
              tps: tuple[float, ...] = (50.0, 1000.0, 1200.0, 1100.0, 900.0), evals: dict | None = None,
              heldout: dict | None = None, loss0: float = 6.0) -> Path:
    """A pre-training run directory as the trainer leaves it: config, model config, metrics, eval results."""
    from biglm import BiGLMConfig

    run = root / f"{name}-s{seed}"
    run.mkdir(parents=True)
    config = {"name": name, "out_dir": str(run), "preset": "tiny", "tokenizer": tokenizer, "data": {corpus: 1.0},
              "seq_len": 32, "global_batch": 8, "micro_batch": 8, "steps": steps, "schedule": schedule,
              "anneal_fraction": anneal_fraction, "warmup_steps": 5, "device": "cpu", "seed": seed}
    (run / "train_config.json").write_text(json.dumps(config))
    BiGLMConfig.from_preset("tiny", hidden_size=hidden).save_pretrained(run)
    lines = []
    every = steps // len(tps)
    for s in range(1, steps + 1):
        loss = loss0 - 0.02 * s
        lines.append({"kind": "train", "step": s, "loss": loss})
        if s % every == 0:
            lines.append({"kind": "log", "step": s, "loss": loss, "lr": 1e-3, "tokens_per_s": tps[s // every - 1],
                          "tokens": s * 256, "mfu": None})
        if s % 50 == 0:
            lines.append({"kind": "val", "step": s, "tokens": s * 256, "val_loss": loss + 0.1})
            lines.append({"kind": "tasks", "step": s, "tokens": s * 256, "ARC-E": 0.30 + s / 1000,
                          "ARC-E_stderr": 0.02, "ARC-C": 0.20 + s / 1000, "ARC-C_stderr": 0.02, "avg": 0.25 + s / 1000})
    (run / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    if evals is not None:
        write_eval(run / "eval" / "suite" / "results_2026.json", evals, pretrained=str(run / "hf"))
    if heldout is not None:
        write_eval(run / "eval" / "heldout.json", {"heldout": heldout}, pretrained=str(run))
    return run


def write_eval(path: Path, tasks: dict[str, dict[str, tuple[float, float]]], *, pretrained: str) -> Path:
    """lm-eval's results layout: results.TASK["METRIC,none"] and ["METRIC_stderr,none"]."""
    results = {}
    for task, metrics in tasks.items():
        results[task] = {"alias": task}
        for metric, (value, se) in metrics.items():
            results[task][f"{metric},none"] = value
            results[task][f"{metric}_stderr,none"] = se
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"results": results, "config": {"model": "biglm", "model_args": f"pretrained={pretrained}"}}))
    return path


SMALL_EVAL = {"arc_easy_local": {"acc": (0.4321, 0.015), "acc_norm": (0.41, 0.015)},
              "arc_challenge_local": {"acc_norm": (0.2575, 0.0125), "acc": (0.24, 0.0125)},
              "piqa_local": {"acc_norm": (0.6011, 0.0114)}}
LARGE_EVAL = {"arc_easy_local": {"acc": (0.4599, 0.015)}, "arc_challenge_local": {"acc_norm": (0.2701, 0.0125)},
              "piqa_local": {"acc_norm": (0.6150, 0.0113)}}
SMALL_HELDOUT = {"masked_loss": (4.2500, 0.0250), "fill_acc": (0.3125, 0.0050)}
LARGE_HELDOUT = {"masked_loss": (3.8750, 0.0200), "fill_acc": (0.3500, 0.0050)}


def parse_table(md: str) -> dict[str, dict[str, str]]:
    """A Markdown table as row label -> column header -> cell text."""
    lines = [l for l in md.strip().splitlines() if l.startswith("|")]
    split = lambda l: [c.strip() for c in re.split(r"(?<!\\)\|", l.strip())[1:-1]]  # noqa: E731
    header = split(lines[0])
    return {cells[0]: dict(zip(header, cells)) for cells in map(split, lines[2:])}


@pytest.fixture
def two_runs(tmp_path) -> tuple[Path, Path]:
    small = write_run(tmp_path / "runs", "small", evals=SMALL_EVAL, heldout=SMALL_HELDOUT)
    large = write_run(tmp_path / "runs", "large", schedule="cosine", hidden=128,
                      evals=LARGE_EVAL, heldout=LARGE_HELDOUT, loss0=5.5, tps=(40.0, 3000.0, 3200.0, 2800.0, 3100.0))
    return small, large


# ---------------------------------------------------------------------------------------------- the report
def test_report_on_two_runs(two_runs, tmp_path):
    small, large = two_runs
    report = build_report([str(small), str(large)], out=tmp_path / "rep", baseline="small")

    # the figure: a valid PNG, embedded byte for byte in the page; Fig. 4 needs runs on two corpora
    assert set(report.figures) == {"fig3"}
    assert "share one corpus (corpus-a)" in {s.what: s.why for s in report.skipped}["Fig. 4 (corpora)"]
    page = report.html.read_text()
    for fig in report.figures.values():
        data = fig.path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
        assert f"data:image/png;base64,{base64.b64encode(data).decode()}" in page
    assert set(report.figures["fig3"].lines) == {"small", "large"}
    assert report.figures["fig3"].lines["small"] == {"loss": 100, "val_loss": 2, "arc": 2}
    # self-contained: nothing fetched
    assert not re.search(r"(src|href)=\"(https?:)?//", page) and "<script" not in page and "<link" not in page

    # the annealing marker: WSD, 20% of 100 steps -> annealing starts after 80 steps = 80 x 8 x 32 tokens; cosine: none
    assert report.anneal == {"small": {"step": 80, "tokens": 80 * 8 * 32}}

    # every table is on the page and in its Markdown file
    for key in ("ablation", "delta", "cost", "runs", "other_metrics"):
        assert f'id="table-{key}"' in page
        assert (tmp_path / "rep" / f"table_{key}.md").is_file()

    # the ablation table's numbers are the inputs' (percent for the paper columns, the paper's metric per column)
    t = parse_table(report.tables["ablation"].markdown())
    assert t["small"]["ARC-E"] == "43.21 ± 1.50"
    assert t["small"]["ARC-C"] == "25.75 ± 1.25"  # acc_norm, the paper's metric for ARC-C
    assert t["small"]["PIQA"] == "60.11 ± 1.14"
    assert t["large"]["ARC-E"] == "45.99 ± 1.50"
    avg_small = (0.4321 + 0.2575 + 0.6011) / 3
    avg_large = (0.4599 + 0.2701 + 0.6150) / 3
    assert float(t["small"]["Avg"].split(" ± ")[0]) == pytest.approx(100 * avg_small, abs=0.005)
    assert float(t["large"]["Δ Avg vs small"].split(" ± ")[0]) == pytest.approx(100 * (avg_large - avg_small), abs=0.005)
    assert t["small"]["Δ Avg vs small"] == "baseline"
    assert t["small"]["heldout masked_loss"] == "4.2500 ± 0.0250"
    assert t["large"]["heldout fill_acc"] == "0.3500 ± 0.0050"
    # the paper columns come first, then the others
    header = report.tables["ablation"].header
    assert header[:6] == ["run", "ARC-E", "ARC-C", "PIQA", "Avg", "Δ Avg vs small"]
    # the cells keep the exact numbers
    cell = report.tables["ablation"].rows[0][1]
    assert cell.value == pytest.approx(43.21) and cell.stderr == pytest.approx(1.5)

    d = parse_table(report.tables["delta"].markdown())
    assert list(d) == ["large"]
    assert d["large"]["heldout masked_loss"].startswith("-0.3750")
    assert d["large"]["ARC-E"].startswith("+2.78")
    o = parse_table(report.tables["other_metrics"].markdown())
    assert o["small"]["arc_easy acc_norm"] == "0.4100 ± 0.0150"

    # the cost table: tokens of the recipe / median logged tokens/s (first interval left out) / 3600, device named
    c = parse_table(report.tables["cost"].markdown())
    tps = statistics.median([1000.0, 1200.0, 1100.0, 900.0])
    tokens = 100 * 8 * 32
    assert c["small"]["tokens"] == f"{tokens:,}"
    assert c["small"]["device"] == "CPU"
    assert c["small"]["tokens/s per device"] == f"{tps:,.0f}"
    row = next(r for r in report.tables["cost"].rows if r[0].text == "small")
    assert row[4].value == tps and row[5].value == pytest.approx(tokens / tps / 3600, rel=1e-12)
    assert c["large"]["tokens/s per device"] == f"{statistics.median([3000.0, 3200.0, 2800.0, 3100.0]):,.0f}"
    # the paper's rows: its GPU hours beside the recipe's tokens (300k x 1024 x 2048)
    assert c["biglm-360m (paper recipe)"]["paper GPU hours (Table 6)"] == "22,528"
    assert c["biglm-3.5b (paper recipe)"]["tokens"] == f"{300_000 * 1024 * 2048:,}"

    # report.json holds the same numbers
    saved = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert saved["figures"]["fig3"]["anneal"] == {"small": {"step": 80, "tokens": 20480}}
    assert saved["tables"]["ablation"]["rows"][1][1]["value"] == pytest.approx(45.99)


def test_fig4_compares_corpora(two_runs, tmp_path):
    small, large = two_runs
    other = write_run(tmp_path / "runs", "other-corpus", corpus="data/corpus-b", anneal_fraction=0.1)
    report = build_report([str(small), str(large), str(other)], out=tmp_path / "rep", baseline="small")
    page = report.html.read_text()
    for fig in report.figures.values():
        assert f"data:image/png;base64,{base64.b64encode(fig.path.read_bytes()).decode()}" in page
    # Fig. 3 compares sizes on the baseline's corpus; Fig. 4 every run by corpus, each with its own anneal start
    assert set(report.figures["fig3"].lines) == {"small", "large"}
    assert set(report.figures["fig4"].lines) == {"small", "large", "other-corpus"}
    assert report.figures["fig4"].anneal == {"small": {"step": 80, "tokens": 80 * 256},
                                             "other-corpus": {"step": 90, "tokens": 90 * 256}}
    assert "the run is in Fig. 4" in {s.what: s.why for s in report.skipped}["fig3: other-corpus"]


def test_seed_replicas_fold_into_one_row(tmp_path):
    runs = [write_run(tmp_path, "biglm", seed=s, evals={"arc_easy_local": {"acc": (v, 0.01)}})
            for s, v in ((0, 0.40), (1, 0.44))]
    runs.append(write_run(tmp_path, "mlm", evals={"arc_easy_local": {"acc": (0.38, 0.01)}}))
    report = build_report([str(r) for r in runs], out=tmp_path / "rep", baseline="biglm")
    t = parse_table(report.tables["ablation"].markdown())
    assert list(t) == ["biglm", "mlm"]
    assert t["biglm"]["ARC-E"] == "42.00 ± 2.00 (n=2)"  # mean of 40 and 44, standard error over the two seeds
    # every replica still draws its own curve, labelled by its folder
    assert set(report.figures["fig3"].lines) == {"biglm-s0", "biglm-s1", "mlm"}


def test_bad_inputs_are_skipped_with_reasons(two_runs, tmp_path):
    small, large = two_runs
    (tmp_path / "empty").mkdir()
    foreign = tmp_path / "other_tool.json"
    foreign.write_text(json.dumps({"scores": {"arc": 0.5}}))
    # a run cut off mid-write: the last line is half a record
    partial = write_run(tmp_path / "runs", "partial", corpus="data/corpus-a")
    with open(partial / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 101, "lo')
    # a run with another tokenizer, meant to be compared with the others
    other_tok = write_run(tmp_path / "runs", "other-tok", tokenizer="tok-B", heldout={"masked_loss": (2.0, 0.01)})
    report = build_report([str(small), str(large), str(partial), str(other_tok), str(tmp_path / "empty"),
                           str(foreign), str(tmp_path / "missing")], out=tmp_path / "rep", baseline="small")
    why = {s.what: s.why for s in report.skipped}
    assert why[str(tmp_path / "empty")] == "empty directory"
    assert "not lm-eval's results layout" in why[str(foreign)]
    assert why[str(tmp_path / "missing")] == "no such file or directory"
    lines = [s.line() for s in report.skipped]
    assert any("metrics.jsonl line" in l and "cut off" in l and "partial" in l for l in lines), lines  # named
    assert report.figures["fig3"].lines["partial"]["loss"] == 100  # ... and the rest read
    assert "other-tok" in why["tokenizers"] and "2 tokenizers" in why["tokenizers"]
    assert "not the reference" in why["fig3: other-tok loss"]
    assert report.figures["fig3"].lines["other-tok"] == {"loss": 0, "val_loss": 0, "arc": 2}  # ARC still drawn
    t = parse_table(report.tables["ablation"].markdown())
    assert t["other-tok"]["heldout masked_loss"] == "—"  # per-token numbers of another vocabulary left out
    assert t["small"]["heldout masked_loss"] == "4.2500 ± 0.0250"
    # the page says so too
    page = report.html.read_text()
    assert 'id="skipped"' in page and "empty directory" in page


def test_cli(two_runs, tmp_path, capsys):
    small, large = two_runs
    (tmp_path / "empty").mkdir()
    out = tmp_path / "rep"
    assert biglm_main(["report", f"base={small}", str(large), str(tmp_path / "empty"), "--out", str(out),
                       "--baseline", "base"]) == 0
    captured = capsys.readouterr()
    assert "wrote" in captured.out and (out / "report.html").is_file()
    assert "biglm report: skipped" in captured.err and "empty directory" in captured.err
    assert "Δ Avg vs base" in (out / "table_ablation.md").read_text()
    # a baseline that names no run: one line, exit 2, nothing written
    assert biglm_main(["report", str(small), "--out", str(tmp_path / "x"), "--baseline", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nope" in err and "small" in err
    with pytest.raises(ReportError, match="names none of the runs"):
        build_report([str(small)], out=tmp_path / "x", baseline="nope")
    assert biglm_main(["report", "--help"]) == 0
    assert biglm_main(["report"]) == 2
    # nothing usable: the page lists why, exit 1
    assert biglm_main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "y")]) == 1
    assert "empty directory" in (tmp_path / "y" / "report.html").read_text()


def test_resumed_run_keeps_the_continued_records(tmp_path):
    run = write_run(tmp_path, "r", steps=20, tps=(10.0, 20.0))
    with open(run / "metrics.jsonl", "a") as f:  # a resume re-logs steps 11-20 after the checkpoint at 10
        for s in range(11, 21):
            f.write(json.dumps({"kind": "train", "step": s, "loss": 1.0}) + "\n")
    report = build_report([str(run)], out=tmp_path / "rep")
    r = report.runs[0]
    assert r.loss.steps == list(range(1, 21)) and r.loss.values[10:] == [1.0] * 10


def test_nothing_imports_the_report_code():
    src = Path(__file__).resolve().parents[1] / "src" / "biglm"
    offenders = [str(p) for p in src.rglob("*.py") if "report" not in p.relative_to(src).parts
                 and re.search(r"^\s*(from\s+(biglm|\.+)\s*\.?\s*report\b|import\s+biglm\.report\b|from\s+\.+\s+import\s+report\b)",
                               p.read_text(), re.M)]
    assert offenders == []


# ---------------------------------------------------------------------------------------------- a real run
@pytest.fixture
def one_thread():
    """One torch thread: a tiny model's step is ~20x faster than with threads fighting over a shared CPU."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_report_reads_a_real_pretraining_run(synthetic_data, tmp_path, one_thread):
    """What the trainer writes (metrics, config, tokenizer, checkpoints) is what the report reads."""
    run = tmp_path / "run"
    model = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 64}
    args = ["pretrain", "--data", str(synthetic_data / "shards"), "--tokenizer", str(synthetic_data / "tok"),
            "--preset", "tiny", *[a for k, v in model.items() for a in (f"--model.{k}", str(v))], "--seq_len", "32",
            "--micro_batch", "4", "--global_batch", "4", "--steps", "4", "--warmup_steps", "1", "--schedule", "wsd",
            "--anneal_fraction", "0.25", "--log_every", "1", "--eval_every", "2", "--eval_windows", "4",
            "--save_every", "4", "--device", "cpu", "--out_dir", str(run), "--name", "real"]
    assert biglm_main(args) == 0
    write_eval(run / "eval" / "heldout.json", {"heldout": SMALL_HELDOUT}, pretrained=str(run))
    report = build_report([str(run)], out=tmp_path / "rep")
    assert report.figures["fig3"].lines["real"] == {"loss": 4, "val_loss": 2, "arc": 0}
    assert report.anneal == {"real": {"step": 3, "tokens": 3 * 4 * 32}}  # WSD: the last of 4 steps annealed
    r = report.runs[0]
    assert r.tokenizer.startswith("sha:") and r.params is not None and r.corpus == "shards"
    c = parse_table(report.tables["cost"].markdown())
    assert c["real"]["device"].startswith("CPU (")  # the trainer logs the device it ran on and c["real"]["tokens"] == f"{4 * 4 * 32:,}"
    logged = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    tps = [l["tokens_per_s"] for l in logged if l["kind"] == "log"]
    assert next(row for row in report.tables["cost"].rows if row[0].text == "real")[4].value == statistics.median(tps[1:])
    assert parse_table(report.tables["ablation"].markdown())["real"]["heldout masked_loss"] == "4.2500 ± 0.0250"


def test_a_gpu_scale_run_reads_unchanged(tmp_path):
    """Nothing assumes CPU or tiny: a 10k-step run of biglm-360m on 8 GPUs (world size from its checkpoint,
    CUDA from its RNG state, MFU logged) gives binned curves, device-hours per GPU and the FLOP-based estimate."""
    import torch

    from biglm import BiGLMConfig

    run = tmp_path / "biglm-360m"
    run.mkdir()
    steps, gb, L = 10_000, 1024, 2048
    config = {"name": "biglm-360m", "preset": "biglm-360m", "data": {"data/fineweb-edu": 220.0, "data/cosmopedia-v2": 28.0},
              "seq_len": L, "global_batch": gb, "micro_batch": 8, "steps": steps, "schedule": "wsd",
              "anneal_fraction": 0.2, "lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 2000}
    (run / "train_config.json").write_text(json.dumps(config))
    BiGLMConfig.from_preset("biglm-360m").save_pretrained(run)
    flops = flops_per_token(BiGLMConfig.from_preset("biglm-360m"), OBJECTIVES["biglm"], L)[0]  # as the trainer logs it
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"kind": "train", "step": s, "loss": 3 + 5 / s ** 0.3}) + "\n")
            if s % 100 == 0:
                f.write(json.dumps({"kind": "log", "step": s, "loss": 3.0, "tokens_per_s": 1.6e6, "tokens": s * gb * L,
                                    "mfu": 0.42, "mfu_unmasked": 0.40, "flops_per_token": flops}) + "\n")
    ckpt = run / "checkpoints" / "step_0010000"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": steps, "world_size": 8}))
    torch.save({"step": steps, "rng_cpu": torch.get_rng_state(), "rng_cuda": torch.zeros(16, dtype=torch.uint8)},
               ckpt / "rank00000.pt")
    report = build_report([str(run)], out=tmp_path / "rep", max_points=400)
    assert report.figures["fig3"].lines["biglm-360m"]["loss"] <= 400
    assert report.anneal == {"biglm-360m": {"step": 8_000, "tokens": 8_000 * gb * L}}
    rows = {r[0].text: r for r in report.tables["cost"].rows}
    paper_row = rows["biglm-360m (paper recipe)"]  # this run measures that very model
    assert paper_row[2].text == "CUDA GPU (model not logged) ×8"
    assert paper_row[4].value == 1.6e6 / 8 and paper_row[6].value == pytest.approx(0.42)
    tokens = 300_000 * 1024 * 2048
    assert paper_row[5].value == pytest.approx(tokens / (1.6e6 / 8) / 3600)
    assert paper_row[8].value == 22528
    own = rows["biglm-360m"]  # the run's own recipe (10k steps)
    assert own[1].value == steps * gb * L and own[5].value == pytest.approx(steps * gb * L / (1.6e6 / 8) / 3600)
    assert own[8].text == "—"  # the paper's hours belong to its 300k-step recipe only
    assert f"run {run}" in rows["biglm-1.3b (paper recipe)"][10].text  # unmeasured: FLOP-based at this run's FLOP/s


def test_paper_recipe_costs_match_the_recipes():
    """The report's table of the paper's recipes (tokens, FLOPs per token) is what the recipes train and the trainer
    counts: a report reads recorded numbers, this keeps them true."""
    from biglm.model import BiGLMConfig
    from biglm.report.tables import PAPER_GPU_HOURS, PAPER_RECIPES
    from biglm.training.recipes import get_recipe

    assert set(PAPER_GPU_HOURS) <= set(PAPER_RECIPES)
    for name, (tokens, flops, preset, seq_len) in PAPER_RECIPES.items():
        cfg = get_recipe(name)
        model = BiGLMConfig.from_preset(cfg.preset, **cfg.model.overrides())
        assert (tokens, preset, seq_len) == (cfg.steps * cfg.global_batch * cfg.seq_len, cfg.preset, cfg.seq_len), name
        assert flops == pytest.approx(flops_per_token(model, cfg.objective, cfg.seq_len)[0], rel=1e-12), name
