"""Model names that stand for models built on this machine instead of downloaded: one place for every command.

- `tiny-qwen2.5-vl`: the tiny random Qwen2.5-VL of `vepo_trl.builtin.tiny_models` (the CPU demo and tests), built once and cached;
  `tiny-<family>` the same for every family of `vepo_trl.builtin.tiny_models.TINY_FAMILIES` (`tiny-<family>` for each).
- `lab-warm-start`: the lab's SFT'd small Qwen2.5-VL (`vepo_trl.builtin.warm_start`), built on first use and cached.

A folder of the same name in the working directory wins: the name then means that folder, as for any local path.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

from .errors import UsageError


# `model_name_or_path` that builds the tiny random Qwen2.5-VL locally (the CPU demo and tests)
# `dataset_name` that generates synthetic visual-reasoning rows instead of loading a data set
SYNTHETIC_DATASET = "synthetic"
# `dataset_name` of the lab's tasks (count the circles, name the square's colour), the warm start's task family
LAB_DATASET = "lab"


TINY_MODEL = "tiny-qwen2.5-vl"
# `model_name_or_path` of the lab's warm start: a small Qwen2.5-VL SFT'd on the lab tasks, built once and cached
LAB_MODEL = "lab-warm-start"


# A Hub repo id: "name" or "owner/name", letters, digits, "-", "_", "."
_HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")
_TRUE = ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=1)
def hub_unreachable() -> str | None:
    """Why the Hugging Face Hub cannot be used from here (offline mode set, no network), or None when it can.

    One TCP connect with a 3 s timeout instead of the Hub clients' retries (26-51 s offline before their traceback).
    """
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in _TRUE:
            return f"{variable} is set"
    return _hub_connect_problem()


def _hub_connect_problem() -> str | None:
    """One TCP connect to `HF_ENDPOINT` (3 s timeout): why it failed, or None."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parsed = urlparse(endpoint)
    host, port = parsed.hostname or "huggingface.co", parsed.port or (80 if parsed.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        return f"the Hub ({host}) cannot be reached from this machine"
    return None


def check_hub_push(token: str | None = None, repo_id: str | None = None) -> None:
    """A push needs the Hub and a token, and (`repo_id`: a card pushed to a model's repo) the repo must exist, so a
    mistyped id does not create a new public repo holding only a card: a `UsageError` saying what is missing, before
    anything loads (and again before the push)."""
    from huggingface_hub import get_token

    reason = None
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:  # the offline switch the Hub client reads
        reason = "HF_HUB_OFFLINE is set"
    elif not any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        reason = _hub_connect_problem()  # a direct TCP connect: behind a proxy it would not tell
    if reason:
        raise UsageError(
            f"push_to_hub is on, and {reason}: run without it and push later, or where the Hub can be reached."
        )
    if not token and not get_token():
        raise UsageError(
            "push_to_hub is on, but no Hugging Face token is set: log in (`hf auth login`), set HF_TOKEN, or pass "
            "--hub_token."
        )
    if repo_id is None:
        return
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token).repo_info(repo_id)
    except RepositoryNotFoundError:
        raise UsageError(f"--hub_model_id {repo_id}: no such model repo on the Hub; push the model first.") from None
    except HfHubHTTPError as error:
        raise UsageError(f"--hub_model_id {repo_id}: the Hub answered {error.response.status_code}.") from None


def _cached_file(repo_id: str, filename: str, repo_type: str = "model", revision: str | None = None) -> str | None:
    """The path of `filename` of a Hub repo in the local cache, or None (not cached, or not a valid repo id)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(repo_id, filename, repo_type=repo_type, revision=revision)
    except ValueError:  # not a valid repo id
        return None
    return path if isinstance(path, str) else None


def _in_hub_cache(repo_id: str, filename: str, repo_type: str = "model") -> bool:
    return _cached_file(repo_id, filename, repo_type) is not None


def local_config_file(name: str, revision: str | None = None) -> Path | None:
    """A model's `config.json` on this machine: in its folder, or in the Hub cache for a Hub id; None otherwise."""
    path = Path(name).expanduser() / "config.json"
    if path.is_file():
        return path
    cached = _cached_file(name, "config.json", revision=revision)
    return Path(cached) if cached else None


