"""Gemma 3: whole images `(n_images, C, H, W)` on SigLIP's grid, average-pooled to soft tokens."""

from .base import HALF_STD, Family, InputLimits, tiles_layout


FAMILY = Family(
    "gemma3",
    order=70,
    model_types=("gemma3",),
    model_classes=("Gemma3ForConditionalGeneration",),
    pixel_values="images `(n_images, C, H, W)`",
    make_layout=tiles_layout(),
    trl_limitation=(
        "pan-and-scan (`do_pan_and_scan`) adds crops per image, which TRL 1.16 splits by image count: refused at "
        "start-up"
    ),
    reference=("google/gemma-3-4b-it", HALF_STD),
    recipes=("gemma-3-4b-it/",),
    limits=InputLimits(
        "Gemma 3",
        # Gemma3Processor's own image defaults (`images_kwargs`) decide, over the image processor's attribute
        processor_off=(
            (
                "do_pan_and_scan",
                "its extra crops per image break TRL 1.16's split of pixel_values by image count. Keep the "
                "processor's images_kwargs do_pan_and_scan=False (its default).",
            ),
        ),
    ),
    media_tokens=("<image_soft_token>", "<start_of_image>", "<end_of_image>"),
    # A 56x56 image, 14x14 patches (4x4), average-pooled to 2x2 = 4 soft tokens per image (the real: 896, 64x64, 256)
)
