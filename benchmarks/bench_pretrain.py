"""Pre-training throughput: tokens/s and MFU of the BiGLM training step per preset, against a Hugging Face
transformers masked LM of the same size and shape (ModernBERT, full attention) on the same batches.

    python benchmarks/bench_pretrain.py --presets biglm-136m,biglm-360m         # GPU: bf16, flex, compile
    python benchmarks/bench_pretrain.py --device cpu --presets tiny,biglm-136m,biglm-360m --layers 2 --seq-len 256 --batch 4 --threads 1

The BiGLM step is the trainer's: global-batch masks, sparse MLM head, AdamW (fused), clip 1.0.
Targets on H100: MFU >= 45% at 360M; >= 1.3x the transformers baseline's tokens/s.

With --data (shards of `biglm data prepare`) and --tokenizer, the step timed is `Trainer.train_step` itself, as
`biglm pretrain` runs it (document masking on, blocks compiled on a GPU), once per path of --paths: ``new`` (every
lever of issue 40 on: the loss fused with the output projection in chunks, host-drawn masks a step ahead in a
thread, no host sync in the step) and ``previous`` (all three off: the path before them), in one process. Each row:
device, preset, path, mfu (a fraction of the dense bf16 peak), tokens_per_second:

    python benchmarks/bench_pretrain.py --data runs/gpu/data --tokenizer runs/gpu/smol --presets biglm-136m,biglm-360m
"""

from __future__ import annotations

import argparse

import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.objective import apply_masks, draw_masks, get_objective, make_generator, masked_lm_loss
from biglm.training.trainer import PEAK_TFLOPS, flops_per_token

from common import timeit, write_result


def modernbert_like(c: BiGLMConfig, L: int):
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    mc = ModernBertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                          num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                          max_position_embeddings=max(L, 512), global_attn_every_n_layers=1, sparse_prediction=True,
                          pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    # SDPA, not the eager default: eager attention materialises (B*heads, L, L) fp32 scores (OOM at 360M, L=2048)
    # and would flatter BiGLM; ModernBERT's own recipe uses FlashAttention-2, which SDPA dispatches to on a GPU
    return ModernBertForMaskedLM._from_config(mc, attn_implementation="sdpa")


PATHS = {"new": {}, "previous": dict(loss_chunk=0, host_masks=False, deferred_finite_check=False)}


