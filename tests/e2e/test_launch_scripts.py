"""The multi-node SLURM script and the vLLM-server launcher, run with DRY_RUN=1: the commands they would start parse
with accelerate's and the training script's own parsers, and keep the paper's batches whatever the GPU count."""

import os
import shlex
import subprocess
import sys

import pytest
from accelerate.commands.launch import launch_command_parser

from ..support import (
    COMPLETIONS_PER_ROLLOUT,
    COMPLETIONS_PER_STEP,
    RECIPES,
    accelerate_argv,
    parse_argv,
    world_size,
)


SLURM = RECIPES / "slurm" / "train.slurm"
SERVER = RECIPES / "launch_vllm_server.sh"


def dry_run(script, *args, **env):
    result = subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        cwd=RECIPES.parent,
        # `python` is this environment's, as in the user's activated one (the scripts ask TRL for the server line)
        env={
            **os.environ,
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
            "DRY_RUN": "1",
            **{k: str(v) for k, v in env.items()},
        },
        timeout=60,
    )
    return result, [shlex.split(line) for line in result.stdout.splitlines() if line.strip()]


def training_run(command, node=0):
    """accelerate's launch arguments and the training script's, from a printed command that starts
    `accelerate launch ... vepo_trl/train.py ...`, the latter parsed as each of the launch's processes would."""
    argv = accelerate_argv(command, node)
    launch = launch_command_parser().parse_args(argv[2:])
    assert launch.training_script == "vepo_trl/train.py"
    with world_size(launch.num_processes):
        _, training_args, _ = parse_argv(launch.training_script_args)
    return launch, training_args


def check_batches(training_args, gpus):
    per_step = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * gpus
    per_rollout = training_args.per_device_train_batch_size * training_args.steps_per_generation * gpus
    assert (per_step, per_rollout) == (COMPLETIONS_PER_STEP, COMPLETIONS_PER_ROLLOUT)
    assert training_args.generation_batch_size == COMPLETIONS_PER_ROLLOUT  # TRL's own arithmetic agrees


@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
def test_slurm_multinode_launch(nodes):
    result, commands = dry_run(
        SLURM, "Qwen2.5-VL-7B-Instruct", "vepo/config_paper", "zero2", SLURM_JOB_NUM_NODES=nodes
    )
    assert result.returncode == 0, result.stderr
    (srun,) = commands
    launch, training_args = training_run(srun)
    assert (launch.num_machines, launch.num_processes, launch.machine_rank) == (nodes, 8 * nodes, 0)
    assert launch.main_process_ip == "node0" and launch.config_file.endswith("zero2.yaml")
    check_batches(training_args, 8 * nodes)
    assert training_args.use_vllm and training_args.vllm_mode == "colocate"  # the recipe's own generation


