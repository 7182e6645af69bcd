#!/usr/bin/env bash
# Everything issue 40 measures on a GPU, in one command of at most ~8 minutes on one H100 (`run_gpu.sh all`):
#   1. MFU of `Trainer.train_step` at biglm-136m and biglm-360m (bf16, L=2048, document masking), the new path and
#      the previous one side by side (bench_pretrain.py --data: pretrain-levers-gpu.json);
#   2. SmolLM2-135M from its GGUF (carried in two halves, sha256 checked), `biglm convert`ed and adapted with
#      `biglm pretrain blocks-adapt` for as many tokens as fit in ADAPT_MINUTES (steps from step 1's tokens/s,
#      --max_minutes the hard stop);
#   3. the adapted model evaluated there: held-out masked loss, fill-in and continuation NLL (`biglm eval --suite
#      heldout`), the zero-shot subset (`--suite paper`, local data) and tokens per call of the default exact
#      decoding (bench_exact_drafts.py); adapt-smol-gpu.json sums it up. Results: benchmarks/results/*-gpu.*.
# Before it, carry the halves (`python benchmarks/gpu_carry.py pack GGUF ../shared/data runs/gpu-carry` here; one
# device call carries runs/gpu-carry/a, the next runs/gpu-carry/b and runs this).
#   bash benchmarks/gpu_all.sh --dry-run   # every step end to end on a CPU at tiny sizes (a tiny GGUF, 2 steps), the
#                                          # same commands; results: runs/gpu-dry/results (tests/test_gpu_dry_run.py)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/benchmarks:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
T0=$SECONDS
step() { echo "=== gpu_all: $1 (at $((SECONDS - T0)) s)"; }
if [ $DRY = 1 ]; then
  W=${GPU_DRY_DIR:-runs/gpu-dry}; SUF=dry; SHARED=${SHARED_DATA:-../shared/data}
  export BIGLM_RESULTS=$W/results CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  PRESETS=tiny; L=64; B=2; ITERS=1; COMPILE=""; AL=64; AMB=2; AGB=4; ADAPT_MINUTES=${ADAPT_MINUTES:-10}
  HW=8; HD=4; LIMIT=2; PROMPTS=1; NEW=8; WORKERS=1; DTYPE=float32
  rm -rf "$W"; mkdir -p "$W"
  step "a tiny GGUF packed as the real one is"
  python benchmarks/gpu_carry.py tiny-gguf "$W/tiny.gguf" --data "$SHARED"
  python benchmarks/gpu_carry.py pack "$W/tiny.gguf" "$SHARED" "$W/carry" --no-wheels
  CARRY=$W/carry
else
  W=${GPU_DIR:-runs/gpu}; SUF=gpu; CARRY=${GPU_CARRY:-runs/gpu-carry}
  PRESETS=biglm-136m,biglm-360m; L=2048; B=8; ITERS=${MFU_ITERS:-10}; COMPILE=--compile; AL=2048; AMB=8; AGB=32
  ADAPT_MINUTES=${ADAPT_MINUTES:-2.5}; HW=256; HD=200; LIMIT=200; PROMPTS=4; NEW=96; WORKERS=8; DTYPE=float32
  mkdir -p "$W"
fi
R=${BIGLM_RESULTS:-benchmarks/results}
mkdir -p "$R"

# an evaluation that fails on the GPU (a package the device image lacks) is left out of the summary, not the end of the
# run; the dry run fails on any error, so a typo never reaches the GPU
soft() { if [ $DRY = 1 ]; then "$@"; else "$@" || echo "=== gpu_all: failed (rc $?), left out: $*"; fi; }

