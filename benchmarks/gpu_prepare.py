"""Prepare a GPU machine that has no package registry: the wheels it lacks, in one folder that travels with the tree.

The GPU machines this project is sometimes lent (one H100 or H200, Python 3.12, their own torch, transformers,
accelerate and peft; no TRL, datasets, math-verify, qwen-vl-utils or DeepSpeed; no registry, no Hub) take only what
is copied to them. This script, run on a machine with PyPI:

1. walks the dependency closure of `vepo-trl[deepspeed]` as installed here (the versions CI tests);
2. keeps what the GPU image lacks, or holds at a version outside a requirement of the closure
   (`GPU_IMAGE`: the image's package list, with the versions read off it);
3. downloads exactly those releases as CPython 3.12 manylinux x86_64 wheels into `.gpu-wheels/` (git-ignored),
   building DeepSpeed's wheel here without its CUDA ops (PyPI has only its sdist; the ops JIT-compile on first use);
4. checks the folder (one wheel per package, tags that install on 3.12 x86_64, under 64 MiB in all) and prints the
   one command to run on the GPU machine.

    python benchmarks/gpu_prepare.py            # download, build, check, print the device command
    python benchmarks/gpu_prepare.py --check    # only check an existing folder against this environment
    python benchmarks/gpu_prepare.py --plan     # only print what would be carried and why

Run it from the virtual environment that has `vepo-trl[dev,deepspeed]` installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version


ROOT = Path(__file__).resolve().parent.parent
WHEEL_DIR = ROOT / ".gpu-wheels"
LIMIT_BYTES = 64 * 2**20  # what travels with the working tree, in all
TARGET_PYTHON = "3.12"
# pip matches each manylinux tag exactly: these cover every wheel of the closure seen so far
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
ROOT_REQUIREMENT = "vepo-trl[deepspeed]"
# Beyond the package's runtime needs: SmolVLM's processor spells numbers with num2words (the dev extra's)
EXTRA_REQUIREMENTS = ("num2words>=0.5",)

# The GPU image's Python packages (read off the machine on 2026-11-17; versions where a session printed them).
# A name with a version is carried only when that version misses a requirement of the closure; one without is
# taken as present at a version that fits.
GPU_IMAGE_VERSIONS = {
    "accelerate": "1.15.0",
    "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "torchvision": "0.26.0",
    "transformers": "5.17.0",
    "triton": "3.6.0",
}
GPU_IMAGE = set(GPU_IMAGE_VERSIONS) | {
    canonicalize_name(name)
    for name in """
    absl-py aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click
    cloudpickle colorama contourpy cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cycler cython einops filelock
    fonttools frozenlist fsspec h11 h5py hf-xet httpcore httpx idna imageio iniconfig jinja2 joblib kiwisolver
    lazy-loader markdown markdown-it-py markupsafe matplotlib mdurl ml-dtypes mpmath msgpack multidict networkx ninja
    nvidia-ml-py packaging pandas pathspec peft pillow pip pluggy portalocker propcache protobuf psutil pyarrow
    nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvjitlink
    nvidia-nvshmem-cu13 nvidia-nvtx pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pytest python-dateutil pyyaml regex requests rich scipy
    setuptools shellingham six sympy tqdm typer typing-extensions urllib3 wheel xxhash yarl zipp
    """.split()
}
# Requirements of the closure left behind on purpose: what needs them is never run by the acceptance command
LEFT_OUT = {
    "av": "qwen-vl-utils reads videos with it; vepo_trl imports only its image resizing (a 35 MB wheel)",
    "docopt": "num2words' command line only (and PyPI has no wheel of it)",
}
# Built here from the sdist (PyPI has no wheel); DS_BUILD_OPS=0 leaves the CUDA ops to DeepSpeed's JIT
BUILT_HERE = {"deepspeed"}


@dataclass
class Carried:
    name: str
    version: str
    why: str


def _environment() -> dict:
    env = default_environment()
    env.update(python_version=TARGET_PYTHON, python_full_version=f"{TARGET_PYTHON}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", implementation_name="cpython")  # fmt: skip
    return env


def closure(
    root: str = ROOT_REQUIREMENT, provided: frozenset[str] = frozenset()
) -> dict[str, tuple[str, list[tuple[str, Requirement]]]]:
    """Every installed distribution `root` needs on the target Python: name -> (installed version, [(who, req)]).
    The requirements of a `provided` package are the image's business: they are not followed."""
    env = _environment()
    found: dict[str, tuple[str, list[tuple[str, Requirement]]]] = {}
    stack = [("(root)", Requirement(root))] + [("(root)", Requirement(extra)) for extra in EXTRA_REQUIREMENTS]
    while stack:
        parent, requirement = stack.pop()
        name = canonicalize_name(requirement.name)
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            if parent == "(root)":
                sys.exit(f"gpu_prepare.py: {requirement.name} is not installed here; run it from the project's venv")
            found.setdefault(name, ("", []))[1].append((parent, requirement))
            continue
        first = name not in found
        found.setdefault(name, (version, []))[1].append((parent, requirement))
        if not first or name in provided:
            continue
        for text in metadata.requires(name) or []:
            child = Requirement(text)
            extras = requirement.extras or {""}
            if child.marker is None or any(child.marker.evaluate({**env, "extra": extra}) for extra in extras):
                stack.append((name, child))
    return found


