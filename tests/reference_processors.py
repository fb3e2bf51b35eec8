"""Each family's reference checkpoint as its processor and config see it (no weights), for
tests/test_perturb_real_processors.py: the image-processor class and the kwargs that rebuild its `preprocessor_config.json`,
what the family's processor adds on every call, the config class and the kwargs that give it the checkpoint's vision
geometry. Each entry cites its source in a comment above it ("read": a public copy of the file, named; "as X": another
entry's file, and then derived from it; "card": the model card and the family's known geometry; "class defaults": the
transformers class). Test data, not the package's: a family module holds only its runtime adapter."""

import dataclasses
from dataclasses import dataclass, field

from vepo_trl.families.base import CLIP_MEAN, CLIP_STD, HALF_STD, IMAGENET_MEAN, IMAGENET_STD


@dataclass(frozen=True)
class RealProcessor:
    """A family's reference checkpoint as its processor and config see it (no weights): the image-processor class (a
    `transformers` name) and the kwargs that rebuild its `preprocessor_config.json`; what the family's processor adds
    on every call (`call`); the config class and the kwargs that give it the checkpoint's vision geometry. A family
    module declares one as `REAL_PROCESSOR`, its source in a comment above it ("read": a public copy of the file,
    named; "as X": another entry's file; "card": the model card and the family's known geometry; "class defaults": the
    transformers class); tests/test_perturb_real_processors.py checks the perturbations on it at real image sizes."""

    checkpoint: str
    processor: str
    kwargs: dict
    config: str
    config_kwargs: dict
    call: dict = field(default_factory=dict)
    # The processor takes images per prompt (nested lists) and lays `pixel_values` out one row per prompt
    per_prompt: bool = False
    # Which pixels are the image's own, the rest padding: "all", "pixel_mask" (`pixel_attention_mask`), "image_sizes"
    # (each image's top-left `image_sizes`), "anyres" (each crop's box inside the letterbox, zero crops after) or
    # "positions" (patch rows whose `image_position_ids` are not -1)
    real: str = "all"
    # It cuts an image into tiles: a white page has identical ones
    tiles: bool = False
    # The model reads every patch holding an image pixel, the last ones part padding (Idefics2's
    # patch_attention_mask over a batch padded past the image): its patch grid covers the image rounded up
    partial_patches: bool = False


REAL_PROCESSORS: dict[str, RealProcessor] = {}