step "join the GGUF halves (sha256) and convert"
python benchmarks/gpu_carry.py join "$CARRY" "$W/model.gguf"
python -c "import gguf" 2>/dev/null || pip install -q --no-index --no-deps "$CARRY"/a/wheels/*.whl  # carried by pack
D=$CARRY/data
rm -rf "$W/smol" "$W/data" "$W/adapt" "$W/eval-heldout" "$W/eval-paper"
python -m biglm convert "$W/model.gguf" "$W/smol"
python -m biglm data prepare "$D/pretrain/fineweb_edu_sample/fineweb_edu_sample.jsonl" \
  "$D/pretrain/wikitext2/wiki.test.raw" "$D/pretrain/tinystories/TinyStories-train.head.txt" --tokenizer "$W/smol" --out "$W/data" --val_docs 50 \
  --workers $WORKERS

step "MFU: Trainer.train_step, new path and previous path"
python benchmarks/bench_pretrain.py --data "$W/data" --tokenizer "$W/smol" --presets $PRESETS --seq-len $L \
  --batch $B --iters $ITERS $COMPILE --paths new,previous --out pretrain-levers-$SUF

step "adapt the converted model for ${ADAPT_MINUTES} min"
STEPS=$(python - "$R/pretrain-levers-$SUF.json" $ADAPT_MINUTES $AGB $AL $DRY <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
minutes, tokens_per_step, dry = float(sys.argv[2]), int(sys.argv[3]) * int(sys.argv[4]), sys.argv[5] == "1"
tok_s = next(r["tokens_per_second"] for r in rows if r["path"] == "new")  # the 136M shape is SmolLM2-135M's
print(2 if dry else max(2, int(minutes * 60 * tok_s / tokens_per_step)))
EOF
)
echo "adaptation: $STEPS steps of $AGB x $AL tokens (at most ${ADAPT_MINUTES} min)"
python -m biglm pretrain blocks-adapt --init_from "$W/smol" --data "$W/data" --out_dir "$W/adapt" --steps $STEPS \
  --seq_len $AL --micro_batch $AMB --global_batch $AGB --warmup_steps $(( STEPS < 40 ? 1 : 20 )) \
  --max_minutes $ADAPT_MINUTES --eval_every 0 --save_every 0 --log_every 10 --eval_windows 16

step "evaluate: held-out, zero-shot subset, tokens per call"
soft python -m biglm eval --suite heldout --heldout_data "$W/data" --heldout_windows $HW --heldout_docs $HD \
  --model_args pretrained="$W/adapt" --output_path "$W/eval-heldout"
soft python -m biglm eval --suite paper --suite_tasks PIQA,ARC-E,SciQ,WinoGrande --data_dir "$D/eval" \
  --model_args pretrained="$W/adapt" --limit $LIMIT --output_path "$W/eval-paper"
soft python benchmarks/bench_exact_drafts.py --model "$W/adapt" --data "$D" --prompts $PROMPTS --max-new-tokens $NEW \
  --dtype $DTYPE --threads 4 --out exact-drafts-adapt-$SUF

step "summary"
python - "$W" "$R" $SUF <<'EOF'
import json, sys
from pathlib import Path
w, r, suf = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in (w / "adapt" / "metrics.jsonl").read_text().splitlines()]
log = [x for x in rows if x.get("kind") == "log"]
val = [x for x in rows if x.get("kind") == "val"]
def results(folder):
    found = sorted(Path(folder).rglob("*.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(found[-1].read_text()).get("results") if found else None
drafts_file = r / f"exact-drafts-adapt-{suf}.json"
drafts = json.loads(drafts_file.read_text()) if drafts_file.is_file() else {}
mfu = json.loads((r / f"pretrain-levers-{suf}.json").read_text())["rows"]
summary = {"device": log[-1]["device"] if log else None, "model": "SmolLM2-135M-Instruct (GGUF Q4_1), biglm convert",
           "steps": log[-1]["step"] if log else None, "tokens": log[-1]["tokens"] if log else None,
           "train_tokens_per_second": log[-1]["tokens_per_s"] if log else None,
           "train_mfu": log[-1]["mfu"] if log else None, "val_loss": val[-1]["val_loss"] if val else None,
           "heldout": results(w / "eval-heldout"), "zero_shot": results(w / "eval-paper"),
           "tokens_per_call": drafts.get("tokens_per_call_mean_of_kinds"),
           "same_text_as_one_per_call": drafts.get("same_text"),
           "pretrain_mfu": [{k: x[k] for k in ("device", "preset", "path", "mfu", "tokens_per_second")} for x in mfu]}
(r / f"adapt-smol-{suf}.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF
step "done"
if [ -n "${OUT:-}" ] && [ $DRY = 0 ]; then cp "$R"/*-gpu.* "$OUT"/ 2>/dev/null || true; fi
