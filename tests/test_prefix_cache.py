"""The preallocated prefix cache (`PrefixCache.reserve`): a cache that grows block by block (the append cache,
speculative decoding) is written in place into buffers reserved up front instead of copied per block, gives the
same keys/values and the same tokens as the copying cache, and never lets an older state overwrite a newer one."""

from __future__ import annotations

import pytest
import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM, PrefixCache
from biglm.generation import Decode, DecodingConfig, left_pad
from biglm.generation.speculative import SpeculativeDecode

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]  # different lengths: left padding matters


def _model(seed: int = 0, **overrides) -> BiGLMForMaskedLM:
    # a biglm-blocks model (trained rule = the append cache) with peaked predictions at random init (std 0.2)
    torch.manual_seed(seed)
    overrides = {"prefix_block_lengths": [1, 4, 8], **overrides}
    config = BiGLMConfig.from_preset("tiny", initializer_range=0.2, prefix_attention="blocks", **overrides)
    return BiGLMForMaskedLM(config).eval()


@pytest.fixture(scope="module")
def model() -> BiGLMForMaskedLM:
    return _model()


def _blocks(model: BiGLMForMaskedLM, n: int, width: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(5, model.config.vocab_size, (3, width), generator=g) for _ in range(n)]


def _same(a: PrefixCache, b: PrefixCache) -> None:
    assert a.length == b.length and a.padded == b.padded and torch.equal(a.key_valid, b.key_valid)
    for x, y in zip(a.keys + a.values, b.keys + b.values):
        assert torch.equal(x, y)
    assert (a.hidden is None) == (b.hidden is None)
    if a.hidden is not None:
        assert torch.equal(a.hidden, b.hidden)


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_extend_writes_in_place_then_moves_past_capacity(model, shift):
    """A reserved cache grown by blocks of 2 keeps its buffers (layer 0's keys at the same address, the hidden states
    of a shift model too) while 5 free slots last, and equals the copying cache exactly; the block that does not fit
    moves it into new buffers with 5 free slots again, still equal."""
    model = _model(shift_logits=True) if shift else model
    ids, mask = left_pad(PROMPTS, pad_id=0)
    with torch.inference_mode():
        plain = model.encode_prefix(ids, mask)
        grown = plain.reserve(5)
        assert grown.length == plain.length and grown.capacity == plain.length + 5
        _same(grown, plain)
        ptr = grown.keys[0].data_ptr()
        hidden_ptr = grown.hidden.data_ptr() if shift else None
        for i, block in enumerate(_blocks(model, 3, 2)):
            plain = model.encode_prefix(block, past=plain)
            grown = model.encode_prefix(block, past=grown)
            _same(grown, plain)
            moved = i == 2  # 2 + 2 fit in 5 slots, a third block of 2 does not
            assert (grown.keys[0].data_ptr() != ptr) == moved
            if shift:
                assert (grown.hidden.data_ptr() != hidden_ptr) == moved
        assert grown.capacity - grown.length == 5 and plain.capacity == plain.length
        assert grown.padded  # the left-padded prompt's flag travels with the views


def test_an_older_state_extended_again_copies_and_leaves_the_newer_intact(model):
    """Extending a state of the cache that a newer view has grown past (or a shorter `first` of it) must not write
    the buffers the newer view reads: it copies, and the newest view still grows in place."""
    ids, mask = left_pad(PROMPTS, pad_id=0)
    x, y, z = _blocks(model, 3, 2)
    with torch.inference_mode():
        base = model.encode_prefix(ids, mask).reserve(8)
        ptr = base.keys[0].data_ptr()
        newer = model.encode_prefix(x, past=base)
        want_newer = [k.clone() for k in newer.keys]
        assert newer.keys[0].data_ptr() == ptr  # written in place
        branch = model.encode_prefix(y, past=base)  # base is older than newer: a copy
        assert branch.keys[0].data_ptr() != ptr and branch.capacity == branch.length
        short = model.encode_prefix(z, past=newer.first(base.length + 1))  # a shorter view of the same buffers
        assert short.keys[0].data_ptr() != ptr
        for k, want in zip(newer.keys, want_newer):
            assert torch.equal(k, want)  # neither branch touched what newer reads
        # the branch holds base then y, exactly as an unreserved cache would
        plain = model.encode_prefix(ids, mask)
        _same(branch, model.encode_prefix(y, past=plain))
        newest = model.encode_prefix(z, past=newer)  # newer still owns the free slots
        assert newest.keys[0].data_ptr() == ptr
        _same(newest, model.encode_prefix(z, past=model.encode_prefix(x, past=plain)))


