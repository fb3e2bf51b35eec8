"""A stand-in for vLLM, for tests: the API surface TRL's `use_vllm=True` paths call (`LLM`, `SamplingParams`,
`RequestOutput`; the server in `_standin_server`), generating with the tiny checkpoint through transformers.

Prompts are treated as vLLM 0.31 treats them: `LLM.generate` applies vLLM's prompt update to token prompts with images
(each image's placeholder expands to its feature tokens, `_standin.Engine.prompt_update`) and returns the processed
ids as `RequestOutput.prompt_token_ids`; the server's `/inference/v1/generate` takes features with their placeholders,
to which vLLM applies no update.

Not vLLM: no paged attention, no CUDA. Put this folder on `sys.path` to make it the installed `vllm`
(tests/vllm_standin/__init__.py does, for the tests that need it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from ._standin import Engine
from .sampling_params import SamplingParams


__version__ = "0.30.0"
__all__ = ["LLM", "CompletionOutput", "Logprob", "RequestOutput", "SamplingParams"]


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    text: str = ""


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class _Model:
    """`llm.llm_engine.model_executor.driver_worker.model_runner.model`: where TRL's colocate sync loads weights."""

    def __init__(self, llm: LLM):
        self.llm = llm

    def load_weights(self, weights):
        if "weights" in self.llm.sleeping:
            raise RuntimeError("vLLM stand-in: load_weights while the weights sleep (wake_up(tags=['weights']) first)")
        return self.llm.engine.load_weights(weights)


class LLM:
    """Colocate mode: one engine in the training process."""

    instances: list[LLM] = []  # every engine built, for tests to inspect

    def __init__(self, model: str, seed: int = 0, max_model_len: int | None = None, enable_sleep_mode=False, **kwargs):
        self.kwargs = dict(kwargs, model=model, seed=seed, max_model_len=max_model_len)
        self.engine = Engine(model, seed=seed)
        self.enable_sleep_mode = enable_sleep_mode
        self.sleeping: set[str] = set()
        self.calls: list[tuple] = []  # (method, argument) of each sleep / wake_up / reset_prefix_cache / generate
        # Each prompt as TRL sent it and as vLLM's prompt update left it (what the engine generated from)
        self.prompts_received: list[list[int]] = []
        self.prompts_processed: list[list[int]] = []
        text_config = getattr(self.engine.model.config, "text_config", self.engine.model.config)
        model_config = SimpleNamespace(max_model_len=max_model_len or text_config.max_position_embeddings)
        runner = SimpleNamespace(model=_Model(self))
        self.llm_engine = SimpleNamespace(
            model_config=model_config,
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner)),
            reset_encoder_cache=lambda: self.calls.append(("reset_encoder_cache", None)),
        )
        LLM.instances.append(self)

    def generate(self, prompts, sampling_params: SamplingParams | None = None, use_tqdm=True, **kwargs):
        if self.sleeping:
            raise RuntimeError(f"vLLM stand-in: generate while asleep ({sorted(self.sleeping)})")
        params = sampling_params or SamplingParams()
        self.calls.append(("generate", len(prompts)))
        ids, images = [], []
        for prompt in prompts:
            image = (prompt.get("multi_modal_data") or {}).get("image")
            images.append(None if image is None else image if isinstance(image, list) else [image])
            # Token prompts go through vLLM's prompt update, as in vLLM: placeholders expand against the images
            ids.append(self.engine.prompt_update(list(prompt["prompt_token_ids"]), images[-1]))
        self.prompts_received.extend(list(prompt["prompt_token_ids"]) for prompt in prompts)
        self.prompts_processed.extend(ids)
        outputs = []
        for i, (prompt_ids, samples) in enumerate(zip(ids, self.engine.generate(ids, images, params))):
            completions = [
                CompletionOutput(
                    index=j,
                    token_ids=tokens,
                    logprobs=None
                    if params.logprobs is None
                    else [{t: Logprob(lp, rank)} for t, lp, rank in zip(tokens, logprobs, ranks)],
                )
                for j, (tokens, logprobs, ranks) in enumerate(samples)
            ]
            outputs.append(RequestOutput(request_id=str(i), prompt_token_ids=prompt_ids, outputs=completions))
        return outputs

    def sleep(self, level: int = 1) -> None:
        if not self.enable_sleep_mode:
            raise RuntimeError("vLLM stand-in: sleep() needs enable_sleep_mode=True")
        self.calls.append(("sleep", level))
        self.sleeping = {"weights", "kv_cache"}
        if level == 2:
            self.engine.discard_weights()

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tuple(tags or ())))
        self.sleeping -= set(tags or {"weights", "kv_cache"})

    def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset_prefix_cache", None))
        return True
