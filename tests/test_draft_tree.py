"""The draft-tree step (`ObjectiveConfig.draft_tree_every`): windows laid out as speculative decoding's call, so the
mask groups learn the draft slots under exactly the attention a call gives them, and a shift model's text rows learn
the next token (the check). Tested: the layout's rule, positions and labels; each group's logits equal a pass of
that group alone after its visible text (no group or later text leaks in); and the trainer runs such steps."""

from __future__ import annotations

import pytest
import torch

from biglm.objective import IGNORE_INDEX, draft_tree_layout, draw_draft_tree, get_objective

L, W, G, MASK = 24, 4, 5, 99


def _tree(batch: int = 3, seed: int = 0):
    objective = get_objective("biglm-blocks", draft_width=W, draft_groups=G, draft_tree_every=2)
    return draw_draft_tree(batch, L, objective, generator=torch.Generator().manual_seed(seed), device="cpu")


@pytest.mark.parametrize("shift", [True, False])
def test_the_layout_gives_each_group_the_text_up_to_its_anchor_and_labels_the_slots_after_it(shift):
    windows = torch.randint(0, 90, (3, L), generator=torch.Generator().manual_seed(1))
    tree = _tree()
    batch = draft_tree_layout(windows, tree, width=W, shift=shift, mask_token_id=MASK)
    rule, pos, labels = batch.attention_rule, batch.position_ids, batch.labels
    assert rule.shape == (3, L + G * W, L + G * W) and batch.input_ids.shape == labels.shape == (3, L + G * W)
    assert (batch.input_ids[:, :L] == windows).all() and (batch.input_ids[:, L:] == MASK).all()
    for b in range(3):
        q = int(tree.prompt_len[b])
        assert not rule[b, :L, L:].any()  # no text row sees a group
        for i in range(L):  # the prompt both ways, then blocks of one
            want = [j < q if i < q else j <= i for j in range(L)]
            assert rule[b, i, :L].tolist() == want
        for g in range(G):
            t = int(tree.anchors[b, g])
            assert max(q - 1, 0) <= t <= L - 1 - W
            rows = range(L + g * W, L + (g + 1) * W)
            for r in rows:
                assert rule[b, r, :L].tolist() == [j <= t for j in range(L)]
                assert rule[b, r, L:].nonzero().squeeze(1).add(L).tolist() == list(rows)  # its own group only
            assert pos[b, L + g * W:L + (g + 1) * W].tolist() == list(range(t + 1, t + 1 + W))
            assert labels[b, L + g * W] == IGNORE_INDEX  # slot 0 is the check's
            assert labels[b, L + g * W + 1:L + (g + 1) * W].tolist() == windows[b, t + 2:t + 1 + W].tolist()
        text = labels[b, :L]
        if shift:  # each token from the one before it, from the prompt's end on
            first = max(q, 1)
            assert (text[:first] == IGNORE_INDEX).all() and (text[first:] == windows[b, first:]).all()
        else:
            assert (text == IGNORE_INDEX).all()
    assert int(batch.normalizer) == int((labels != IGNORE_INDEX).sum())


@pytest.mark.parametrize("shift", [True, False])
def test_each_groups_logits_equal_a_pass_of_that_group_alone_after_its_text(shift):
    from biglm import BiGLMConfig, BiGLMForMaskedLM

    torch.manual_seed(0)
    cfg = BiGLMConfig.from_preset("tiny", vocab_size=100, mask_token_id=MASK, attn_backend="eager",
                                  shift_logits=shift, max_position_embeddings=64)
    model = BiGLMForMaskedLM(cfg).eval()
    windows = torch.randint(0, 90, (2, L), generator=torch.Generator().manual_seed(2))
    tree = _tree(batch=2, seed=3)
    batch = draft_tree_layout(windows, tree, width=W, shift=shift, mask_token_id=MASK)
    with torch.no_grad():
        hidden = model.model(batch.input_ids, **batch.attention()).last_hidden_state
        for b in range(2):
            q = int(tree.prompt_len[b])
            for g in range(G):
                t = int(tree.anchors[b, g])
                ids = torch.cat((windows[b, :t + 1], torch.full((W,), MASK)))[None]
                n = t + 1 + W
                i = torch.arange(n)
                alone = (i[:, None] >= i[None, :]) | ((i[:, None] < q) & (i[None, :] < q))
                alone[t + 1:, :] = i[None, :] <= t
                alone[t + 1:, t + 1:] = True
                want = model.model(ids, attention_rule=alone[None]).last_hidden_state[0, t + 1:]
                got = hidden[b, L + g * W:L + (g + 1) * W]
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            # the text rows are those of the text alone under its own rule
            i = torch.arange(L)
            text_rule = (i[:, None] >= i[None, :]) | ((i[:, None] < q) & (i[None, :] < q))
            want = model.model(windows[b:b + 1], attention_rule=text_rule[None]).last_hidden_state[0]
            torch.testing.assert_close(hidden[b, :L], want, atol=1e-5, rtol=1e-5)


