"""The `vllm serve` command line TRL runs for `trl vllm-serve` (which TRL 1.16 deprecates), as TRL itself builds it
(`trl.scripts.vllm_serve.build_command`: the flags it imposes follow the installed TRL and vLLM), bound to HOST on port
8000. Printed as NUL-separated words for the launch scripts (`mapfile -d ''`).

    python recipes/vllm_serve_command.py MODEL HOST TENSOR_PARALLEL_SIZE
"""

import sys

from trl.scripts.vllm_serve import ScriptArguments, build_command


def main(model: str, host: str, tensor_parallel_size: str) -> None:
    words = build_command(
        ScriptArguments(model=model, host=host, port=8000, tensor_parallel_size=int(tensor_parallel_size))
    )
    print("\0".join(["vllm", *words[words.index("serve") :]]), end="")


if __name__ == "__main__":
    main(*sys.argv[1:])
