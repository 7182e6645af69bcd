"""Issue 32 item 3, the distillation arm: text the AR source writes itself, to adapt its BiGLM on.

The source (SmolLM2-135M-Instruct, the GGUF made a transformers directory by benchmarks/common.hf_directory) continues
the first ``--prompt-words`` words of documents from the same files as the shared-corpus arm (FineWeb-edu sample,
WikiText-2 test, TinyStories head), sampled at temperature 1 (top-p 0.95) for ``--new-tokens`` tokens, with vLLM's
offline engine; run it with the vLLM environment's python (benchmarks/bench_serve_vs_vllm.py makes it):

    .venv-vllm/bin/python docs/experiments/distill_corpus.py --model runs/bevh-b1/source-hf \\
        --out runs/distill/source-text.jsonl --docs 1000
    biglm data prepare runs/distill/source-text.jsonl --tokenizer runs/smol-biglm --out runs/data-smol-distill \\
        --val_docs 0

Each output line is {"text": prompt + continuation}; the held-out split stays the shared mix's, so the arms are
scored on the same documents.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "pretrain"


def documents(limit: int) -> list[str]:
    """Documents of the three sources in turn (the shared mix's files), non-empty, until ``limit``."""
    fineweb = [json.loads(line)["text"] for line in (SHARED / "fineweb_edu_sample" / "fineweb_edu_sample.jsonl")
               .read_text(encoding="utf-8").splitlines() if line.strip()]
    wiki = [p.strip() for p in (SHARED / "wikitext2" / "wiki.test.raw").read_text(encoding="utf-8").split("\n")
            if len(p.strip()) > 200 and not p.strip().startswith("=")]  # one paragraph per line, headings left out
    stories = [p.strip() for p in (SHARED / "tinystories" / "TinyStories-train.head.txt").read_text(encoding="utf-8")
               .split("\n\n") if len(p.strip()) > 100]  # paragraphs
    out: list[str] = []
    for i in range(max(len(fineweb), len(wiki), len(stories))):
        for source in (fineweb, wiki, stories):
            if i < len(source) and len(out) < limit:
                out.append(source[i])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the source as a transformers directory")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--prompt-words", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from vllm import LLM, SamplingParams

    prompts = [" ".join(doc.split()[:args.prompt_words]) for doc in documents(args.docs)]
    # the CPU backend reserves KV-cache memory by VLLM_CPU_KVCACHE_SPACE (GiB; set it, e.g. 2, as the serving benchmark
    # does) and checks the machine's free memory against gpu_memory_utilization
    llm = LLM(model=args.model, dtype="bfloat16", seed=args.seed, max_model_len=1024, gpu_memory_utilization=0.3)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=args.new_tokens)  # seeded by the engine (LLM seed):
    # a per-request seed fails on the CPU backend ("CPU Generator does not use offset")
    outputs = llm.generate(prompts, params)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for prompt, out in zip(prompts, outputs):
            f.write(json.dumps({"text": prompt + out.outputs[0].text}) + "\n")
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"wrote {len(outputs)} documents, {tokens} generated tokens, to {args.out}")


if __name__ == "__main__":
    main()
