"""biglm's one-call RMSNorm (`packed.KernelRMSNorm`) against PyTorch's `rms_norm`, in a bfloat16 export's batch-1
decoding with the bfloat16 products on in both (issue 49): each held-out prompt decoded both ways, alternating which
goes first, one thread.

    python docs/experiments/rms_norm_ab.py runs/smol-causal-a80g-bf16
"""

import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_exact_drafts import prompt_rows, prompt_text  # noqa: E402

torch.set_num_threads(1)
from biglm.checkpoint import load_model  # noqa: E402
from biglm.generation import generate_ids  # noqa: E402
from biglm.generation.config import model_decoding  # noqa: E402
from biglm.model.packed import KernelRMSNorm  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    model, tok = load_model(sys.argv[1], pack=True)
norms = [(p, n, c) for p in model.modules() for n, c in p.named_children() if isinstance(c, KernelRMSNorm)]
assert norms, "no KernelRMSNorm: pass a bfloat16 export on a CPU where biglm's kernels run"


def use(kernel: bool) -> None:
    for parent, name, norm in norms:
        setattr(parent, name, norm if kernel else norm._norm[0])


rows = prompt_rows(Path(__file__).resolve().parents[3] / "shared" / "data", 4)
prompts = [torch.tensor([tok(prompt_text(tok, r), add_special_tokens=False)["input_ids"]]) for r in rows]
for name, fields in (("one per call", {"strategy": "confidence", "block_length": 1, "steps": 96, "draft_length": 0}),
                     ("default", {})):
    config = model_decoding(model.config, {"max_new_tokens": 96, "ignore_eos": True, **fields})
    seconds, calls, texts = {True: 0.0, False: 0.0}, {True: 0, False: 0}, {True: [], False: []}
    for i, ids in enumerate(prompts):
        for kernel in ((True, False) if i % 2 else (False, True)):
            use(kernel)
            t0 = time.perf_counter()
            out = generate_ids(model, ids, config=config)
            seconds[kernel] += time.perf_counter() - t0
            calls[kernel] += out.forward_calls
            texts[kernel].append(out.token_lists()[0])
    same = sum(a == b for a, b in zip(texts[True], texts[False]))
    print(f"{name}: one-call norm {1e3 * seconds[True] / calls[True]:.1f} ms a call, torch rms_norm "
          f"{1e3 * seconds[False] / calls[False]:.1f}; {96 * len(prompts) / seconds[True]:.1f} vs "
          f"{96 * len(prompts) / seconds[False]:.1f} tok/s; the same text {same}/{len(prompts)}", flush=True)