# Qwen/Qwen2-VL-7B-Instruct preprocessor_config.json: Qwen2VLImageProcessor, min_pixels 3136, max_pixels 12845056,
# patch_size 14, temporal_patch_size 2, merge_size 2, CLIP mean/std (card: Qwen2.5-VL's file below, read, has the
# same; patch, merge, temporal and stats are also the class defaults, max_pixels not: 1003520 there). config.json
# vision patch_size 14
REAL_PROCESSORS["qwen2-vl"] = RealProcessor(
    "Qwen/Qwen2-VL-7B-Instruct",
    "Qwen2VLImageProcessor",
    dict(
        min_pixels=3136,
        max_pixels=12845056,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
    ),
    "Qwen2VLConfig",
    {"vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)


# Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json (read: the copy in github
# remodlai/qwen-2.5-vl-7b-instruct-lexiq): Qwen2_5_VLImageProcessor, min_pixels 3136, max_pixels 12845056, patch
# 14, temporal 2, merge 2, CLIP mean/std. config.json vision patch_size 14
REAL_PROCESSORS["qwen2.5-vl"] = RealProcessor(
    "Qwen/Qwen2.5-VL-7B-Instruct",
    "Qwen2VLImageProcessor",
    dict(
        min_pixels=3136,
        max_pixels=12845056,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
    ),
    "Qwen2_5_VLConfig",
    {"vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)


# What the Qwen3-VL and Qwen3.5 files below both say (each cites its own source): Qwen2VLImageProcessorFast at 16-px
# patches, size 65536 / 16777216, temporal 2, merge 2, mean/std 0.5; config.json vision patch_size 16
QWEN3_PREPROCESSOR = dict(
    size={"shortest_edge": 65536, "longest_edge": 16777216},
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=list(HALF_STD),
    image_std=list(HALF_STD),
)
QWEN3_VISION = {"vision_config": {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}}


# Qwen/Qwen3-VL-8B-Instruct preprocessor_config.json: Qwen2VLImageProcessorFast, size shortest_edge 65536,
# longest_edge 16777216, patch 16, temporal 2, merge 2, mean/std 0.5 (read: copies of the Qwen3-VL-family file in
# several public test fixtures agree; card for this checkpoint). config.json vision patch_size 16
REAL_PROCESSORS["qwen3-vl"] = RealProcessor(
    "Qwen/Qwen3-VL-8B-Instruct",
    "Qwen2VLImageProcessor",
    QWEN3_PREPROCESSOR,
    "Qwen3VLConfig",
    QWEN3_VISION,
)


# Qwen/Qwen3-VL-30B-A3B-Instruct: as qwen3-vl, the same preprocessor_config.json and vision tower (card)
REAL_PROCESSORS["qwen3-vl-moe"] = dataclasses.replace(
    REAL_PROCESSORS["qwen3-vl"], checkpoint="Qwen/Qwen3-VL-30B-A3B-Instruct", config="Qwen3VLMoeConfig"
)


# Qwen/Qwen3.5-9B preprocessor_config.json (read: Qwen/Qwen3.5-2B-Base's, as a public log prints it from the Hub;
# the same file across Qwen3.5):
# Qwen2VLImageProcessorFast, size 65536 / 16777216, patch 16, temporal 2, merge 2, mean/std 0.5. config.json
# vision patch_size 16
REAL_PROCESSORS["qwen3.5"] = RealProcessor(
    "Qwen/Qwen3.5-9B",
    "Qwen2VLImageProcessor",
    QWEN3_PREPROCESSOR,
    "Qwen3_5Config",
    QWEN3_VISION,
)


# Qwen/Qwen3.5-35B-A3B: as qwen3.5, its preprocessor_config.json and vision tower (card)
REAL_PROCESSORS["qwen3.5-moe"] = dataclasses.replace(
    REAL_PROCESSORS["qwen3.5"], checkpoint="Qwen/Qwen3.5-35B-A3B", config="Qwen3_5MoeConfig"
)


# google/gemma-3-4b-it preprocessor_config.json (read: as public eval scripts write it out): Gemma3ImageProcessor,
# size 896x896, mean/std 0.5, resample 2 (bilinear), do_pan_and_scan null. config.json vision (SigLIP) image_size
# 896, patch_size 14
REAL_PROCESSORS["gemma3"] = RealProcessor(
    "google/gemma-3-4b-it",
    "Gemma3ImageProcessor",
    dict(
        size={"height": 896, "width": 896},
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
        resample=2,
        do_pan_and_scan=False,
    ),
    "Gemma3Config",
    {"vision_config": {"model_type": "siglip_vision_model", "image_size": 896, "patch_size": 14}},
)


# HuggingFaceTB/SmolVLM2-2.2B-Instruct preprocessor_config.json: SmolVLMImageProcessor, size longest_edge 1536
# (the whole image, 4 x 384), max_image_size longest_edge 384 (the tiles), do_image_splitting true, mean/std 0.5,
# resample 1 (Lanczos) (card; a public reader's fixture of SmolVLM's files has this 1536 / 384 pair with vision
# image_size 384, patch 14; the class defaults are 4 x 364 / 364; the 256M / 500M checkpoints use 512 px tiles of
# 16 px patches instead). config.json vision image_size 384, patch_size 14
REAL_PROCESSORS["smolvlm"] = RealProcessor(
    "HuggingFaceTB/SmolVLM2-2.2B-Instruct",
    "SmolVLMImageProcessor",
    dict(
        size={"longest_edge": 1536},
        max_image_size={"longest_edge": 384},
        do_image_splitting=True,
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
        resample=1,
    ),
    "SmolVLMConfig",
    {"vision_config": {"image_size": 384, "patch_size": 14}, "scale_factor": 3},
    per_prompt=True,
    real="pixel_mask",
    tiles=True,
)


LLAVA_ONEVISION_PINPOINTS = [[384 * i, 384 * j] for i in range(1, 7) for j in range(1, 7)]  # "anyres_max_9"

# llava-hf/llava-onevision-qwen2-7b-ov-hf preprocessor_config.json (as tests/test_perturb_layouts.py):
# LlavaOnevisionImageProcessor, size 384x384, mean/std 0.5, image_grid_pinpoints (384 i, 384 j) for i, j in 1..6.
# config.json vision (SigLIP so400m) image_size 384, patch_size 14
REAL_PROCESSORS["llava-onevision"] = RealProcessor(
    "llava-hf/llava-onevision-qwen2-7b-ov-hf",
    "LlavaOnevisionImageProcessor",
    dict(
        size={"height": 384, "width": 384},
        image_grid_pinpoints=LLAVA_ONEVISION_PINPOINTS,
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
    ),
    "LlavaOnevisionConfig",
    {
        "vision_config": {"model_type": "siglip_vision_model", "image_size": 384, "patch_size": 14},
        "image_grid_pinpoints": LLAVA_ONEVISION_PINPOINTS,
    },
    real="anyres",
    tiles=True,
)


LLAVA_NEXT_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]

# llava-hf/llava-v1.6-mistral-7b-hf preprocessor_config.json (as tests/test_perturb_layouts.py):
# LlavaNextImageProcessor, shortest_edge 336, crop 336x336, CLIP mean/std, the 5 LLAVA_NEXT_PINPOINTS. config.json
# vision (CLIP ViT-L/14-336) image_size 336, patch_size 14
REAL_PROCESSORS["llava-next"] = RealProcessor(
    "llava-hf/llava-v1.6-mistral-7b-hf",
    "LlavaNextImageProcessor",
    dict(
        size={"shortest_edge": 336},
        crop_size={"height": 336, "width": 336},
        image_grid_pinpoints=LLAVA_NEXT_PINPOINTS,
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
    ),
    "LlavaNextConfig",
    {
        "vision_config": {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14},
        "image_grid_pinpoints": LLAVA_NEXT_PINPOINTS,
    },
    real="anyres",
    tiles=True,
)


# llava-hf/llava-1.5-7b-hf preprocessor_config.json: CLIPImageProcessor, shortest_edge 336, center crop 336x336,
# CLIP mean/std, resample 3 (card, not read here; the class defaults are 224). config.json vision (CLIP
# ViT-L/14-336) image_size 336, patch_size 14
REAL_PROCESSORS["llava"] = RealProcessor(
    "llava-hf/llava-1.5-7b-hf",
    "CLIPImageProcessor",
    dict(
        size={"shortest_edge": 336},
        crop_size={"height": 336, "width": 336},
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
        resample=3,
    ),
    "LlavaConfig",
    {"vision_config": {"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14}},
)


# google/paligemma2-3b-pt-224 preprocessor_config.json (as google/paligemma-3b-pt-224's): SiglipImageProcessor,
# size 224x224, mean/std 0.5, resample 3 (card, not read here). config.json vision (SigLIP) image_size 224,
# patch_size 14
REAL_PROCESSORS["paligemma"] = RealProcessor(
    "google/paligemma2-3b-pt-224",
    "SiglipImageProcessor",
    dict(size={"height": 224, "width": 224}, image_mean=list(HALF_STD), image_std=list(HALF_STD), resample=3),
    "PaliGemmaConfig",
    {"vision_config": {"model_type": "siglip_vision_model", "image_size": 224, "patch_size": 14}},
)


# HuggingFaceM4/idefics2-8b preprocessor_config.json: Idefics2ImageProcessor, shortest_edge 378, longest_edge 980,
# mean/std 0.5, do_image_splitting false (card; all of them Idefics2ImageProcessor's class defaults too). Not
# splitting, it has no identical tiles to check. config.json vision image_size 980, patch_size 14
REAL_PROCESSORS["idefics2"] = RealProcessor(
    "HuggingFaceM4/idefics2-8b",
    "Idefics2ImageProcessor",
    dict(
        size={"shortest_edge": 378, "longest_edge": 980},
        image_mean=list(HALF_STD),
        image_std=list(HALF_STD),
        do_image_splitting=False,
    ),
    "Idefics2Config",
    {"vision_config": {"image_size": 980, "patch_size": 14}},
    per_prompt=True,
    real="pixel_mask",
    partial_patches=True,
)


# OpenGVLab/InternVL3-8B-hf preprocessor_config.json: GotOcr2ImageProcessorFast, size 448x448, min_patches 1,
# max_patches 12, ImageNet mean/std (card; a public spec of InternVL3.5-8B-HF's processor reads 448 px tiles, 1 to
# 12 of them; vepo_trl/builtin/tiny_models.py's tiny InternVL cites the stats). crop_to_patches is InternVLProcessor's
# images_kwargs default (True), passed on each call as the processor does. config.json vision image_size
# [448, 448], patch_size [14, 14]
REAL_PROCESSORS["internvl"] = RealProcessor(
    "OpenGVLab/InternVL3-8B-hf",
    "GotOcr2ImageProcessor",
    dict(
        size={"height": 448, "width": 448},
        min_patches=1,
        max_patches=12,
        image_mean=IMAGENET_MEAN,
        image_std=list(IMAGENET_STD),
    ),
    "InternVLConfig",
    {"vision_config": {"image_size": [448, 448], "patch_size": [14, 14]}},
    call={"crop_to_patches": True},
    tiles=True,
)


# zai-org/GLM-4.1V-9B-Thinking preprocessor_config.json: Glm4vImageProcessor, size shortest_edge 12544,
# longest_edge 9633792, patch 14, temporal 2, merge 2, CLIP mean/std (read: zai-org/GLM-OCR's file, quoted
# verbatim in a public fixture, which public converters give glm4v models too; GLM-4.1V's own not read; the class
# default longest_edge is 11760000). config.json vision patch_size 14
REAL_PROCESSORS["glm4v"] = RealProcessor(
    "zai-org/GLM-4.1V-9B-Thinking",
    "Glm4vImageProcessor",
    dict(
        size={"shortest_edge": 12544, "longest_edge": 9633792},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
    ),
    "Glm4vConfig",
    {"vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}},
)


# mistralai/Mistral-Small-3.1-24B-Instruct-2503 preprocessor_config.json (read: Mistral 3 / Pixtral bundles' files
# in public fixtures): PixtralImageProcessor, size longest_edge 1540, patch_size 14, CLIP mean/std, resample 3.
# processor_config.json: patch_size 14, spatial_merge_size 2, so PixtralProcessor hands the image processor
# patch_size 14 x 2 = 28 on each call. config.json vision (Pixtral) image_size 1540, patch_size 14
REAL_PROCESSORS["mistral3"] = RealProcessor(
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
    "PixtralImageProcessor",
    dict(
        size={"longest_edge": 1540},
        patch_size={"height": 14, "width": 14},
        image_mean=CLIP_MEAN,
        image_std=list(CLIP_STD),
        resample=3,
    ),
    "Mistral3Config",
    {"vision_config": {"model_type": "pixtral", "image_size": 1540, "patch_size": 14}, "spatial_merge_size": 2},
    call={"patch_size": {"height": 28, "width": 28}},
    real="image_sizes",
)


# google/gemma-4-e2b-it (the checkpoint transformers' Gemma 4 docstrings name): Gemma4ImageProcessor's class
# defaults in transformers (not read from the Hub): patch_size 16, max_soft_tokens 280, pooling 3, no
# normalisation; Gemma4VisionConfig's patch_size 16 and pooling_kernel_size 3 (class defaults)
REAL_PROCESSORS["gemma4"] = RealProcessor(
    "google/gemma-4-e2b-it",
    "Gemma4ImageProcessor",
    dict(
        patch_size=16,
        max_soft_tokens=280,
        pooling_kernel_size=3,
        do_normalize=False,
        image_mean=[0.0, 0.0, 0.0],
        image_std=[1.0, 1.0, 1.0],
    ),
    "Gemma4Config",
    {"vision_config": {"patch_size": 16, "pooling_kernel_size": 3}},
    real="positions",
)
