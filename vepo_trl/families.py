"""The model families VEPO's perturbed pass supports: what it needs to know about each one's images, in one place.

A family is looked up from the model's `config.model_type` (the same key transformers' Auto classes use). Its adapter
says how the processor lays out `pixel_values` and gives the `perturb` layout (normalisation and the model's patch
size) the perturbations work through. Splitting a batch's multimodal inputs per response is TRL's own
(`batch.take_rows`), so an adapter holds no splitting rule. Adding a family: one `Family` entry here and one tiny-model
builder in `testing.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .perturb import ImageLayout, PixelLayout


__all__ = [
    "Family",
    "FAMILIES",
    "family_of",
    "get_family",
    "pixel_layout",
    "supported_families",
    "trainable_families",
]


def _qwen_layout(image_processor, config) -> PixelLayout:
    # Patch size, temporal copies and merge size are the image processor's (Qwen3-VL: 16, 2, 2)
    return PixelLayout.from_image_processor(image_processor)


def _vision_patch_size(config) -> int:
    patch = config.vision_config.patch_size
    return int(patch[0] if isinstance(patch, (list, tuple)) else patch)


def _tiles_layout(**options) -> Callable:
    def layout(image_processor, config) -> ImageLayout:
        return ImageLayout.from_image_processor(image_processor, _vision_patch_size(config), **options)

    return layout


@dataclass(frozen=True)
class Family:
    """One model family: its name, the `model_type`s and classes that belong to it, the layout of its `pixel_values`
    (for the README) and how to read its `perturb` layout off its image processor and config. `trl_failure` says why
    TRL's own `GRPOTrainer` cannot train the family here (its adapter is kept and tested, training is left out)."""

    name: str
    model_types: tuple[str, ...]
    model_classes: tuple[str, ...]
    pixel_values: str
    make_layout: Callable
    tiny_model: str
    trl_failure: str | None = None


FAMILIES: tuple[Family, ...] = (
    Family(
        "qwen2-vl",
        ("qwen2_vl",),
        ("Qwen2VLForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen2-vl",
    ),
    Family(
        "qwen2.5-vl",
        ("qwen2_5_vl",),
        ("Qwen2_5_VLForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen2.5-vl",
    ),
    Family(
        "qwen3-vl",
        ("qwen3_vl",),
        ("Qwen3VLForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen3-vl",
    ),
    Family(
        "qwen3-vl-moe",
        ("qwen3_vl_moe",),
        ("Qwen3VLMoeForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen3-vl-moe",
    ),
    Family(
        "gemma3",
        ("gemma3",),
        ("Gemma3ForConditionalGeneration",),
        "images `(n_images, C, H, W)`",
        _tiles_layout(),
        "tiny-gemma3",
    ),
    Family(
        "smolvlm",
        ("smolvlm", "idefics3"),
        ("SmolVLMForConditionalGeneration", "Idefics3ForConditionalGeneration"),
        "tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`, zero tiles are padding",
        _tiles_layout(zero_tile_is_padding=True),
        "tiny-smolvlm",
    ),
    Family(
        "llava-onevision",
        ("llava_onevision",),
        ("LlavaOnevisionForConditionalGeneration",),
        "crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops are padding",
        _tiles_layout(),
        "tiny-llava-onevision",
    ),
    Family(
        "internvl",
        ("internvl",),
        ("InternVLForConditionalGeneration",),
        "tiles `(n_tiles, C, H, W)`, split per prompt by TRL's `num_tiles`",
        _tiles_layout(),
        "tiny-internvl",
    ),
    Family(
        "mistral3",
        ("mistral3",),
        ("Mistral3ForConditionalGeneration",),
        "images `(n_images, C, H_max, W_max)` zero-padded + `image_sizes`",
        _tiles_layout(crop_to_image_sizes=True),
        "tiny-mistral3",
        trl_failure=(
            "TRL 1.16's GRPOTrainer fails on any batch whose prompts differ in length: PixtralProcessor returns "
            "tensors by default, so TRL's unpadded prompt tokenisation raises 'Unable to create tensor, you should "
            "probably activate truncation and/or padding'"
        ),
    ),
)

_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def supported_families() -> list[str]:
    """Every family with an adapter: its images can be perturbed."""
    return [family.name for family in FAMILIES]


def trainable_families() -> list[str]:
    """The families TRL's own GRPOTrainer trains here, and VEPO with it."""
    return [family.name for family in FAMILIES if family.trl_failure is None]


def family_of(config) -> Family | None:
    """The family of a model config (or a model: its `.config`), `None` when VEPO has no adapter for it."""
    config = getattr(config, "config", config)
    return _BY_MODEL_TYPE.get(getattr(config, "model_type", None))


def get_family(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"Unknown model family {name!r}. Supported families: {', '.join(supported_families())}.")


def pixel_layout(config, image_processor, strategy: str = "vepo") -> PixelLayout | ImageLayout:
    """The `perturb` layout of a model's `pixel_values`; one line naming the supported families for any other."""
    family = family_of(config)
    if family is None:
        config = getattr(config, "config", config)
        raise ValueError(
            f"selection_strategy={strategy!r} perturbs the model's images, but VEPO has no adapter for "
            f"{getattr(config, 'model_type', type(config).__name__)!r} models. Supported families: "
            f"{', '.join(supported_families())}; or use selection_strategy='entropy' / 'full'."
        )
    return family.make_layout(image_processor, getattr(config, "config", config))
