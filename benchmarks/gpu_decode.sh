#!/usr/bin/env bash
# Issue 38 item 7 in one device call (461 s on one H100): SmolLM2-135M from its GGUF (carried in two halves by
# `gpu_carry.py pack`, joined and sha256-checked here), `biglm convert`ed, adapted by the command of issue 38's
# done-when (`blocks-adapt`, 40 steps, global and micro batch 16, on the CPU runs' mix of three texts), then
# benchmarks/bench_vs_compiled_ar.py: biglm's default decoding and one token per call (bf16, and the exactness
# check in float32; layers compiled too) against the source through transformers, eager and with a static
# cache compiled with CUDA graphs, at batch 1 and 32, 128 tokens, each row with its judged quality.
#   device call 1: carry runs/gpu-carry/a, command `true`; call 2: carry runs/gpu-carry/b and .whl, command
#   `bash benchmarks/gpu_decode.sh` (results copied to $OUT). The device image lacks `datasets` (what `data prepare`
#   reads text with): .whl holds its wheels, made here with `echo /.whl/ >> .git/info/exclude; python3 -m pip download
#   --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d .whl
#   datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19`. The text is tokenized there, with the tokenizer converted
#   there: transformers 5.17 (the image's) builds a GGUF's tokenizer otherwise than 5.24 (normalizer, decoder, BPE
#   flags; the special tokens `biglm convert` now takes from the file), so shards made here are refused there.
#   bash benchmarks/gpu_decode.sh --dry-run   # the same commands on a CPU at tiny sizes (2 steps, 8 tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/benchmarks:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
T0=$SECONDS
step() { echo "=== gpu_decode: $1 (at $((SECONDS - T0)) s)"; }
C=${GPU_CARRY:-runs/gpu-carry}
if [ "${1:-}" = "--dry-run" ]; then
  W=${DECODE_DIR:-runs/gpu-decode-dry}; export BIGLM_RESULTS=$W/results CUDA_VISIBLE_DEVICES=""
  STEPS=2; WARM=1; BENCH="--device cpu --per-kind 1 --batch 3 --batch1-per-kind 1 --new-tokens 8"; OUTNAME=vs-compiled-ar-dry
else
  W=${DECODE_DIR:-runs/gpu-decode}
  STEPS=40; WARM=20; BENCH="--device cuda --biglm-compile"; OUTNAME=vs-compiled-ar-gpu
  python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
fi
R=${BIGLM_RESULTS:-benchmarks/results}
mkdir -p "$W" "$R"
step "join the GGUF halves (sha256) and convert"
python benchmarks/gpu_carry.py join "$C" "$W/model.gguf"
python -c "import gguf" 2>/dev/null || python -m pip install -q --no-index --no-deps "$C"/a/wheels/*.whl
python -c "import datasets" 2>/dev/null || python -m pip install -q --no-index --no-deps .whl/*.whl  # carried wheels
rm -rf "$W/a40"
[ -f "$W/smol/config.json" ] || python -m biglm convert "$W/model.gguf" "$W/smol"
step "the CPU runs' text mix, tokenized with this converted model's tokenizer"
rm -rf "$W/data"
python -m biglm data prepare "$C/data/pretrain/fineweb_edu_sample/fineweb_edu_sample.jsonl" \
  "$C/data/pretrain/wikitext2/wiki.test.raw" "$C/data/pretrain/tinystories/TinyStories-train.head.txt" \
  --tokenizer "$W/smol" --out "$W/data" --val_docs 50 --workers 1
step "adapt: issue 38's done-when command ($STEPS steps)"
python -m biglm pretrain blocks-adapt --init_from "$W/smol" --data "$W/data" --out_dir "$W/a40" --steps $STEPS --warmup_steps $WARM \
  --global_batch 16 --micro_batch 16 --compile no --attn_backend sdpa --eval_every 0 --save_every $STEPS
step "decode: biglm vs the compiled AR"
python benchmarks/bench_vs_compiled_ar.py --biglm "$W/a40" --source "$W/model.gguf" --data "$C/data" \
  --work "$W" $BENCH --out $OUTNAME
step "done"
if [ -n "${OUT:-}" ]; then cp "$R"/$OUTNAME* "$OUT"/ 2>/dev/null || true; fi