def test_a_frozen_text_layout_gives_the_groups_the_loss_and_adapter_gradients_of_the_whole_layout():
    """A causal model's mask adapters trained alone (``frozen_text``): the text becomes the groups' cache, encoded
    without gradient, and only the groups are rows; their loss and every adapter's gradient equal those of the whole
    layout with the text's labels left out (the text has nothing to learn: its rows run no adapter)."""
    from biglm import BiGLMConfig, BiGLMForMaskedLM
    from biglm.objective import masked_lm_loss

    torch.manual_seed(0)
    cfg = BiGLMConfig.from_preset("tiny", vocab_size=100, mask_token_id=MASK, attn_backend="eager", shift_logits=True,
                                  max_position_embeddings=64, prefix_attention="causal", prefix_block_lengths=[1],
                                  mask_adapter_rank=4)
    model = BiGLMForMaskedLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("up.weight"):
                p.normal_(0, 0.05)  # adapters that act (they start at zero)
    windows = torch.randint(0, 90, (2, L), generator=torch.Generator().manual_seed(4))
    tree = _tree(batch=2, seed=5)
    tree = type(tree)(prompt_len=torch.zeros_like(tree.prompt_len), anchors=tree.anchors)  # a causal model: no prompt
    full = draft_tree_layout(windows, tree, width=W, shift=True, mask_token_id=MASK)
    full.labels[:, :L] = IGNORE_INDEX  # the text's labels out: the frozen layout has none
    frozen = draft_tree_layout(windows, tree, width=W, shift=True, mask_token_id=MASK, frozen_text=True)
    assert frozen.input_ids.shape == (2, G * W) and (frozen.context_ids == windows).all()
    assert int(frozen.normalizer) == int((frozen.labels != IGNORE_INDEX).sum()) == 2 * G * (W - 1)
    assert torch.equal(frozen.labels, full.labels[:, L:])

    def adapter_grads(loss):
        model.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if "_adapter." in n}

    want_loss = masked_lm_loss(model(full.input_ids, **full.attention(), labels=full.labels).logits, full,
                               normalizer=frozen.normalizer.float())
    want = adapter_grads(want_loss)
    with torch.no_grad():
        cache = model.model(frozen.context_ids, causal=True, return_cache=True).cache
    got_loss = masked_lm_loss(model(frozen.input_ids, **frozen.attention(), prefix_cache=cache,
                                    labels=frozen.labels).logits, frozen, normalizer=frozen.normalizer.float())
    got = adapter_grads(got_loss)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
    assert want and all(want[n].abs().sum() > 0 for n in want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], atol=1e-5, rtol=1e-4)


def test_source_targets_are_the_sources_next_token_distribution_at_each_draft_slot():
    """``draft_targets`` "source": each labelled slot at position s learns the source's distribution for s given the
    text before it (the text's causal logits at s - 1, the mask token left out), not only its token."""
    from types import SimpleNamespace

    from biglm import BiGLMConfig, BiGLMForMaskedLM
    from biglm.training.trainer import Trainer

    torch.manual_seed(0)
    cfg = BiGLMConfig.from_preset("tiny", vocab_size=100, mask_token_id=MASK, attn_backend="eager", shift_logits=True,
                                  max_position_embeddings=64, prefix_attention="causal", prefix_block_lengths=[1],
                                  mask_adapter_rank=4)
    model = BiGLMForMaskedLM(cfg).eval()
    windows = torch.randint(0, 90, (2, L), generator=torch.Generator().manual_seed(6))
    tree = _tree(batch=2, seed=7)
    tree = type(tree)(prompt_len=torch.zeros_like(tree.prompt_len), anchors=tree.anchors)
    batch = draft_tree_layout(windows, tree, width=W, shift=True, mask_token_id=MASK, frozen_text=True).find_positions()
    with torch.no_grad():
        cache = model.model(batch.context_ids, causal=True, return_cache=True).cache
        trainer = SimpleNamespace(raw_model=model, mask_id=MASK)
        got = Trainer._source_target_loss(trainer, model, batch, cache, batch.normalizer.float())
        student = model(batch.input_ids, **batch.attention(), prefix_cache=cache).logits  # (2, G*W, V)
        want, n = torch.zeros(()), 0
        for b in range(2):
            for g in range(G):
                t = int(tree.anchors[b, g])
                for k in range(1, W):  # slot t + 1 + k, given the text up to t + k
                    seen = model.model(windows[b:b + 1, :t + k + 1], causal=True).last_hidden_state[0, -1]
                    text = model.lm_head(seen)  # the source's prediction after token t + k
                    text[MASK] = float("-inf")
                    assert int(batch.labels[b, g * W + k]) == int(windows[b, t + 1 + k])
                    want -= (text.softmax(-1) * student[b, g * W + k].log_softmax(-1)).sum()
                    n += 1
    assert n == int(batch.normalizer)
    torch.testing.assert_close(got, want / n, atol=1e-5, rtol=1e-5)


