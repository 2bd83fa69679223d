"""OpenAI's Predicted Outputs on /v1/chat/completions: the prediction's tokens are drafted
and verified, the reply is the one the model writes without it, and usage counts the
accepted and rejected prediction tokens; a malformed prediction is a 400 naming it."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from engine.sampling_params import SamplingParams

MESSAGES = [{"role": "user", "content": "Return this file: def f(x):\n    return x + 1\n"}]


def post(served, body: dict) -> httpx.Response:
    return httpx.post(served.url + "/v1/chat/completions",
                      json={"model": served.model, "messages": MESSAGES, **body}, timeout=60)


def test_the_reply_is_unchanged_and_usage_counts_the_prediction(tiny_served):
    plain = post(tiny_served, {"max_tokens": 24, "temperature": 0})
    assert plain.status_code == 200, plain.text
    text = plain.json()["choices"][0]["message"]["content"]
    predicted = post(tiny_served, {"max_tokens": 24, "temperature": 0,
                                   "prediction": {"type": "content",
                                                  "content": [{"type": "text", "text": text}]}})
    assert predicted.status_code == 200, predicted.text
    body = predicted.json()
    assert body["choices"][0]["message"]["content"] == text
    details = body["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0
    assert details["rejected_prediction_tokens"] >= 0
    assert "completion_tokens_details" not in plain.json()["usage"]


@pytest.mark.parametrize(("prediction", "param"), [
    ("just text", "prediction"),
    ({"type": "audio", "content": "x"}, "prediction"),
    ({"type": "content", "content": 3}, "prediction.content"),
    ({"type": "content", "content": [{"type": "image_url"}]}, "prediction.content"),
    ({"type": "content", "content": "x", "extra": 1}, "prediction"),
])
def test_a_malformed_prediction_is_a_400_naming_it(tiny_served, prediction, param):
    response = post(tiny_served, {"max_tokens": 4, "prediction": prediction})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert "prediction" in error["message"]


def test_sampling_params_check_the_speculative_fields():
    with pytest.raises(ValueError, match="speculative"):
        SamplingParams(speculative="eagle")
    with pytest.raises(ValueError, match="prediction"):
        SamplingParams(prediction=3)
    assert SamplingParams(speculative="off", prediction="x").prediction == "x"
