"""Seq2seq decoding (GitHub issue 9): BiGLM's CMLM decode (length beam 3, Mask-Predict T = 10, exact prefix
cache) against the same-shape autoregressive model's `generate`, in one run; and quality against speed.

Speed (``--mode speed``, the default)
- Models (random weights: they do not change the cost of a forward pass): a
  `BiGLMForConditionalGeneration` of ``--preset`` with ``--layers/--hidden/--heads/--kv-heads/--intermediate/
  --vocab-size`` overrides, its window raised to S + N; a `LlamaForCausalLM` with the same layers, hidden
  size, heads, kv heads, MLP width, vocabulary and tying; with ``--encdec`` (default on) also a T5 (v1.1
  style gated MLP, same d_model, heads, MLP width and vocabulary) with ceil(L/2) encoder and ceil(L/2) decoder
  layers, about the same parameter count (its decoder layers add cross-attention; T5 has no GQA).
- Input: B random sources of S tokens (an XSum-like document; same length, so nobody pads); answers of N tokens.
- Rows (batch B, target N):
  * ``ar``: Llama ``generate``, greedy, its KV cache, the source as prompt, exactly N tokens (min = max = N).
  * ``encdec``: T5 ``generate`` the same way (encoder over the source once, decoder with its KV cache).
  * ``biglm``: the library's length-beam decode for the whole batch at once: ``predict_lengths`` (one encoder
    pass over the sources; its prefix cache is kept and reused by the decode), then
    `biglm.generation.generate_ids` with a (B, 3) length table, Mask-Predict T = 10, ``use_cache=True``.
    The table is forced to (N, N-1, N-2) for every source, i.e. the cost of a decode whose predicted top-1
    length is N (the head's own picks would be random on random weights).
  * ``biglm-loop`` (B > 1): the same, one source at a time, as `decode_with_length_head` at commit f418a9e
    does (each source: ``predict_lengths``, then ``generate_ids`` with its own 3 lengths). With
    ``--loop-sample k`` only the first k sources are decoded and the time scaled by B / k (every source costs
    the same: same S, same lengths); the row says ``projected_from``.
- Timing: each configuration runs once untimed (warm-up: the same shapes, 1 Mask-Predict step / 4 AR tokens),
  then ``--repeats`` timed rounds, interleaved (each round runs every configuration once), so the load of
  a shared machine hits every configuration alike. Median is the headline (minimum kept). Ratios are against
  ``ar`` of the same batch and N in the same run. tokens/s = B * N / latency.

Quality (``--mode quality --model DIR``): a fine-tuned seq2seq export (``biglm finetune xsum|seq2seq``, its
``best`` directory or the run).
- Sources: the first ``--examples`` K rows of ``--data`` (JSONL), rendered with the model's own
  ``biglm_task.json`` templates (or ``--source-template``/``--target-template``) and cut as fine-tuning cuts
  them (the start, then the template's text after its last field), at most ``max_source_length`` tokens.
- For each T in ``--steps`` (4 10 16): the length-beam decode (beam ``--beam``, from the length head) of all K
  sources, at each ``--batch`` size (1: one source at a time, the f418a9e library loop; 32: left-padded
  batches with a (B, beam) length table); ROUGE-1/2/L (`biglm.scoring.metrics.rouge`) against the
  references, seconds per source, mean answer length, and the share of answers equal to the batch-1 answers.
- A model-free row for scale: LEAD-1, the first sentence of the source's first field (XSum's LEAD baseline; for
  one-sentence sources such as SQuAD-QG's, copying the source).

Usage
    python benchmarks/bench_seq2seq.py --threads 1 --preset biglm-124m --layers 2 --vocab-size 8192 \\
        --source-len 256 --new-tokens 32 64 --batch 1 32 --out seq2seq-cpu-loaded
    python benchmarks/bench_seq2seq.py --mode quality --model RUN/best --data valid.jsonl --examples 32

Results go to ``benchmarks/results/<out>.json`` (machine, torch version, git commit) and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from biglm import BiGLMConfig
from biglm.finetune.tasks.seq2seq import cut_source, render_rows, template_tail
from biglm.generation import DecodingConfig, generate_ids, left_pad
from biglm.model import count_parameters
from biglm.model.seq2seq import BiGLMForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_header, write_report  # noqa: E402

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


# --- models ---------------------------------------------------------------------------------------------------


def build_models(args: argparse.Namespace):
    """A random BiGLMForConditionalGeneration, a same-shape LlamaForCausalLM and (optionally) a T5 of ~ the same size."""
    from transformers import LlamaConfig, LlamaForCausalLM

    window = args.source_len + max(args.new_tokens)
    overrides = dict(attn_backend="sdpa", max_position_embeddings=max(window, 256))
    for flag, name in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"), ("vocab_size", "vocab_size"),
                       ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"),
                       ("intermediate", "intermediate_size")):
        if getattr(args, flag):
            overrides[name] = getattr(args, flag)
    config = BiGLMConfig.from_preset(args.preset, **overrides)
    config.max_target_length = max(args.new_tokens)
    torch.manual_seed(0)
    biglm = BiGLMForConditionalGeneration(config).eval()
    llama_config = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps, tie_word_embeddings=config.tie_word_embeddings,
        attention_bias=False, mlp_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    llama = LlamaForCausalLM._from_config(llama_config, attn_implementation="sdpa").eval()
    t5 = None
    if args.encdec:
        from transformers import T5Config, T5ForConditionalGeneration

        half = math.ceil(config.num_hidden_layers / 2)
        t5_config = T5Config(
            vocab_size=config.vocab_size, d_model=config.hidden_size, d_ff=config.intermediate_size,
            d_kv=config.hidden_size // config.num_attention_heads, num_heads=config.num_attention_heads,
            num_layers=half, num_decoder_layers=half, feed_forward_proj="gated-gelu", dropout_rate=0.0,
            tie_word_embeddings=config.tie_word_embeddings, pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
        )
        torch.manual_seed(0)
        t5 = T5ForConditionalGeneration._from_config(t5_config, attn_implementation="sdpa").eval()
    return config, biglm, llama, t5


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# --- speed ----------------------------------------------------------------------------------------------------


def _length_beam_decode(model, ids: torch.Tensor, *, lengths: list[int], steps: int) -> int:
    """The library's length-beam decode of ``ids`` (B, S) with the candidate lengths forced to ``lengths`` for
    every source: ``predict_lengths`` (its prefix cache is reused by the decode), then one ``generate_ids``."""
    cfg = DecodingConfig(max_new_tokens=max(lengths), steps=steps, length_beam=len(lengths), use_cache=True)
    with torch.inference_mode():
        model.predict_lengths(ids, None, beam=len(lengths))  # the cost the library pays; the picks are overridden
        table = torch.tensor([lengths], dtype=torch.long).expand(ids.shape[0], -1)
        out = generate_ids(model, ids, None, config=cfg, lengths=table)
    assert out.tokens.shape == (ids.shape[0], max(lengths)), out.tokens.shape
    return out.steps


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def speed(args: argparse.Namespace) -> dict:
    config, biglm, llama, t5 = build_models(args)
    counts = count_parameters(config)
    print(f"model: layers={config.num_hidden_layers} hidden={config.hidden_size} heads={config.num_attention_heads}/"
          f"{config.num_key_value_heads} mlp={config.intermediate_size} vocab={config.vocab_size} "
          f"(BiGLM {counts['total'] / 1e6:.2f}M, Llama {_params(llama) / 1e6:.2f}M"
          + (f", T5 {_params(t5) / 1e6:.2f}M" if t5 is not None else "") + " params), fp32 CPU", flush=True)
    g = torch.Generator().manual_seed(0)
    cases = []  # (batch, n, variant, run, warm, scale)
    for batch in args.batch:
        src = torch.randint(5, config.vocab_size, (batch, args.source_len), generator=g)
        attn = torch.ones_like(src)
        for n in args.new_tokens:
            lengths = [n - i for i in range(args.beam)]

            def ar(k=n, src=src, attn=attn):
                with torch.inference_mode():
                    out = llama.generate(src, attention_mask=attn, max_new_tokens=k, min_new_tokens=k, do_sample=False)
                assert out.shape[1] == src.shape[1] + k, out.shape

            cases.append((batch, n, "ar", ar, lambda ar=ar: ar(k=4), 1.0))
            if t5 is not None:
                def encdec(k=n, src=src, attn=attn):
                    with torch.inference_mode():
                        out = t5.generate(src, attention_mask=attn, max_new_tokens=k, min_new_tokens=k, do_sample=False)
                    assert out.shape[1] == k + 1, out.shape  # the decoder start token, then k tokens

                cases.append((batch, n, "encdec", encdec, lambda encdec=encdec: encdec(k=4), 1.0))

            def batched(src=src, lengths=lengths, steps=args.steps):
                return _length_beam_decode(biglm, src, lengths=lengths, steps=steps)

            cases.append((batch, n, "biglm", batched,
                          lambda src=src, lengths=lengths: _length_beam_decode(biglm, src, lengths=lengths, steps=1), 1.0))
            if batch > 1:
                k = min(batch, args.loop_sample or batch)

                def loop(src=src, lengths=lengths, steps=args.steps, k=k):
                    for i in range(k):
                        _length_beam_decode(biglm, src[i:i + 1], lengths=lengths, steps=steps)

                cases.append((batch, n, "biglm-loop", loop,
                               lambda src=src, lengths=lengths: _length_beam_decode(biglm, src[:1], lengths=lengths,
                                                                                   steps=1), batch / k))
    for batch, n, variant, _, warm, _ in cases:
        print(f"  warm-up batch={batch:<3} N={n:<4} {variant:<11} {_time(warm):8.2f} s", flush=True)
    times: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    for r in range(args.repeats):
        for i, (batch, n, variant, run, _, scale) in enumerate(cases):
            t = _time(run) * scale
            times[i].append(t)
            print(f"  round {r + 1}/{args.repeats} batch={batch:<3} N={n:<4} {variant:<11} {t:8.2f} s"
                  + (f" (projected x {scale:g})" if scale != 1.0 else ""), flush=True)
    rows = []
    for i, (batch, n, variant, _, _, scale) in enumerate(cases):
        med = statistics.median(times[i])
        row = dict(batch=batch, new_tokens=n, variant=variant, latency_s=med, latency_min_s=min(times[i]),
                   tokens_per_s=batch * n / med, times_s=times[i],
                   model_calls=(args.steps + 1) * (batch if variant == "biglm-loop" else 1) if variant.startswith("biglm")
                   else n + 1 if variant == "encdec" else n)
        if scale != 1.0:
            row["projected_from"] = round(batch / scale)
        rows.append(row)
    ar = {(r["batch"], r["new_tokens"]): r["latency_s"] for r in rows if r["variant"] == "ar"}
    for row in rows:
        row["speedup_vs_ar"] = ar[(row["batch"], row["new_tokens"])] / row["latency_s"]
    return dict(mode="speed", settings=dict(
        preset=args.preset, num_hidden_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size, vocab_size=config.vocab_size, params_biglm=counts["total"],
        params_llama=_params(llama), params_t5=_params(t5) if t5 is not None else None,
        t5_layers=f"{t5.config.num_layers}+{t5.config.num_decoder_layers}" if t5 is not None else None,
        source_len=args.source_len, beam=args.beam, steps=args.steps, forced_lengths="N, N-1, ..., N-beam+1",
        repeats=args.repeats, loop_sample=args.loop_sample), results=rows)


def speed_markdown(report: dict) -> str:
    s = report["settings"]
    t5 = f", T5 {s['t5_layers']} layers {s['params_t5'] / 1e6:.2f}M" if s["params_t5"] else ""
    lines = [
        f"- shape: {s['num_hidden_layers']} layers, hidden {s['hidden_size']}, heads {s['num_attention_heads']}/"
        f"{s['num_key_value_heads']}, MLP {s['intermediate_size']}, vocab {s['vocab_size']} (BiGLM "
        f"{s['params_biglm'] / 1e6:.2f}M, Llama {s['params_llama'] / 1e6:.2f}M{t5} params), random weights, fp32 CPU",
        f"- source S = {s['source_len']} tokens; BiGLM: length beam {s['beam']} (lengths forced to N, N-1, N-2), "
        f"Mask-Predict T = {s['steps']}, exact prefix cache; AR/enc-dec: greedy `generate`, KV cache, exactly N tokens",
        f"- median of {s['repeats']} interleaved rounds after a warm-up; `vs AR` = AR latency / row latency, same run",
        "",
        "| batch | N | variant | model calls | latency median (s) | min (s) | tokens/s | vs AR |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        note = f" (projected from {r['projected_from']} sources)" if "projected_from" in r else ""
        lines.append(f"| {r['batch']} | {r['new_tokens']} | {r['variant']}{note} | {r['model_calls']} | "
                     f"{r['latency_s']:.3f} | {r['latency_min_s']:.3f} | {r['tokens_per_s']:.1f} | "
                     f"{r['speedup_vs_ar']:.2f}x |")
    return "\n".join(lines)


# --- quality --------------------------------------------------------------------------------------------------


def _lead(text: str) -> str:
    """The first sentence of ``text`` (up to the first ., ! or ? followed by a space): LEAD-1 for a document, the
    whole source for a one-sentence source (QG's copy-the-source baseline)."""
    return re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]


