"""`biglm presets`: the architecture presets (paper Table 7) with their parameter counts.

(It lives beside the dispatcher, not in `model/`, because `model/` imports nothing else from biglm and
every command parses its options with `biglm.config`.)"""

from __future__ import annotations

from dataclasses import dataclass

from .config import parse_cli
from .model.config import PRESETS, BiGLMConfig, count_parameters


@dataclass
class PresetsArgs:
    vocab_size: int = 49152
    """vocabulary used for the counts (SmolLM's: 49152)"""


def main(argv: list[str]) -> int:
    args = parse_cli(PresetsArgs, argv, prog="biglm presets", doc=__doc__)
    header = f"{'preset':<12} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>3} {'mlp':>5} {'init':>6} {'non-emb':>10} {'total':>10}"
    print(header)
    print("-" * len(header))
    for name in PRESETS:
        c = BiGLMConfig.from_preset(name, vocab_size=args.vocab_size)
        n = count_parameters(c)
        print(f"{name:<12} {c.num_hidden_layers:>6} {c.hidden_size:>6} {c.num_attention_heads:>5} {c.num_key_value_heads:>3} "
              f"{c.intermediate_size:>5} {c.initializer_range:>6} {n['non_embedding'] / 1e6:>9.1f}M {n['total'] / 1e6:>9.1f}M")
    print(f"\ncounts for vocab_size={args.vocab_size}, tied input/output embeddings")
    print("mlp: not given by the paper; SmolLM/Llama conventions (136m: 1536, 360m: 2560, else 8/3·hidden rounded up\n"
          "to a multiple of 256), except biglm-3.5b: 11264 so that it has the 3.5B parameters of its name (8/3·hidden\n"
          "= 6912 would give 2.50B)")
    return 0
