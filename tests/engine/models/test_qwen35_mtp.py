"""Qwen3.5's MTP head (engine/models/qwen35_mtp.py) against the head written in plain
PyTorch from the same weights (tests/engine/tiny_mtp.py: transformers' Qwen3.5 layers in
vLLM's arrangement), dense and MoE: its forward through the paged KV cache in two chunks,
and the engine's drafts, which read the target's final-norm hidden states as captured
from the target's own forwards."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.sampling_params import SamplingParams
from tests.engine.tiny_models import random_prompt
from tests.engine.tiny_mtp import mtp_config, reference_head, save_mtp_model

ATOL = 1e-4


@pytest.fixture(scope="module", params=["dense", "moe"])
def model(request, tmp_path_factory):
    from engine import LLM

    config = mtp_config(moe=request.param == "moe")
    folder = save_mtp_model(tmp_path_factory.mktemp("mtp") / request.param, config)
    engine = LLM(str(folder), num_gpu_blocks=64, kv_cache_dtype="float32", block_size=8,
                 dtype="float32", speculative="mtp").engine
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return engine, hf, reference_head(folder, config)


def final_hidden(hf, tokens: list[int]) -> torch.Tensor:
    """The target's hidden states after its final norm [T, hidden] (what feeds the head)."""
    with torch.no_grad():
        return hf.model(torch.tensor([tokens])).last_hidden_state[0]


def reference(hf, head, tokens: list[int], hidden: torch.Tensor) -> torch.Tensor:
    """The head over positions 0..len(tokens)-1: token i + 1 and hidden state i."""
    with torch.no_grad():
        return head(hf.model.embed_tokens(torch.tensor(tokens)), hidden)


def test_the_heads_forward_equals_the_reference(model):
    engine, hf, head = model
    mtp = engine._speculator.draft
    tokens = random_prompt(5, 22)
    hidden = final_hidden(hf, tokens)
    want = reference(hf, head, tokens[1:], hidden[:-1])
    request = mtp.scheduler.add_request("t", tokens[1:13], SamplingParams(
        temperature=0, max_tokens=None, ignore_eos=True))
    seq = request.seqs[0]
    for rows in (hidden[:12], hidden[12:-1]):  # a prefill chunk, then the rest
        out = mtp.scheduler.schedule()
        logits, got = mtp.runner.run(out, rows)
        seq.num_computed_tokens += out.scheduled[0].num_new_tokens
        end = seq.num_computed_tokens
        torch.testing.assert_close(got[0], want[end - 1], atol=ATOL, rtol=0)
        torch.testing.assert_close(logits[0], hf.lm_head(want[end - 1]).detach(),
                                   atol=ATOL, rtol=0)
        seq.token_ids += tokens[end + 1:]
    mtp.scheduler.abort("t")


def test_drafts_equal_the_references_from_the_targets_hidden_states(model):
    engine, hf, head = model
    mtp = engine._speculator.draft
    # Decoded plainly ("off"): the drafts are asked for here, after each step.
    request_id = engine.add_request(random_prompt(6, 19), SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, speculative="off"))
    request = engine.scheduler.requests[request_id]
    mtp.track(request)
    seq = request.seqs[0]
    checked = 0
    while engine.has_unfinished_requests():
        engine.step()
        if seq.is_finished or seq.num_uncomputed_tokens != 1:
            continue
        drafts = mtp.propose([(seq, 3)])[seq.seq_id]
        tokens = list(seq.token_ids)
        hidden = final_hidden(hf, tokens[:-1])
        inputs, rows, want = tokens[1:], hidden, []
        for _ in range(3):
            out = reference(hf, head, inputs, rows)
            want.append(int(hf.lm_head(out[-1]).argmax()))
            inputs, rows = inputs + want[-1:], torch.cat([rows, out[-1:]])
        assert drafts == want, f"after {len(tokens)} tokens"
        checked += 1
    assert checked >= 8