def test_a_view_whose_tensors_were_replaced_does_not_write_the_buffers(model):
    """A caller that swaps a view's key mask (as speculative decoding does to a call's block) has a cache that no
    longer reads the buffers: extending it copies rather than writing slots its own mask does not describe."""
    ids, mask = left_pad(PROMPTS, pad_id=0)
    (x,) = _blocks(model, 1, 2)
    with torch.inference_mode():
        cache = model.encode_prefix(ids, mask).reserve(4)
        ptr = cache.keys[0].data_ptr()
        cache.key_valid = cache.key_valid.clone()
        grown = model.encode_prefix(x, past=cache)
        assert grown.keys[0].data_ptr() != ptr and grown.capacity == grown.length


def _drive(decode: Decode | SpeculativeDecode) -> tuple[torch.Tensor, torch.Tensor, set[int]]:
    """Run a decode to the end as `generate_ids` does; the answer, its lengths and the addresses layer 0's cache keys
    had after each call."""
    ptrs = set()
    speculative = isinstance(decode, SpeculativeDecode)
    with torch.inference_mode():
        while not (decode.finished if speculative else decode.run.pending is None):
            decode.step()
            ptrs.add((decode.cache if speculative else decode.denoise.cache).keys[0].data_ptr())
    out = decode.output()
    return out.tokens, out.lengths, ptrs


@pytest.mark.parametrize("block_length", [1, 4])
@pytest.mark.parametrize("strategy", ["confidence", "mask-predict"])
@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_block_decoding_gives_the_copying_caches_tokens_in_one_buffer(strategy, block_length, shift):
    """Block decoding with the append cache over a left-padded batch, fp32: the reserved cache writes every block
    into one buffer (one address across the whole decode) and gives the copying cache's answer token for token;
    the copying cache moves every block. A length beam of 2 (rows repeated by `select`) rides along at blocks of 4."""
    model = _model(shift_logits=shift)
    ids, mask = left_pad(PROMPTS, pad_id=0)
    steps = 12 if block_length == 1 else 6  # mask-predict at blocks of 4: two iterations per block
    kw = dict(max_new_tokens=12, strategy=strategy, steps=steps, block_length=block_length, block_cache="append",
              length_beam=2 if block_length == 4 else 1)
    runs = {}
    for reserve in (True, False):
        decode = Decode(model, ids, mask, config=DecodingConfig(**kw), reserve_cache=reserve)
        runs[reserve] = _drive(decode)
    (tok, n, ptrs), (ref_tok, ref_n, ref_ptrs) = runs[True], runs[False]
    assert torch.equal(tok, ref_tok) and torch.equal(n, ref_n)
    assert len(ptrs) == 1 and len(ref_ptrs) > 1


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_speculative_decoding_gives_the_copying_caches_tokens(shift):
    """Speculative decoding (m = 2), fp32: one prompt keeps one buffer for the whole answer; a left-padded batch
    (its cache grows by the widest row per call, so it may outgrow N + W) gives the copying cache's tokens too,
    moving buffers less often than calls."""
    model = _model(shift_logits=shift)
    cfg = DecodingConfig(max_new_tokens=24, strategy="confidence", draft_length=2)
    one = torch.tensor([PROMPTS[0]])
    batch, mask = left_pad(PROMPTS, pad_id=0)
    for ids, m, alone in ((one, None, True), (batch, mask, False)):
        runs = {reserve: _drive(SpeculativeDecode(model, ids, m, config=cfg, reserve_cache=reserve))
                for reserve in (True, False)}
        (tok, n, ptrs), (ref_tok, ref_n, ref_ptrs) = runs[True], runs[False]
        assert torch.equal(tok, ref_tok) and torch.equal(n, ref_n)
        assert len(ref_ptrs) > 2 and len(ptrs) < len(ref_ptrs)
        if alone:
            assert len(ptrs) == 1