def _misses(name: str, required_by: list[tuple[str, Requirement]]) -> list[str]:
    """The requirements the image's version of `name` does not satisfy (none when its version is not known)."""
    if name not in GPU_IMAGE_VERSIONS:
        return []
    image = Version(GPU_IMAGE_VERSIONS[name])
    return [
        f"{parent} needs {req.specifier}" for parent, req in required_by if not req.specifier.contains(image, True)
    ]


def plan() -> tuple[list[Carried], list[str]]:
    """What to carry (name, version, why) and the notes on what is left behind or missing here."""
    provided = frozenset(GPU_IMAGE)
    while True:  # an image package whose version misses a requirement is carried, and its own needs followed
        found = closure(provided=provided)
        short = {name for name in provided & set(found) if _misses(name, found[name][1])}
        if not short:
            break
        provided -= short
    carried, notes = [], []
    for name, (version, required_by) in sorted(found.items()):
        if name == "vepo-trl":
            continue  # installed from the working tree on the machine
        if name in LEFT_OUT:
            notes.append(f"left out {name}: {LEFT_OUT[name]}")
            continue
        if not version:
            wanted_by = ", ".join(sorted({p for p, _ in required_by}))
            notes.append(f"missing here: {name} (needed by {wanted_by}); pip install -e '.[dev,deepspeed]' first")
            continue
        misses = _misses(name, required_by)
        if misses:
            carried.append(Carried(name, version, f"image has {GPU_IMAGE_VERSIONS[name]}; {'; '.join(misses)}"))
        elif name not in GPU_IMAGE:
            carried.append(Carried(name, version, f"not in the image (needed by {required_by[0][0]})"))
    return carried, notes


def target_tags() -> set[Tag]:
    return set(cpython_tags((3, 12), platforms=PLATFORMS)) | set(compatible_tags((3, 12), "cp312", PLATFORMS))


