"""services.worker_protocol.ModelWorker: the local and the remote worker, and the tests'
fakes, each implement the whole surface the bridge calls (it probes nothing)."""

from __future__ import annotations

import pytest

from desktop_app.services.local_worker import LocalWorker
from desktop_app.services.remote import RemoteLLM, RemoteWorker
from desktop_app.services.worker_protocol import ModelWorker
from tests.desktop_app.conftest import FakeLLM, FakeWorker
from tests.desktop_app.controllers.test_reply_reading import ReplayWorker

MEMBERS = sorted(name for name in vars(ModelWorker) if not name.startswith("_"))


def test_the_protocol_is_what_the_bridge_calls():
    assert MEMBERS == sorted([
        "model_name", "max_model_len", "tokenizer", "prompts", "is_remote",
        "beam_search_refusal", "submit",
        "cancel", "preload", "kv_stats", "memory_stats", "remote_status",
        "clear_disk",
        "set_activity_listener", "start", "shutdown"])


@pytest.mark.parametrize("cls", [LocalWorker, RemoteWorker, FakeWorker, ReplayWorker])
def test_every_worker_has_every_member(cls):
    assert [name for name in MEMBERS if not hasattr(cls, name)] == []


def test_the_remote_worker_answers_for_what_it_lacks():
    worker = RemoteWorker(RemoteLLM("http://127.0.0.1:9/v1", "served", max_model_len=4096))
    assert isinstance(worker, ModelWorker)
    assert (worker.model_name, worker.max_model_len, worker.is_remote) == ("served", 4096,
                                                                           True)
    assert worker.prompts is None and worker.tokenizer is None
    assert "this computer's models only" in worker.beam_search_refusal
    assert worker.kv_stats() is None and worker.memory_stats() is None
    worker.preload([{"role": "user", "content": "hi"}])  # nothing to load ahead
    worker.clear_disk()
    worker.set_activity_listener(lambda event: None)


def test_the_fake_worker_is_a_local_model_without_a_prompt_builder():
    worker = FakeWorker(FakeLLM(name="fake", max_model_len=512))
    assert isinstance(worker, ModelWorker)
    assert (worker.model_name, worker.max_model_len, worker.is_remote) == ("fake", 512, False)
    assert worker.prompts is None and worker.remote_status() is None
