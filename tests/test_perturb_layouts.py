"""LLaVA-NeXT and LLaVA-OneVision any-res crops: the letterbox padding inside a crop stays as the processor made it.

Any-res resizes an image into the best of its resolutions keeping the aspect ratio, pads it (centred, black) to that
resolution and cuts the canvas into crops. A crop counted as padding only when all zero, so the black bands were
noised (on llava-v1.6, 1280x720 makes crops 44% padding; `diffusion` changed every such pixel from exactly 0 in
[0, 1] space). Checked with each family's real image processor built with its checkpoint's preprocessing values:

- llava-hf/llava-v1.6-mistral-7b-hf, preprocessor_config.json: CLIP mean/std, shortest_edge 336, crop 336x336,
  image_grid_pinpoints [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]];
- llava-hf/llava-onevision-qwen2-7b-ov-hf, preprocessor_config.json: mean/std 0.5, size 384x384, image_grid_pinpoints
  every (384 i, 384 j) for i, j in 1..6 ("anyres_max_9").
"""

import pytest
import torch
from PIL import Image

from vepo_trl.perturb import ImageLayout, anyres_boxes, perturb_pixel_values


CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def llava_next():
    from transformers import LlavaNextImageProcessor

    return LlavaNextImageProcessor(
        image_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
        size={"shortest_edge": 336},
        crop_size={"height": 336, "width": 336},
    )


def llava_onevision():
    from transformers import LlavaOnevisionImageProcessor

    return LlavaOnevisionImageProcessor(
        image_grid_pinpoints=[[384 * i, 384 * j] for i in range(1, 7) for j in range(1, 7)],
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        size={"height": 384, "width": 384},
    )


PROCESSORS = {"llava-next": llava_next, "llava-onevision": llava_onevision}
SIZES = [(1280, 720), (300, 1200), (20, 20), (448, 448)]  # (width, height) as PIL takes them


def colour_picture(width, height):
    """A picture with no black pixel (so any black pixel in a crop is the processor's letterbox)."""
    image = Image.new("RGB", (width, height), (200, 60, 40))
    for x in range(0, width, 7):
        for y in range(0, height, 5):
            image.putpixel((x, y), (40 + x % 200, 90, 30 + y % 200))
    return image


def real_mask(box, shape):
    mask = torch.zeros(shape, dtype=torch.bool)
    if box is not None:
        top, bottom, left, right = box
        mask[top:bottom, left:right] = True
    return mask


@pytest.mark.parametrize("family", list(PROCESSORS))
@pytest.mark.parametrize("size", SIZES)
def test_letterbox_stays_and_the_image_is_perturbed(family, size):
    processor = PROCESSORS[family]()
    encoded = processor(images=[colour_picture(*size)], return_tensors="pt")
    pixel_values, image_sizes = encoded["pixel_values"], encoded["image_sizes"]
    layout = ImageLayout.from_image_processor(processor, 14)
    boxes = anyres_boxes(tuple(image_sizes[0].tolist()), layout.grid_pinpoints, layout.crop_size)
    assert len(boxes) <= pixel_values.shape[1]
    out = perturb_pixel_values("diffusion", pixel_values, None, layout, image_sizes=image_sizes, noise_step=500)
    identity = perturb_pixel_values("gaussian", pixel_values, None, layout, image_sizes=image_sizes, sigma=0.0)
    letterbox_pixels = 0
    for index, box in enumerate(boxes):
        crop, perturbed = pixel_values[0, index], out[0, index]
        mask = real_mask(box, crop.shape[-2:])
        unit = layout.to_unit(crop)
        # The boxes are exactly the processor's: black outside (the letterbox), never black inside
        assert bool((unit[:, ~mask].abs() < 1e-5).all())
        assert bool((unit.abs().amax(0)[mask] > 1e-3).all())
        assert torch.equal(perturbed[:, ~mask], crop[:, ~mask])  # letterbox untouched, bit for bit
        if box is not None:
            assert float((perturbed[:, mask] != crop[:, mask]).float().mean()) > 0.99
        letterbox_pixels += int((~mask).sum())
    torch.testing.assert_close(identity, pixel_values, rtol=0, atol=1e-5)  # no noise: the image back
    # The batch's padding crops (beyond this image's own) are untouched
    assert torch.equal(out[0, len(boxes) :], pixel_values[0, len(boxes) :])
    if size == (1280, 720) and family == "llava-next":
        # The reviewed case: 4 of the 5 crops hold letterbox, 43.8% of the canvas crops' pixels
        canvas = sum(int(real_mask(b, (336, 336)).numel()) for b in boxes[1:])
        assert letterbox_pixels / canvas == pytest.approx(0.4375, abs=1e-3)


@pytest.mark.parametrize("family", list(PROCESSORS))
def test_an_image_is_perturbed_alike_alone_and_batched(family):
    processor = PROCESSORS[family]()
    images = [colour_picture(1280, 720), colour_picture(300, 1200)]
    layout = ImageLayout.from_image_processor(processor, 14)
    together = processor(images=images, return_tensors="pt")
    both = perturb_pixel_values(
        "diffusion", together["pixel_values"], None, layout, image_sizes=together["image_sizes"], noise_step=500
    )
    for index, image in enumerate(images):
        alone = processor(images=[image], return_tensors="pt")
        own = perturb_pixel_values(
            "diffusion", alone["pixel_values"], None, layout, image_sizes=alone["image_sizes"], noise_step=500
        )
        crops = own.shape[1]
        torch.testing.assert_close(both[index, :crops], own[0], rtol=0, atol=0)
