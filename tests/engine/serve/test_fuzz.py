"""schemathesis generates requests from the server's own OpenAPI schema (valid bodies and
edge cases of every field, negative ones included); none may end in a 500."""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from engine.serve.app import ServeSettings
from tests.engine.embeddings.tiny_embedders import save_tiny_bert
from tests.engine.serve.conftest import Served

EMBEDDER = "tiny-embedder"

pytestmark = pytest.mark.slow

OPERATIONS = ["POST /v1/chat/completions", "POST /v1/completions", "POST /v1/embeddings",
              "GET /v1/models", "GET /health", "GET /metrics", "GET /v1/status"]


@pytest.fixture(scope="module")
def tiny_served(tiny_llm, tmp_path_factory):
    # schemathesis calls the ASGI app with Host "testserver": a name the server must be
    # told it is served under, as a user behind a proxy would (--allowed-hosts).
    embedder = save_tiny_bert(tmp_path_factory.mktemp("embedder") / EMBEDDER)
    served = Served(tiny_llm, ServeSettings(max_body_bytes=64 * 1024, max_waiting=8,
                                            allowed_hosts="testserver",
                                            embedding_model=str(embedder)))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def api_schema(tiny_served):
    return schemathesis.openapi.from_asgi("/openapi.json", tiny_served.server.app)


def test_the_schema_lists_every_route(api_schema):
    labels = [result.ok().label for result in api_schema.get_all_operations()]
    assert sorted(labels) == sorted(OPERATIONS)


CASES = [(label, GenerationMode.POSITIVE) for label in OPERATIONS] + [
    (label, GenerationMode.NEGATIVE) for label in OPERATIONS if label.startswith("POST")]


def _serving(case, model: str):
    if isinstance(case.body, dict):
        case.body["model"] = model
    return case


@pytest.mark.parametrize(("label", "mode"), CASES)
def test_no_request_makes_a_server_error(api_schema, tiny_served, label, mode):
    operation = api_schema.find_operation_by_label(label)
    strategy = operation.as_strategy(generation_mode=mode)
    if mode is GenerationMode.POSITIVE:
        # A random model name only ever meets the 404: name the served one, so that the
        # generated sampling settings, messages and prompts reach the engine.
        served = EMBEDDER if label.endswith("embeddings") else tiny_served.model
        strategy = strategy.map(lambda case: _serving(case, served))

    @given(case=strategy)
    @settings(max_examples=20, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case):
        case.call_and_validate(checks=[not_a_server_error])

    check()
    # Every request ran to its end: nothing holds a block.
    deadline = time.monotonic() + 10
    while tiny_served.worker.kv_stats().num_used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tiny_served.worker.kv_stats().num_used == 0
