"""LFM2-VL: TRL 1.16 trains it; VEPO cannot perturb its images yet."""

from .base import Refused


REFUSED = Refused(
    "lfm2_vl",
    "Lfm2VlForConditionalGeneration",
    "patch rows `(n_tiles, max_patches, 3*16*16)` zero-padded + `spatial_shapes` + `pixel_attention_mask`",
    "its image processor hands the model tiles as padded patch rows whose grid only `spatial_shapes` records; no "
    "perturbation layout reads that yet",
)
