"""Gemma 4: padded patch rows `(n_images, max_patches, 3*16*16)` addressed by `image_position_ids` (-1 for padding);
its image processor does not normalise."""

from .base import Family, positioned_layout


def vllm_blocker(config) -> str | None:
    """vLLM's Gemma 4 plans its memory from `vision_config.default_output_length`, the image-token budget a Gemma 4
    checkpoint's config.json sets (280); transformers 5.24's Gemma4VisionConfig has no such field of its own, so a
    config without it cannot start an engine. Checked against the installed vLLM's source, not its version."""
    import importlib.util
    from pathlib import Path

    if getattr(config.vision_config, "default_output_length", None) is not None:
        return None
    spec = importlib.util.find_spec("vllm.model_executor.models.gemma4_mm")
    if spec is None or spec.origin is None or "default_output_length" not in Path(spec.origin).read_text():
        return None
    return (
        "vLLM's Gemma 4 reads vision_config.default_output_length (the image-token budget Gemma 4 checkpoints set "
        "in config.json, e.g. 280), which this config lacks: add it to its vision_config"
    )


FAMILY = Family(
    "gemma4",
    order=170,
    model_types=("gemma4",),
    model_classes=("Gemma4ForConditionalGeneration",),
    pixel_values="patch rows `(n_images, max_patches, 3*16*16)` zero-padded + `image_position_ids`",
    make_layout=positioned_layout,
    vllm_blocker=vllm_blocker,
    # Gemma4ImageProcessor does not normalise: the pixels in [0, 1] reach the model as they are
    reference=("google/gemma-4-e2b-it", (1.0, 1.0, 1.0)),
    media_tokens=("<|image|>", "<|image>", "<image|>", "<|video|>", "<|audio|>", "<|audio>", "<audio|>"),
    # 4-px patches pooled 3 x 3, at most 70 soft tokens (the smallest budget it takes): an image is resized to about
    # 100 px and padded to 630 patch rows (the real: 16-px patches, 280 soft tokens, 2,520 rows)
)
