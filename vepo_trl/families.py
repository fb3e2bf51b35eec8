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
    "supported_models_table",
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
    TRL's own `GRPOTrainer` cannot train the family here (its adapter is kept and tested, training is left out);
    `trl_limitation` which of TRL's settings fail on the family in `GRPOTrainer` itself."""

    name: str
    model_types: tuple[str, ...]
    model_classes: tuple[str, ...]
    pixel_values: str
    make_layout: Callable
    tiny_model: str
    trl_failure: str | None = None
    recipes: tuple[str, ...] = ()
    trl_limitation: str | None = None


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
        recipes=("Qwen2.5-VL-7B-Instruct/", "Qwen2.5-VL-3B-Instruct/"),
    ),
    Family(
        "qwen3-vl",
        ("qwen3_vl",),
        ("Qwen3VLForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen3-vl",
        recipes=("Qwen3-VL-4B-Instruct/", "Qwen3-VL-8B-Instruct/"),
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
        "qwen3.5",
        ("qwen3_5",),
        ("Qwen3_5ForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen3.5",
    ),
    Family(
        "gemma3",
        ("gemma3",),
        ("Gemma3ForConditionalGeneration",),
        "images `(n_images, C, H, W)`",
        _tiles_layout(),
        "tiny-gemma3",
        recipes=("gemma-3-4b-it/",),
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
        "crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops and each crop's letterbox are padding",
        _tiles_layout(),
        "tiny-llava-onevision",
        trl_limitation=(
            "TRL 1.16's GRPOTrainer fails whenever it runs a forward at rollout time (old log-probs when "
            "steps_per_generation x num_iterations does not divide gradient_accumulation_steps, vLLM importance "
            "sampling, a reference model with beta > 0): the processor's `batch_num_images` reaches "
            "`_get_per_token_logps_and_entropies` as an unknown keyword"
        ),
    ),
    Family(
        "llava-next",
        ("llava_next",),
        ("LlavaNextForConditionalGeneration",),
        "crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops and each crop's letterbox are padding",
        _tiles_layout(),
        "tiny-llava-next",
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
        "glm4v",
        ("glm4v",),
        ("Glm4vForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-glm4v",
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


def supported_models_table() -> str:
    """The README's "Supported models" table, from this registry (a test keeps the README's copy equal to it)."""
    from .perturb import PERTURBATIONS

    # Every layout implements what a perturbation reads (units, black, noise, patches): each family takes them all
    perturbations = f"all {len(PERTURBATIONS)}"
    rows = [
        "| family | model classes | `pixel_values` | perturbations | tested how | recipes |",
        "|---|---|---|---|---|---|",
    ]
    for family in FAMILIES:
        classes = ", ".join(f"`{name}`" for name in family.model_classes)
        if family.trl_failure is None:
            tested = (
                f"`{family.tiny_model}`: TRL's GRPOTrainer and VEPO train; `full` = GRPO; identity gives 0; "
                "perturbed pixels checked; `vepo-trl demo --model_family " + family.name + "`"
            )
        else:
            tested = (
                f"left out of training: {family.trl_failure}; its perturbations are checked on `{family.tiny_model}`"
            )
        if family.trl_limitation is not None:
            tested += f". Limitation: {family.trl_limitation}"
        recipes = ", ".join(f"`recipes/{path}`" for path in family.recipes) or "-"
        rows.append(f"| {family.name} | {classes} | {family.pixel_values} | {perturbations} | {tested} | {recipes} |")
    return "\n".join(rows) + "\n"