def check(folder: Path, wanted: list[Carried]) -> list[str]:
    """Problems with `folder` against the plan; empty when it is complete and fits."""
    problems = []
    if not folder.is_dir():
        return [f"{folder} does not exist: run benchmarks/gpu_prepare.py"]
    wheels = sorted(folder.glob("*.whl"))
    strays = sorted(p.name for p in folder.iterdir() if p.suffix != ".whl")
    if strays:
        problems.append(f"not wheels: {', '.join(strays)}")
    by_name: dict[str, list[tuple[Version, Path]]] = {}
    tags = target_tags()
    for wheel in wheels:
        name, version, _, wheel_tags = parse_wheel_filename(wheel.name)
        by_name.setdefault(name, []).append((version, wheel))
        if not wheel_tags & tags:
            problems.append(f"{wheel.name} does not install on CPython 3.12 x86_64")
    for item in wanted:
        have = by_name.pop(canonicalize_name(item.name), [])
        if not have:
            problems.append(f"missing {item.name}=={item.version}")
        elif len(have) > 1:
            problems.append(f"{item.name}: {len(have)} wheels ({', '.join(p.name for _, p in have)}); keep one")
        elif have[0][0] != Version(item.version):
            problems.append(f"{item.name}: wheel {have[0][0]}, this environment tests {item.version}")
    for _, extra in sorted(by_name.items()):
        problems.append(f"not in the plan: {', '.join(p.name for _, p in extra)}")
    total = sum(w.stat().st_size for w in wheels)
    if total > LIMIT_BYTES:
        problems.append(f"{total / 2**20:.1f} MiB of wheels, over the {LIMIT_BYTES // 2**20} MiB that can travel")
    return problems


def download(folder: Path, wanted: list[Carried]) -> None:
    folder.mkdir(exist_ok=True)
    keep = {canonicalize_name(item.name): item for item in wanted}
    for wheel in folder.glob("*.whl"):  # drop stale versions and packages no longer needed
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if name not in keep or version != Version(keep[name].version):
            wheel.unlink()
    have = {parse_wheel_filename(w.name)[0] for w in folder.glob("*.whl")}
    fetch = [item for item in wanted if canonicalize_name(item.name) not in have and item.name not in BUILT_HERE]
    if fetch:
        platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--python-version", TARGET_PYTHON, "--implementation", "cp", *platforms, "-d", str(folder),
                   *[f"{item.name}=={item.version}" for item in fetch]]  # fmt: skip
        subprocess.run(command, check=True)
    for item in wanted:
        if item.name in BUILT_HERE and canonicalize_name(item.name) not in have:
            with tempfile.TemporaryDirectory() as build:
                env = {**os.environ, "DS_BUILD_OPS": "0", "DS_SKIP_CUDA_CHECK": "1"}
                subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                                "--no-binary", item.name, "-w", build, f"{item.name}=={item.version}"],
                               check=True, env=env)  # fmt: skip
                for wheel in Path(build).glob("*.whl"):
                    shutil.move(str(wheel), folder / wheel.name)


def device_command(folder: Path) -> str:
    """The command to run in the repository root on the GPU machine (the folder carried with the tree)."""
    relative = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
    return (
        f"python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site {relative}/*.whl && "
        "python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . && "
        "export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH && "
        "python3 benchmarks/gpu_acceptance.py --out ${OUT:-gpu-acceptance}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=WHEEL_DIR, help="the wheel folder (default: .gpu-wheels/)")
    parser.add_argument("--check", action="store_true", help="only check the folder")
    parser.add_argument("--plan", action="store_true", help="only print what would be carried and why")
    args = parser.parse_args()
    wanted, notes = plan()
    for item in wanted:
        print(f"carry {item.name}=={item.version:<12} {item.why}")
    for note in notes:
        print(note)
    if args.plan:
        return
    missing = [note for note in notes if note.startswith("missing here")]
    if missing:
        # Carrying a partial closure would only fail on the GPU machine, minutes into a lent slot
        sys.exit(f"gpu_prepare.py: {missing[0]}")
    if not args.check:
        download(args.dir, wanted)
    problems = check(args.dir, wanted)
    total = sum(w.stat().st_size for w in args.dir.glob("*.whl")) if args.dir.is_dir() else 0
    for problem in problems:
        print(f"problem: {problem}")
    if problems:
        sys.exit(1)
    print(f"{len(wanted)} wheels, {total / 2**20:.1f} MiB of {LIMIT_BYTES // 2**20} MiB, in {args.dir}")
    print("On the GPU machine, carrying that folder, in the repository root:")
    print("  " + device_command(args.dir))


if __name__ == "__main__":
    main()
