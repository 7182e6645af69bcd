"""Generation speed: BiGLM iterative unmasking (with and without the exact prefix cache) against an
autoregressive Llama of the same shape, in one run.

Protocol
- Both models are randomly initialised with the same layers / hidden / heads / kv heads / MLP width /
  vocabulary (`LlamaForCausalLM` built from the BiGLM config), same dtype and device. Random
  weights do not change the cost of a forward pass.
- BiGLM: `biglm.generation.generate_ids`, Mask-Predict, greedy, ``early_stop=False`` so every
  configuration makes exactly T model calls (a trained model would stop earlier, never later).
- Autoregressive: transformers' greedy ``generate`` with its KV cache, forced to write exactly N
  tokens (``min_new_tokens = max_new_tokens = N``). With ``--compile`` on a GPU: static cache and
  ``torch.compile(mode="reduce-overhead")`` of its forward.
- Each configuration runs once untimed (warm-up: allocator, kernels, oneDNN primitives for that
  shape), then ``--repeats`` timed runs; the timed region is the generation call only (prompt
  ids already on the device), bracketed by device synchronisation. The median is the headline;
  the minimum and every run's time are kept too (on a shared machine other jobs only add time).
- tokens/s = batch · N / latency.

Usage
    python benchmarks/bench_generation.py --quick                     # CPU subset, < 3 minutes
    python benchmarks/bench_generation.py --preset biglm-136m --device cuda --dtype bfloat16 --compile

Results go to ``benchmarks/results/<name>.json`` and ``.md`` with the machine, torch version and git commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import generate_ids
from biglm.model import count_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# --quick: a subset that runs in under 3 minutes on a 2-core CPU (a 124M-wide model cut to 2 layers).
# One thread: on a shared 2-core machine, 2 OpenMP threads competing with other jobs made each BiGLM call
# 14x slower and the timings meaningless (3.8 s vs 0.26 s for the same decode); 1 thread is stable.
QUICK = dict(preset="biglm-124m", layers=2, vocab_size=8192, prompt_len=64, new_tokens=[128], batch=[1, 4],
             steps=[4, 8, 16], repeats=3, threads=1)


def build_models(args: argparse.Namespace, device: torch.device, dtype: torch.dtype):
    """A BiGLM and a LlamaForCausalLM with identical shapes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    overrides = dict(attn_backend="sdpa", max_position_embeddings=args.prompt_len + max(args.new_tokens))
    if args.layers:
        overrides["num_hidden_layers"] = args.layers
    if args.vocab_size:
        overrides["vocab_size"] = args.vocab_size
    config = BiGLMConfig.from_preset(args.preset, **overrides)
    torch.manual_seed(0)
    biglm = BiGLMForMaskedLM(config).to(device=device, dtype=dtype).eval()
    llama_config = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps, tie_word_embeddings=config.tie_word_embeddings,
        attention_bias=False, mlp_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    llama = LlamaForCausalLM._from_config(llama_config, attn_implementation="sdpa").to(device=device, dtype=dtype).eval()
    if args.compile:
        if device.type != "cuda":
            print("--compile is meant for GPUs; compiling on CPU anyway", file=sys.stderr)
        llama.generation_config.cache_implementation = "static"
        llama.forward = torch.compile(llama.forward, mode="reduce-overhead", fullgraph=True)
    return config, biglm, llama


def timed(fn, *, repeats: int, device: torch.device) -> tuple[list[float], object]:
    """Seconds of each of ``repeats`` calls of ``fn``, after one untimed warm-up call."""
    out = fn()  # warm-up, excluded
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times, out


