"""A transformers Llama and its byte-level BPE written as a float32 GGUF file laid out as llama.cpp writes one (its
tensor names; q/k rows permuted for its RoPE, which the readers undo): the inverse of the GGUF reading `convert` does,
so the tests and the GPU run's dry run can stand a tiny model in for SmolLM2's GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
"""transformers' Llama module names -> llama.cpp's tensor names (``blk.{layer}.{name}.weight``)."""


def _permute(x: Any, heads: int) -> Any:
    # llama.cpp's rotary layout of q/k rows
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def write_llama_gguf(path: str | Path, model: torch.nn.Module, bpe: dict, shape: dict, *, specials: set[str] | list[str],
                     bos_id: int, eos_id: int, pad_id: int | None = None, chat_template: str | None = None) -> int:
    """Write ``model`` (a `LlamaForCausalLM` of ``shape``: the `LlamaConfig` fields it was built with) and its tokenizer
    (``bpe``: the "model" object of a tokenizers byte-level BPE's JSON; ``specials`` typed as control tokens) to
    ``path``; an untied output layer is written as ``output.weight``. Returns the vocabulary's size."""
    import gguf

    tokens = sorted(bpe["vocab"], key=bpe["vocab"].get)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(shape["num_hidden_layers"])
    w.add_context_length(shape["max_position_embeddings"])
    w.add_embedding_length(shape["hidden_size"])
    w.add_feed_forward_length(shape["intermediate_size"])
    w.add_head_count(shape["num_attention_heads"])
    w.add_head_count_kv(shape["num_key_value_heads"])
    w.add_rope_freq_base(shape["rope_theta"])
    w.add_layer_norm_rms_eps(shape["rms_norm_eps"])
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])  # 3: control
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in bpe["merges"]])
    w.add_bos_token_id(bos_id)
    w.add_eos_token_id(eos_id)
    if pad_id is not None:
        w.add_pad_token_id(pad_id)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    tied = model.config.tie_word_embeddings
    for name, value in model.state_dict().items():
        a = value.numpy()
        if name == "model.embed_tokens.weight":
            key = "token_embd.weight"
        elif name == "model.norm.weight":
            key = "output_norm.weight"
        elif name == "lm_head.weight":
            if tied:
                continue
            key = "output.weight"
        else:
            parts = name.split(".")
            sub = ".".join(parts[3:5]) if parts[3] in ("self_attn", "mlp") else parts[3]
            key = f"blk.{parts[2]}.{GGUF_NAMES[sub]}.weight"
            if sub in ("self_attn.q_proj", "self_attn.k_proj"):
                a = _permute(a, shape["num_attention_heads" if sub.endswith("q_proj") else "num_key_value_heads"])
        w.add_tensor(key, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return len(tokens)
