"""download_model against a fake model hub served on 127.0.0.1 by this test."""

import errno
import hashlib
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import huggingface_hub.file_download as hf_file_download
import pytest

from desktop_app.services import downloads
from desktop_app.services.downloads import (
    OFFLINE_MESSAGE,
    DownloadCancelled,
    DownloadError,
    download_model,
    list_model_files,
    select_files,
)

SLOW_PIECE = 64 * 1024


class FakeHub:
    """The two hub endpoints huggingface_hub uses: the model info API and file resolution."""

    def __init__(self) -> None:
        self.repos: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.slow: set[str] = set()  # "repo/file" served in small pieces with pauses
        self.missing: set[str] = set()  # "repo/file" listed but answering 404
        self.ranges: list[tuple[str, int]] = []  # ("repo/file", first byte) of range requests

    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> str:
        sha = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = {"sha": sha, "files": files}
        return sha


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
                self._model_info(f"{parts[2]}/{parts[3]}", body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(f"{parts[0]}/{parts[1]}", "/".join(parts[4:]), body)
            else:
                self._error(404, "RepoNotFound", body)

        def _model_info(self, repo_id: str, body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", body)
            siblings = [{"rfilename": name, "size": len(data),
                         "blobId": hashlib.sha1(data).hexdigest()}
                        for name, data in repo["files"].items()]
            payload = json.dumps({"id": repo_id, "sha": repo["sha"],
                                  "siblings": siblings}).encode()
            self._send(200, {"Content-Type": "application/json"}, payload, body)

        def _resolve(self, repo_id: str, name: str, body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", body)
            data = repo["files"].get(name)
            if data is None or f"{repo_id}/{name}" in hub.missing:
                return self._error(404, "EntryNotFound", body, {"X-Repo-Commit": repo["sha"]})
            headers = {"X-Repo-Commit": repo["sha"],
                       "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                       "Content-Type": "application/octet-stream"}
            slow = f"{repo_id}/{name}" in hub.slow
            start = _range_start(self.headers.get("Range"))
            if start:  # a resumed download: the bytes from `start` on
                hub.ranges.append((f"{repo_id}/{name}", start))
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                return self._send(206, headers, data[start:], body, slow=slow)
            self._send(200, headers, data, body, slow=slow)

        def _error(self, code: int, error_code: str, body: bool, extra=None) -> None:
            headers = {"X-Error-Code": error_code, "Content-Type": "application/json",
                       **(extra or {})}
            self._send(code, headers, json.dumps({"error": error_code}).encode(), body)

        def _send(self, code: int, headers: dict, data: bytes, body: bool,
                  slow: bool = False) -> None:
            self.send_response(code)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            if not body:
                return
            try:
                step = SLOW_PIECE if slow else len(data) or 1
                for start in range(0, len(data), step):
                    self.wfile.write(data[start:start + step])
                    if slow:
                        self.wfile.flush()
                        time.sleep(0.02)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client cancelled

    return Handler


def _range_start(header: str | None) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes="):].split("-", 1)[0] or 0)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> dict[str, bytes]:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(folder)
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())}
    files["tokenizer_config.json"] = b'{"model_max_length": 64}'
    files["README.md"] = b"# tiny"
    files["pytorch_model.bin"] = b"not wanted"
    files["original/consolidated.safetensors"] = b"not wanted either"
    return files


@pytest.fixture(scope="module")
def hub(tiny_llama):
    fake = FakeHub()
    fake.add_repo("folio-test/tiny-llama", tiny_llama)
    fake.add_repo("folio-test/big", {"config.json": tiny_llama["config.json"],
                                      "model.safetensors": os.urandom(3 * 1024 * 1024)})
    fake.slow.add("folio-test/big/model.safetensors")
    fake.add_repo("folio-test/broken", {"config.json": b"{}", "model.safetensors": b"x" * 100})
    fake.missing.add("folio-test/broken/model.safetensors")
    fake.add_repo("folio-test/gguf-only", {"README.md": b"# q", "model-Q4_0.gguf": b"g" * 50,
                                           "model-Q8_0.gguf": b"h" * 90})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()


def _download(hub, repo_id, cache, **kwargs):
    return download_model(repo_id, endpoint=hub.endpoint, cache_dir=cache, token=False, **kwargs)


def _left_behind(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def _models(cache: Path) -> list[str]:
    """What the model list would see: the cache's model folders (not the partial ones)."""
    return [n for n in _left_behind(cache) if not n.startswith(".")]


def _partial(cache: Path, repo_id: str) -> Path:
    [folder] = cache.glob(".folio-partial-models--" + repo_id.replace("/", "--") + "-*")
    return folder


def test_select_files():
    names = ["config.json", "README.md", "model-00001-of-00002.safetensors",
             "model-00002-of-00002.safetensors", "model.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "generation_config.json", "pytorch_model.bin", "onnx/model.safetensors",
             "chat_template.jinja", "model.Q4_0.gguf"]
    assert select_files(names) == [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "generation_config.json", "chat_template.jinja"]
    assert select_files(names, "model.Q4_0.gguf") == [
        "config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "generation_config.json", "chat_template.jinja", "model.Q4_0.gguf"]
    assert select_files(["config.json", "pytorch_model.bin"]) == []
    assert select_files(names, "other.gguf") == []


def test_download_completes_with_increasing_progress(hub, tiny_llama, tmp_path):
    from transformers import AutoConfig

    cache = tmp_path / "hub"
    seen = []
    result = _download(hub, "folio-test/tiny-llama", cache, on_progress=seen.append)
    wanted = ["config.json", "generation_config.json", "model.safetensors",
              "tokenizer_config.json"]
    assert sorted(result.files) == wanted
    total = sum(len(tiny_llama[n]) for n in wanted)
    assert result.total_bytes == total
    done = [p.done_bytes for p in seen]
    assert done == sorted(done) and done[0] == 0 and done[-1] == total
    assert all(p.total_bytes == total for p in seen)
    assert (seen[-1].files_done, seen[-1].files_total) == (4, 4)
    assert result.path == (cache / "models--folio-test--tiny-llama" / "snapshots"
                           / hub.repos["folio-test/tiny-llama"]["sha"])
    assert sorted(p.name for p in result.path.iterdir()) == wanted
    for name in wanted:
        assert (result.path / name).read_bytes() == tiny_llama[name]
    refs = cache / "models--folio-test--tiny-llama" / "refs" / "main"
    assert refs.read_text() == result.commit
    assert _left_behind(cache) == ["models--folio-test--tiny-llama"]
    fetched = {p.rsplit("/", 1)[-1] for m, p in hub.requests if m == "GET" and "/resolve/" in p}
    assert "pytorch_model.bin" not in fetched and "README.md" not in fetched
    config = AutoConfig.from_pretrained(result.path)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("llama", 16, 1)


def test_second_download_reuses_the_cache(hub, tmp_path):
    cache = tmp_path / "hub"
    first = _download(hub, "folio-test/tiny-llama", cache)
    hub.requests.clear()
    second = _download(hub, "folio-test/tiny-llama", cache)
    assert second.path == first.path
    assert [p for _, p in hub.requests if "/resolve/" in p] == []


def test_list_model_files(hub):
    commit, files = list_model_files("folio-test/gguf-only", endpoint=hub.endpoint, token=False)
    assert commit == hub.repos["folio-test/gguf-only"]["sha"]
    assert [(f.name, f.size) for f in files] == [("README.md", 3), ("model-Q4_0.gguf", 50),
                                                 ("model-Q8_0.gguf", 90)]


def test_gguf_repo_needs_a_chosen_file(hub, tmp_path):
    cache = tmp_path / "hub"
    with pytest.raises(DownloadError) as info:
        _download(hub, "folio-test/gguf-only", cache)
    assert info.value.kind == "no_weights"
    assert "model-Q4_0.gguf, model-Q8_0.gguf" in info.value.message
    result = _download(hub, "folio-test/gguf-only", cache, gguf_file="model-Q8_0.gguf")
    assert result.files == ["model-Q8_0.gguf"]
    assert (result.path / "model-Q8_0.gguf").read_bytes() == b"h" * 90


def test_unknown_repo_gives_not_found_and_leaves_nothing(hub, tmp_path):
    cache = tmp_path / "hub"
    with pytest.raises(DownloadError) as info:
        _download(hub, "folio-test/missing", cache)
    assert info.value.kind == "not_found"
    assert "folio-test/missing was not found" in info.value.message
    assert _left_behind(cache) == []


def test_missing_file_mid_download_keeps_what_arrived_out_of_the_model_list(hub, tmp_path):
    cache = tmp_path / "hub"
    with pytest.raises(DownloadError) as info:
        _download(hub, "folio-test/broken", cache)
    assert info.value.kind == "not_found"
    # config.json arrived before the failure: kept for the next try, out of the model list.
    assert _models(cache) == []
    assert sorted(p.name for p in _partial(cache, "folio-test/broken").iterdir()) == [
        "config.json"]


def _cancel_mid_file(hub, cache):
    cancel = threading.Event()
    seen = []

    def on_progress(p):
        seen.append((p.file_name, p.done_bytes))
        if p.file_name == "model.safetensors" and p.done_bytes > len(hub.repos[
                "folio-test/big"]["files"]["config.json"]):
            cancel.set()

    with pytest.raises(DownloadCancelled) as info:
        _download(hub, "folio-test/big", cache, on_progress=on_progress, cancel=cancel)
    assert info.value.kind == "cancelled"
    return seen


def test_cancel_mid_file_keeps_the_bytes_out_of_the_model_list(hub, tmp_path):
    cache = tmp_path / "hub"
    seen = _cancel_mid_file(hub, cache)
    config_size = len(hub.repos["folio-test/big"]["files"]["config.json"])
    assert seen[-1] == ("model.safetensors", config_size + downloads.CHUNK_SIZE)
    assert _models(cache) == []
    partial = _partial(cache, "folio-test/big")
    assert (partial / "config.json").read_bytes() == hub.repos["folio-test/big"]["files"][
        "config.json"]
    assert (partial / "model.safetensors.part").stat().st_size >= downloads.CHUNK_SIZE


def test_a_cancelled_download_resumes_where_it_stopped(hub, tmp_path):
    cache = tmp_path / "hub"
    _cancel_mid_file(hub, cache)
    data = hub.repos["folio-test/big"]["files"]["model.safetensors"]
    kept = (_partial(cache, "folio-test/big") / "model.safetensors.part").stat().st_size
    assert 0 < kept < len(data)
    hub.requests.clear()
    hub.ranges.clear()
    seen = []
    result = _download(hub, "folio-test/big", cache, on_progress=seen.append)
    # config.json is not asked for again, and the weights only from the kept bytes on.
    assert [p for m, p in hub.requests if m == "GET" and "/resolve/" in p] == [
        f"/folio-test/big/resolve/{result.commit}/model.safetensors"]
    assert hub.ranges == [("folio-test/big/model.safetensors", kept)]
    config_size = len(hub.repos["folio-test/big"]["files"]["config.json"])
    done = [p.done_bytes for p in seen if p.file_name == "model.safetensors"]
    assert done[1] == config_size + kept  # the first report after the range request
    assert done == sorted(done) and seen[-1].done_bytes == result.total_bytes
    assert (result.path / "model.safetensors").read_bytes() == data
    assert _left_behind(cache) == ["models--folio-test--big"]  # the partial is gone


def test_cancel_before_start(hub, tmp_path):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(DownloadCancelled):
        _download(hub, "folio-test/tiny-llama", tmp_path / "hub", cancel=cancel)
    assert _left_behind(tmp_path / "hub") == []


def test_unreachable_hub_gives_offline_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(DownloadError) as info:
        download_model("folio-test/tiny-llama", endpoint=f"http://127.0.0.1:{port}",
                       cache_dir=tmp_path / "hub", token=False)
    assert (info.value.kind, info.value.message) == ("offline", OFFLINE_MESSAGE)
    assert _left_behind(tmp_path / "hub") == []


def test_not_enough_space_up_front(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(downloads, "_free_bytes", lambda path: 10)
    cache = tmp_path / "hub"
    with pytest.raises(DownloadError) as info:
        _download(hub, "folio-test/tiny-llama", cache)
    assert info.value.kind == "disk_full"
    assert info.value.message.startswith(f"not enough disk space in {cache}")
    assert _left_behind(cache) == []


def test_disk_full_while_writing_keeps_the_model_list_clean(hub, tmp_path, monkeypatch):
    def full_disk_get(url, temp_file, **kwargs):
        temp_file.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hf_file_download, "http_get", full_disk_get)
    cache = tmp_path / "hub"
    with pytest.raises(DownloadError) as info:
        _download(hub, "folio-test/tiny-llama", cache)
    assert info.value.kind == "disk_full"
    assert _models(cache) == []


def test_an_older_commits_partial_download_is_removed(hub, tmp_path):
    cache = tmp_path / "hub"
    old = cache / ".folio-partial-models--folio-test--gguf-only-0123abcd"
    other = cache / ".folio-partial-models--folio-test--big-0123abcd"
    old.mkdir(parents=True)
    other.mkdir()
    _download(hub, "folio-test/gguf-only", cache, gguf_file="model-Q4_0.gguf")
    assert _left_behind(cache) == [other.name, "models--folio-test--gguf-only"]


@pytest.mark.parametrize("kwargs, field", [
    ({"repo_id": "not a repo"}, "repo_id"),
    ({"repo_id": "a/b/c"}, "repo_id"),
    ({"repo_id": "a/b", "gguf_file": "model.bin"}, "gguf_file"),
])
def test_bad_arguments(kwargs, field, tmp_path):
    with pytest.raises(ValueError, match=field):
        download_model(cache_dir=tmp_path, endpoint="http://127.0.0.1:9", **kwargs)


def test_default_cache_follows_hf_hub_cache_env(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "env-cache"))
    result = download_model("folio-test/gguf-only", gguf_file="model-Q4_0.gguf",
                            endpoint=hub.endpoint, token=False)
    assert result.path == (tmp_path / "env-cache" / "models--folio-test--gguf-only"
                           / "snapshots" / result.commit)
    assert (result.path / "model-Q4_0.gguf").read_bytes() == b"g" * 50


def test_download_through_hf_endpoint_appears_in_the_model_list(hub, tmp_path, monkeypatch):
    """As a user's setup would: the hub address and the cache come from the environment."""
    from engine.loaders.catalog import list_local_models

    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    seen = []
    result = download_model("folio-test/tiny-llama", token=False, on_progress=seen.append)
    assert seen and seen[-1].done_bytes == seen[-1].total_bytes == result.total_bytes
    listed = {info.name: info for info in list_local_models()}
    assert "folio-test/tiny-llama" in listed
    info = listed["folio-test/tiny-llama"]
    assert (info.architecture, info.format) == ("llama", "hf")
    assert info.path == result.path
