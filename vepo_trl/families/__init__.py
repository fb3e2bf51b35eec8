"""The model families VEPO's perturbed pass supports, one module each in this package.

A family is looked up from the model's `config.model_type` (the same key transformers' Auto classes use). Its module
declares a `FAMILY` (`base.Family`): how the processor lays out `pixel_values` and the `perturb` layout (normalisation
and the model's patch size) the perturbations work through, the inputs TRL 1.16 fails on for it, its reference
checkpoint. Beside it, the same module holds the family's tiny model as data (`TINY_RECIPE`, built by
`vepo_trl.builtin.tiny_models`) and its reference checkpoint's processor and config values, each with its source
(`REFERENCE_PROCESSOR`, `REFERENCE_CONFIG`: what the tests check the tiny model and the perturbations against). A
module declaring a `REFUSED` (`base.Refused`) names a model type TRL trains whose images VEPO cannot perturb yet. Splitting a batch's multimodal
inputs per response is TRL's own (`batch.take_rows`), so a family holds no splitting rule.

Adding a family: one module here. The registry finds it, and every family-parametrised test, the README's tables,
the architecture's layers (`vepo_trl.families.*`) and `vepo-trl demo --model_family` read the registry.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..perturb import ImageLayout, PixelLayout
from .base import Family, Refused, arrow_table, image_count_row, image_counts


__all__ = [
    "Family",
    "FAMILIES",
    "FAMILY_MODULES",
    "NOT_YET",
    "Refused",
    "banned_token_ids",
    "blocker",
    "check_family_inputs",
    "family_of",
    "get_family",
    "pixel_layout",
    "supported_families",
    "supported_models_table",
    "trainable_families",
]


def _discover() -> tuple[tuple[Family, ...], dict[str, Refused], dict[str, object]]:
    families, refused, modules = [], {}, {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        if module.name.startswith("_") or module.name == "base":
            continue
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        if hasattr(loaded, "FAMILY"):
            families.append(loaded.FAMILY)
            modules[loaded.FAMILY.name] = loaded
        if hasattr(loaded, "REFUSED"):
            refused[loaded.REFUSED.model_type] = loaded.REFUSED
    families.sort(key=lambda family: family.order)
    return tuple(families), refused, modules


# The families and the refused model types; each family's module (its tiny recipe and reference values)
FAMILIES, NOT_YET, FAMILY_MODULES = _discover()
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
_BY_NAME = {family.name: family for family in FAMILIES}


def blocker(model_type) -> str:
    """` (<what blocks it>)` for a model type in `NOT_YET`, else empty: appended to a refusal's first clause."""
    return f" ({NOT_YET[model_type].blocker})" if model_type in NOT_YET else ""


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


# Config attributes that name a media placeholder or a vision special token (transformers' names across families)
CONFIG_MEDIA_ATTRIBUTES = (
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "video_token_index",
    "audio_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "boi_token_id",
    "boi_token_index",
    "eoi_token_id",
    "eoi_token_index",
    "image_start_token_id",
    "image_end_token_id",
    "video_start_token_id",
    "video_end_token_id",
)


def banned_token_ids(config, processing_class=None) -> list[int]:
    """The ids no completion may hold: the media ids `config` (or its text config) names, and the family's declared
    `media_tokens` (`families.base.Family`) that the tokenizer holds. Sorted, each once."""
    ids: set[int] = set()
    configs = [config]
    if config is not None and hasattr(config, "get_text_config"):
        configs.append(config.get_text_config())
    for source in configs:
        for name in CONFIG_MEDIA_ATTRIBUTES:
            value = getattr(source, name, None)
            if isinstance(value, int) and value >= 0:
                ids.add(value)
    family = family_of(config)
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if family is not None and hasattr(tokenizer, "convert_tokens_to_ids"):
        # One lookup per declared token (every generation call reads this): a token the tokenizer lacks comes back as
        # None or as the unknown token
        for token in family.media_tokens:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is not None and token_id != getattr(tokenizer, "unk_token_id", None):
                ids.add(token_id)
    return sorted(ids)


def get_family(name: str) -> Family:
    if name in _BY_NAME:
        return _BY_NAME[name]
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
    from ..perturb import PERTURBATIONS

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
    for refused in NOT_YET.values():
        rows.append(
            f"| {refused.model_type} | `{refused.model_class}` | {refused.pixel_values} | none | refused at start-up in "
            f"one line: {refused.blocker}; `entropy` and `full` perturb nothing | - |"
        )
    return "\n".join(rows) + "\n"


