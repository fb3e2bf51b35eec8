"""The recipes: each YAML file parses into the training script's dataclasses with the paper's settings, each accelerate
config loads the way `accelerate launch` loads it, and every command in recipes/README.md names real files and flags."""

import dataclasses
import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import launch_command_parser
from trl import ModelConfig, get_peft_config

from vepo_trl.config import VEPOConfig
from vepo_trl.train import VEPOScriptArguments

from .support import COMPLETIONS_PER_ROLLOUT, COMPLETIONS_PER_STEP, RECIPES, accelerate_argv, parse_argv, world_size


REPO = Path(__file__).resolve().parent.parent
ACCELERATE_CONFIGS = RECIPES / "accelerate_configs"
MODELS = ("Qwen2.5-VL-7B-Instruct", "Qwen2.5-VL-3B-Instruct")

# The selection settings of the four 8-GPU recipes of each model; everything else they share
PAPER_RECIPES = {
    "vepo/config_paper.yaml": {
        "selection_strategy": "vepo",
        "selection_ratio": 0.2,
        "selection_alpha": 0.7,
        "perturbation": "diffusion",
        "noise_step": 500,
        "noise_annealing": False,
    },
    "grpo/config_full.yaml": {"selection_strategy": "full"},
    "grpo/config_entropy_top20.yaml": {"selection_strategy": "entropy", "selection_ratio": 0.2},
    "grpo/config_entropy_top40.yaml": {"selection_strategy": "entropy", "selection_ratio": 0.4},
}
LORA_RECIPE = "vepo/config_lora.yaml"
PAPER_GPUS = 8

# A CPU machine has no bf16 GPU, and TrainingArguments refuses `bf16: true` there unless the run is on the CPU: the
# recipes stay as they run on GPUs and the tests parse them as CPU runs
CPU = ("--use_cpu", "true")
TRAINING_FLAGS = {
    f.name for dataclass in (VEPOScriptArguments, VEPOConfig, ModelConfig) for f in dataclasses.fields(dataclass)
} | {"config"}
LAUNCH_FLAGS = {option for action in launch_command_parser()._actions for option in action.option_strings}


def parse(config, *overrides):
    return parse_argv(["--config", str(config), *overrides])


def model_recipes():
    return sorted(path.relative_to(RECIPES).as_posix() for path in RECIPES.glob("Qwen2.5-VL-*/**/*.yaml"))


# ------------------------------------------------------------------------------------------------------------------
# Recipes
# ------------------------------------------------------------------------------------------------------------------


def test_every_recipe_is_covered_here():
    expected = [f"{model}/{name}" for model in MODELS for name in [*PAPER_RECIPES, LORA_RECIPE]]
    assert model_recipes() == sorted(expected)