@pytest.mark.parametrize("pack", [False, True])
def test_an_encoded_prompts_keys_and_values_hold_no_more_than_themselves(pack):
    """A prompt's cache (what a server keeps in its prompt cache, sized by its tensors) holds its own storage, not views
    of the layers' q/k/v products (which would keep every query head alive: 5x the values, 4x the keys here), with the
    fused products of an inference model too."""
    from biglm.model.packed import pack_linears

    model = _model()
    if pack:
        pack_linears(model)
    ids, mask = left_pad(PROMPTS, pad_id=0)
    with torch.inference_mode():
        cache = model.encode_prefix(ids, mask)
    for t in cache.keys + cache.values:
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


@pytest.mark.parametrize("held", [0, 1, 2], ids=["suffix-only", "held-1", "held-2"])
def test_a_call_into_the_rooms_of_right_padded_rows_equals_each_row_alone(model, held):
    """The server engine's pooled layout (rows right-padded to the longest, each row's length in ``ends``) with the
    rows' room (`PrefixCache.room`): a call writes its keys/values into each row's room right after its own keys and
    attends to them there. Each row's logits equal that row alone with its own unpadded cache (float32, 1e-5), its
    keys/values land at ``ends + j`` (equal to the ones the call returns), and no other column changes."""
    g = torch.Generator().manual_seed(3)
    L, spare = 3, 4
    with torch.inference_mode():
        alone = [model.encode_prefix(torch.tensor([p])) for p in PROMPTS]
        lengths = [c.length for c in alone]
        width, capacity = max(lengths), max(lengths) + L + spare
        cfg = model.config
        # what lies past a row's keys is no one's: large values there would show if read (finite, as a pool's are)
        keys = [1e4 * torch.randn(3, cfg.num_key_value_heads, capacity, cfg.head_dim, generator=g) for _ in alone[0].keys]
        values = [1e4 * torch.randn(k.shape, generator=g) for k in keys]
        valid = torch.zeros(3, width, dtype=torch.bool)
        for r, c in enumerate(alone):
            for buf, src in zip(keys + values, c.keys + c.values):
                buf[r, :, :c.length] = src[0]
            valid[r, :c.length] = True
        before = [k.clone() for k in keys]
        ends = torch.tensor(lengths)
        pooled = PrefixCache(keys=[k[:, :, :width] for k in keys], values=[v[:, :, :width] for v in values],
                             key_valid=valid, padded=True, ends=ends, room=(keys, values))
        ids = torch.randint(5, cfg.vocab_size, (3, L), generator=g)
        ids[:, held:] = cfg.mask_token_id
        pos = ends[:, None] + torch.arange(L)
        prefix = torch.full((3,), width + held) if held else None  # (counted from the cache's start)
        out = model.model(ids, prefix_cache=pooled, position_ids=pos, prefix_len=prefix, return_cache=True)
        for r, c in enumerate(alone):
            one = model.model(ids[r:r + 1], prefix_cache=c, prefix_len=None if prefix is None else c.length + held,
                              return_cache=True)
            torch.testing.assert_close(out.last_hidden_state[r], one.last_hidden_state[0], atol=1e-5, rtol=1e-5)
            n = lengths[r]
            for i, (k, old) in enumerate(zip(keys, before)):
                assert torch.equal(k[r, :, n:n + L], out["cache"].keys[i][r])
                assert torch.equal(k[r, :, :n], old[r, :, :n])
                assert torch.equal(k[r, :, n + L:], old[r, :, n + L:])


def test_a_call_larger_than_the_room_is_refused(model):
    """Room too small for the call after the longest row: refused, naming what is missing (not written past it); room
    in the batch-invariant mode (which lays the keys out itself): refused, not ignored."""
    with torch.inference_mode():
        c = model.encode_prefix(torch.tensor([PROMPTS[0]]))
        keys = [torch.cat((k, torch.zeros_like(k[:, :, :1])), 2) for k in c.keys]
        values = [torch.cat((v, torch.zeros_like(v[:, :, :1])), 2) for v in c.values]
        pooled = PrefixCache(keys=c.keys, values=c.values, key_valid=c.key_valid, padded=True,
                             ends=torch.tensor([c.length]), room=(keys, values))
        with pytest.raises(ValueError, match="room for the call's 2 tokens"):
            model.model(torch.tensor([[5, 6]]), prefix_cache=pooled)
        model.model.batch_invariant = True  # (its attention lays the keys out itself)
        try:
            with pytest.raises(ValueError, match="not for the batch-invariant mode"):
                model.model(torch.tensor([[5]]), prefix_cache=pooled)
        finally:
            model.model.batch_invariant = False