def gaussian_strength_table(sigma: float = 2.0, base: str = "qwen2.5-vl") -> str:
    """The README's table of what `--perturbation gaussian --noise_sigma {sigma}` means per family: the noise is drawn
    on the model's normalised pixels (the release's definition, exact on its model, `base`), so in [0, 1] space its
    std is `sigma x` the family's normalisation std; the last column is the sigma that gives `base`'s [0, 1]-space
    strength (a test keeps the README's copy equal to this)."""
    base_std = get_family(base).reference[1]
    base_mean = sum(base_std) / len(base_std)
    rows = [
        f"| family | reference checkpoint | normalisation std (R, G, B) | std in [0, 1] space at sigma {sigma:g} | "
        f"sigma for {_display(base)}'s strength |",
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


def _display(name: str) -> str:
    """A family's name as its checkpoints spell it (the table's header): `qwen2.5-vl` -> `Qwen2.5-VL`."""
    checkpoint = get_family(name).reference[0].split("/")[-1]
    return checkpoint[: len(name)] if checkpoint.lower().startswith(name) else name


def check_family_inputs(
    config, processor, datasets: dict | None = None, *, chat_template=None, use_vllm: bool = False
) -> None:
    """What a family's processor or data would crash on deep inside TRL 1.16 (or silently mistrain), refused at
    start-up in one line: prompts whose image parts have no images, then the family's own checks
    (`Family.limits`). `datasets`: name -> data set (the train and eval data; an eval dict counts each of its
    sets)."""
    check_processor_of(config, processor)
    named = _named(datasets or {})
    for name, dataset in named:
        if problem := _image_parts_problem(name, dataset):
            raise ValueError(problem)
    family = family_of(config)
    limits = family.limits if family is not None else None
    if limits is None:
        return
    for option, why in limits.processor_off:  # the processor's own image defaults decide, over its image processor's
        image_processor = getattr(processor, "image_processor", None)
        if (getattr(processor, "images_kwargs", None) or {}).get(option, getattr(image_processor, option, False)):
            raise ValueError(f"{limits.title}'s processor has {option} on: {why}")
    tokenizer = getattr(processor, "tokenizer", None)
    templates = (chat_template, getattr(processor, "chat_template", None), getattr(tokenizer, "chat_template", None))
    if limits.chat_template and not any(templates):
        raise ValueError(f"{limits.title} has no chat template: {limits.chat_template}")
    if limits.vllm and use_vllm:
        raise ValueError(f"{limits.title} with use_vllm: {limits.vllm}")
    for name, dataset in named:
        if limits.most_images and (most := image_count_row(dataset, max)) and most[1] > limits.most_images[0]:
            raise ValueError(
                f"{limits.title} with {most[1]} images in one prompt ({name} row {most[0]}): {limits.most_images[1]}"
            )
        if limits.fewest_images and (few := image_count_row(dataset, min)) and few[1] < limits.fewest_images[0]:
            raise ValueError(
                f"{limits.title} needs {limits.fewest_images[0]} image(s) in every prompt ({name} row {few[0]} has "
                f"{few[1] or 'none'}): {limits.fewest_images[1]}"
            )


# Checkpoints of one model type that ship another type's processor (families/llava.py: Pixtral-in-LLaVA)
SHARED_PROCESSORS = {"llava": {"PixtralProcessor"}}


def check_processor_of(config, processor) -> None:
    """A processor made for another model (a Qwen3-VL processor with a Qwen2.5-VL model: another patch size, so
    features that do not fit the model) trains without a word: refused when transformers maps the model's type to
    another processor class than the one given, and the one given is some other model's."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    model_type = getattr(config, "model_type", None)
    expected = PROCESSOR_MAPPING_NAMES.get(model_type) if model_type else None
    if processor is None or not isinstance(expected, str):
        return
    names = {cls.__name__ for cls in type(processor).__mro__}
    others = {name for name in PROCESSOR_MAPPING_NAMES.values() if isinstance(name, str)} - {expected}
    if expected not in names and names & others - SHARED_PROCESSORS.get(model_type, set()):
        raise ValueError(
            f"processing_class is a {type(processor).__name__}, and the model is a {model_type} model, whose processor "
            f"is a {expected}: load the processor of the same checkpoint (AutoProcessor.from_pretrained(model_id))."
        )


def _named(datasets: dict) -> list[tuple[str, object]]:
    """(name, data set) pairs, an eval dict's sets (TRL takes one) each under its own key."""
    pairs = []
    for name, dataset in datasets.items():
        if isinstance(dataset, dict):
            pairs += [(f"{name}[{key!r}]", value) for key, value in dataset.items() if value is not None]
        elif dataset is not None:
            pairs.append((name, dataset))
    # A stream (`streaming=True`, `to_iterable_dataset()`) has no length: its first rows stand for it
    pairs = [(name, dataset if hasattr(dataset, "__len__") else _head_of_stream(dataset)) for name, dataset in pairs]
    return [(name, dataset) for name, dataset in pairs if dataset is not None]


def _head_of_stream(stream, rows: int = 16):
    """The first `rows` rows of a stream as a `datasets.Dataset`, or None where they cannot be read here (a start-up
    check never stops a run that would train: TRL reads the stream itself)."""
    import itertools

    import datasets

    try:
        head = list(itertools.islice(iter(stream), rows))
        return datasets.Dataset.from_list(head) if head else None
    except Exception:  # noqa: BLE001 - a stream that cannot be read twice, rows datasets cannot tabulate
        return None


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


def _image_parts_problem(name: str, dataset) -> str | None:
    """Prompts whose image parts have no images to fill them, said naming the column or the row (TRL fails on the
    first batch, 60 lines deep in the processor, "Number of images provided (0) does not match"), or None."""
    columns = getattr(dataset, "column_names", None) or []
    if "prompt" not in columns or len(dataset) == 0:
        return None
    table = arrow_table(dataset)
    prompts = table.column("prompt").to_pylist() if table is not None else dataset["prompt"]
    parts = [_image_parts(prompt) for prompt in prompts]
    if any(parts) and "images" not in columns and "image" not in columns:
        row = next(i for i, n in enumerate(parts) if n)
        return (
            f"{name}: row {row}'s prompt has {parts[row]} image part(s) and the data set has no 'images' (or 'image') "
            f"column to fill them; add the images as an 'images' column (a list per row), columns present: "
            f"{columns}."
        )
    for row, (wanted, given) in enumerate(zip(parts, image_counts(dataset) or [] if any(parts) else [])):
        if wanted and wanted != given:
            return (
                f"{name}: row {row}'s prompt has {wanted} image part(s) and {given} image(s): give one image per "
                "image part."
            )
    return None