def _sources(args: argparse.Namespace, tokenizer, task: dict) -> tuple[list[list[int]], list[str], list[str]]:
    """Source ids (cut as fine-tuning cuts them), reference texts and the LEAD-1 baseline (`_lead` of the source
    template's first field) of the first K rows of ``--data``."""
    src_t = args.source_template or task.get("source_template", "{source}")
    tgt_t = args.target_template or task.get("target_template", "{target}")
    limit = int(task.get("max_source_length", 512))
    rows = []
    with open(args.data) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) == args.examples:
                break
    tail_text = template_tail(src_t)
    tail = list(tokenizer(tail_text, add_special_tokens=False)["input_ids"]) if tail_text else []
    texts = render_rows(rows, src_t, source=args.data, what="source")
    sources = [cut_source(tokenizer(t, add_special_tokens=False)["input_ids"], max_length=limit, tail=tail)
               for t in texts]
    first_field = _PLACEHOLDER.search(src_t).group(1)
    refs = [t.strip() for t in render_rows(rows, tgt_t, source=args.data, what="target")]
    return sources, refs, [_lead(str(r[first_field])) for r in rows]


def quality(args: argparse.Namespace) -> dict:
    from biglm.checkpoint import load_model
    from biglm.scoring.metrics import rouge

    model, tokenizer = load_model(args.model)
    if not isinstance(model, BiGLMForConditionalGeneration):
        raise SystemExit(f"{args.model} is not a seq2seq (length-head) model: {type(model).__name__}")
    model.model.validate_inputs = False
    task_file = Path(args.model) / "biglm_task.json"
    if not task_file.is_file():
        task_file = Path(args.model) / "best" / "biglm_task.json"
    saved = json.loads(task_file.read_text()) if task_file.is_file() else {}
    task = {**saved.get("settings", {}), **saved.get("decoding", {})}  # templates and max_source_length
    sources, refs, leads = _sources(args, tokenizer, task)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    N = int(model.config.max_target_length)
    print(f"quality: {len(sources)} sources (mean {statistics.mean(map(len, sources)):.0f} tokens), length beam "
          f"{args.beam}, N <= {N}, {args.model}", flush=True)

    def decode(steps: int, batch: int) -> tuple[list[list[int]], float]:
        cfg = DecodingConfig(max_new_tokens=N, steps=steps, length_beam=args.beam, use_cache=True)
        answers = []
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i in range(0, len(sources), batch):
                ids, mask = left_pad(sources[i:i + batch], pad_id=pad)
                mask_arg = None if bool(mask.all()) else mask
                lengths = model.predict_lengths(ids, mask_arg, beam=args.beam)  # (B, beam); its cache is reused
                answers += generate_ids(model, ids, mask_arg, config=cfg, lengths=lengths).token_lists()
        return answers, time.perf_counter() - t0

    decode(min(args.steps), min(args.batch))  # warm-up, untimed
    rows, first = [], {}
    for steps in args.steps:
        for batch in args.batch:
            answers, seconds = decode(steps, batch)
            texts = [t.strip() for t in tokenizer.batch_decode(answers, skip_special_tokens=True)]
            first.setdefault(steps, answers)
            same = sum(a == b for a, b in zip(answers, first[steps])) / len(answers)
            scores = rouge(predictions=texts, references=refs)
            rows.append(dict(steps=steps, batch=batch, seconds=seconds, seconds_per_source=seconds / len(sources),
                             mean_answer_tokens=statistics.mean(map(len, answers)), same_as_first_batch=same,
                             example=texts[0], **scores))
            print(f"  T={steps:<3} batch={batch:<3} {seconds / len(sources):7.3f} s/source  R1 {scores['rouge1']:5.2f}  "
                  f"R2 {scores['rouge2']:5.2f}  RL {scores['rougeL']:5.2f}  len {rows[-1]['mean_answer_tokens']:.1f}  "
                  f"same {same:.2f}", flush=True)
    lead = rouge(predictions=leads, references=refs)
    print(f"  LEAD-1 (first sentence of the source)  R1 {lead['rouge1']:5.2f}  R2 {lead['rouge2']:5.2f}  "
          f"RL {lead['rougeL']:5.2f}", flush=True)
    return dict(mode="quality", lead_baseline=lead, settings=dict(model=args.model, data=args.data, examples=len(sources), beam=args.beam,
                                              max_target_length=N, source_template=task.get("source_template"),
                                              max_source_length=task.get("max_source_length"),
                                              mean_source_tokens=statistics.mean(map(len, sources)),
                                              mean_reference_words=statistics.mean(len(r.split()) for r in refs)),
                results=rows)