@pytest.mark.parametrize("recipe", model_recipes())
def test_recipe_has_the_open_r1_sections(recipe):
    lines = (RECIPES / recipe).read_text().splitlines()
    headers = [line for line in lines if line in ("# Model arguments", "# Data arguments", "# Trainer arguments")]
    assert headers == ["# Model arguments", "# Data arguments", "# Trainer arguments"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", list(PAPER_RECIPES))
def test_paper_recipe(model, name):
    script_args, training_args, model_args = parse(RECIPES / model / name)

    assert model_args.model_name_or_path == f"Qwen/{model}"
    assert model_args.dtype == "bfloat16"
    assert model_args.attn_implementation == "flash_attention_2"
    assert not model_args.use_peft

    assert script_args.dataset_name == "paper_mix"
    assert script_args.dataset_train_split == "train"
    assert script_args.reward_funcs == ["accuracy", "format"]
    assert training_args.reward_weights == [0.9, 0.1]
    assert (script_args.min_pixels, script_args.max_pixels) == (262_144, 1_000_000)
    assert script_args.freeze_vision_tower

    for key, value in PAPER_RECIPES[name].items():
        assert getattr(training_args, key) == value, key
    # GRPO's batch-wide entropy filter stays off: the selection strategy does the filtering
    assert training_args.top_entropy_quantile == 1.0

    # 8 GPUs: 8 x 24 x 8 = 1536 completions (128 prompts x 12) per optimiser step; 4 steps per rollout batch
    per_device = training_args.per_device_train_batch_size
    accumulation = training_args.gradient_accumulation_steps
    assert training_args.num_generations == 12
    assert per_device * accumulation * PAPER_GPUS == COMPLETIONS_PER_STEP
    assert training_args.steps_per_generation == 4 * accumulation
    assert per_device * training_args.steps_per_generation * PAPER_GPUS == COMPLETIONS_PER_ROLLOUT
    assert training_args.num_iterations == 1
    assert training_args.temperature == 1.0
    assert training_args.max_completion_length == 2048
    assert training_args.num_train_epochs == 20

    assert training_args.learning_rate == 1e-6
    assert training_args.weight_decay == 0.01
    assert training_args.max_grad_norm == 1.0
    assert training_args.beta == 0.0
    assert training_args.epsilon == 0.2
    assert training_args.epsilon_high in (None, 0.2)  # None: the upper clip is epsilon too
    assert training_args.loss_type == "bnpo"
    assert training_args.entropy_coef == 0.0  # the release's 1e-3 bonus is not in the paper

    assert training_args.use_vllm and training_args.vllm_mode == "colocate"
    assert training_args.vllm_gpu_memory_utilization == 0.35
    # Room for ~1,300 image tokens (1e6 pixels / 28^2), the question and the completion
    assert training_args.vllm_max_model_length >= 1_000_000 // 28**2 + 512 + training_args.max_completion_length
    assert training_args.bf16 and training_args.activation_checkpointing
    assert training_args.seed == 42 and not training_args.push_to_hub
    assert training_args.log_completions and training_args.logging_steps == 1
    assert training_args.output_dir.startswith(f"data/{model}-")

    # Evaluation batches hold whole prompt groups on 8 GPUs
    if training_args.eval_strategy != "no":
        assert script_args.eval_dataset_name
        eval_generations = training_args.num_generations_eval or training_args.num_generations
        assert training_args.per_device_eval_batch_size * PAPER_GPUS % eval_generations == 0


SELECTION_KEYS = {"selection_strategy", "selection_ratio", "selection_alpha", "perturbation", "noise_step"}


def load_yaml(path):
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("model", MODELS)
def test_paper_recipes_differ_only_in_selection(model):
    recipes = {name: load_yaml(RECIPES / model / name) for name in PAPER_RECIPES}
    vepo = recipes["vepo/config_paper.yaml"]
    for name, recipe in recipes.items():
        differing = {key for key in vepo.keys() | recipe.keys() if vepo.get(key) != recipe.get(key)}
        assert differing <= SELECTION_KEYS | {"noise_annealing", "output_dir"}, name
    # A run resumes from its output_dir: runs must not share one
    assert len({recipe["output_dir"] for recipe in recipes.values()}) == len(recipes)


@pytest.mark.parametrize("name", [*PAPER_RECIPES, LORA_RECIPE])
def test_3b_recipes_are_the_7b_recipes(name):
    big, small = (load_yaml(RECIPES / model / name) for model in MODELS)
    differing = {key for key in big.keys() | small.keys() if big.get(key) != small.get(key)}
    assert differing <= {"model_name_or_path", "output_dir", "vllm_gpu_memory_utilization"}
    assert small["model_name_or_path"] == "Qwen/Qwen2.5-VL-3B-Instruct"


# Module names of a real Qwen2.5-VL checkpoint, and whether the LoRA recipes adapt them
QWEN2_5_VL_MODULES = {
    "model.language_model.layers.0.self_attn.q_proj": True,
    "model.language_model.layers.27.self_attn.o_proj": True,
    "model.language_model.layers.3.mlp.gate_proj": True,
    "model.language_model.layers.3.mlp.down_proj": True,
    "lm_head": False,
    "model.language_model.embed_tokens": False,
    "model.visual.blocks.0.attn.qkv": False,
    "model.visual.blocks.0.mlp.gate_proj": False,  # same projection names as the language model's MLP
    "model.visual.blocks.31.mlp.down_proj": False,
    "model.visual.merger.mlp.0": False,
}


@pytest.mark.parametrize("model", MODELS)
def test_lora_recipe(model):
    script_args, training_args, model_args = parse(RECIPES / model / LORA_RECIPE)

    assert model_args.model_name_or_path == f"Qwen/{model}"
    assert model_args.use_peft
    assert (model_args.lora_r, model_args.lora_alpha) == (64, 128)
    assert (training_args.per_device_train_batch_size, training_args.num_generations) == (4, 4)
    assert training_args.gradient_accumulation_steps == 8
    assert training_args.steps_per_generation == 4 * training_args.gradient_accumulation_steps
    assert training_args.max_completion_length == 1024
    assert training_args.selection_strategy == "vepo" and training_args.selection_ratio == 0.2
    assert training_args.reward_weights == [0.9, 0.1] and script_args.reward_funcs == ["accuracy", "format"]
    assert script_args.freeze_vision_tower
    assert training_args.use_vllm and training_args.vllm_mode == "colocate"
    assert training_args.vllm_gpu_memory_utilization <= 0.3

    peft_config = get_peft_config(model_args)
    # A string is a regular expression that PEFT matches against each module's full name
    assert isinstance(peft_config.target_modules, str)
    for name, adapted in QWEN2_5_VL_MODULES.items():
        assert bool(re.fullmatch(peft_config.target_modules, name)) == adapted, name


def test_lora_targets_exactly_the_language_model_projections():
    from peft import get_peft_model

    from vepo_trl.builtin.tiny_models import build_model, build_processor

    _, _, model_args = parse(RECIPES / MODELS[0] / LORA_RECIPE)
    model = get_peft_model(build_model(build_processor()), get_peft_config(model_args))
    adapted = [name for name, module in model.named_modules() if hasattr(module, "lora_A")]
    assert adapted and all(".language_model.layers." in name for name in adapted)
    projections = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert {name.rsplit(".", 1)[-1] for name in adapted} == projections
    layers = model.base_model.model.config.text_config.num_hidden_layers
    assert len(adapted) == layers * len(projections)


ABLATIONS = [
    (["--selection_strategy", "vepo_no_jsd"], {"selection_strategy": "vepo_no_jsd"}),
    (["--selection_strategy", "vepo_kl"], {"selection_strategy": "vepo_kl", "selection_ratio": 0.2}),
    (["--selection_ratio", "0.3", "--selection_alpha", "0.5"], {"selection_ratio": 0.3, "selection_alpha": 0.5}),
    (["--selection_strategy", "vepo_bottom"], {"selection_strategy": "vepo_bottom", "selection_ratio": 0.2}),
    (["--perturbation", "gaussian", "--noise_sigma", "2.0"], {"perturbation": "gaussian", "noise_sigma": 2.0}),
    (["--noise_annealing", "true"], {"noise_annealing": True, "noise_step": 500}),
    (["--entropy_coef", "0.001"], {"entropy_coef": 0.001}),
]


@pytest.mark.parametrize(("overrides", "expected"), ABLATIONS)
def test_ablation_overrides_the_paper_recipe(overrides, expected):
    _, training_args, _ = parse(RECIPES / MODELS[0] / "vepo/config_paper.yaml", *overrides)
    for key, value in expected.items():
        assert getattr(training_args, key) == value, key
    assert training_args.learning_rate == 1e-6  # the rest of the recipe stays


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["--selection_strategy", "vepo_jsd"],
            r"--selection_strategy 'vepo_jsd': must be a selection strategy \(one of ",
        ),
        (["--selection_ratio", "20"], r"--selection_ratio 20(\.0)?: must be in \(0, 1\]: k, the fraction"),
        (["--perturbation", "blur"], "--perturbation 'blur': must be a perturbation"),
        (["--top_entropy_quantile", "0.2"], "Leave top_entropy_quantile at 1.0"),
    ],
)
def test_invalid_override_fails_with_vepo_config_message(overrides, message):
    with pytest.raises(ValueError, match=message):
        parse(RECIPES / MODELS[0] / "vepo/config_paper.yaml", *overrides)


