"""The starter with its weights kept quantized (weights="stored") against the same file
dequantized to float32 (weights="float32", the exact path): the next-token distributions
over a fixed 512-token English text, and greedy chat replies.

Both models read the same blocks, so what differs is only what the CPU path adds on top of
the file's quantization. On the native path (kernels/cpu) that is the 8-bit rounding of
each activation block going into a product; without the library (PyTorch's weight-only
ops, kernels/quant/torch_packed.py) it is bf16 rounding of the group scales, the activations and
the outputs. The LM head recomputes its top logits in float32 (engine/layers/lm_head.py)."""

from __future__ import annotations

import pytest
import torch

import kernels.cpu
from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.models.base import pool_layers
from kernels import allocate_kv_cache
from kernels.quant.torch_packed import INT4_OP_MAX_ROWS

pytestmark = pytest.mark.slow
# Decode-sized chunks (the GEMV path; on the PyTorch path int4pack, bf16 in and out) and
# one prefill-sized chunk (the tiled GEMM; PyTorch's dequantized float slices).
CHUNK = 32
assert CHUNK < INT4_OP_MAX_ROWS

TOKENS = 512
# Public domain: Charles Dickens, A Tale of Two Cities (1859), book 1, chapter 1, and Jane
# Austen, Pride and Prejudice (1813), chapter 1. More than 512 tokens; cut at 512.
TEXT = """\
It was the best of times, it was the worst of times, it was the age of wisdom, it was the \
age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the \
season of Light, it was the season of Darkness, it was the spring of hope, it was the winter \
of despair, we had everything before us, we had nothing before us, we were all going direct \
to Heaven, we were all going direct the other way - in short, the period was so far like the \
present period, that some of its noisiest authorities insisted on its being received, for \
good or for evil, in the superlative degree of comparison only.

There were a king with a large jaw and a queen with a plain face, on the throne of England; \
there were a king with a large jaw and a queen with a fair face, on the throne of France. In \
both countries it was clearer than crystal to the lords of the State preserves of loaves and \
fishes, that things in general were settled for ever.

It was the year of Our Lord one thousand seven hundred and seventy-five. Spiritual \
revelations were conceded to England at that favoured period, as at this. Mrs. Southcott had \
recently attained her five-and-twentieth blessed birthday, of whom a prophetic private in \
the Life Guards had heralded the sublime appearance by announcing that arrangements were made \
for the swallowing up of London and Westminster. Even the Cock-lane ghost had been laid only \
a round dozen of years, after rapping out its messages, as the spirits of this very year last \
past (supernaturally deficient in originality) rapped out theirs.

It is a truth universally acknowledged, that a single man in possession of a good fortune, \
must be in want of a wife. However little known the feelings or views of such a man may be \
on his first entering a neighbourhood, this truth is so well fixed in the minds of the \
surrounding families, that he is considered the rightful property of some one or other of \
their daughters.

"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield Park is \
let at last?" Mr. Bennet replied that he had not. "But it is," returned she; "for Mrs. Long \
has just been here, and she told me all about it." Mr. Bennet made no answer. "Do you not \
want to know who has taken it?" cried his wife impatiently. "You want to tell me, and I have \
no objection to hearing it." This was invitation enough.

"Why, my dear, you must know, Mrs. Long says that Netherfield is taken by a young man of \
large fortune from the north of England; that he came down on Monday in a chaise and four to \
see the place, and was so much delighted with it, that he agreed with Mr. Morris \
immediately; that he is to take possession before Michaelmas, and some of his servants are \
to be in the house by the end of next week."
"""

PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the ocean.",
    "What is 12 plus 7?",
    "Give me a tip for sleeping better.",
]


def _llm(weights: str) -> LLM:
    # 16-token blocks: the backend's float cache (runner/device.py), so the bounds below
    # measure the weights alone; tests/engine/test_kv_precision_engine.py measures int8's.
    return LLM("starter", EngineConfig(weights=weights, device="cpu", max_model_len=1024,
                                       block_size=16))


@pytest.fixture(scope="module")
def models() -> dict[str, LLM]:
    """float32; "stored" on the default path (native where built); "torch": stored on
    PyTorch's ops, the path where the library is not built."""
    found = {"float32": _llm("float32"), "stored": _llm("stored")}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels.cpu, "available", lambda: False)  # chosen at load
        found["torch"] = _llm("stored")
    return found


@pytest.fixture(scope="module")
def text_ids(models) -> list[int]:
    ids = models["float32"].tokenizer.encode(TEXT)
    assert len(ids) >= TOKENS
    assert models["stored"].tokenizer.encode(TEXT) == ids
    return ids[:TOKENS]