def assert_trls_serve_line(command, model, *, host, tensor_parallel):
    """`command` ends in the `vllm serve` line TRL's `trl vllm-serve` would run for these settings (TRL's own
    `build_command`), bound to `host`: never every interface."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    words = build_command(ScriptArguments(model=model, host=host, port=8000, tensor_parallel_size=tensor_parallel))
    expected = ["vllm", *words[words.index("serve") :]]
    assert command[command.index("vllm") :] == expected
    assert command[command.index("--host") + 1] == host != "0.0.0.0"


def test_slurm_with_a_vllm_node():
    result, commands = dry_run(
        SLURM, "Qwen2.5-VL-7B-Instruct", "vepo/config_paper", "zero3", "--vllm_node", SLURM_JOB_NUM_NODES=3
    )
    assert result.returncode == 0, result.stderr
    serve = next(c for c in commands if "serve" in c)
    train = next(c for c in commands if "bash" in c)
    assert "--nodelist=node2" in serve and "VLLM_SERVER_DEV_MODE=1" in serve
    assert_trls_serve_line(serve, "Qwen/Qwen2.5-VL-7B-Instruct", host="node2", tensor_parallel=4)
    launch, training_args = training_run(train, node=1)
    assert (launch.num_machines, launch.num_processes, launch.machine_rank) == (2, 16, 1)
    assert training_args.vllm_mode == "server" and training_args.vllm_server_host == "node2"
    assert training_args.vllm_server_timeout == 900
    check_batches(training_args, 16)


@pytest.mark.parametrize("address", ["10.1.2.3", "127.0.1.1", "0.0.0.0"])
def test_slurm_binds_the_vllm_nodes_cluster_address(address):
    """VLLM_SERVER_ADDR (or the node's name as the cluster resolves it) is where the server listens and the trainers
    connect; a loopback or wildcard address (a node's own /etc/hosts entry) is refused in one line."""
    result, commands = dry_run(
        SLURM, "Qwen2.5-VL-7B-Instruct", "vepo/config_paper", "zero3", "--vllm_node", SLURM_JOB_NUM_NODES=3,
        VLLM_SERVER_ADDR=address,
    )  # fmt: skip
    if address != "10.1.2.3":
        assert result.returncode == 2 and "VLLM_SERVER_ADDR" in result.stderr and not commands
        return
    assert result.returncode == 0, result.stderr
    serve = next(c for c in commands if "serve" in c)
    assert_trls_serve_line(serve, "Qwen/Qwen2.5-VL-7B-Instruct", host=address, tensor_parallel=4)
    _, training_args = training_run(next(c for c in commands if "bash" in c), node=0)
    assert training_args.vllm_server_host == address


def test_slurm_extra_flags_keep_their_quoting():
    # Extra flags go through srun's `bash -c` on every node: spaces and quotes must arrive as given
    result, commands = dry_run(
        SLURM, "Qwen2.5-VL-7B-Instruct", "vepo/config_paper", "zero2", "--run_name", "paper run", "--output_dir",
        "data/it's here", SLURM_JOB_NUM_NODES=2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (srun,) = commands
    _, training_args = training_run(srun, node=1)
    assert (training_args.run_name, training_args.output_dir) == ("paper run", "data/it's here")
    # SLURM opens logs/ before the script runs: the usage says to create it
    assert "mkdir -p logs" in SLURM.read_text()


def test_slurm_refuses_what_cannot_keep_the_paper_batch():
    result, _ = dry_run(
        SLURM, "Qwen2.5-VL-7B-Instruct", "vepo/config_paper", "zero2", "--vllm_node", SLURM_JOB_NUM_NODES=1
    )
    assert result.returncode == 2 and "at least 2 nodes" in result.stderr
    result, _ = dry_run(SLURM, "Qwen2.5-VL-7B-Instruct", "vepo/config_paper", "zero2", SLURM_JOB_NUM_NODES=5)
    assert result.returncode == 2 and "do not divide" in result.stderr


@pytest.mark.parametrize("vllm_gpus, train_gpus", [(2, 6), (4, 4)])
def test_vllm_server_launch_on_one_node(vllm_gpus, train_gpus):
    result, commands = dry_run(
        SERVER, "Qwen2.5-VL-3B-Instruct", "vepo/config_paper", "zero2", "--output_dir", "data/x", VLLM_GPUS=vllm_gpus
    )
    assert result.returncode == 0, result.stderr
    serve = next(c for c in commands if "serve" in c)
    train = next(c for c in commands if "accelerate" in c)
    devices = {c[1].split("=")[0]: c[1].split("=")[1] for c in (serve, train)}
    assert serve[1] == "CUDA_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(train_gpus, 8))
    assert train[1] == "CUDA_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(train_gpus)), devices
    # On this node only (the trainer connects to 127.0.0.1), tensor parallel over the server's GPUs
    assert serve[2] == "VLLM_SERVER_DEV_MODE=1"
    assert_trls_serve_line(serve, "Qwen/Qwen2.5-VL-3B-Instruct", host="127.0.0.1", tensor_parallel=vllm_gpus)
    launch, training_args = training_run(train)
    assert launch.num_processes == train_gpus
    assert training_args.vllm_mode == "server" and training_args.output_dir == "data/x"
    assert training_args.vllm_server_timeout == 900  # TRL's 240 s is short for a 7B server's start
    check_batches(training_args, train_gpus)


def test_vllm_server_launch_refuses_a_count_that_breaks_the_batch():
    result, _ = dry_run(SERVER, "Qwen2.5-VL-7B-Instruct", "vepo/config_paper", "zero2", VLLM_GPUS=1)
    assert result.returncode == 2 and "do not divide" in result.stderr