def quality_markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"- model `{s['model']}`; first {s['examples']} rows of `{s['data']}` (sources {s['mean_source_tokens']:.0f} "
             f"tokens on average, cut at {s['max_source_length']}); length beam {s['beam']} from the length head, "
             f"Mask-Predict, exact prefix cache", "",
             "| T | batch | s/source | ROUGE-1 | ROUGE-2 | ROUGE-L | mean answer tokens | same answers as first batch size |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        lines.append(f"| {r['steps']} | {r['batch']} | {r['seconds_per_source']:.3f} | {r['rouge1']:.2f} | "
                     f"{r['rouge2']:.2f} | {r['rougeL']:.2f} | {r['mean_answer_tokens']:.1f} | "
                     f"{r['same_as_first_batch']:.2f} |")
    if report.get("lead_baseline"):
        b = report["lead_baseline"]
        lines.append(f"| LEAD-1 (source's first sentence, no model) | | | {b['rouge1']:.2f} | {b['rouge2']:.2f} | "
                     f"{b['rougeL']:.2f} | | |")
    return "\n".join(lines)


# --- entry point ------------------------------------------------------------------------------------------------


def to_markdown(report: dict) -> str:
    head = markdown_header(f"Seq2seq decoding benchmark ({report['mode']})", report,
                           load_note=": a shared machine, absolute times are loaded ones; compare rows of this run only")
    body = speed_markdown(report) if report["mode"] == "speed" else quality_markdown(report)
    return "\n".join(head) + "\n" + body + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["speed", "quality"], default="speed")
    p.add_argument("--preset", default="biglm-124m", help="speed: BiGLM preset (random weights)")
    p.add_argument("--layers", type=int, default=None, help="speed: override the preset's layer count")
    p.add_argument("--hidden", type=int, default=None, help="speed: override the preset's width")
    p.add_argument("--intermediate", type=int, default=None, help="speed: override the preset's MLP width")
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--encdec", action=argparse.BooleanOptionalAction, default=True,
                   help="speed: also time a T5 of about the same size")
    p.add_argument("--source-len", type=int, default=256, help="speed: source tokens S")
    p.add_argument("--new-tokens", type=int, nargs="+", default=[32, 64], help="speed: target tokens N")
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="sources per call (speed default 1 32; quality default 1 32)")
    p.add_argument("--beam", type=int, default=3, help="length beam")
    p.add_argument("--steps", type=int, nargs="+", default=None, help="Mask-Predict T (speed: one, default 10; "
                                                                        "quality default 4 10 16)")
    p.add_argument("--loop-sample", type=int, default=None,
                   help="speed: time the one-source-at-a-time loop on this many sources and scale (projected)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: see bench_generation)")
    p.add_argument("--model", default=None, help="quality: a fine-tuned seq2seq export or finetune run")
    p.add_argument("--data", default=None, help="quality: a JSONL file with the template's columns")
    p.add_argument("--examples", type=int, default=32, help="quality: first K rows of --data")
    p.add_argument("--source-template", default=None, help="quality: default the model's biglm_task.json")
    p.add_argument("--target-template", default=None)
    p.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    args = p.parse_args(argv)
    args.batch = args.batch or [1, 32]
    if args.mode == "speed":
        args.steps = (args.steps or [10])[0]
    else:
        args.steps = args.steps or [4, 10, 16]
        if not args.model or not args.data:
            p.error("--mode quality needs --model (a fine-tuned seq2seq model) and --data (a JSONL file)")
        for flag, path in (("--model", args.model), ("--data", args.data)):
            if not Path(path).exists():
                p.error(f"{flag} {path}: no such file or directory")
    torch.set_num_threads(args.threads)
    report = dict(command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), machine=machine(torch.device("cpu")))
    report.update(speed(args) if args.mode == "speed" else quality(args))
    stem = args.out or f"seq2seq-{args.mode}-cpu"
    write_report(stem, report, to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