def not_a_vlm(name: str | None, revision: str | None = None) -> str | None:
    """`a text-only 'qwen2' model` when the model's `config.json` on this machine names a type that
    `AutoModelForImageTextToText` cannot load (a text-only model); None for a vision-language model or an unknown one."""
    import json

    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    path = local_config_file(name, revision) if name else None
    if path is None:
        return None
    try:
        model_type = json.loads(path.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: transformers says why when it loads
    if not model_type or model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return None
    return f"a text-only {model_type!r} model (no image-text-to-text class in transformers for it)"


# A model folder's weights: one file, shards, or a PEFT adapter's
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
                "adapter_model.safetensors", "adapter_model.bin")  # fmt: skip


def missing_weights(folder: str | Path) -> bool:
    """A local folder with a `config.json` (or an adapter config) and no weight file: a checkpoint saved without
    its model (FSDP / DeepSpeed state only), or a copy that lost them."""
    path = Path(folder).expanduser()
    has_config = (path / "config.json").is_file() or (path / "adapter_config.json").is_file()
    return path.is_dir() and has_config and not any((path / name).is_file() for name in WEIGHT_FILES)


def check_weights(flag: str, name: str | None, use: str = "use the run's output_dir") -> None:
    """A `UsageError` for a local model folder with its config and no weights (`missing_weights`), naming `flag`, the
    folder and what to give instead: one line before anything loads, the same in every command."""
    if name and missing_weights(name):
        raise UsageError(
            f"{flag} {name}: the folder holds no weights (model.safetensors, shards or an adapter), as a checkpoint "
            f"saved by FSDP or DeepSpeed has: {use}, or export the checkpoint's model first."
        )


def image_factor_of(name: str | None, revision: str | None = None) -> int | None:
    """The multiple a model's processor rounds image sides to, read off its processor config on this machine (its
    folder or the Hub cache): `patch_size x merge_size` for the patch-row layouts (28 or 32),
    1 for a processor that resizes on its own terms (whole images, tiles, crops); None when no processor
    config is here (a built-in model not built yet, a Hub id not cached)."""
    import json

    if not name:
        return None
    for filename in ("preprocessor_config.json", "processor_config.json"):
        path = Path(name).expanduser() / filename
        found = str(path) if path.is_file() else _cached_file(name, filename, revision=revision)
        if not found:
            continue
        try:
            config = json.loads(Path(found).read_text())
        except (OSError, ValueError):
            continue
        config = config.get("image_processor", config) if isinstance(config, dict) else {}
        patch, merge = config.get("patch_size"), config.get("merge_size")
        return int(patch) * int(merge) if patch and merge else 1
    return None


def tiny_model_names() -> list[str]:
    """`tiny-<family>` for every family with a tiny offline model (`tiny-qwen2.5-vl` first)."""
    from .builtin.tiny_models import TINY_FAMILIES

    return [TINY_MODEL, *(f"tiny-{family}" for family in TINY_FAMILIES if f"tiny-{family}" != TINY_MODEL)]


def is_builtin_model(name: str) -> bool:
    """Whether `name` stands for a model built on this machine (and no folder of that name is here)."""
    return not os.path.isdir(name) and (name == LAB_MODEL or name in tiny_model_names())


