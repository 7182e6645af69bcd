"""The pre-training objective: masking as pure seeded functions, and the one loss (with ``IGNORE_INDEX``).

`biglm.objective.masking` turns token windows into a `MaskedBatch` (the paper's objective and its variants, named in
`OBJECTIVES`); `biglm.objective.loss` is the only loss in biglm. This room sits at the bottom of the house: it
imports nothing from biglm, and the model's Hugging Face ``labels`` path, pre-training and fine-tuning all call it.
The ideas: docs/concepts/objective.md."""

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
