"""Muse Glimmer: TRL 1.16 trains it (it ships its chat template, `muse_glimmer.jinja`, and scales its logits by its
`output_multiplier`); VEPO cannot perturb its images yet."""

from .base import Refused


REFUSED = Refused(
    "muse_glimmer",
    "MuseGlimmerForConditionalGeneration",
    "patch rows `(sum t*h*w, 2*3*14*14)` + `image_grid_thw`, raster order, each row (temporal, channel, P, P)",
    "its patch rows run in raster order with the temporal copy outside the channel (Qwen's run in 2x2 merge blocks, "
    "channel first), which the patch-row layout does not read yet",
)