def check_model_name(
    name: str | None, what: str = "model_name_or_path", *, use: str = "give the run's output_dir",
    adapter: bool = False, visual: str | None = None, adapters: bool = True,
) -> str:  # fmt: skip
    """The one rule for a model a command is given, before anything loads (a `UsageError` naming `what` and the
    fix): a missing local folder; a folder that is not a saved model (no config.json, or only an adapter's
    adapter_config.json where the command loads no adapter: `adapters`), or not a PEFT adapter where `adapter` asks
    for one; a folder without its weights (`check_weights`: `use` says what to give instead); a text-only model where
    `visual` says why images are needed; a name that is not owner/name, or a Hub id neither in the local cache nor
    downloadable (offline). Returns the name as it loads (a folder with `~` expanded)."""
    if not name:
        raise UsageError(f"{what} is not set: give a Hub id, a local model folder or {TINY_MODEL}.")
    if is_builtin_model(name):
        return name
    path = Path(name).expanduser()
    if path.is_dir():
        config, adapter_config = (path / "config.json").is_file(), (path / "adapter_config.json").is_file()
        if not config and not (adapters and adapter_config):  # `adapters`: the command loads an adapter's folder
            raise UsageError(f"{what} {name!r} is a folder without config.json: not a saved model.")
        if adapter and not adapter_config:
            raise UsageError(
                f"{what} {name}: a full model folder, not a PEFT adapter (no adapter_config.json): pass it as "
                "--model instead."
            )
        check_weights(what, name, use)
        text_only = not_a_vlm(name) if visual and config else None
        if text_only:
            raise UsageError(f"{what} {name}: {text_only}; {visual}.")
        return str(path)
    demo = " Run `vepo-trl demo` first." if path.name == "vepo-demo" else ""  # the demo's output folder
    # A Hub id is owner/name (every vision-language checkpoint is): a bare name is a folder that is not here
    looks_local = name.startswith(("/", "./", "../", "~", ".\\")) or path.exists() or name.count("/") != 1
    looks_local = looks_local or not _HUB_ID.match(name)
    if looks_local or demo:
        raise UsageError(
            f"{what} {name!r}: no such model folder. Give a local folder saved with save_pretrained, a Hub id such "
            f"as Qwen/Qwen2.5-VL-3B-Instruct, or {TINY_MODEL} (the tiny offline model).{demo}"
        )
    if _in_hub_cache(name, "config.json"):
        return name
    reason = hub_unreachable()
    if reason:
        raise UsageError(
            f"{what} {name!r} is not in the local Hugging Face cache and {reason}: download it where there is a "
            f"network (`hf download {name}`) and copy the cache or the folder here, or give a local model folder."
        )
    return name


def check_cache(building: bool = True) -> None:
    """The vepo_trl cache (where tiny models, the lab's warm start and the field rules go) can be written: a
    `VEPO_TRL_CACHE` that is a folder that can be written, or made (checked by the CLI at start-up); and, where a
    built-in model is `building`, the default folder (a read-only home): one line naming the folder and the fix,
    before a build fails deep in torch."""
    from .files import check_output
    from .utils import cache_root

    variable = os.environ.get("VEPO_TRL_CACHE")
    if variable:
        try:
            check_output("VEPO_TRL_CACHE", variable)
        except UsageError as error:
            raise UsageError(f"{error} (an environment variable: point it at a folder, or unset it)") from None
        return
    root = cache_root()
    if not building or (root.is_dir() and os.access(root, os.W_OK | os.X_OK)):
        return
    try:
        check_output("the vepo_trl cache", root)
    except UsageError as error:
        raise UsageError(
            f"{error} Set VEPO_TRL_CACHE to a folder you can write (the built-in models go there)."
        ) from None


def _check_cached_weights(path: Path) -> None:
    """A cached built-in model whose weights are damaged (a disk that filled up, a copy cut short): one line naming the
    folder to delete, instead of safetensors' error inside transformers."""
    from safetensors import safe_open

    from .errors import UsageError

    weights = Path(path) / "model.safetensors"
    try:
        with safe_open(str(weights), "pt") as handle:  # reads the header and checks it against the file's size
            if not list(handle.keys()):
                raise ValueError("no tensors")
    except Exception as error:  # truncated, empty, not safetensors, missing
        raise UsageError(
            f"the cached model {path} is damaged ({type(error).__name__}: {' '.join(str(error).split())[:120]}): "
            f"delete the folder {path} and rerun; it is built again in seconds."
        ) from None


def resolve_model_name(name: str) -> str:
    """The local path a built-in name stands for (building the model on first use); any other name is checked
    (`check_model_name`: a `UsageError` for a missing folder or an unreachable Hub id) and passes as is."""
    if name.startswith("tiny-") and not os.path.isdir(name):
        from accelerate import PartialState

        from .builtin.tiny_models import TINY_FAMILIES, tiny_model_path

        family = name.removeprefix("tiny-")
        if family in TINY_FAMILIES:
            check_cache()
            # Under torch.distributed only rank 0 writes weights: it builds, the other ranks then find the folder
            with PartialState().main_process_first():
                path = tiny_model_path(family=family)
            _check_cached_weights(path)
            return str(path)
    if name == LAB_MODEL and not os.path.isdir(name):
        from .builtin.warm_start import WarmStartConfig, warm_start_path

        # The first lab task's (one square's colour): the `lab` data set's, built on first use (minutes), then
        # cached; rank 0 builds
        return str(warm_start_path(WarmStartConfig.for_task("colour")))
    check_model_name(name, "model")
    return name