def _row(*, times: list[float], batch: int, n: int, **fields) -> dict:
    # median is the headline; min is kept because on a shared machine other jobs only ever add time
    med, best = statistics.median(times), min(times)
    return dict(batch=batch, new_tokens=n, **fields, latency_s=med, latency_min_s=best, tokens_per_s=batch * n / med,
                tokens_per_s_best=batch * n / best, times_s=times)


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = _DTYPES[args.dtype]
    config, biglm, llama = build_models(args, device, dtype)
    counts = count_parameters(config)
    print(f"model: {args.preset} layers={config.num_hidden_layers} hidden={config.hidden_size} "
          f"heads={config.num_attention_heads}/{config.num_key_value_heads} vocab={config.vocab_size} "
          f"({counts['total'] / 1e6:.1f}M params), {args.dtype} on {device}", flush=True)
    rows = []
    g = torch.Generator().manual_seed(0)
    for batch in args.batch:
        prompt = torch.randint(5, config.vocab_size, (batch, args.prompt_len), generator=g).to(device)
        attn = torch.ones_like(prompt)
        for n in args.new_tokens:
            def ar() -> torch.Tensor:
                with torch.inference_mode():
                    return llama.generate(prompt, attention_mask=attn, max_new_tokens=n, min_new_tokens=n,
                                          do_sample=False)

            times, out = timed(ar, repeats=args.repeats, device=device)
            assert out.shape == (batch, args.prompt_len + n), out.shape
            rows.append(_row(times=times, batch=batch, n=n, model="llama-ar", steps=n, cache=True, model_calls=n))
            print(f"  AR      batch={batch:<3} N={n:<4}          latency {rows[-1]['latency_s'] * 1e3:9.1f} ms  "
                  f"{rows[-1]['tokens_per_s']:9.1f} tok/s", flush=True)
            for steps in args.steps:
                for use_cache in (True, False):
                    def nar() -> object:
                        return generate_ids(biglm, prompt, max_new_tokens=n, steps=steps, strategy=args.strategy,
                                            use_cache=use_cache, early_stop=False)

                    times, out = timed(nar, repeats=args.repeats, device=device)
                    rows.append(_row(times=times, batch=batch, n=n, model="biglm", steps=steps, cache=use_cache,
                                     model_calls=out.steps))
                    print(f"  BiGLM   batch={batch:<3} N={n:<4} T={steps:<3} cache={'on ' if use_cache else 'off'} "
                          f"latency {rows[-1]['latency_s'] * 1e3:9.1f} ms  {rows[-1]['tokens_per_s']:9.1f} tok/s  "
                          f"({out.steps} calls)", flush=True)
    return dict(
        command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        machine=machine(device),
        settings=dict(preset=args.preset, num_hidden_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
                      num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
                      intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
                      params_total=counts["total"], dtype=args.dtype, device=str(device), prompt_len=args.prompt_len,
                      strategy=args.strategy, repeats=args.repeats, compile=args.compile),
        results=rows,
    )


def to_markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        "# Generation benchmark: BiGLM (Mask-Predict) vs autoregressive Llama of the same shape",
        "",
        f"- command: `{report['command']}`",
        f"- machine: {m['cpu']}, {m['cpu_cores']} cores (torch threads {m['torch_threads']}, "
        f"load average {m['load_avg_1m_at_start']} at start)"
        + (f", GPU {m['gpu']}" if m["gpu"] else ""),
        f"- torch {m['torch']}, transformers {m['transformers']}, python {m['python']}, git {m['git_commit'][:12]}"
        + (" (dirty)" if m["git_dirty"] else ""),
        f"- model: {s['preset']} cut to {s['num_hidden_layers']} layers, hidden {s['hidden_size']}, heads "
        f"{s['num_attention_heads']}/{s['num_key_value_heads']}, MLP {s['intermediate_size']}, vocab {s['vocab_size']} "
        f"({s['params_total'] / 1e6:.1f}M params), {s['dtype']} on {s['device']}; prompt {s['prompt_len']} tokens; "
        f"median of {s['repeats']} timed runs after 1 warm-up",
        "",
        "| batch | N | model | T | prefix cache | latency median (ms) | latency min (ms) | tokens/s (median) "
        "| speed-up vs AR (median) |",
        "|---:|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    ar = {(r["batch"], r["new_tokens"]): r["latency_s"] for r in report["results"] if r["model"] == "llama-ar"}
    for r in report["results"]:
        base = ar[(r["batch"], r["new_tokens"])]
        name = "Llama AR (KV cache)" if r["model"] == "llama-ar" else "BiGLM Mask-Predict"
        cache = "-" if r["model"] == "llama-ar" else ("on" if r["cache"] else "off")
        lines.append(f"| {r['batch']} | {r['new_tokens']} | {name} | {r['steps']} | {cache} | "
                     f"{r['latency_s'] * 1e3:.1f} | {r['latency_min_s'] * 1e3:.1f} | {r['tokens_per_s']:.1f} | "
                     f"{base / r['latency_s']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="biglm-124m")
    p.add_argument("--layers", type=int, default=None, help="override the preset's layer count")
    p.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary size")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p.add_argument("--compile", action="store_true", help="AR baseline: static KV cache + torch.compile (GPU)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--steps", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    p.add_argument("--strategy", default="mask-predict", choices=["mask-predict", "confidence"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help=f"small CPU subset (explicit flags override): {QUICK}")
    p.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    known, _ = p.parse_known_args(argv)
    if known.quick:  # the subset's values become defaults, so explicit flags still win
        p.set_defaults(**QUICK)
    args = p.parse_args(argv)
    report = run(args)
    stem = args.out or f"bench_generation_{'quick_' if args.quick else ''}{torch.device(args.device).type}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(to_markdown(report))
    print(f"wrote {RESULTS / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