def teacher_forced_logits(llm: LLM, ids: list[int], build_attention_metadata,
                          chunk: int = CHUNK) -> torch.Tensor:
    """float32 logits [len(ids), vocab] of a prefill of `ids` in chunks of `chunk` tokens
    through the engine's own model and attention backend, into a KV pool of its own (the
    engine's block manager owns the engine's pool)."""
    runner = llm.engine.runner
    s = runner.shape
    blocks = -(-len(ids) // s.block_size)
    kv_cache = allocate_kv_cache(s.num_layers, blocks, s.block_size, s.num_kv_heads,
                                 s.head_size, s.dtype, runner.device,
                                 head_major=runner.backend.head_major_kv)
    logits = []
    with torch.inference_mode():
        for start in range(0, len(ids), chunk):
            stop = min(start + chunk, len(ids))
            meta = build_attention_metadata([list(range(blocks))], [start], [stop - start],
                                            s.block_size)
            hidden = runner.model(torch.tensor(ids[start:stop]), torch.arange(start, stop),
                                  pool_layers(kv_cache, meta), meta, runner.backend)
            logits.append(runner.model.compute_logits(hidden))
    return torch.cat(logits)


# (path, chunk, mean KL bound in nats, top-1 agreement bound). The native path is held
# to the bars; the PyTorch path to what its bf16 roundings allow.
QUALITY = [("stored", CHUNK, 0.005, 0.98), ("stored", TOKENS, 0.005, 0.98),
           ("torch", CHUNK, 0.01, 0.97)]


@pytest.fixture(scope="module")
def exact_logits(models, text_ids, build_attention_metadata) -> torch.Tensor:
    return teacher_forced_logits(models["float32"], text_ids, build_attention_metadata)


@pytest.mark.parametrize(("path", "chunk", "max_kl", "min_agree"), QUALITY)
def test_stored_weights_track_float32_teacher_forced(models, text_ids, exact_logits,
                                                     build_attention_metadata, path, chunk,
                                                     max_kl, min_agree):
    if path == "stored" and not kernels.cpu.available():
        pytest.skip("the native library is not built (the torch row measures that path)")
    exact = exact_logits
    stored = teacher_forced_logits(models[path], text_ids, build_attention_metadata, chunk)
    assert exact.shape == stored.shape == (TOKENS, 49152)
    log_p = torch.log_softmax(exact.double(), dim=-1)
    log_q = torch.log_softmax(stored.double(), dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(dim=-1)  # KL(float32 || stored) per position
    agree = (exact.argmax(dim=-1) == stored.argmax(dim=-1)).double().mean().item()
    # The float32 model really reads the text (not noise): it predicts many of the tokens.
    hits = (exact[:-1].argmax(dim=-1) == torch.tensor(text_ids[1:])).double().mean().item()
    print(f"\n{path} in chunks of {chunk}: mean KL {kl.mean().item():.5f} nats "
          f"(max {kl.max().item():.4f}), top-1 agreement {agree:.4f}, float32 next-token "
          f"accuracy {hits:.3f}")
    assert hits > 0.3
    assert kl.mean().item() <= max_kl
    assert agree >= min_agree


@pytest.fixture(scope="module")
def greedy_replies(models) -> dict[str, list]:
    params = SamplingParams(max_tokens=32, temperature=0)
    conversations = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    replies = {name: models[name].generate(conversations, params)
               for name in ("float32", "stored")}
    for prompt, a, b in zip(PROMPTS, replies["float32"], replies["stored"], strict=True):
        print(f"\n{prompt!r}\n  float32: {a.outputs[0].text!r}\n  stored:  {b.outputs[0].text!r}")
    return replies


def test_greedy_replies_split_only_at_near_ties(models, greedy_replies,
                                               build_attention_metadata):
    """Where a stored reply leaves the float32 one, float32 itself barely prefers its token:
    at the first differing token its margin over the stored path's choice is a small
    fraction of a logit (quantization noise decides coin flips, nothing more)."""
    replies = greedy_replies
    assert all(out.outputs[0].token_ids for out in replies["stored"])
    assert "Paris" in replies["stored"][0].outputs[0].text
    for prompt, exact, stored in zip(PROMPTS, replies["float32"], replies["stored"],
                                     strict=True):
        a, b = exact.outputs[0].token_ids, stored.outputs[0].token_ids
        if a == b:
            continue
        split = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
        context = exact.prompt_token_ids + a[:split]
        f32 = teacher_forced_logits(models["float32"], context, build_attention_metadata)[-1]
        margin = float(f32[a[split]] - f32[b[split]])
        print(f"\n{prompt!r}: split at token {split}, float32 margin {margin:.4f}")
        assert 0 <= margin < 0.25, prompt


def test_greedy_replies_identical_in_four_of_five(greedy_replies):
    # The bar for the native path; PyTorch's (bf16 roundings) is held to the near-tie
    # test above instead.
    if not kernels.cpu.available():
        pytest.skip("the native library is not built (its bar; the fallback splits more "
                    "often, only at near-ties)")
    same = [a.outputs[0].token_ids == b.outputs[0].token_ids
            for a, b in zip(greedy_replies["float32"], greedy_replies["stored"], strict=True)]
    assert sum(same) >= 4, same
