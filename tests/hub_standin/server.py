"""A stand-in of the Hugging Face Hub's HTTP API on 127.0.0.1, for what `huggingface_hub`'s real client sends when a
run pushes a model: repository creation, the commit API with its LFS protocol, repository info.

Copied from the behaviour `huggingface_hub` 2.4's client expects (its `create_repo`, `_fetch_upload_modes`,
`post_lfs_batch_info`, `lfs_upload` and `_send_commit`), not from an idea of it:

- `POST /api/repos/create` makes `{organization}/{name}` with the Hub's first commit (a `.gitattributes`); an existing
  repo answers 409 with its `url`, which `create_repo(exist_ok=True)` accepts.
- `POST /api/models/{repo}/preupload/{revision}` says per file "lfs" or "regular" as a new Hub repo does: the LFS
  patterns of the Hub's default `.gitattributes` (weights, archives, ...) or 10 MB and over are LFS; a file whose
  content the repo holds already comes back with its `oid`, so the client skips it.
- `POST /{repo}.git/info/lfs/objects/batch` answers each object with an upload action to
  `PUT /lfs-upload/{oid}` (none when the object is stored); the bytes must hash to the oid.
- `POST /api/models/{repo}/commit/{revision}` takes the client's NDJSON (header, `file` base64, `lfsFile` by oid,
  `deletedFile` / `deletedFolder`); an `lfsFile` whose object never arrived fails, as on the Hub.
- `POST /api/validate-yaml`, which the client calls before committing a README.md: the card's YAML front matter must
  parse, and a `model-index` must have the fields the Hub requires of each result (task type, dataset type and name,
  metrics with type and value); errors come back as 400 with `errors`, as the Hub answers.
- Every write needs `Authorization: Bearer <token>` with the stand-in's token (401 otherwise).

Not served: Xet storage (`hf_xet`). Its client talks to a separate chunk store; the tests set `HF_HUB_DISABLE_XET=1`
so the client uses the LFS protocol, which the Hub still accepts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from fnmatch import fnmatch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


# The LFS patterns of the .gitattributes the Hub writes into a new model repo (its first commit)
LFS_PATTERNS = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*", "*.mlmodel",
    "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt",
    "*.pth", "*.rar", "*.safetensors", "*.tar.*", "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst",
    "*tfevents*",
)  # fmt: skip
LFS_SIZE = 10 * 1024 * 1024
GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in LFS_PATTERNS).encode()


def git_blob_sha(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class HubStandin:
    """The stand-in's state: repos (files as bytes, commits), stored LFS objects, and every request seen."""

    def __init__(self, token: str = "hf_standin_token"):
        self.token = token
        self.repos: dict[str, dict] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo_id: str) -> dict[str, bytes]:
        return self.repos[repo_id]["files"]

    def commits(self, repo_id: str) -> list[dict]:
        return self.repos[repo_id]["commits"]

    def lfs_paths(self, repo_id: str) -> set[str]:
        return set(self.repos[repo_id]["lfs_paths"])

    def _commit(self, repo_id: str, summary: str, changes: dict[str, bytes | None], lfs_paths=()) -> str:
        repo = self.repos[repo_id]
        for path, content in changes.items():
            if content is None:
                for existing in [p for p in repo["files"] if p == path or p.startswith(path.rstrip("/") + "/")]:
                    del repo["files"][existing]
                    repo["lfs_paths"].discard(existing)
            else:
                repo["files"][path] = content
        repo["lfs_paths"].update(lfs_paths)
        oid = hashlib.sha1(f"{repo_id}{len(repo['commits'])}{summary}".encode()).hexdigest()
        repo["commits"].append({"oid": oid, "summary": summary, "paths": sorted(changes)})
        return oid


def card_metadata_errors(content: str) -> list[str]:
    """What the Hub's metadata validation would refuse in a README.md: YAML that does not parse, a `model-index`
    without the fields every result needs."""
    import yaml

    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", content, re.DOTALL)
    if not match:
        return []
    try:
        metadata = yaml.safe_load(match[1]) or {}
    except yaml.YAMLError as error:
        return [f"YAML: {error}"]
    errors = []
    for entry in metadata.get("model-index") or []:
        if not entry.get("name"):
            errors.append('"model-index[0].name" is required')
        for result in entry.get("results") or []:
            if not (result.get("task") or {}).get("type"):
                errors.append('"model-index[0].results[].task.type" is required')
            dataset = result.get("dataset") or {}
            if not dataset.get("type") or not dataset.get("name"):
                errors.append('"model-index[0].results[].dataset" needs "type" and "name"')
            for metric in result.get("metrics") or [{}]:
                if not metric.get("type") or "value" not in metric:
                    errors.append('"model-index[0].results[].metrics[]" needs "type" and "value"')
    return errors