def test_the_trainer_runs_draft_tree_steps_and_refuses_them_with_doc_mask(tmp_path, synthetic_data):
    from conftest import tiny_train_config, train_losses

    from biglm.config import ConfigError
    from biglm.training import Trainer
    from biglm.training.distributed import DistInfo

    objective = get_objective("biglm-blocks", prefix_blocks=(1, 4), draft_width=3, draft_groups=4, draft_tree_every=2)
    data = {"data": {str(synthetic_data / "shards"): 1.0}, "tokenizer": str(synthetic_data / "tok")}
    cfg = tiny_train_config(tmp_path / "run", **data, objective=objective, steps=4, eval_every=0, save_every=4)
    Trainer(cfg, info=DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")),
            echo=lambda s: None).train()
    losses = train_losses(tmp_path / "run")
    assert sorted(losses) == [1, 2, 3, 4] and all(0 < v < 20 for v in losses.values())
    bad = tiny_train_config(tmp_path / "bad", **data, objective=objective, doc_mask=True)
    with pytest.raises(ConfigError, match="draft_tree_every with --doc_mask"):
        bad.validate()


def test_blocks_adapt_takes_draft_tree_steps_on_a_teachers_greedy_text_only(tmp_path, synthetic_data):
    import json
    import shutil

    from conftest import tiny_train_config

    from biglm.training import Trainer, get_recipe
    from biglm.training.distributed import DistInfo

    objective = get_recipe("blocks-adapt").objective
    assert objective.draft_tree_every == -1  # auto
    objective = objective.replace(prefix_blocks=(1, 4), draft_width=3, draft_groups=4)
    single = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    greedy, sampled = tmp_path / "greedy", tmp_path / "sampled"
    for folder, temperature in ((greedy, 0.0), (sampled, 0.7)):
        shutil.copytree(synthetic_data / "shards", folder)
        (folder / "distill.json").write_text(json.dumps({"teacher": "t", "temperature": temperature}) + "\n")
    got = {}
    for name, data in (("greedy", [greedy]), ("sampled", [sampled]), ("corpus", [synthetic_data / "shards"]),
                       ("mixed", [greedy, synthetic_data / "shards"])):
        cfg = tiny_train_config(tmp_path / name, data={str(d): 1.0 for d in data},
                                tokenizer=str(synthetic_data / "tok"), objective=objective)
        got[name] = Trainer(cfg, info=single, echo=lambda s: None).objective.draft_tree_every
    assert got == {"greedy": 2, "sampled": 0, "corpus": 0, "mixed": 0}
    from biglm.training.distill import auto_draft_tree_every

    # a causal conversion's mask adapters (a frozen text): every step drafts, on a teacher's greedy text only
    assert [auto_draft_tree_every([str(d)], frozen_text=True) for d in (greedy, sampled)] == [1, 0]


def test_a_window_too_short_for_the_groups_is_refused_before_any_step(tmp_path, synthetic_data):
    from conftest import tiny_train_config

    from biglm.config import ConfigError

    objective = get_objective("biglm-blocks", prefix_blocks=(1, 4), draft_width=20, draft_tree_every=2)
    cfg = tiny_train_config(tmp_path / "run", data={str(synthetic_data / "shards"): 1.0},
                            tokenizer=str(synthetic_data / "tok"), objective=objective)
    with pytest.raises(ConfigError, match="too short for draft-tree groups"):
        cfg.validate()
