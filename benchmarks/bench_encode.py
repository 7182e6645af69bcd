"""Corpus-encoding throughput: biglm's bi-encoder (`BiGLMBiEncoder.encode`, batched by length) against
sentence-transformers encoding with a same-shape Hugging Face encoder (a randomly initialised ModernBERT
wrapped as Transformer -> Pooling(mean) -> Normalize) on the same texts.

    python benchmarks/bench_encode.py --docs 1000 --layers 2 --threads 1

Both encoders: biglm-124m's shape (12 heads = 12 kv heads, since ModernBERT has no GQA; GeGLU/SwiGLU of the
same width) cut to ``--layers``, global attention in every ModernBERT layer, the same tokenizer (trained on the
texts) so both see the same token ids, ``--max-length`` tokens per text, fp32, sdpa attention, CPU. Texts:
SciFact's corpus (title + " " + text), the first ``--docs``. sentence-transformers also sorts texts by length
before batching, so this compares the encoders and the per-batch work, not the batching policy. Timed:
``--repeats`` full passes over the texts after one untimed pass on a slice (warm-up); the best pass counts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import write_result

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "finetune" / "beir_scifact" / "corpus.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(SHARED), help="a BEIR corpus.jsonl")
    ap.add_argument("--docs", type=int, default=1000, help="encode the first N documents (0: all)")
    ap.add_argument("--preset", default="biglm-124m", help="biglm architecture preset whose widths both models take")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--note", default="", help="recorded with the result, e.g. 'machine loaded by other jobs'")
    ap.add_argument("--out", default=None, help="results file stem (default encode-cpu)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer
    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer
    from transformers import ModernBertConfig, ModernBertModel

    from biglm import BiGLMConfig, BiGLMModel
    from biglm.data import train_tokenizer
    from biglm.finetune.tasks.retrieval import doc_text
    from biglm.model.biencoder import BiGLMBiEncoder

    rows = [json.loads(line) for line in Path(args.corpus).read_text().splitlines() if line.strip()]
    texts = [doc_text(r) for r in (rows[:args.docs] if args.docs else rows)]
    tmp = Path(tempfile.mkdtemp(prefix="bench_encode_"))
    tok = train_tokenizer(texts=texts, vocab_size=8192, out_dir=str(tmp / "tok"))
    lengths = [len(ids) for ids in tok(texts, truncation=True, max_length=args.max_length)["input_ids"]]

    base = BiGLMConfig.from_preset(args.preset)
    c = BiGLMConfig.from_preset(args.preset, num_hidden_layers=args.layers, num_key_value_heads=base.num_attention_heads,
                                vocab_size=len(tok), attn_backend="sdpa",
                                max_position_embeddings=max(512, args.max_length), pad_token_id=tok.pad_token_id,
                                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                mask_token_id=tok.mask_token_id)
    torch.manual_seed(0)
    ours = BiGLMBiEncoder(BiGLMModel(c).eval(), tok)
    ours.model.validate_inputs = False  # an inference server would check its inputs once, not per batch

    mc = ModernBertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                          num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                          max_position_embeddings=c.max_position_embeddings, global_attn_every_n_layers=1,
                          pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          cls_token_id=tok.bos_token_id, sep_token_id=tok.eos_token_id, attn_implementation="sdpa")
    torch.manual_seed(0)
    ModernBertModel(mc).save_pretrained(tmp / "modernbert")
    tok.save_pretrained(tmp / "modernbert")
    transformer = Transformer(str(tmp / "modernbert"), max_seq_length=args.max_length)
    st = SentenceTransformer(modules=[transformer, Pooling(c.hidden_size, pooling_mode="mean"), Normalize()], device="cpu")
    st.eval()
    params = {"biglm": sum(p.numel() for p in ours.parameters()), "modernbert": sum(p.numel() for p in st.parameters())}

    def run_ours(xs):
        return ours.encode(xs, batch_size=args.batch_size, max_length=args.max_length)

    def run_st(xs):
        return st.encode(xs, batch_size=args.batch_size, convert_to_tensor=True, show_progress_bar=False)

    result = {}
    for name, fn in (("biglm", run_ours), ("sentence_transformers_modernbert", run_st)):
        fn(texts[:2 * args.batch_size])  # warm-up: first-call allocations and kernel selection
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            out = fn(texts)
            times.append(time.perf_counter() - t)
        assert tuple(out.shape) == (len(texts), c.hidden_size)
        result[name] = {"best_s": min(times), "median_s": statistics.median(times),
                        "texts_per_s": len(texts) / min(times), "tokens_per_s": sum(lengths) / min(times)}
    peer = result["sentence_transformers_modernbert"]
    row = {"texts": len(texts), "mean_tokens": round(sum(lengths) / len(lengths), 1), "max_length": args.max_length,
           "batch_size": args.batch_size, "layers": c.num_hidden_layers, "hidden": c.hidden_size,
           "heads": c.num_attention_heads, "parameters": params, **result,
           "ratio_biglm_over_st": result["biglm"]["texts_per_s"] / peer["texts_per_s"]}
    print(json.dumps(row, indent=1))
    print("wrote", write_result("encode", {"args": vars(args), "note": args.note, "rows": [row]}, stem=args.out))


if __name__ == "__main__":
    main()
