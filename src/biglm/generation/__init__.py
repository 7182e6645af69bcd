"""Generation with BiGLM by iterative unmasking: an all-mask answer unmasked over T model calls.

Layers, each built on the one before (litgpt style):
``sampling.sample`` (logits -> token, confidence) -> ``decoding.AnswerDenoiser`` (one model call over
the answer slots, with the exact prefix cache) -> the decoding loop in ``decoding`` (one loop for every
strategy of the ``strategies`` registry: Mask-Predict, confidence-ordered commit, threshold rule; a state
machine that `decoding.DecodeRun` drives, block by block with a growing prefix cache) -> ``decoding.Decode``
(the set-up: lengths, sampler, prompt cache, folded block passes) -> ``generate`` (text in, text out) ->
``cli.main``; ``engine.DecodeEngine`` drives one `Decode` per request, one merged model call per step (for a
server). ``speculative`` is a second state machine (``draft_length``, `speculative.SpeculativeDecode`):
one-token-per-call decoding with drafts checked in the same pass, reached through ``generate_ids`` and the engine. A new decoding strategy is one class registered in ``strategies``.
Every decoding option lives in one `DecodingConfig`, validated once where it is built and passed
down unchanged. The default is the published Mask-Predict (T iterations = T model calls);
``early_stop`` is opt-in.
"""

from .api import cut_at_stop, encode_prompts, generate, generate_from_ids
from .config import STRATEGIES, DecodingConfig
from .decoding import (
    AnswerDenoiser,
    Decode,
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
from .strategies import DecodingStrategy, StepState, get_strategy, register

__all__ = [
    "STRATEGIES", "AnswerDenoiser", "Decode", "DecodeEngine", "DecodeRun", "DecodingConfig", "DecodingStrategy",
    "EngineEvent", "GenerationOutput", "StepInfo", "StepState", "candidate_lengths", "cut_at_stop", "encode_prompts",
    "filter_logits", "generate", "generate_from_ids", "generate_ids", "get_strategy", "left_pad", "mask_predict_count",
    "register", "sample",
]
