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

from .perturb import ImageLayout, PixelLayout, PositionedPatchLayout


__all__ = [
    "Family",
    "FAMILIES",
    "check_family_inputs",
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


def _positioned_layout(image_processor, config) -> PositionedPatchLayout:
    # The processor cuts the rows: its patch size and statistics (Gemma 4: 16 px, no normalisation)
    return PositionedPatchLayout.from_image_processor(image_processor)


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
    # A reference checkpoint and the per-channel std its preprocessor_config.json normalises with: how strong
    # `gaussian`'s noise (drawn on the normalised pixels, as the release does) is in [0, 1] space on this family
    reference: tuple[str, tuple[float, float, float]] | None = None
    # `pixel_values` a flat run of tiles, counted per prompt by TRL's `num_tiles` (InternVL)
    tiles_per_prompt: bool = False
    # A prefix LM: `token_type_ids` 0 marks the bidirectional prefix (image and prompt), 1 the causal suffix
    prefix_lm: bool = False


CLIP_STD = (0.26862954, 0.26130258, 0.27577711)  # OpenAI CLIP's
HALF_STD = (0.5, 0.5, 0.5)  # SigLIP's and Qwen3-VL's
IMAGENET_STD = (0.229, 0.224, 0.225)

FAMILIES: tuple[Family, ...] = (
    Family(
        "qwen2-vl",
        ("qwen2_vl",),
        ("Qwen2VLForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen2-vl",
        reference=("Qwen/Qwen2-VL-7B-Instruct", CLIP_STD),
    ),
    Family(
        "qwen2.5-vl",
        ("qwen2_5_vl",),
        ("Qwen2_5_VLForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen2.5-vl",
        reference=("Qwen/Qwen2.5-VL-7B-Instruct", CLIP_STD),
        recipes=("Qwen2.5-VL-7B-Instruct/", "Qwen2.5-VL-3B-Instruct/"),
    ),
    Family(
        "qwen3-vl",
        ("qwen3_vl",),
        ("Qwen3VLForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen3-vl",
        reference=("Qwen/Qwen3-VL-8B-Instruct", HALF_STD),
        recipes=("Qwen3-VL-4B-Instruct/", "Qwen3-VL-8B-Instruct/"),
    ),
    Family(
        "qwen3-vl-moe",
        ("qwen3_vl_moe",),
        ("Qwen3VLMoeForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen3-vl-moe",
        reference=("Qwen/Qwen3-VL-30B-A3B-Instruct", HALF_STD),
    ),
    Family(
        "qwen3.5",
        ("qwen3_5",),
        ("Qwen3_5ForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen3.5",
        reference=("Qwen/Qwen3.5-9B", HALF_STD),
    ),
    Family(
        "qwen3.5-moe",
        ("qwen3_5_moe",),
        ("Qwen3_5MoeForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*16*16)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-qwen3.5-moe",
        reference=("Qwen/Qwen3.5-35B-A3B", HALF_STD),
    ),
    Family(
        "gemma3",
        ("gemma3",),
        ("Gemma3ForConditionalGeneration",),
        "images `(n_images, C, H, W)`",
        _tiles_layout(),
        "tiny-gemma3",
        trl_limitation=(
            "pan-and-scan (`do_pan_and_scan`) adds crops per image, which TRL 1.16 splits by image count: refused at "
            "start-up"
        ),
        reference=("google/gemma-3-4b-it", HALF_STD),
        recipes=("gemma-3-4b-it/",),
    ),
    Family(
        "smolvlm",
        ("smolvlm", "idefics3"),
        ("SmolVLMForConditionalGeneration", "Idefics3ForConditionalGeneration"),
        "tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`, zero tiles are padding",
        _tiles_layout(zero_tile_is_padding=True),
        "tiny-smolvlm",
        reference=("HuggingFaceTB/SmolVLM2-2.2B-Instruct", HALF_STD),
    ),
    Family(
        "llava-onevision",
        ("llava_onevision",),
        ("LlavaOnevisionForConditionalGeneration",),
        "crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops and each crop's letterbox are padding",
        _tiles_layout(),
        "tiny-llava-onevision",
        reference=("llava-hf/llava-onevision-qwen2-7b-ov-hf", HALF_STD),
        trl_limitation=(
            "TRL 1.16's GRPOTrainer fails whenever it runs a forward at rollout time (old log-probs when "
            "steps_per_generation x num_iterations does not divide gradient_accumulation_steps, vLLM importance "
            "sampling, a reference model with beta > 0): the processor's `batch_num_images` reaches "
            "`_get_per_token_logps_and_entropies` as an unknown keyword. VEPOTrainer drops that keyword and trains "
            "(rollout-time scoring and beta > 0 tested). Prompts with two or more images fail in TRL and are refused "
            "at start-up"
        ),
    ),
    Family(
        "llava-next",
        ("llava_next",),
        ("LlavaNextForConditionalGeneration",),
        "crops `(n_images, n_crops, C, H, W)` + `image_sizes`, zero crops and each crop's letterbox are padding",
        _tiles_layout(),
        "tiny-llava-next",
        reference=("llava-hf/llava-v1.6-mistral-7b-hf", CLIP_STD),
    ),
    Family(
        "llava",
        ("llava",),
        ("LlavaForConditionalGeneration",),
        "images `(n_images, C, H, W)`; Pixtral-in-LLaVA checkpoints zero-padded + `image_sizes`",
        # A CLIP / SigLIP LLaVA's images are all one size; a Pixtral one (mistral-community/pixtral-12b) pads them to
        # the batch's largest and says each one's size in `image_sizes`
        _tiles_layout(crop_to_image_sizes=True),
        "tiny-llava",
        reference=("llava-hf/llava-1.5-7b-hf", CLIP_STD),
    ),
    Family(
        "paligemma",
        ("paligemma",),
        ("PaliGemmaForConditionalGeneration",),
        "images `(n_images, C, H, W)` + `token_type_ids`",
        _tiles_layout(),
        "tiny-paligemma",
        reference=("google/paligemma2-3b-pt-224", HALF_STD),
        prefix_lm=True,
        trl_limitation=(
            "TRL 1.16's GRPOTrainer fails on prompts of different lengths (the processor builds `labels` with "
            "np.array over unpadded ids) and scores completions as part of the bidirectional prefix (it extends "
            "`token_type_ids` with zeros): VEPOTrainer tokenises padded then unpadded and marks the completion "
            "causal, as `generate` samples it. Refused at start-up: a text-only prompt (the processor refuses it), no chat "
            "template (its checkpoints ship none: set one), vLLM (its prompt and prefix there are unverified)"
        ),
    ),
    Family(
        "idefics2",
        ("idefics2",),
        ("Idefics2ForConditionalGeneration",),
        "tiles `(B, n_tiles, C, H, W)` + `pixel_attention_mask`, zero tiles and unmasked pixels are padding",
        _tiles_layout(zero_tile_is_padding=True, crop_to_pixel_mask=True),
        "tiny-idefics2",
        reference=("HuggingFaceM4/idefics2-8b", HALF_STD),
    ),
    Family(
        "internvl",
        ("internvl",),
        ("InternVLForConditionalGeneration",),
        "tiles `(n_tiles, C, H, W)`, split per prompt by TRL's `num_tiles`",
        _tiles_layout(),
        "tiny-internvl",
        tiles_per_prompt=True,
        reference=("OpenGVLab/InternVL3-8B-hf", IMAGENET_STD),
    ),
    Family(
        "glm4v",
        ("glm4v",),
        ("Glm4vForConditionalGeneration",),
        "patch rows `(sum t*h*w, 3*2*14*14)` + `image_grid_thw`",
        _qwen_layout,
        "tiny-glm4v",
        reference=("zai-org/GLM-4.1V-9B-Thinking", CLIP_STD),
    ),
    Family(
        "mistral3",
        ("mistral3",),
        ("Mistral3ForConditionalGeneration",),
        "images `(n_images, C, H_max, W_max)` zero-padded + `image_sizes`",
        _tiles_layout(crop_to_image_sizes=True),
        "tiny-mistral3",
        reference=("mistralai/Mistral-Small-3.1-24B-Instruct-2503", CLIP_STD),
        trl_limitation=(
            "TRL 1.16's GRPOTrainer fails on any batch whose prompts differ in length: PixtralProcessor returns "
            "tensors by default, so TRL's unpadded prompt tokenisation raises 'Unable to create tensor'. VEPOTrainer "
            "tokenises such prompts padded and drops the padding (`prompt_padding`), as TRL does for transformers 5.3"
        ),
    ),
    Family(
        "gemma4",
        ("gemma4",),
        ("Gemma4ForConditionalGeneration",),
        "patch rows `(n_images, max_patches, 3*16*16)` zero-padded + `image_position_ids`",
        _positioned_layout,
        "tiny-gemma4",
        # Gemma4ImageProcessor does not normalise: the pixels in [0, 1] reach the model as they are
        reference=("google/gemma-4-e2b-it", (1.0, 1.0, 1.0)),
    ),
)

# Model types TRL trains whose images VEPO cannot perturb yet, each with what blocks it: refused in one line (the
# README's model table lists them)
NOT_YET: dict[str, tuple[str, str, str]] = {
    "lfm2_vl": (
        "Lfm2VlForConditionalGeneration",
        "patch rows `(n_tiles, max_patches, 3*16*16)` zero-padded + `spatial_shapes` + `pixel_attention_mask`",
        "its image processor hands the model tiles as padded patch rows whose grid only `spatial_shapes` records; no "
        "perturbation layout reads that yet",
    ),
}


def blocker(model_type) -> str:
    """`: <what blocks it>` for a model type in `NOT_YET`, else empty: appended to a refusal's first clause."""
    return f" ({NOT_YET[model_type][2]})" if model_type in NOT_YET else ""


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
        model_type = getattr(config, "model_type", type(config).__name__)
        raise ValueError(
            f"selection_strategy={strategy!r} perturbs the model's images, but VEPO has no adapter for "
            f"{model_type!r} models{blocker(model_type)}. Supported families: "
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
    for model_type, (model_class, pixel_values, reason) in NOT_YET.items():
        rows.append(
            f"| {model_type} | `{model_class}` | {pixel_values} | none | refused at start-up in one line: {reason}; "
            "`entropy` and `full` perturb nothing | - |"
        )
    return "\n".join(rows) + "\n"


def gaussian_strength_table(sigma: float = 2.0) -> str:
    """The README's table of what `--perturbation gaussian --noise_sigma {sigma}` means per family: the noise is drawn
    on the model's normalised pixels (the release's definition, exact on its Qwen2.5-VL), so in [0, 1] space its std is
    `sigma x` the family's normalisation std; the last column is the sigma that gives Qwen2.5-VL's [0, 1]-space
    strength (a test keeps the README's copy equal to this)."""
    base = next(f for f in FAMILIES if f.name == "qwen2.5-vl").reference[1]
    base_mean = sum(base) / len(base)
    rows = [
        f"| family | reference checkpoint | normalisation std (R, G, B) | std in [0, 1] space at sigma {sigma:g} | "
        f"sigma for Qwen2.5-VL's strength |",
        "|---|---|---|---|---|",
    ]
    for family in FAMILIES:
        if family.reference is None:
            continue
        checkpoint, std = family.reference
        unit = ", ".join(f"{sigma * s:.2f}" for s in std)
        matching = sigma * base_mean / (sum(std) / len(std))
        stds = ", ".join(f"{s:.4g}" for s in std)
        rows.append(f"| {family.name} | `{checkpoint}` | {stds} | {unit} | {matching:.2f} |")
    return "\n".join(rows) + "\n"


def check_family_inputs(
    config, processor, datasets: dict | None = None, *, chat_template=None, use_vllm: bool = False
) -> None:
    """What a family's processor or data would crash on deep inside TRL 1.16 (or silently mistrain), refused at
    start-up in one line: Gemma 3 with pan-and-scan (extra crops per image, which TRL splits by image count),
    LLaVA-OneVision with two or more images in one prompt (TRL's and transformers' split of its crops fails),
    PaliGemma with a text-only prompt (its processor refuses it), without a chat template (its checkpoints ship none)
    or with vLLM (its prompt and bidirectional prefix are unverified there). `datasets`: name -> data set (the train
    and eval data; an eval dict counts each of its sets)."""
    for name, dataset in _named(datasets or {}):
        _check_image_parts(name, dataset)
    family = family_of(config)
    if family is None:
        return
    image_processor = getattr(processor, "image_processor", None)
    # Gemma3Processor's own image defaults (`images_kwargs`) decide, over the image processor's attribute
    images_kwargs = getattr(processor, "images_kwargs", None) or {}
    pan_and_scan = images_kwargs.get("do_pan_and_scan", getattr(image_processor, "do_pan_and_scan", False))
    if family.name == "gemma3" and pan_and_scan:
        raise ValueError(
            "Gemma 3's processor has do_pan_and_scan on: its extra crops per image break TRL 1.16's split of "
            "pixel_values by image count. Keep the processor's images_kwargs do_pan_and_scan=False (its default)."
        )
    if family.name == "paligemma":
        tokenizer = getattr(processor, "tokenizer", None)
        if (
            chat_template is None
            and not getattr(processor, "chat_template", None)
            and not getattr(tokenizer, "chat_template", None)
        ):
            raise ValueError(
                "PaliGemma checkpoints ship no chat template and TRL renders conversational prompts with one: set "
                "processor.chat_template to one that writes each image as <image>, then the text, and pass "
                "processing_class=processor."
            )
        if use_vllm:
            raise ValueError(
                "PaliGemma with use_vllm: vLLM's prompt for it (bos and newline added around the images) and its "
                "bidirectional prefix are not verified against the trainer's; generate with transformers."
            )
    for name, dataset in _named(datasets or {}):
        if family.name == "paligemma":
            fewest = _image_count_row(dataset, min)
            if fewest is not None and fewest[1] == 0:
                raise ValueError(
                    f"PaliGemma needs an image in every prompt ({name} row {fewest[0]} has none): its processor refuses "
                    "text-only prompts. Drop text-only rows for this family."
                )
        if family.name == "llava-onevision":
            most = _image_count_row(dataset, max)
            if most is not None and most[1] >= 2:
                raise ValueError(
                    f"LLaVA-OneVision with {most[1]} images in one prompt ({name} row {most[0]}): TRL 1.16 cannot "
                    "split its crops per prompt. Keep one image per prompt for this family."
                )


def _named(datasets: dict) -> list[tuple[str, object]]:
    """(name, data set) pairs, an eval dict's sets (TRL takes one) each under its own key."""
    pairs = []
    for name, dataset in datasets.items():
        if isinstance(dataset, dict):
            pairs += [(f"{name}[{key!r}]", value) for key, value in dataset.items() if value is not None]
        elif dataset is not None:
            pairs.append((name, dataset))
    return pairs


def _image_parts(prompt) -> int:
    """How many `{"type": "image"}` parts a conversational prompt holds (0 for a plain-text prompt)."""
    if not isinstance(prompt, list):
        return 0
    return sum(
        1
        for message in prompt
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    )


def _check_image_parts(name: str, dataset) -> None:
    """Prompts whose image parts have no images to fill them: one line naming the column or the row (TRL fails on
    the first batch, 60 lines deep in the processor, "Number of images provided (0) does not match")."""
    columns = getattr(dataset, "column_names", None) or []
    if "prompt" not in columns or len(dataset) == 0:
        return
    table = _arrow_table(dataset)
    prompts = table.column("prompt").to_pylist() if table is not None else dataset["prompt"]
    parts = [_image_parts(prompt) for prompt in prompts]
    if not any(parts):
        return
    if "images" not in columns and "image" not in columns:
        row = next(i for i, n in enumerate(parts) if n)
        raise ValueError(
            f"{name}: row {row}'s prompt has {parts[row]} image part(s) and the data set has no 'images' (or 'image') "
            f"column to fill them; add the images as an 'images' column (a list per row), columns present: "
            f"{columns}."
        )
    counted = _image_counts(dataset)
    for row, (wanted, given) in enumerate(zip(parts, counted or [])):
        if wanted and wanted != given:
            raise ValueError(
                f"{name}: row {row}'s prompt has {wanted} image part(s) and {given} image(s): give one image per "
                "image part."
            )


def _arrow_table(dataset):
    """The rows of a `datasets.Dataset` as an Arrow table, in the data set's own order (a `select` keeps an index
    mapping over the whole table, which `dataset.data` alone does not apply); None for other data sets."""
    if not hasattr(dataset, "with_format") or getattr(dataset, "data", None) is None:
        return None
    if getattr(dataset, "_indices", None) is None:
        return dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    return dataset.with_format("arrow")[:]


def _image_counts(dataset) -> list[int] | None:
    """Images per row, read off the Arrow table without decoding any: an `images` list, or one `image`."""
    import pyarrow.compute as pc

    table = _arrow_table(dataset)
    columns = getattr(dataset, "column_names", None) or []
    if table is None:
        return None
    if "images" in columns:
        lengths = pc.list_value_length(table.column("images")).to_pylist()
        return [0 if n is None else n for n in lengths]
    if "image" in columns:
        return [0 if null else 1 for null in pc.is_null(table.column("image")).to_pylist()]
    return None


def _image_count_row(dataset, pick=max) -> tuple[int, int] | None:
    """(row, image count) of the row with the most (`pick=max`) or fewest (`min`) images, read off the Arrow table
    without decoding any image: an `images` list, or TRL's other form, one `image` (none where it is null)."""
    lengths = _image_counts(dataset)
    if not lengths:
        return None
    row = pick(range(len(lengths)), key=lengths.__getitem__)
    return row, lengths[row]