def _is_lfs(path: str, size: int) -> bool:
    name = path.rsplit("/", 1)[-1]
    return size >= LFS_SIZE or any(fnmatch(name, pattern) for pattern in LFS_PATTERNS)


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandin

    def log_message(self, *args):  # quiet: the tests read `hub.requests`
        pass

    def _reply(self, status: int, body=None, content_type="application/json"):
        data = b"" if body is None else (json.dumps(body).encode() if content_type == "application/json" else body)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if status >= 400 and isinstance(body, dict) and "error" in body:
            self.send_header("X-Error-Message", body["error"])
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.hub.token}":
            return True
        self._reply(401, {"error": "Invalid credentials in Authorization header"})
        return False

    def _repo(self, repo_id: str):
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._reply(404, {"error": "Repository not found"})
        return repo

    # -- routes -----------------------------------------------------------------------------------------------------

    def do_GET(self):
        self.hub.requests.append(("GET", self.path))
        if self.path.startswith("/api/whoami-v2"):
            if self._authorized():
                self._reply(200, {"type": "user", "name": self.hub.token_user, "auth": {"type": "access_token"}})
            return
        match = re.match(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/?]+))?(?:\?.*)?$", self.path)
        if match:
            with self.hub.lock:
                repo = self._repo(match[1])
                if repo is None:
                    return
                siblings = [{"rfilename": path} for path in sorted(repo["files"])]
                self._reply(200, {"id": match[1], "sha": repo["commits"][-1]["oid"], "siblings": siblings})
            return
        self._reply(404, {"error": f"not served by the stand-in: GET {self.path}"})

    def do_POST(self):
        self.hub.requests.append(("POST", self.path))
        body = self._body()
        if self.path == "/api/repos/create":
            return self._create(json.loads(body))
        if self.path == "/api/validate-yaml":
            errors = card_metadata_errors(json.loads(body)["content"])
            return self._reply(400 if errors else 200, {"errors": [{"message": e} for e in errors], "warnings": []})
        match = re.match(r"^/api/models/([^/]+/[^/]+)/preupload/([^/?]+)", self.path)
        if match:
            return self._preupload(match[1], json.loads(body))
        match = re.match(r"^/([^/]+/[^/]+)\.git/info/lfs/objects/batch$", self.path)
        if match:
            return self._lfs_batch(match[1], json.loads(body))
        match = re.match(r"^/api/models/([^/]+/[^/]+)/commit/([^/?]+)", self.path)
        if match:
            return self._commit(match[1], body)
        self._reply(404, {"error": f"not served by the stand-in: POST {self.path}"})

    def do_PUT(self):
        self.hub.requests.append(("PUT", self.path))
        body = self._body()
        match = re.match(r"^/lfs-upload/([0-9a-f]{64})$", self.path)
        if not match:
            return self._reply(404, {"error": f"not served by the stand-in: PUT {self.path}"})
        if hashlib.sha256(body).hexdigest() != match[1]:
            return self._reply(400, {"error": "content does not match its oid"})
        with self.hub.lock:
            self.hub.lfs[match[1]] = body
        self._reply(200, {})

    def _create(self, payload):
        if not self._authorized():
            return
        repo_type = payload.get("type") or "model"
        if repo_type != "model":
            return self._reply(400, {"error": f"the stand-in serves model repos, not {repo_type}"})
        owner = payload.get("organization") or "tester"
        repo_id = f"{owner}/{payload['name']}"
        url = f"{self.hub.endpoint}/{repo_id}"
        with self.hub.lock:
            if repo_id in self.hub.repos:
                return self._reply(409, {"error": "You already created this model repo", "url": url})
            self.hub.repos[repo_id] = {
                "files": {},
                "commits": [],
                "lfs_paths": set(),
                "visibility": payload.get("visibility"),
            }
            self.hub._commit(repo_id, "initial commit", {".gitattributes": GITATTRIBUTES})
        self._reply(200, {"url": url, "name": repo_id})

    def _preupload(self, repo_id, payload):
        if not self._authorized():
            return
        with self.hub.lock:
            repo = self._repo(repo_id)
            if repo is None:
                return
            files = []
            for entry in payload["files"]:
                mode = "lfs" if _is_lfs(entry["path"], int(entry["size"])) else "regular"
                existing = repo["files"].get(entry["path"])
                oid = None
                if existing is not None:
                    oid = hashlib.sha256(existing).hexdigest() if mode == "lfs" else git_blob_sha(existing)
                files.append({"path": entry["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self._reply(200, {"files": files, "commitOid": repo["commits"][-1]["oid"]})

    def _lfs_batch(self, repo_id, payload):
        if not self._authorized():
            return
        with self.hub.lock:
            if self._repo(repo_id) is None:
                return
            objects = []
            for item in payload["objects"]:
                entry = {"oid": item["oid"], "size": item["size"], "authenticated": True}
                if item["oid"] not in self.hub.lfs:
                    entry["actions"] = {
                        "upload": {"href": f"{self.hub.endpoint}/lfs-upload/{item['oid']}", "header": {}}
                    }
                objects.append(entry)
        self._reply(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}, "application/json")

    def _commit(self, repo_id, body):
        if not self._authorized():
            return
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = next((line["value"] for line in lines if line["key"] == "header"), {})
        changes, lfs_paths = {}, set()
        with self.hub.lock:
            if self._repo(repo_id) is None:
                return
            for line in lines:
                key, value = line["key"], line["value"]
                if key == "file":
                    changes[value["path"]] = base64.b64decode(value["content"])
                elif key == "lfsFile":
                    content = self.hub.lfs.get(value["oid"])
                    if content is None:
                        return self._reply(
                            422, {"error": f"LFS object {value['oid']} of {value['path']} was never uploaded"}
                        )
                    changes[value["path"]] = content
                    lfs_paths.add(value["path"])
                elif key in ("deletedFile", "deletedFolder"):
                    changes[value["path"]] = None
            oid = self.hub._commit(repo_id, header.get("summary", ""), changes, lfs_paths)
        self._reply(
            200, {"commitUrl": f"{self.hub.endpoint}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
        )


HubStandin.token_user = "tester"