# ------------------------------------------------------------------------------------------------------------------
# Accelerate configs
# ------------------------------------------------------------------------------------------------------------------

ACCELERATE = {
    "ddp": ("MULTI_GPU", {}),
    "zero2": ("DEEPSPEED", {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "2", "ACCELERATE_DEEPSPEED_ZERO3_INIT": "false"}),
    "zero3": (
        "DEEPSPEED",
        {
            "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
            "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",
            "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true",
        },
    ),
    "fsdp": ("FSDP", {"FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP"}),
}


def test_every_accelerate_config_is_covered_here():
    assert sorted(path.stem for path in ACCELERATE_CONFIGS.glob("*.yaml")) == sorted(ACCELERATE)


@pytest.mark.parametrize("name", list(ACCELERATE))
def test_accelerate_config_loads(name):
    path = ACCELERATE_CONFIGS / f"{name}.yaml"
    config = load_config_from_file(str(path))  # what `accelerate launch --config_file` calls
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type.value == ACCELERATE[name][0]
    assert (config.num_machines, config.num_processes, config.mixed_precision) == (1, 8, "bf16")
    assert not config.use_cpu
    # Nested keys become `accelerate launch` flags: each must be one
    for key in [*config.deepspeed_config, *config.fsdp_config]:
        assert f"--{key}" in LAUNCH_FLAGS, key
    assert "--num_processes" in path.read_text()  # the header says how to change the GPU count


