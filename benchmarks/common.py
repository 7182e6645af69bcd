"""Shared helpers for benchmark scripts: the machine, the code version, timing with warm-up excluded."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch

# $BIGLM_RESULTS: another folder (run_gpu.sh --dry-run writes there, not into the tracked results)
RESULTS = Path(os.environ.get("BIGLM_RESULTS") or Path(__file__).resolve().parent / "results")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (a count of tokens, calls, slots or rounds), else a one-line usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def machine(device: torch.device | None = None) -> dict:
    """CPU model and cores, GPU name, library versions, load and the git commit, for a results file."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    import transformers

    gpu = torch.cuda.get_device_name(device) if torch.cuda.is_available() and (device is None or device.type == "cuda") else None
    return {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # other jobs on a shared machine slow every number down; the load says how busy it was
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--", "src/biglm", "benchmarks")),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn: Callable[[], object], *, device: torch.device, warmup: int = 2, iters: int = 5) -> float:
    """Mean seconds per call of ``fn`` over ``iters`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t) / iters


def write_result(name: str, payload: dict, *, stem: str | None = None) -> Path:
    """Write ``results/<stem or name-cpu|gpu>.json`` with the machine description."""
    RESULTS.mkdir(exist_ok=True)
    tag = "gpu" if torch.cuda.is_available() else "cpu"
    path = RESULTS / f"{stem or f'{name}-{tag}'}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2))
    return path


def write_report(stem: str, report: dict, markdown: str) -> None:
    """Write ``results/<stem>.json`` (``report`` as is, machine included by the caller) and ``results/<stem>.md``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown)
    print(f"wrote {RESULTS / stem}.json and .md")


def markdown_header(title: str, report: dict, *, load_note: str = "") -> list[str]:
    """The first lines of a results ``.md``: title, command, machine (``load_note`` after its load average),
    versions and commit, from ``report["command"]`` and ``report["machine"]`` (`machine()`)."""
    m = report["machine"]
    return [f"# {title}", "", f"- command: `{report['command']}`",
            f"- machine: {m['cpu']}, {m['cpu_cores']} cores (torch threads {m['torch_threads']}, load average "
            f"{m['load_avg_1m_at_start']} at start{load_note})" + (f", GPU {m['gpu']}" if m["gpu"] else ""),
            f"- torch {m['torch']}, transformers {m['transformers']}, python {m['python']}, git {m['git_commit'][:12]}"
            + (" (dirty)" if m["git_dirty"] else "")]


def hf_directory(source: Path, work: Path) -> Path:
    """A transformers directory of ``source`` (a GGUF file is dequantized and saved once into ``work/source-hf``,
    what lm-eval's `hf` model and vLLM load; a directory is itself)."""
    if source.is_dir():
        return source
    out = work / "source-hf"
    if (out / "config.json").is_file():
        return out
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    kw = {"gguf_file": source.name}
    cfg = AutoConfig.from_pretrained(source.parent, **kw)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, **kw)
    if hasattr(cfg, "quantization_config"):  # a GGUF-loaded model refuses save_pretrained: rebuild it plainly
        del cfg.quantization_config
    plain = LlamaForCausalLM(cfg)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(source.parent, **kw).save_pretrained(out)
    return out


def load_packed(path: str, script: str, **kw):
    """``load_model(path, pack=True, **kw)`` as `biglm generate` loads it, the float32-compute notice of a bfloat16
    export on a CPU without bfloat16 kernels silenced; a path that is not a model exits in one line naming
    ``script``, before any work."""
    import warnings

    from biglm.checkpoint import check_model_path, load_model

    try:
        check_model_path(path)
    except FileNotFoundError as e:
        raise SystemExit(f"{script}: {e}") from None
    kw.setdefault("pack", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model(path, **kw)


def kernel_switch(model):
    """For a model whose linear layers `pack_linears` packed for biglm's bfloat16 kernel: a function ``use(kernel,
    layers=None)`` that puts every such product on that kernel and every norm on its one-call kernel (`KernelRMSNorm`)
    (``kernel`` True), or the products on oneDNN's prepacked float32 of the same weights and the norms on PyTorch's
    `rms_norm` (False); ``layers`` (``kernel`` when None; only with it) each decoder layer whole in one C call
    (`KernelLayer`) or as PyTorch's ops around those products. Each way keeps its own table of draft costs
    (`speculative.draft_costs`: the timings that choose draft_fill's block are that way's own)."""
    from biglm.model.modeling import BiGLMBlock
    from biglm.model.packed import FusedPackedLinear, KernelRMSNorm, PackedLinear, Prepacked

    norms = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, KernelRMSNorm)]
    blocks = [(b, b.kernel_forward) for b in model.modules() if isinstance(b, BiGLMBlock)]
    ways = []
    for m in model.modules():
        if isinstance(m, (PackedLinear, FusedPackedLinear)) and m.packed is not None and m.packed.bf16:
            weight = (m.weight if isinstance(m, PackedLinear)
                      else torch.cat([p.weight.detach() for p in m._parts]))
            ways.append((m, m.packed, Prepacked(weight, m.bias, bf16=False)))
    if not ways:
        raise SystemExit("this model's linear layers are not packed for the bfloat16 kernel: pass a bfloat16 export "
                         "on a CPU without bfloat16 matrix kernels, where the kernel builds (biglm.model.cpu_kernels)")

    tables, now = {}, [None]

    def use(kernel: bool, layers: bool | None = None) -> None:
        layers = kernel if layers is None else layers
        if layers and not kernel:
            raise ValueError("the layer kernel runs the bfloat16 products: layers=True needs kernel=True")
        for m, bf16, onednn in ways:
            m.packed = bf16 if kernel else onednn
        for parent, name, norm in norms:
            setattr(parent, name, norm if kernel else norm._norm[0])
        for block, layer in blocks:
            block.kernel_forward = layer if layers else None
        if now[0] is not None:
            tables[now[0]] = model.__dict__.pop("draft_costs", None)
        if tables.get((kernel, layers)) is not None:
            model.__dict__["draft_costs"] = tables[(kernel, layers)]
        now[0] = (kernel, layers)
    return use
