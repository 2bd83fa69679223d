"""The MTP head after an image: on a tiny Qwen3.5 vision-language folder that ships an
MTP head, the head reads every index at the position the target model computed it at
(M-RoPE's 3-D positions on the image's tokens, the shifted ones after it, drafts
included), embeds an image's tokens as the image's rows, as the target did, and greedy
replies with ``speculative="mtp"`` equal plain decode's."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.chat import ChatRequest
from tests.engine.tiny_models import calm_qwen35_weights
from tests.engine.tiny_mtp import ReferenceMTP
from tests.engine.vision.test_qwen35_vision_engine import CHATS
from tests.engine.vision.tiny_qwen35_vl import (
    qwen35_vl_tokenizer,
    save_tiny_qwen35_vl,
    tiny_qwen35_vl_config,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
TEXT_ONLY = [{"role": "user", "content": "what is in the picture, now?"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny dense Qwen3.5 VL folder with a random MTP head (``mtp.*`` at the top
    level, ``mtp_num_hidden_layers`` in its text config, as the releases ship them)."""
    path = save_tiny_qwen35_vl(tmp_path_factory.mktemp("mtpvl") / "mtpvl", seed=5)
    text = tiny_qwen35_vl_config(qwen35_vl_tokenizer()).text_config
    text._attn_implementation = "eager"
    torch.manual_seed(6)
    head = ReferenceMTP(text)
    calm_qwen35_weights(head, 6)
    tensors = load_file(path / "model.safetensors")
    tensors |= {f"mtp.{name}": t.contiguous() for name, t in head.state_dict().items()
                if not name.startswith("rotary.")}
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(config))
    return path


def engine(folder, **fields) -> LLM:
    return LLM(str(folder), num_gpu_blocks=128, block_size=8, kv_cache_dtype="float32",
               vision_dtype="float32", **fields)


def record_positions(runner, owner_of) -> dict[tuple[int, int], tuple[int, int, int]]:
    """Every (seq_id, index) -> (time, height, width) position ``runner`` computes from
    now on; ``owner_of(seq_id)``: the target candidate a row belongs to."""
    seen: dict[tuple[int, int], tuple[int, int, int]] = {}
    prepare = runner.prepare

    def spy(out):
        prepared = prepare(out)
        positions = prepared[1]
        axes = positions if positions.dim() == 2 else positions.expand(3, -1)
        row = 0
        for item in out.scheduled:
            seq = item.seq
            for i in range(item.num_new_tokens):
                index = seq.num_computed_tokens + i
                seen[(owner_of(seq.seq_id), index)] = tuple(axes[:, row + i].tolist())
            row += item.num_new_tokens
        return prepared

    runner.prepare = spy
    return seen


@pytest.mark.parametrize("name", ["one image", "two images", "earlier turn"])
def test_the_head_reads_the_targets_positions(folder, name):
    with engine(folder, speculative="mtp") as spec:
        mtp = spec.engine._speculator.draft
        target = record_positions(spec.engine.runner, lambda s: s)
        head = record_positions(mtp.runner, lambda s: mtp._by_mirror[s].owner)
        got = spec.chat(CHATS[name], GREEDY)
        spans = spec.prompts.build(ChatRequest(CHATS[name])).images
    shared = target.keys() & head.keys()
    after = spans[-1].end
    # The head read the whole prompt and the drafts' indices past it.
    assert len(shared) > after + 4
    assert any(index >= len(got.prompt_token_ids) for _, index in shared)
    assert {key: head[key] for key in shared} == {key: target[key] for key in shared}
    # What it compared: 3-D positions on an image, shifted ones after the last.
    assert any(len(set(target[(s, i)])) > 1 for s, i in shared)
    assert all(target[(s, i)][0] < i for s, i in shared if i >= after)
    with engine(folder) as plain:
        assert plain.chat(CHATS[name], GREEDY).outputs[0].token_ids == got.outputs[0].token_ids
    assert got.metrics.num_draft_tokens > 0


def test_a_text_chat_on_the_same_engine_is_unshifted(folder):
    """No image: the head's positions are the indices, as before."""
    with engine(folder, speculative="mtp") as spec:
        mtp = spec.engine._speculator.draft
        head = record_positions(mtp.runner, lambda s: mtp._by_mirror[s].owner)
        spec.chat(TEXT_ONLY, GREEDY)
    assert head and all(pos == (i, i, i) for (_, i), pos in head.items())


def test_the_head_embeds_an_images_tokens_as_the_target_did(folder):
    """Mirror index j reads token j + 1: where that is an image's token, the head's
    embedding input is the image's row there (the target's encoder cache), elsewhere the
    token's embedding."""
    chat = CHATS["two images"]
    with engine(folder, speculative="mtp") as spec:
        mtp = spec.engine._speculator.draft
        rows_of: list[list[tuple[int, int]]] = []  # each head forward's (owner, index)
        prepare = mtp.runner.prepare

        def spy(out):
            rows_of.append([(mtp._by_mirror[i.seq.seq_id].owner, i.seq.num_computed_tokens + k)
                            for i in out.scheduled for k in range(i.num_new_tokens)])
            return prepare(out)

        seen: dict[tuple[int, int], torch.Tensor] = {}
        norm = mtp.head.pre_fc_norm_embedding

        class Recorder(torch.nn.Module):  # the norm's input: the head's embeddings
            def forward(self, embedded):
                for key, row in zip(rows_of[-1], embedded, strict=True):
                    seen.setdefault(key, row.clone())
                return norm(embedded)

        mtp.runner.prepare = spy
        mtp.head.pre_fc_norm_embedding = Recorder()
        spec.chat(chat, GREEDY)
        built = spec.prompts.build(ChatRequest(chat))
        (owner,) = {key[0] for key in seen}
        embed = spec.engine.runner.model.embed_tokens
        checked = 0
        for span in built.images:
            rows = spec.engine.runner.images.embeddings(span)
            for j in range(span.start - 1, span.end - 1):
                torch.testing.assert_close(seen[(owner, j)], rows[j + 1 - span.start])
                checked += 1
            after = span.end - 1  # reads the token after the image: text
            torch.testing.assert_close(seen[(owner, after)],
                                       embed(torch.tensor([built.ids[after + 1]]))[0])
        assert checked == sum(s.end - s.start for s in built.images) > 0
