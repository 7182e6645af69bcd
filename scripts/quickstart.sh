#!/usr/bin/env bash
# One command from a fresh clone: make a virtual environment (.venv, or $BIGLM_VENV), install PyTorch
# (the CUDA build only when an NVIDIA GPU is present, else the CPU build) and biglm with every extra,
# then run
#   scripts/quickstart.sh demo [ARGS]   `biglm pretrain` on its built-in default (the main job)
#   scripts/quickstart.sh test [ARGS]   the test suite (`python -m pytest -q -n auto`, on up to 4 cores), as CI runs it
#   scripts/quickstart.sh CMD [ARGS]    any command inside the environment, e.g. `biglm eval --help`
# Re-running reuses the environment; set BIGLM_TORCH_INDEX to force a PyTorch wheel index.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${BIGLM_VENV:-.venv}
TORCH_VERSION=2.13.0

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  if [ -n "${BIGLM_TORCH_INDEX:-}" ]; then
    python -m pip install -q "torch==$TORCH_VERSION" --index-url "$BIGLM_TORCH_INDEX"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q "torch==$TORCH_VERSION"          # PyPI's Linux wheel is the CUDA build
  elif [ "$(uname -s)" = Linux ] && curl -fsS --max-time 5 -o /dev/null https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null; then
    python -m pip install -q "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
  else
    python -m pip install -q "torch==$TORCH_VERSION"          # macOS/Windows wheels and local mirrors: CPU
  fi
fi
python -m pip install -q -e ".[all]"

# WordNet for METEOR (biglm.scoring.metrics): Debian's wordnet-base + wordnet-sense-index (WNdb 3.0 in
# /usr/share/wordnet), laid out as nltk's corpus ($VENV/nltk_data/corpora/wordnet, on nltk's default
# path). nltk's downloader needs GitHub, so it is not used. Debian omits `lexnames` (the fixed
# table of WordNet 3.0's 45 lexicographer files, lexnames(5WN)), which nltk's reader needs: written here.
WN_DST="$VENV/nltk_data/corpora/wordnet"
if [ ! -f "$WN_DST/lexnames" ]; then
  if [ ! -f /usr/share/wordnet/index.sense ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      apt-get install -y -q --no-install-recommends wordnet-base wordnet-sense-index >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends wordnet-base wordnet-sense-index >/dev/null 2>&1; } ||
        true  # not fatal: METEOR alone needs it, and the message below says how to add it
    elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo apt-get install -y -q --no-install-recommends wordnet-base wordnet-sense-index >/dev/null 2>&1 || true
    fi
  fi
  if [ -f /usr/share/wordnet/index.sense ]; then
    mkdir -p "$WN_DST"
    cp /usr/share/wordnet/* "$WN_DST/"   # copied, not linked: nltk refuses paths outside its data roots
    i=0
    for name in adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute \
        noun.body noun.cognition noun.communication noun.event noun.feeling noun.food noun.group \
        noun.location noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession \
        noun.process noun.quantity noun.relation noun.shape noun.state noun.substance noun.time \
        verb.body verb.change verb.cognition verb.communication verb.competition verb.consumption \
        verb.contact verb.creation verb.emotion verb.motion verb.perception verb.possession \
        verb.social verb.stative verb.weather adj.ppl; do
      case $name in noun.*) cat=1 ;; verb.*) cat=2 ;; adj.*) cat=3 ;; adv.*) cat=4 ;; esac
      printf '%02d\t%s\t%d\n' "$i" "$name" "$cat"
      i=$((i + 1))
    done > "$WN_DST/lexnames.tmp" && mv "$WN_DST/lexnames.tmp" "$WN_DST/lexnames"
  else
    echo "quickstart: WordNet (for METEOR) not installed; as root run: apt-get install wordnet-base wordnet-sense-index," \
      "then re-run scripts/quickstart.sh" >&2
  fi
fi

# Headless Chromium and its driver for the playground's browser test (tests/test_playground_browser.py, Selenium on
# the system's chromedriver; Selenium Manager never downloads one): Debian's chromium + chromium-driver.
if ! command -v chromedriver >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1; } ||
      true  # not fatal: the browser test alone needs it, and skips saying so
  elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || true
  fi
  command -v chromedriver >/dev/null 2>&1 ||
    echo "quickstart: Chromium not installed (the playground's browser test skips); as root run:" \
      "apt-get install chromium chromium-driver" >&2
fi

what=${1:-demo}
[ $# -gt 0 ] && shift
case "$what" in
  demo) exec biglm pretrain "$@" ;;
  # the suite on up to 4 cores (pytest-xdist; a file's tests stay in one worker, which shares its session fixtures)
  test) exec python -m pytest -q -n auto --maxprocesses 4 --dist loadfile "$@" ;;
  *) exec "$what" "$@" ;;
esac
