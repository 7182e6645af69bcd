"""Byte-level BPE tokenizers for BiGLM, trained with `tokenizers` and used through `transformers`.

Notable features
- Special tokens ``<pad> <s> </s> <unk> <mask>`` always take ids 0..4, in that order, so a
  model config can rely on them.
- ``<mask>`` is an ``lstrip`` token, as in RoBERTa: in "The <mask> sat" the space before the
  mask is absorbed into it and the mask stays one token, so fill-mask prompts written the
  natural way ask the model for "Ġcat" (a word with its leading space), which is what the
  model saw in pre-training.
- ``load_tokenizer`` accepts any Hugging Face tokenizer directory; one without a mask or pad
  token gets them added, and the caller must then resize the model's embeddings to
  ``tokenizer_vocab_size(tok)``.
- ``tokenizer_fingerprint`` identifies the token-id mapping (model, normaliser,
  pre-tokeniser, added tokens), so token shards can refuse a different tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

PAD, BOS, EOS, UNK, MASK = "<pad>", "<s>", "</s>", "<unk>", "<mask>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK, MASK)  # ids 0..4 in this order


def _mask_token(content: str = MASK) -> AddedToken:
    # lstrip: "The <mask> sat" -> ["The", "<mask>", "Ġsat"], the space goes with the mask
    return AddedToken(content, lstrip=True, rstrip=False, normalized=False, special=True)


def _build_fast(backend: Tokenizer) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK, mask_token=_mask_token(),
        model_max_length=2048,  # BiGLM's pre-training window (the paper's L = 2048)
        padding_side="right",
    )
    return tok


def train_tokenizer(
    *,
    texts: Iterable[str],
    vocab_size: int = 49152,
    out_dir: str | os.PathLike[str] | None = None,
    min_frequency: int = 2,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and optionally save it to ``out_dir``.

    The vocabulary holds the 5 special tokens (ids 0..4), the 256 byte symbols and the
    learned merges, ``vocab_size`` entries in all (fewer if the text runs out of merges
    seen ``min_frequency`` times). Encoding with ``add_special_tokens=True`` wraps a text as
    ``<s> ... </s>`` (RoBERTa style); the pre-training shards use ``add_special_tokens=False``
    and put ``</s>`` after each document themselves.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size={vocab_size} is too small: byte-level BPE needs at least "
                         f"{len(SPECIAL_TOKENS) + 256} (5 special tokens + 256 bytes)")
    backend = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    # add_prefix_space=False: a document's first word is not given a phantom space, so
    # token counts match the text; use_regex keeps GPT-2's word/number/punctuation split
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*SPECIAL_TOKENS[:4], _mask_token()],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def nonempty(it: Iterable[str]) -> Iterator[str]:
        for text in it:
            if text:
                yield text

    backend.train_from_iterator(nonempty(texts), trainer=trainer)
    for i, tok_str in enumerate(SPECIAL_TOKENS):
        if backend.token_to_id(tok_str) != i:  # guards the ids the model config relies on
            raise RuntimeError(f"special token {tok_str} got id {backend.token_to_id(tok_str)}, expected {i}")
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}",
        pair=f"{BOS} $A {EOS} {EOS} $B {EOS}",  # RoBERTa's pair layout
        special_tokens=[(BOS, SPECIAL_TOKENS.index(BOS)), (EOS, SPECIAL_TOKENS.index(EOS))],
    )
    tok = _build_fast(backend)
    if out_dir is not None:
        save_tokenizer(tok, out_dir=out_dir)
    return tok


def save_tokenizer(tok: PreTrainedTokenizerFast, *, out_dir: str | os.PathLike[str]) -> None:
    """Save ``tok`` as a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json)."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(str(out_dir))


class TokenizerError(ValueError):
    """A tokenizer spec that names no loadable tokenizer (a missing or empty folder, an unknown hub name)."""


# the files a Hugging Face tokenizer folder is recognised by (a fast tokenizer's own, or the config naming its class)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def check_tokenizer_fits(tok: PreTrainedTokenizerFast, config, *, where: str | os.PathLike[str],
                         fingerprint: str | None = None) -> None:
    """Refuse (`TokenizerError`, one line) a tokenizer that is not the model's: more tokens than the model's embedding
    has rows, a special id past them, a mask or pad id other than the model's (``config``'s ``vocab_size``,
    ``mask_token_id``, ``pad_token_id``), or, when ``fingerprint`` is given (recorded at conversion), another
    mapping of text to ids. Such a pair decodes garbage with no error of its own."""
    fix = (f"put the tokenizer the model was trained or converted with in {where} (`biglm export` and `biglm convert` "
           "write it beside the weights)")
    vocab, n = int(config.vocab_size), len(tok)
    if n > vocab:
        raise TokenizerError(f"the tokenizer in {where} has {n:,} tokens but the model's embedding has {vocab:,} rows: "
                             f"it is not the model's tokenizer; {fix}")
    for name in ("mask", "pad"):
        want, got = getattr(config, f"{name}_token_id", None), getattr(tok, f"{name}_token_id")
        if want is not None and got != want and (name == "mask" or got is not None):
            raise TokenizerError(f"the tokenizer in {where} has {name} id {got} but the model's is {want} "
                                 f"({n:,} tokens beside {vocab:,} embedding rows): it is not the model's tokenizer; "
                                 f"{fix}")
    beyond = sorted(i for i in tok.all_special_ids if i >= vocab)
    if beyond:
        raise TokenizerError(f"the tokenizer in {where} has special token id {beyond[0]}, past the model's {vocab:,} "
                             f"embedding rows: it is not the model's tokenizer; {fix}")
    if fingerprint is not None and tokenizer_fingerprint(tok) != fingerprint:
        raise TokenizerError(f"the tokenizer in {where} maps text to other ids than the one the model was converted "
                             f"with (fingerprint {tokenizer_fingerprint(tok)} vs {fingerprint}): {fix}")


