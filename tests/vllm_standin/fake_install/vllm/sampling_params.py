"""`SamplingParams` / `StructuredOutputsParams` with the fields TRL sets."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class StructuredOutputsParams:
    regex: str | None = None
    json: object | None = None
    choice: list | None = None
    grammar: str | None = None


@dataclass
class SamplingParams:
    n: int = 1
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int | None = 16
    logprobs: int | None = None
    seed: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None

    def __post_init__(self):
        # vLLM's own conversion: keys to ints (JSON gives strings), biases clamped to [-100, 100]
        if self.logit_bias is not None:
            self.logit_bias = {int(k): min(100.0, max(-100.0, float(v))) for k, v in self.logit_bias.items()}

    @classmethod
    def from_request(cls, body: dict) -> SamplingParams:
        """The sampling fields of an HTTP request body (the rest, like `model` or `output_kind`, is not sampling)."""
        names = {f.name for f in fields(cls)}
        params = cls(**{k: v for k, v in body.items() if k in names and k != "structured_outputs"})
        if body.get("structured_outputs") is not None:
            params.structured_outputs = StructuredOutputsParams(**body["structured_outputs"])
        return params
