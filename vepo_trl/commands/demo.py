"""`vepo-trl demo`: `train` on the packaged tiny recipe (or the lab's warm start, or another family's tiny model)."""

from __future__ import annotations

from importlib import resources

from .train import DEMO_RECIPE, WARM_DEMO_RECIPE, _fail, _parse, _run, _split_equals


def main(argv: list[str]):
    argv = _split_equals(argv, "--config", "--model_family", "--warm_start")
    if "--config" in argv:
        _fail("demo", "demo trains its own recipe (tiny.yaml); to train from a recipe: vepo-trl train --config FILE.")
    warm = "--warm_start" in argv
    if warm and "--model_family" in argv:
        _fail(
            "demo",
            "--warm_start starts from the lab's warm start (a Qwen2.5-VL trained on the lab's task) and --model_family "
            "from that family's random tiny model: give one of them.",
        )
    argv = [arg for arg in argv if arg != "--warm_start"]
    if "--model_family" in argv:
        # The same demo on another family's tiny model (`vepo_trl.families`): `tiny-<family>` as the model
        from ..families import FAMILIES, get_family, trainable_families

        index = argv.index("--model_family")
        family = argv[index + 1] if index + 1 < len(argv) else None
        if family not in trainable_families():
            reason = get_family(family).trl_failure if family in [f.name for f in FAMILIES] else None
            _fail("demo", f"--model_family {family}: " + (reason or f"one of {', '.join(trainable_families())}."))
        argv = [*argv[:index], *argv[index + 2 :], "--model_name_or_path", f"tiny-{family}"]
    recipe = resources.files("vepo_trl").joinpath(WARM_DEMO_RECIPE if warm else DEMO_RECIPE)
    with resources.as_file(recipe) as path:
        args = _parse("demo", ["--config", str(path), *argv])
    import torch

    # The tiny model's matrices gain nothing from intra-op threads, and threads contend badly on a busy machine
    torch.set_num_threads(1)
    return _run("demo", args)
