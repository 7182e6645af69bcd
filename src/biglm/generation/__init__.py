"""Generation with BiGLM by iterative unmasking (DESIGN §4).

Layers, each built on the one before (litgpt style):
``sampling.sample`` (logits -> token, confidence) -> ``decoding.AnswerDenoiser`` (one model call over
the answer slots, with the exact prefix cache) -> the loops in ``decoding`` (Mask-Predict,
confidence-ordered commit, threshold rule; state machines that `decoding.DecodeRun` drives, block by block with a
growing prefix cache) -> ``generate`` (text in, text out) -> ``cli.main``; ``engine.DecodeEngine`` drives many runs
at once, one merged model call per step (for a server).
Every decoding option lives in one `DecodingConfig`, validated once where it is built and passed
down unchanged. The default is the published Mask-Predict (T iterations = T model calls);
``early_stop`` is opt-in.
"""

from .api import cut_at_stop, encode_prompts, generate, generate_from_ids
from .config import STRATEGIES, DecodingConfig
from .decoding import (
    AnswerDenoiser,
    DecodeRun,
    GenerationOutput,
    StepInfo,
    candidate_lengths,
    generate_ids,
    left_pad,
    mask_predict_count,
)
from .engine import DecodeEngine, EngineEvent
from .sampling import filter_logits, sample

__all__ = [
    "STRATEGIES", "AnswerDenoiser", "DecodeEngine", "DecodeRun", "DecodingConfig", "EngineEvent", "GenerationOutput", "StepInfo", "candidate_lengths",
    "cut_at_stop", "encode_prompts", "filter_logits", "generate", "generate_from_ids", "generate_ids", "left_pad",
    "mask_predict_count", "sample",
]
