"""The stand-in's server: the routes of `VLLM_SERVER_DEV_MODE=1 vllm serve` that TRL's `VLLMClient` calls, on a real
HTTP server, generating with `Engine`.

Images: `/v1/chat/completions/render` returns the images themselves (PNG, base64) as the opaque `features` TRL pairs
with token ids in `/inference/v1/generate`, with one `mm_placeholders["image"]` entry per image as vLLM does. Weights:
`/init_weight_transfer_engine` joins the trainer's transfer group (see `distributed.weight_transfer`),
`/update_weights` reads the announced tensors from it and loads them.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import torch
from PIL import Image

from ._standin import Engine
from .sampling_params import SamplingParams


class NotFound(LookupError):
    pass


class StandinServer:
    def __init__(self, model: str, host: str = "127.0.0.1", port: int = 0, seed: int = 0):
        self.model_name = model
        self.engine = Engine(model, seed=seed)
        self.calls: list[str] = []  # route of every request, in order
        self.weight_updates: list[list[str]] = []  # names announced by each /update_weights
        self.prompts_processed: list[list[int]] = []  # token ids of each image request, as the engine used them
        self.transfer: socket.socket | None = None
        self.updating = False
        self.http = ThreadingHTTPServer((host, port), _handler(self))
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.http.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> StandinServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.http.shutdown()
        self.http.server_close()
        if self.transfer is not None:
            self.transfer.close()

    # -- routes ----------------------------------------------------------------------------------------------------

    def server_info(self, query: str) -> dict:
        return {
            "vllm_config": {
                "model_config": {"model": self.model_name, "logprobs_mode": "processed_logprobs"},
                "weight_transfer_config": {"backend": "nccl"},
                "parallel_config": {"tensor_parallel_size": 1, "data_parallel_size": 1},
            }
        }

    def init_weight_transfer_engine(self, body: dict) -> dict:
        info = body["init_info"]
        deadline = time.monotonic() + 60.0
        while True:  # the trainer opens its end of the group while this request is in flight
            try:
                self.transfer = socket.create_connection((info["master_address"], info["master_port"]), timeout=60.0)
                return {}
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def update_weights(self, body: dict) -> dict:
        if self.transfer is None:
            raise RuntimeError("/update_weights before /init_weight_transfer_engine")
        info = body["update_info"]
        received = []
        for name, dtype_name, shape in zip(info["names"], info["dtype_names"], info["shapes"], strict=True):
            dtype = getattr(torch, dtype_name)
            size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            data = bytearray(size)
            view, read = memoryview(data), 0
            while read < size:
                got = self.transfer.recv_into(view[read:], size - read)
                if not got:
                    raise ConnectionError("the trainer closed the weight-transfer group mid-update")
                read += got
            received.append((name, torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)))
        self.engine.load_weights(received)
        self.weight_updates.append([name for name, _ in received])
        return {}

    def render(self, body: dict) -> dict:
        images = []
        for message in body["messages"]:
            for part in message["content"] if isinstance(message["content"], list) else []:
                if part.get("type") == "image_url":
                    images.append(part["image_url"]["url"].split(",", 1)[1])
        digests = [hashlib.sha256(image.encode()).hexdigest() for image in images]
        placeholders = [{"offset": 0, "length": 0} for _ in images]  # TRL recomputes them from the token ids
        return {
            "features": {"images": images, "mm_hashes": {"image": digests}, "mm_placeholders": {"image": placeholders}}
        }

    def generate_from_features(self, body: dict) -> dict:
        features = body.get("features")
        images = None
        if features is not None:
            images = [Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB") for data in features["images"]]
        params = SamplingParams.from_request(body["sampling_params"])
        if images:
            # vLLM places each image's embeddings at its `mm_placeholders` entry and applies no prompt update here:
            # each entry must cover exactly that image's run of feature tokens in the ids
            ids, token = body["token_ids"], self.engine.processor.image_token_id
            merge = self.engine.processor.image_processor.merge_size**2
            counts = (self.engine.image_inputs(images)["image_grid_thw"].prod(-1) // merge).tolist()
            placed = features["mm_placeholders"]["image"]
            for count, place in zip(counts, placed, strict=True):
                run = ids[place["offset"] : place["offset"] + place["length"]]
                if place["length"] != count or run != [token] * count:
                    raise ValueError(f"vLLM stand-in: placeholder {place} does not cover {count} image tokens")
        self.prompts_processed.append(list(body["token_ids"]))
        (samples,) = self.engine.generate([body["token_ids"]], [images], params)
        return {"request_id": body.get("request_id"), "choices": [_choice(s, params, chat=True) for s in samples]}

    def completions(self, body: dict) -> dict:
        prompts = body["prompt"]
        if not prompts or not isinstance(prompts[0], list):
            raise NotImplementedError("vLLM stand-in: /v1/completions takes token ids")
        params = SamplingParams.from_request(body)
        results = self.engine.generate(prompts, [None] * len(prompts), params)
        choices = []
        for ids, samples in zip(prompts, results):
            for sample in samples:
                choices.append({**_choice(sample, params, chat=False), "prompt_token_ids": ids})
        return {"choices": choices}

    def route(self, method: str, path: str, query: str, body: dict | None):
        self.calls.append(path)
        if method == "GET":
            routes = {
                "/health": lambda: {},
                "/v1/models": lambda: {"object": "list", "data": [{"id": self.model_name, "object": "model"}]},
                "/server_info": lambda: self.server_info(query),
                "/get_world_size": lambda: {"world_size": 1},
            }
            if path not in routes:
                raise NotFound(path)
            return routes[path]()
        routes = {
            "/init_weight_transfer_engine": self.init_weight_transfer_engine,
            "/start_weight_update": self.start_weight_update,
            "/update_weights": self.update_weights,
            "/finish_weight_update": self.finish_weight_update,
            "/reset_prefix_cache": lambda body: {"success": True},
            "/reset_encoder_cache": lambda body: {},
            "/v1/chat/completions/render": self.render,
            "/inference/v1/generate": self.generate_from_features,
            "/v1/completions": self.completions,
        }
        if path not in routes:
            raise NotFound(path)
        return routes[path](body or {})

    def start_weight_update(self, body: dict) -> dict:
        self.updating = True
        return {}

    def finish_weight_update(self, body: dict) -> dict:
        self.updating = False
        return {}


def _choice(sample, params: SamplingParams, *, chat: bool) -> dict:
    tokens, logprobs, _ = sample
    choice = {"index": 0, "token_ids": tokens, "finish_reason": "stop", "logprobs": None}
    if params.logprobs is None:
        return choice
    names = [f"token_id:{t}" for t in tokens]
    if chat:  # the chat / generate format: one entry per position
        content = [{"token": n, "logprob": lp, "top_logprobs": []} for n, lp in zip(names, logprobs)]
        choice["logprobs"] = {"content": content}
    else:  # the completions format
        choice["logprobs"] = {"tokens": names, "token_logprobs": logprobs, "top_logprobs": [{} for _ in names]}
    return choice


def _handler(server: StandinServer):
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str):
            url = urlparse(self.path)
            body = None
            if method == "POST":
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
            try:
                payload, status = server.route(method, url.path, url.query, body), 200
            except NotFound as error:
                payload, status = {"error": f"no route {error}"}, 404
            except Exception as error:  # noqa: BLE001 - reported to the client, which raises it
                payload, status = {"error": f"{type(error).__name__}: {error}"}, 400
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            self._serve("GET")

        def do_POST(self):  # noqa: N802
            self._serve("POST")

        def log_message(self, *args):
            pass

    return Handler