@pytest.mark.parametrize("name", list(ACCELERATE))
def test_accelerate_launch_environment(name, monkeypatch):
    """What `accelerate launch --config_file <name>.yaml` hands the training processes."""
    # accelerate's own launch steps (private helpers: this test follows the pinned accelerate)
    from accelerate.commands.launch import _validate_launch_command
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(ACCELERATE_CONFIGS / f"{name}.yaml"), "x.py"])
    args, defaults, _ = _validate_launch_command(args)
    assert args.num_processes == 8 and args.mixed_precision == "bf16"
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join([*defaults.deepspeed_config, "mixed_precision"])
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    for key, value in ACCELERATE[name][1].items():
        assert env[key] == value, key
    if args.use_fsdp:
        from accelerate.utils import FullyShardedDataParallelPlugin
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

        for key, value in env.items():
            if key.startswith(("FSDP_", "ACCELERATE_")):
                monkeypatch.setenv(key, value)
        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
        assert plugin.cpu_ram_efficient_loading and not plugin.activation_checkpointing
        # The wrapped classes exist in transformers' Qwen2.5-VL and are its own no-split units
        assert plugin.transformer_cls_names_to_wrap == ["Qwen2_5_VLDecoderLayer", "Qwen2_5_VLVisionBlock"]
        for cls_name in plugin.transformer_cls_names_to_wrap:
            assert cls_name in modeling_qwen2_5_vl.Qwen2_5_VLModel._no_split_modules


# ------------------------------------------------------------------------------------------------------------------
# recipes/README.md
# ------------------------------------------------------------------------------------------------------------------

README = (RECIPES / "README.md").read_text()


