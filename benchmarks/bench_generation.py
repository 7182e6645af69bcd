"""Generation speed and quality: BiGLM block decoding with the growing prefix cache, against today's
one-block decoding and an autoregressive Llama of the same shape with its KV cache, in one run.

Speed (``--mode speed``, the default)
- Models: the BiGLM of ``--checkpoint`` (its shape and weights) or of ``--preset`` (random weights),
  its window raised to prompt + N (RoPE; speed only), and a `LlamaForCausalLM` with the same layers,
  hidden size, heads, kv heads, MLP width, vocabulary and tying (random weights: they do not change
  the cost of a forward pass), same dtype and device.
- Variants. BiGLM rows use the ``--strategy`` (default confidence: LLaDA's commit, which block
  decoding was made for), greedy, T = N / k model calls for each k of ``--tokens-per-step`` (k tokens
  committed per call; a block of B < k slots is skipped), so rows of one k make the same number of
  calls and write the same number of tokens per call:
  * ``ar``: transformers' greedy ``generate`` with its KV cache, exactly N tokens (min = max = N).
  * ``one-block``: today's decoding: the prompt in the exact prefix cache, all N slots the suffix of
    every call.
  * ``block-exact``, ``rest-exact``, ``block-append``, ``rest-append``: blocks of ``--block-length``
    slots left to right; each call runs the current block (``block``) or the block and every mask
    after it (``rest``); a finished block joins the cache ``exact`` (prompt + finished blocks
    re-encoded as one prefix: the training condition) or ``append`` (only the block encoded).
- Timing: every configuration first runs once untimed (warm-up: the same shapes with one call per
  block, or 32 AR tokens), then ``--repeats`` timed rounds, interleaved (each round runs every
  configuration once), so the load of a shared machine hits every configuration alike. The timed
  region is the generation call only. The median is the headline; the minimum is kept too. Ratios are
  against the AR model of the same round set, the only comparison that survives a loaded machine.
- A one-block decode at batch 32 x N = 512 takes seconds per call on a CPU: with
  ``--max-one-block-calls C`` one of T > C calls is timed with C calls and scaled by T / C (all its
  calls run the same N suffix slots); its row says ``projected_from_calls``.
- tokens/s = batch * N / latency.

Quality (``--mode quality --checkpoint RUN``): which suffix policy, block length and cache to use,
on a trained checkpoint (a random model cannot show quality).
- Prompts: the first ``--prompt-len`` tokens of the first ``--prompts`` held-out documents that are
  long enough (``--val-shard``, default the run's own ``data/val-*.bin``); N = ``--new-tokens``.
- Every strategy: confidence at T = N / k for each ``--tokens-per-step`` k, threshold (tau = 0.9), and
  Mask-Predict at T = N / 4; each with one block and with every ``--block-length`` x suffix x cache.
- Metrics per configuration: the model's exact chain-rule log-probability of the answer per token
  (`biglm.scoring` estimator ``chain``: Sum_t log P(y_t | prompt, y_<t)), its distinct-2, the token
  agreement with the reference decode (one block, confidence, one token per call), model calls and
  seconds (indicative on a loaded machine). The held-out continuation's log-probability gives scale.
- ``--grammar``: for a checkpoint trained on `synthetic_grammar.py` documents (a tiny model learns
  them in minutes; on real text it stays at the unigram plateau), the share of the answers' complete
  sentences that follow the grammar, and that keep the prompt's subject: a check that does not rely
  on the model that wrote the answer.

Usage
    python benchmarks/bench_generation.py --threads 1 --checkpoint RUN --new-tokens 128 512 --batch 1 32
    python benchmarks/bench_generation.py --mode quality --checkpoint RUN --threads 1
    python benchmarks/bench_generation.py --quick                       # CPU subset, a few minutes

Results go to ``benchmarks/results/<out>.json`` (with the machine, torch version and git commit) and ``.md``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import DecodingConfig, generate_ids
from biglm.model import count_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_header, positive_int, write_report  # noqa: E402

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BIGLM_VARIANTS = {  # name -> DecodingConfig fields on top of the strategy and T
    "one-block": {},
    "block-exact": dict(block_suffix="block", block_cache="exact"),
    "rest-exact": dict(block_suffix="rest", block_cache="exact"),
    "block-append": dict(block_suffix="block", block_cache="append"),
    "rest-append": dict(block_suffix="rest", block_cache="append"),
}
VARIANTS = ("ar", *BIGLM_VARIANTS)

# --quick: a subset that runs in a few minutes on a shared 2-core CPU. One thread: on a shared 2-core machine,
# 2 OpenMP threads competing with other jobs made each BiGLM call 14x slower and the timings meaningless.
QUICK = dict(preset="tiny", layers=4, hidden=192, intermediate=512, heads=6, kv_heads=2, vocab_size=4096, prompt_len=64,
             new_tokens=[128], batch=[1, 4], block_length=[16], repeats=2, threads=1)


# --- models ---------------------------------------------------------------------------------------------------


def build_models(args: argparse.Namespace, device: torch.device, dtype: torch.dtype):
    """A BiGLM (``--checkpoint`` or ``--preset``) and a LlamaForCausalLM of identical shape (`llama_peer`)."""
    window = args.prompt_len + max(args.new_tokens)
    if args.checkpoint:
        from biglm.checkpoint import load_model

        biglm, _ = load_model(args.checkpoint)
        config = biglm.config
        config.max_position_embeddings = max(config.max_position_embeddings, window)  # RoPE: any length runs
    else:
        overrides = dict(attn_backend="sdpa", max_position_embeddings=window)
        for flag, name in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"), ("vocab_size", "vocab_size"),
                           ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads")):
            if getattr(args, flag):
                overrides[name] = getattr(args, flag)
        if args.hidden:
            overrides.update(intermediate_size=args.intermediate or 8 * args.hidden // 3)
        config = BiGLMConfig.from_preset(args.preset, **overrides)
        torch.manual_seed(0)
        biglm = BiGLMForMaskedLM(config)
    biglm = biglm.to(device=device, dtype=dtype).eval()
    return config, biglm, llama_peer(config, device, dtype, compile=args.compile)


def llama_peer(config: BiGLMConfig, device: torch.device, dtype: torch.dtype, *, compile: bool = False,
               ) -> LlamaForCausalLM:
    """The autoregressive peer: a `LlamaForCausalLM` of ``config``'s shape (random weights: they do not change a
    forward's cost) with sdpa attention; ``compile``: a static KV cache and torch.compile (GPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    llama_config = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps, tie_word_embeddings=config.tie_word_embeddings,
        attention_bias=False, mlp_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    llama = LlamaForCausalLM._from_config(llama_config, attn_implementation="sdpa").to(device=device, dtype=dtype).eval()
    if compile:
        llama.generation_config.cache_implementation = "static"
        llama.forward = torch.compile(llama.forward, mode="reduce-overhead", fullgraph=True)
    return llama