def trainer_rows(args, dev: torch.device) -> list[dict]:
    """Time `Trainer.train_step` per preset and path (see the module docstring)."""
    import tempfile

    from biglm.training import Trainer, TrainConfig
    from biglm.training.config import ModelArgs
    from biglm.training.distributed import DistInfo
    from biglm.training.trainer import _device_name

    from common import sync

    info = DistInfo(rank=0, world_size=1, local_rank=0, device=dev)
    rows = []
    for name in args.presets.split(","):
        for path in args.paths.split(","):
            if path not in PATHS:
                raise SystemExit(f"--paths: unknown path {path!r} (new, previous)")
            with tempfile.TemporaryDirectory() as out:
                cfg = TrainConfig(name="bench", out_dir=out, preset=name, data={args.data: 1.0},
                                  tokenizer=args.tokenizer, seq_len=args.seq_len, micro_batch=args.batch,
                                  global_batch=args.batch * args.accum, steps=args.iters + 3 + 1000, warmup_steps=1,
                                  doc_mask=not args.no_doc_mask, device=dev.type, eval_every=0, save_every=0,
                                  model=ModelArgs(num_hidden_layers=args.layers,
                                                  max_position_embeddings=max(args.seq_len, 256)),
                                  compile="yes" if args.compile else "no", **PATHS[path])
                cfg.validate()
                trainer = Trainer(cfg, info=info, echo=lambda s: None)
                trainer.model.train()
                for _ in range(3):  # compile, the first micro-batch's input checks, the prefetch thread's start
                    trainer.train_step()
                sync(dev)
                import time

                t0 = time.perf_counter()
                for _ in range(args.iters):
                    loss, _ = trainer.train_step()
                sync(dev)
                t = (time.perf_counter() - t0) / args.iters
                tok_s = cfg.global_batch * cfg.seq_len / t
                row = {"device": _device_name(dev), "preset": name, "path": path, "B": args.batch, "accum": args.accum,
                       "L": args.seq_len, "doc_mask": cfg.doc_mask, "s_per_step": t, "tokens_per_second": tok_s,
                       "mfu": tok_s * trainer.flops / trainer.peak if trainer.peak else None,
                       "mfu_unmasked": tok_s * trainer.flops_sparse / trainer.peak if trainer.peak else None,
                       "flops_per_token": trainer.flops, "loss": float(loss),
                       "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
                       "levers": {k: getattr(cfg, k) for k in ("loss_chunk", "host_masks", "deferred_finite_check")}}
                trainer.stop_prefetch()
                del trainer
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="biglm-136m,biglm-360m")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models (GPU)")
    ap.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--layers", type=int, default=None, help="cut each preset to this many layers (CPU runs)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 is stable on a shared CPU)")
    ap.add_argument("--data", default=None, help="token shards: time Trainer.train_step on them (see above)")
    ap.add_argument("--tokenizer", default=None, help="with --data: the shards' tokenizer")
    ap.add_argument("--paths", default="new,previous", help="with --data: new, previous (comma-separated)")
    ap.add_argument("--accum", type=int, default=1, help="with --data: micro-batches per step")
    ap.add_argument("--no-doc-mask", action="store_true", help="with --data: attend across documents")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if args.data:
        if not args.tokenizer:
            raise SystemExit("--data needs --tokenizer (the tokenizer the shards were prepared with)")
        if args.threads:
            torch.set_num_threads(args.threads)
        rows = trainer_rows(args, dev)
        print("wrote", write_result("pretrain", {"args": vars(args), "rows": rows}, stem=args.out))
        return
    gpu = dev.type == "cuda"
    if args.threads:
        torch.set_num_threads(args.threads)
    B, L = args.batch, args.seq_len
    peak = None
    if gpu:
        peak = next((tf * 1e12 for k, tf in PEAK_TFLOPS.items() if k in torch.cuda.get_device_name()), None)
    obj = get_objective("biglm")
    rows = []
    for name in args.presets.split(","):
        extra = {"num_hidden_layers": args.layers} if args.layers else {}
        c = BiGLMConfig.from_preset(name, attn_backend="flex" if gpu else "sdpa", max_position_embeddings=max(L, 256), **extra)
        pattern = draw_masks(B, L, obj, generator=make_generator(seed=0, step=0, rank=0, device=dev), device=dev)
        windows = torch.randint(5, c.vocab_size, (B, L), device=dev)
        batch = apply_masks(windows, pattern, mask_token_id=4)
        autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=gpu)

        def make_step(model, fn):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01, fused=True)

            def step():
                with autocast:
                    loss = fn(model)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
            return step

        torch.manual_seed(0)
        model = BiGLMForMaskedLM(c).to(dev)
        model.model.validate_inputs = False
        if args.compile:
            for blk in model.model.layers:
                blk.compile()
        batch.find_positions()  # as Trainer.train_step: masked positions by index, one loss (masked_lm_loss)
        t = timeit(make_step(model, lambda m: masked_lm_loss(
            m(batch.input_ids, **batch.attention(), logits_positions=batch.positions).logits, batch)),
            device=dev, iters=args.iters)
        dense_f, sparse_f = flops_per_token(c, obj, L)
        row = {"preset": name, "B": B, "L": L, "biglm_s_per_step": t, "biglm_tokens_per_s": B * L / t,
               "flops_per_token": dense_f, "flops_per_token_unmasked_blocks": sparse_f}
        if peak:
            row["biglm_mfu"] = B * L / t * dense_f / peak
            row["biglm_mfu_unmasked_blocks"] = B * L / t * sparse_f / peak
        del model
        if not args.no_baseline:
            torch.manual_seed(0)
            base = modernbert_like(c, L).to(dev)
            if args.compile:
                base = torch.compile(base)
            try:
                tb = timeit(make_step(base, lambda m: m(input_ids=batch.input_ids, labels=batch.labels).loss),
                            device=dev, iters=args.iters)
                row.update({"modernbert_s_per_step": tb, "modernbert_tokens_per_s": B * L / tb, "speedup": tb / t})
            except torch.OutOfMemoryError as e:  # recorded, not fatal: the BiGLM row stands
                row["modernbert_error"] = f"out of memory: {str(e).splitlines()[0]}"
            del base
            if gpu:
                torch.cuda.empty_cache()
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    print("wrote", write_result("pretrain", {"args": vars(args), "rows": rows}, stem=args.out))


if __name__ == "__main__":
    main()