def readme_commands():
    """Each command of the README's bash blocks, with `for X in ...; do` loops expanded over their values."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.DOTALL):
        loops = []
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if match := re.fullmatch(r"for (\w+) in (.+); do", line):
                loops.append((match[1], match[2].split()))
            elif line == "done":
                loops.pop()
            elif line:
                for values in itertools.product(*(values for _, values in loops)):
                    command = line
                    for (variable, _), value in sorted(zip(loops, values), key=lambda x: -len(x[0][0])):
                        command = command.replace(f"${variable}", value)
                    commands.append(command)
        assert not loops, "unclosed loop in a README code block"
    return commands


COMMANDS = readme_commands()


def evaluate_flags(capsys):
    from vepo_trl.cli import main

    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    return set(re.findall(r"--\w+", capsys.readouterr().out))


def check_training_args(argv, num_processes):
    flags = [token for token in argv if token.startswith("-")]
    assert set(flag[2:] for flag in flags) <= TRAINING_FLAGS, flags
    recipe = REPO / argv[argv.index("--config") + 1]
    assert recipe.is_file(), recipe
    _, training_args, _ = parse_argv(argv)
    if recipe.relative_to(RECIPES).as_posix().split("/", 1)[-1] in PAPER_RECIPES:
        # Any GPU count the README shows keeps the paper's global and rollout batches
        per_device = training_args.per_device_train_batch_size
        assert per_device * training_args.gradient_accumulation_steps * num_processes == COMPLETIONS_PER_STEP
        assert per_device * training_args.steps_per_generation * num_processes == COMPLETIONS_PER_ROLLOUT


def test_readme_has_commands_of_each_kind():
    starts = {" ".join(command.split()[:2]) for command in COMMANDS}
    assert {"accelerate launch", "vepo-trl train", "python -m", "vepo-trl eval"} <= starts
    # Loops are expanded: the paper's (k, alpha) grid is 3 x 5 runs
    assert sum("--selection_alpha" in command for command in COMMANDS) == 15


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command(command, capsys):
    tokens = shlex.split(command, comments=True)
    assert "$" not in command, "a shell variable the loops do not set"
    if tokens[:2] == ["accelerate", "launch"]:
        args = launch_command_parser().parse_args(tokens[2:])
        assert args.config_file and (REPO / args.config_file).is_file(), args.config_file
        if args.module:
            assert importlib.util.find_spec(args.training_script), args.training_script
        else:
            assert (REPO / args.training_script).is_file(), args.training_script
        num_processes = args.num_processes or load_config_from_file(str(REPO / args.config_file)).num_processes
        check_training_args(args.training_script_args, num_processes)
    elif tokens[:2] == ["vepo-trl", "train"]:
        check_training_args(tokens[2:], 1)
    elif tokens[:3] == ["python", "-m", "vepo_trl.train"]:
        check_training_args(tokens[3:], 1)
    elif tokens[:2] in (["vepo-trl", "eval"], ["vepo-trl", "evaluate"]):
        known = evaluate_flags(capsys)
        assert {token for token in tokens if token.startswith("--")} <= known
    elif any(token.endswith(("slurm/train.slurm", "launch_vllm_server.sh")) for token in tokens):
        # The launchers, run as DRY_RUN: every accelerate launch they would start is checked like the ones above
        env = dict(os.environ, DRY_RUN="1", SLURM_JOB_NUM_NODES="1")
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # the user's python
        while "=" in tokens[0]:  # VAR=value prefixes
            name, _, value = tokens.pop(0).partition("=")
            env[name] = value
        if tokens[0] == "sbatch":  # sbatch's own options set the node count
            env["SLURM_JOB_NUM_NODES"] = tokens[tokens.index("--nodes") + 1]
            tokens = ["bash", *tokens[tokens.index("--nodes") + 2 :]]
        result = subprocess.run(tokens, capture_output=True, text=True, cwd=REPO, env=env, timeout=30)
        assert result.returncode == 0, result.stderr
        launches = [accelerate_argv(shlex.split(line)) for line in result.stdout.splitlines()]
        launches = [launch for launch in launches if launch]
        assert launches, result.stdout
        for launch in launches:
            args = launch_command_parser().parse_args(launch[2:])
            with world_size(args.num_processes):
                check_training_args(args.training_script_args, args.num_processes)
    elif tokens == ["mkdir", "-p", "logs"]:  # the folder train.slurm's #SBATCH --output writes into
        assert "#SBATCH --output=logs/" in (RECIPES / "slurm" / "train.slurm").read_text()
    else:
        pytest.fail(f"recipes/README.md shows a command this test does not check: {command}")


def test_readme_flags_exist(capsys):
    # `sbatch --nodes` and the SLURM script's own `--vllm_node` (tests/e2e/test_launch_scripts.py)
    launcher_flags = {"--nodes", "--vllm_node"}
    known = {f"--{name}" for name in TRAINING_FLAGS} | LAUNCH_FLAGS | evaluate_flags(capsys) | launcher_flags
    flags = set(re.findall(r"(?<![\w-])--[a-z]\w*", README))
    assert flags and flags <= known, sorted(flags - known)


@pytest.mark.parametrize("overrides", sorted(set(re.findall(r"`(--[^`]+ [^`]+)`", README))))
def test_readme_overrides_apply_to_the_paper_recipe(overrides):
    """Each override the README quotes inline (the ablation table) is valid on top of the paper recipe."""
    argv = shlex.split(overrides)
    if {token for token in argv if token.startswith("--")} <= LAUNCH_FLAGS - {f"--{name}" for name in TRAINING_FLAGS}:
        pytest.skip("accelerate flags")
    _, training_args, model_args = parse(RECIPES / MODELS[0] / "vepo/config_paper.yaml", *argv)
    for flag, value in zip(argv[::2], argv[1::2]):
        parsed = getattr(training_args, flag[2:], getattr(model_args, flag[2:], None))
        assert str(parsed).lower() == value.lower(), flag


def test_readme_lists_existing_files():
    for path in re.findall(r"`([\w./{},-]+\.yaml)`", README):
        head, _, rest = path.partition("{")
        names, _, tail = rest.partition("}")
        for name in names.split(",") if rest else [""]:
            assert (RECIPES / f"{head}{name}{tail}").is_file(), path
