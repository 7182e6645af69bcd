"""The pre-training objective: masking as pure seeded functions, and the one loss (with ``IGNORE_INDEX``)."""

from .loss import IGNORE_INDEX, linear_cross_entropy, masked_lm_loss, token_loss
from .masking import (
    OBJECTIVES,
    DraftTree,
    MaskedBatch,
    draft_tree_layout,
    draw_draft_tree,
    MaskPattern,
    apply_masks,
    draw_masks,
    ObjectiveConfig,
    get_objective,
    make_generator,
    mask_batch,
)

__all__ = ["IGNORE_INDEX", "token_loss", "OBJECTIVES", "DraftTree", "draft_tree_layout", "draw_draft_tree", "MaskedBatch", "MaskPattern", "apply_masks", "draw_masks", "ObjectiveConfig", "get_objective", "make_generator", "mask_batch", "masked_lm_loss", "linear_cross_entropy"]