def check_tokenizer_source(name_or_path: str | os.PathLike[str], *, what: str = "tokenizer") -> None:
    """Refuse, without loading anything, a tokenizer spec that cannot be one: a path to nothing, to a file, or to
    a folder without a tokenizer in it. A spec that could be a hub name (``NAME`` or ``OWNER/NAME`` that is no
    local path) passes; `load_tokenizer` tries the hub. ``what`` names the spec in the message (``--tokenizer``).
    Cheap, so a command checks it before it makes or locks any output folder."""
    spec = str(name_or_path)
    p = Path(spec).expanduser()
    hint = "pass the folder `biglm tokenizer train` wrote (tokenizer.json inside) or a hub name (OWNER/NAME)"
    if p.is_dir():
        if not any((p / f).is_file() for f in TOKENIZER_FILES):
            raise TokenizerError(f"{what} {spec}: the folder holds no tokenizer ({' or '.join(TOKENIZER_FILES)}); "
                                 f"{hint}")
    elif p.exists():
        raise TokenizerError(f"{what} {spec}: is a file, not a tokenizer folder; {hint}")
    elif p.is_absolute() or spec.startswith((".", "~")) or spec.count("/") > 1 or spec.endswith("/"):
        raise TokenizerError(f"{what} {spec}: no such folder; {hint}")


def load_tokenizer(name_or_path: str | os.PathLike[str]) -> PreTrainedTokenizerFast:
    """Load a Hugging Face tokenizer and make sure it can serve masked-LM pre-training.

    A tokenizer without a mask token gets ``<mask>`` added (as an lstrip special token);
    one without a pad token gets ``<pad>`` added. A dedicated pad is added rather than
    reusing ``</s>``, because code that masks padding with ``input_ids != pad_id`` would
    otherwise also hide the document separators. When tokens are added a warning says the
    model's embeddings must be resized to ``tokenizer_vocab_size(tok)``.
    """
    check_tokenizer_source(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(str(name_or_path))
    except OSError as e:  # not a local folder and not found on the hub (or no network): say which, in one line
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise TokenizerError(f"tokenizer {name_or_path}: no such local folder, and the hub has none by that name or "
                             f"cannot be reached ({first})") from None
    if not isinstance(tok, PreTrainedTokenizerFast):
        raise TypeError(f"{name_or_path}: BiGLM needs a fast (Rust) tokenizer, got {type(tok).__name__}")
    added: list[str] = []
    if tok.mask_token is None:
        tok.add_special_tokens({"mask_token": _mask_token()})
        added.append(MASK)
    if tok.pad_token is None:
        tok.add_special_tokens({"pad_token": PAD})
        added.append(PAD)
    if added:
        log.warning(
            "tokenizer %s lacked %s; added them: resize the model's embeddings to %d "
            "(model.resize_token_embeddings(tokenizer_vocab_size(tok)))",
            name_or_path, " and ".join(added), len(tok),
        )
    return tok


def tokenizer_vocab_size(tok: PreTrainedTokenizerFast) -> int:
    """Number of token ids the model's embedding must have: base vocabulary plus added tokens."""
    return len(tok)


def document_end_id(tok: PreTrainedTokenizerFast) -> int:
    """The id written after every document in the token shards: ``</s>`` (or ``[SEP]``)."""
    for candidate in (tok.eos_token_id, tok.sep_token_id):
        if candidate is not None:
            return int(candidate)
    raise ValueError("the tokenizer has neither an eos nor a sep token to end documents with; "
                     "add one (tok.add_special_tokens({'eos_token': '</s>'})) and resize the model")


def tokenizer_fingerprint(tok: PreTrainedTokenizerFast) -> str:
    """A 32-hex-digit sha256 prefix of everything that decides which ids a text maps to.

    Covers the model (vocab and merges), normaliser, pre-tokeniser and added tokens, and
    leaves out the post-processor, decoder, padding and truncation settings, which do not
    change the ids written to shards. Stable across ``save_pretrained``/``from_pretrained``.
    """
    state = json.loads(tok.backend_tokenizer.to_str())
    added = sorted((int(i), t.content) for i, t in tok.added_tokens_decoder.items())
    key = {
        "model": state.get("model"),
        "normalizer": state.get("normalizer"),
        "pre_tokenizer": state.get("pre_tokenizer"),
        "added": added,
    }
    blob = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]
