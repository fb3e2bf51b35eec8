#!/bin/bash
# VEPO on one 8-GPU node with generation on GPUs of its own: vLLM's server on the last VLLM_GPUS GPUs (server mode),
# training on the others. Frees the training GPUs of vLLM's memory (colocate mode shares them).
#
# The server is the `vllm serve` line TRL 1.16 runs for `trl vllm-serve` (which it deprecates), built by TRL itself
# (`trl.scripts.vllm_serve.build_command`), in vLLM's dev mode (TRL's weight-transfer and cache routes), bound to
# 127.0.0.1: its weight routes (/update_weights, /init_weight_transfer_engine, /collective_rpc, /sleep, ...) take no
# authentication, and the trainer is on this node (docs/scaling.md).
#
#   bash recipes/launch_vllm_server.sh Qwen2.5-VL-7B-Instruct vepo/config_paper zero2
#   VLLM_GPUS=2 DRY_RUN=1 bash recipes/launch_vllm_server.sh ...   # print the commands, run nothing
#
# Batch arithmetic (recipes/README.md): 1536 completions per optimiser step, 6144 per rollout batch, 8 per GPU per
# micro-batch, G training GPUs: gradient_accumulation_steps = 1536 / (8 x G), steps_per_generation = 4 x that.
#   VLLM_GPUS=2 -> G = 6: 32 / 128      VLLM_GPUS=4 -> G = 4: 48 / 192      VLLM_GPUS=1 -> G = 7: does not divide
#
# The server runs tensor parallel over its VLLM_GPUS GPUs (2 and 4 divide the attention and key-value heads of
# Qwen2.5-VL-3B and -7B); vLLM's server refuses data parallelism for dense models in TRL's set-up (vLLM PR #30739).
# Training waits up to VLLM_SERVER_TIMEOUT seconds (default 900; TRL's 240 is short for a 7B server's start).
set -euo pipefail

MODEL=${1:?model folder under recipes/, e.g. Qwen2.5-VL-7B-Instruct}
RECIPE=${2:?recipe under the model folder without .yaml, e.g. vepo/config_paper}
ACCELERATE=${3:?accelerate config: ddp, zero2, zero3 or fsdp}
shift 3
GPUS=${GPUS:-8}
VLLM_GPUS=${VLLM_GPUS:-2}
TRAIN_GPUS=$((GPUS - VLLM_GPUS))
if ((TRAIN_GPUS < 1 || VLLM_GPUS < 1)); then
    echo "launch_vllm_server.sh: need at least one GPU for vLLM and one for training (GPUS=$GPUS, VLLM_GPUS=$VLLM_GPUS)" >&2
    exit 2
fi
if ((1536 % (8 * TRAIN_GPUS) != 0)); then
    echo "launch_vllm_server.sh: $TRAIN_GPUS training GPUs do not divide the paper's 1536 completions per step in micro-batches of 8; choose VLLM_GPUS so that 192 is a multiple of the training GPUs" >&2
    exit 2
fi
ACCUMULATION=$((1536 / (8 * TRAIN_GPUS)))
TRAIN_DEVICES=$(seq -s, 0 $((TRAIN_GPUS - 1)))
VLLM_DEVICES=$(seq -s, "$TRAIN_GPUS" $((GPUS - 1)))
SERVED_MODEL=$(awk '/^model_name_or_path:/ {print $2}' "recipes/$MODEL/$RECIPE.yaml")

run() {
    if [[ -n "${DRY_RUN:-}" ]]; then
        # One write per command: the background one must not interleave with the other
        local line
        line=$(printf '%q ' "$@")
        printf '%s\n' "$line"
    else
        "$@"
    fi
}

# TRL's own `vllm serve` line (recipes/vllm_serve_command.py), bound to this node only
mapfile -d '' -t SERVE < <(python recipes/vllm_serve_command.py "$SERVED_MODEL" 127.0.0.1 "$VLLM_GPUS")
if ((${#SERVE[@]} < 3)); then
    echo "launch_vllm_server.sh: could not build the vllm serve command with TRL (is trl installed?)" >&2
    exit 2
fi
run env CUDA_VISIBLE_DEVICES="$VLLM_DEVICES" VLLM_SERVER_DEV_MODE=1 "${SERVE[@]}" &
run env CUDA_VISIBLE_DEVICES="$TRAIN_DEVICES" accelerate launch \
    --config_file "recipes/accelerate_configs/$ACCELERATE.yaml" --num_processes "$TRAIN_GPUS" \
    vepo_trl/train.py --config "recipes/$MODEL/$RECIPE.yaml" \
    --per_device_train_batch_size 8 --gradient_accumulation_steps "$ACCUMULATION" \
    --steps_per_generation $((4 * ACCUMULATION)) \
    --use_vllm true --vllm_mode server --vllm_server_host 127.0.0.1 --vllm_server_port 8000 \
    --vllm_server_timeout "${VLLM_SERVER_TIMEOUT:-900}" "$@"
wait