def decoding(variant: str, *, n: int, block_length: int | None, k: int, args: argparse.Namespace) -> DecodingConfig:
    """The decoding options of a BiGLM ``variant`` at N = ``n``, T = N / ``k`` (tokens per step)."""
    extra = dict(BIGLM_VARIANTS[variant])
    if variant != "one-block":
        extra["block_length"] = block_length
    return DecodingConfig(max_new_tokens=n, strategy=args.strategy, steps=max(1, n // k), threshold=args.threshold,
                          **extra)


# --- speed ----------------------------------------------------------------------------------------------------


def case_label(variant: str, block_length: int | None, k: int, *, several_k: bool) -> str:
    """A row's name: the variant, its block length, and its T = N/k when a run times several k."""
    return variant + (f" B={block_length}" if block_length else "") + (
        f" T=N/{k}" if variant != "ar" and several_k else "")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device: torch.device) -> tuple[float, object]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def speed(args: argparse.Namespace) -> dict:
    device, dtype = torch.device(args.device), _DTYPES[args.dtype]
    config, biglm, llama = build_models(args, device, dtype)
    counts = count_parameters(config)
    print(f"model: layers={config.num_hidden_layers} hidden={config.hidden_size} heads={config.num_attention_heads}/"
          f"{config.num_key_value_heads} mlp={config.intermediate_size} vocab={config.vocab_size} "
          f"({counts['total'] / 1e6:.2f}M params), {args.dtype} on {device}", flush=True)
    g = torch.Generator().manual_seed(0)
    cases = []  # (batch, n, variant, block length, tokens per step, run, warm-up, scale, calls)
    for batch in args.batch:
        prompt = torch.randint(5, config.vocab_size, (batch, args.prompt_len), generator=g).to(device)
        attn = torch.ones_like(prompt)
        for n in args.new_tokens:
            for variant in args.variants:
                if variant == "ar":
                    def run(n=n, prompt=prompt, attn=attn, k=None):
                        with torch.inference_mode():
                            out = llama.generate(prompt, attention_mask=attn, max_new_tokens=k or n,
                                                 min_new_tokens=k or n, do_sample=False)
                        assert out.shape[1] == prompt.shape[1] + (k or n), out.shape
                        # a prefill, then one call per further token, each one position per row
                        return dict(steps=n, forward_calls=n, positions=prompt.shape[0] * (prompt.shape[1] + n - 1))

                    cases.append((batch, n, variant, None, 1, run, lambda run=run: run(k=min(n, 32)), 1.0, n))
                    continue
                for block_length, k in itertools.product([None] if variant == "one-block" else args.block_length,
                                                         args.tokens_per_step):
                    if block_length and k > block_length:
                        continue  # a block of B slots cannot take more than B tokens per call
                    cfg = decoding(variant, n=n, block_length=block_length, k=k, args=args)
                    scale, timed_cfg = 1.0, cfg
                    if variant == "one-block" and args.max_one_block_calls and cfg.steps > args.max_one_block_calls:
                        timed_cfg = cfg.override(steps=args.max_one_block_calls)
                        scale = cfg.steps / args.max_one_block_calls
                    blocks = -(-n // block_length) if block_length else 1
                    warm_cfg = cfg.override(steps=blocks if block_length else min(2, cfg.steps))

                    def run(c=timed_cfg, prompt=prompt):
                        out = generate_ids(biglm, prompt, config=c)
                        return dict(steps=out.steps, forward_calls=out.forward_calls, positions=out.positions)

                    def warm(c=warm_cfg, prompt=prompt):
                        return generate_ids(biglm, prompt, config=c)

                    cases.append((batch, n, variant, block_length, k, run, warm, scale, cfg.steps))
    times: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    work: dict[int, dict] = {}  # the last timed run's calls and positions (deterministic for a case)
    def name(variant: str, block_length: int | None, k: int) -> str:
        return case_label(variant, block_length, k, several_k=len(args.tokens_per_step) > 1)

    for i, (batch, n, variant, block_length, k, _, warm, _, _) in enumerate(cases):
        t, _ = _time(warm, device)
        print(f"  warm-up batch={batch:<3} N={n:<4} {name(variant, block_length, k):<18} {t:8.2f} s", flush=True)
    for r in range(args.repeats):
        for i, (batch, n, variant, block_length, k, run, _, scale, calls) in enumerate(cases):
            t, made = _time(run, device)
            times[i].append(t * scale)
            work[i] = made
            print(f"  round {r + 1}/{args.repeats} batch={batch:<3} N={n:<4} {name(variant, block_length, k):<18} "
                  f"{t * scale:8.2f} s" + (f" (projected from {made['steps']} calls x {scale:g})" if scale != 1.0 else ""),
                  flush=True)
    rows = []
    for i, (batch, n, variant, block_length, k, _, _, scale, calls) in enumerate(cases):
        med, best = statistics.median(times[i]), min(times[i])
        row = dict(batch=batch, new_tokens=n, variant=variant, model_calls=calls, latency_s=med, latency_min_s=best,
                   tokens_per_s=batch * n / med, times_s=times[i])
        if variant != "ar":
            row.update(strategy=args.strategy, block_length=block_length, tokens_per_step=k)
            if args.strategy == "threshold":
                row["threshold"] = args.threshold
        if scale != 1.0:
            row["projected_from_calls"] = args.max_one_block_calls
        else:  # tokens per forward call (TPF) and positions processed per committed token, the work behind the time
            row.update(forward_calls=work[i]["forward_calls"], tokens_per_forward=n / work[i]["forward_calls"],
                       positions_per_token=work[i]["positions"] / (batch * n))
        rows.append(row)
    ar = {(r["batch"], r["new_tokens"]): r["latency_s"] for r in rows if r["variant"] == "ar"}
    for row in rows:
        if (row["batch"], row["new_tokens"]) in ar:
            row["speedup_vs_ar"] = ar[(row["batch"], row["new_tokens"])] / row["latency_s"]
    return dict(mode="speed", settings=dict(
        checkpoint=args.checkpoint, num_hidden_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size, vocab_size=config.vocab_size, params_total=counts["total"],
        dtype=args.dtype, device=str(device), prompt_len=args.prompt_len, strategy=args.strategy,
        tokens_per_step=args.tokens_per_step, block_length=args.block_length, repeats=args.repeats,
        max_one_block_calls=args.max_one_block_calls, compile=args.compile), results=rows)


def speed_markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        f"- model: {s['num_hidden_layers']} layers, hidden {s['hidden_size']}, heads {s['num_attention_heads']}/"
        f"{s['num_key_value_heads']}, MLP {s['intermediate_size']}, vocab {s['vocab_size']} "
        f"({s['params_total'] / 1e6:.2f}M params), {s['dtype']} on {s['device']}; prompt {s['prompt_len']} tokens; "
        f"BiGLM {s['strategy']}, T = N/k calls for k in {s['tokens_per_step']}, blocks of {s['block_length']} slots; "
        f"median of {s['repeats']} interleaved rounds after a warm-up",
        "",
        "| batch | N | variant | steps | forward calls | TPF | positions / token | latency median (s) | min (s) "
        "| tokens/s | vs AR |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        note = f" (projected from {r['projected_from_calls']} calls)" if "projected_from_calls" in r else ""
        label = case_label(r["variant"], r.get("block_length"), r.get("tokens_per_step", 1),
                           several_k=len(s["tokens_per_step"]) > 1)
        work = (f"{r['forward_calls']} | {r['tokens_per_forward']:.2f} | {r['positions_per_token']:.2f}"
                if "forward_calls" in r else "— | — | —")
        lines.append(f"| {r['batch']} | {r['new_tokens']} | {label}{note} | {r['model_calls']} | {work} | "
                     f"{r['latency_s']:.3f} | {r['latency_min_s']:.3f} | {r['tokens_per_s']:.1f} | "
                     f"{r.get('speedup_vs_ar', float('nan')):.2f}x |")
    return "\n".join(lines)


# --- quality --------------------------------------------------------------------------------------------------


def _prompts(args: argparse.Namespace) -> tuple[torch.Tensor, list[list[int]]]:
    """(prompts (B, P), held-out continuations) from the first long-enough documents of the validation shard."""
    from biglm.data.shards import ShardReader

    path = Path(args.val_shard) if args.val_shard else sorted((Path(args.checkpoint) / "data").glob("val-*.bin"))[0]
    shard = ShardReader(path, expected_vocab_size=None)
    n, P = max(args.new_tokens), args.prompt_len
    prompts, refs = [], []
    for i in range(len(shard)):
        doc = shard.doc(i).astype("int64").tolist()
        if len(doc) >= P + n:
            prompts.append(doc[:P])
            refs.append(doc[P:P + n])
        if len(prompts) == args.prompts:
            break
    if len(prompts) < args.prompts:
        print(f"only {len(prompts)} documents of {path} hold {P + n} tokens", file=sys.stderr)
    return torch.tensor(prompts, dtype=torch.long), refs


def _distinct2(rows: list[list[int]]) -> float:
    grams = [tuple(r[i:i + 2]) for r in rows for i in range(len(r) - 1)]
    return len(set(grams)) / max(1, len(grams))


def quality_grid(args: argparse.Namespace, n: int) -> list[tuple[str, dict]]:
    """(label, DecodingConfig fields) of every configuration the quality run decodes."""
    layouts = [("one-block", {})]
    for b in args.block_lengths:
        for suffix in ("block", "rest"):
            for cache in ("exact", "append"):
                layouts.append((f"B={b} {suffix}-{cache}", dict(block_length=b, block_suffix=suffix, block_cache=cache)))
    grid = []
    for k in args.tokens_per_step_grid:
        grid += [(f"confidence T=N/{k} {name}", dict(strategy="confidence", steps=n // k, **kw)) for name, kw in layouts]
    grid += [(f"threshold 0.9 {name}", dict(strategy="threshold", threshold=0.9, **kw)) for name, kw in layouts]
    grid += [(f"mask-predict T=N/4 {name}", dict(strategy="mask-predict", steps=n // 4, **kw)) for name, kw in layouts]
    return grid


def quality(args: argparse.Namespace) -> dict:
    from biglm.checkpoint import load_model
    from biglm.scoring.estimators import score_requests

    model, tokenizer = load_model(args.checkpoint)
    n = max(args.new_tokens)
    prompts, refs = _prompts(args)
    P = prompts.shape[1]
    print(f"quality: {prompts.shape[0]} prompts of {P} tokens, N = {n}, {args.checkpoint}", flush=True)
    scores: dict[tuple[int, tuple[int, ...]], float] = {}  # (prompt, answer) -> chain log-prob, computed once

    def logprob(answers: list[list[int]]) -> list[float]:
        todo = [(i, tuple(a)) for i, a in enumerate(answers) if (i, tuple(a)) not in scores]
        if todo:
            out = score_requests(model, [(prompts[i].tolist(), list(a)) for i, a in todo], estimator="chain",
                                 batch_size=16, row_batch_size=512)
            scores.update({key: lp for key, (lp, _) in zip(todo, out)})
        return [scores[(i, tuple(a))] / len(a) for i, a in enumerate(answers)]

    def decode(fields: dict) -> tuple[list[list[int]], int, float]:
        cfg = DecodingConfig(max_new_tokens=n, **fields)
        t0 = time.perf_counter()
        out = generate_ids(model, prompts, config=cfg)
        return out.tokens.tolist(), out.steps, time.perf_counter() - t0

    reference, _, _ = decode(dict(strategy="confidence", steps=n))
    gold = statistics.mean(logprob(refs))
    rows = []
    for label, fields in quality_grid(args, n):
        answers, calls, seconds = decode(fields)
        agree = sum(a == b for x, y in zip(answers, reference) for a, b in zip(x, y)) / (len(answers) * n)
        eos = model.config.eos_token_id
        cut = [a[:a.index(eos)] if eos in a else a for a in answers]
        rows.append(dict(label=label, **fields, model_calls=calls, seconds=seconds,
                         logprob_per_token=statistics.mean(logprob(answers)), distinct2=_distinct2(cut),
                         agreement_with_reference=agree))
        r = rows[-1]
        if args.grammar:  # checked against the grammar that wrote the training data
            from synthetic_grammar import check

            counts = [check(tokenizer.decode(p.tolist(), skip_special_tokens=True),
                            tokenizer.decode(a, skip_special_tokens=True)) for p, a in zip(prompts, cut)]
            total = max(1, sum(c["sentences"] for c in counts))
            r.update(sentences=sum(c["sentences"] for c in counts),
                     grammatical=sum(c["grammatical"] for c in counts) / total,
                     on_subject=sum(c["on_subject"] for c in counts) / total)
        print(f"  {label:<42} calls {calls:4d}  {seconds:6.2f} s  logp/token {r['logprob_per_token']:7.3f}  "
              f"distinct-2 {r['distinct2']:.3f}  agree {agree:.3f}"
              + (f"  grammatical {r['grammatical']:.3f}  on-subject {r['on_subject']:.3f} ({r['sentences']} sentences)"
                 if args.grammar else ""), flush=True)
    return dict(mode="quality", settings=dict(checkpoint=args.checkpoint, prompts=prompts.shape[0], prompt_len=P,
                                              new_tokens=n, gold_logprob_per_token=gold, grammar=args.grammar),
                results=rows)


def quality_markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"- checkpoint `{s['checkpoint']}`; {s['prompts']} held-out prompts of {s['prompt_len']} tokens, "
             f"N = {s['new_tokens']}, greedy; the held-out continuation scores {s['gold_logprob_per_token']:.3f} "
             "log-prob/token", "",
             "| configuration | calls | s | log-prob/token | distinct-2 | agreement with reference |"
             + (" grammatical | on subject |" if s.get("grammar") else ""),
             "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if s.get("grammar") else "")]
    for r in report["results"]:
        lines.append(f"| {r['label']} | {r['model_calls']} | {r['seconds']:.2f} | {r['logprob_per_token']:.3f} | "
                     f"{r['distinct2']:.3f} | {r['agreement_with_reference']:.3f} |"
                     + (f" {r['grammatical']:.3f} | {r['on_subject']:.3f} |" if s.get("grammar") else ""))
    return "\n".join(lines)


# --- entry point ------------------------------------------------------------------------------------------------


def to_markdown(report: dict) -> str:
    head = markdown_header(f"Generation benchmark ({report['mode']})", report)
    body = speed_markdown(report) if report["mode"] == "speed" else quality_markdown(report)
    return "\n".join(head) + "\n" + body + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["speed", "quality"], default="speed")
    p.add_argument("--checkpoint", default=None, help="a trained run or export: its shape (and weights) for speed; "
                                                      "needed for quality")
    p.add_argument("--preset", default="tiny", help="BiGLM preset when no --checkpoint (random weights)")
    p.add_argument("--layers", type=int, default=None, help="override the preset's layer count")
    p.add_argument("--hidden", type=int, default=None, help="override the preset's width (MLP: 8/3 of it)")
    p.add_argument("--intermediate", type=int, default=None, help="MLP width with --hidden")
    p.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary size")
    p.add_argument("--heads", type=int, default=None, help="override the preset's attention heads")
    p.add_argument("--kv-heads", type=int, default=None, help="override the preset's key/value heads")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p.add_argument("--compile", action="store_true", help="AR baseline: static KV cache + torch.compile (GPU)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=positive_int, nargs="+", default=[128, 512])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--strategy", default="confidence", choices=["mask-predict", "confidence", "threshold"],
                   help="speed: threshold commits every prediction above --threshold and at least k per call, so on "
                        "a trained --checkpoint it can make fewer than T = N/k calls (the forward calls column)")
    p.add_argument("--threshold", type=float, default=0.9, help="speed: tau of --strategy threshold")
    p.add_argument("--tokens-per-step", type=positive_int, nargs="+", default=[2],
                   help="speed: T = N / k calls, each k timed with every block length")
    p.add_argument("--block-length", type=positive_int, nargs="+", default=[16, 32], help="speed: block lengths timed")
    p.add_argument("--max-one-block-calls", type=int, default=None,
                   help="time a longer one-block decode with this many calls and scale (marked projected)")
    p.add_argument("--repeats", type=positive_int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--prompts", type=int, default=32, help="quality: held-out prompts")
    p.add_argument("--val-shard", default=None, help="quality: a val-*.bin shard (default: CHECKPOINT/data/val-*.bin)")
    p.add_argument("--block-lengths", type=int, nargs="+", default=[8, 16, 32], help="quality: block lengths tried")
    p.add_argument("--tokens-per-step-grid", type=int, nargs="+", default=[1, 2, 4],
                   help="quality: confidence at T = N / k for each k")
    p.add_argument("--grammar", action="store_true", help="quality: the checkpoint was trained on "
                   "synthetic_grammar.py documents; also check each answer's sentences against that grammar")
    p.add_argument("--quick", action="store_true", help=f"small CPU subset (explicit flags override): {QUICK}")
    p.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    known, _ = p.parse_known_args(argv)
    if known.quick:  # the subset's values become defaults, so explicit flags still win
        p.set_defaults(**QUICK)
    args = p.parse_args(argv)
    if not 0.0 <= args.threshold <= 1.0:
        p.error(f"--threshold {args.threshold} must lie in [0, 1]")
    if args.mode == "quality" and not args.checkpoint:
        p.error("--mode quality needs --checkpoint (a trained run: a random model cannot show quality)")
    if args.threads:
        torch.set_num_threads(args.threads)
    report = dict(command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), machine=machine(torch.device(args.device)))
    report.update(speed(args) if args.mode == "speed" else quality(args))
    stem = args.out or f"bench_generation_{args.mode}_{'quick_' if args.quick else ''}{torch.device(args.device).type}"
    write_report(stem, report, to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
