"""The pre-training objective: masking as pure seeded functions, and the loss."""

from .masking import (
    OBJECTIVES,
    MaskedBatch,
    MaskPattern,
    apply_masks,
    draw_masks,
    ObjectiveConfig,
    get_objective,
    make_generator,
    mask_batch,
    masked_lm_loss,
)

__all__ = ["OBJECTIVES", "MaskedBatch", "MaskPattern", "apply_masks", "draw_masks", "ObjectiveConfig", "get_objective", "make_generator", "mask_batch", "masked_lm_loss"]
