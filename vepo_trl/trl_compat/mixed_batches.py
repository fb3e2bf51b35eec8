"""Mixed batches (rows with images and text-only rows) through TRL 1.16's rollout."""

from __future__ import annotations


class TextRowsTakeEmptyImages:
    """Trainer mixin: TRL 1.16's `_generate` marks the text-only rows of a mixed batch with `None` in its image list,
    which the processor then rejects when the batch is scored; an empty image list says the same and works.
    Generation (vLLM included) has already run, so only scoring sees the change; a TRL that passes `[]` itself goes
    through unchanged."""

    def _generate(self, prompts):
        *rest, images, tool_images = super()._generate(prompts)
        if images is not None:
            images = [row if row is not None else [] for row in images]
        return (*rest, images, tool_images)
