"""``folio bench kv``: its table's met / not met / n/a logic on made-up figures, the
teacher-forcing loop, and the whole workload in its quick plan on a tiny synthetic shape
(no llama.cpp). Nothing here checks how fast anything was."""

from __future__ import annotations

import pytest
import torch

from engine.bench import kv as kv_bench
from engine.bench import synthetic
from engine.bench.cli import WORKLOADS, format_result
from engine.bench.kv import QUICK, KVPlan, bench_kv, shape_bytes
from engine.bench.kv_quality import FormatQuality, Parting, partings, quality
from engine.bench.kv_table import KVFigures, kv_table
from engine.bench.kv_text import leading_paragraphs
from engine.bench.setup import BenchContext, BenchSettings

TINY = synthetic.Shape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
                       intermediate=512, context=256)
PLAN = KVPlan()


@pytest.fixture()
def threads_kept():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    from engine.loaders.catalog import starter_path

    path, _ = synthetic.ensure_synthetic_gguf(starter_path(), TINY,
                                              root=tmp_path_factory.mktemp("kv-bench"))
    return path


def _figures() -> KVFigures:
    fig = KVFigures(model_bytes=shape_bytes(30, 3, 64), speed_shape=shape_bytes(16, 8, 64))
    fig.kl = {"int8": 0.0012, "int4": 0.031}
    fig.greedy = {"int8": 4, "int4": 2}
    fig.partings = {"int8": [Parting(3, 28, 0.0095)],
                    "int4": [Parting(0, 1, 0.5), Parting(1, 0, 1.25), Parting(4, 6, None)]}
    fig.speed = {
        "folio float16": {"ttft_s_4000": 20.0, "decode_tok_s_4000": 20.0,
                          "decode_tok_s_16000": 10.0},
        "folio int8": {"ttft_s_4000": 20.5, "decode_tok_s_4000": 22.0,
                       "decode_tok_s_16000": 11.0},
        "folio int4": {"ttft_s_4000": 22.0, "decode_tok_s_4000": 21.0,
                       "decode_tok_s_16000": 12.0},
        "llama q8_0": {"decode_tok_s_4000": 11.0},
    }
    fig.rss = {"folio int8": 900 << 20, "llama q8_0": 1000 << 20}
    return fig


def test_every_target_has_a_row_and_its_verdict():
    rows, targets = kv_table(_figures(), PLAN)
    status = {row["figure"]: row["status"] for row in rows}
    assert status["KV bytes per token, int8 / float16, starter"] == "met"  # 11,880 / 23,040
    assert status["KV bytes per token, int4 / float16, 1B shape"] == "met"
    kl = "starter, teacher-forced 2,048 tokens, mean KL vs float16, {} (nats)"
    assert (status[kl.format("int8")], status[kl.format("int4")]) == ("met", "not met")
    greedy = ("starter, greedy 48-token replies after ~1,100 words equal to float16, "
              "{} (of 5)")
    assert status[greedy.format("int8")] == "met"  # 4 of 5
    assert status[greedy.format("int4")] == "reported"  # no bar: its count is reported
    # Where the other replies part, counted from 1, and float16's margin there.
    measured = {row["figure"]: row["measured"] for row in rows}
    assert measured[greedy.format("int8")] == (
        "4 of 5; the other parts at token 29, where float16's top two were 0.0095 nats apart")
    assert measured[greedy.format("int4")] == "2 of 5; the others part at tokens 2, 1, 7"
    decode = "1B shape, decode at {:,} tokens of context, int8 / float16"
    assert status[decode.format(4000)] == "met"  # 22 / 20 = 1.1 >= 1.05
    assert status[decode.format(16000)] == "not met"  # 11 / 10 = 1.1 < 1.15
    assert status["1B shape, prefill of 4,000 tokens, int8 / float16"] == "met"  # 0.976
    assert status["1B shape at 4,000 tokens, decode Folio int8 / llama.cpp q8_0"] == "met"
    assert status["1B shape at 4,000 tokens, decode Folio int4 / llama.cpp q4_0"].startswith(
        "n/a: not measured (llama.cpp")
    assert status["3B shape at a 32,768-token context, peak RSS Folio int8 / llama.cpp "
                  "q8_0"] == "met"
    by_name = {t.name: t for t in targets}
    assert len(by_name) == 12  # every bar of the issue, each measured here
    assert by_name[decode.format(16000)].value == pytest.approx(1.1)
    assert by_name["1B shape, prefill of 4,000 tokens, int8 / float16"].value == \
        pytest.approx(20.0 / 20.5, abs=1e-4)
    assert {row["want"] for row in rows if row["status"] == "reported"} == {""}


def test_a_part_not_run_leaves_its_rows_na_with_why():
    fig = _figures()
    fig.speed, fig.rss = {}, {}
    fig.why = {"speed": "1b not run (--sizes)", "folio int4": "int4 did not load (see the "
                                                              "notes)"}
    fig.kl.pop("int4")
    rows, targets = kv_table(fig, PLAN)
    status = {row["figure"]: row["status"] for row in rows}
    assert status["1B shape, decode at 4,000 tokens of context, int8 / float16"] == \
        "n/a: 1b not run (--sizes)"
    assert status["starter, teacher-forced 2,048 tokens, mean KL vs float16, int4 (nats)"] \
        == "n/a: int4 did not load (see the notes)"
    assert status["3B shape at a 32,768-token context, peak RSS Folio int8 / llama.cpp "
                  "q8_0"].startswith("n/a: not measured")
    assert len(targets) == 6  # the bytes (4), int8's KL and greedy agreement


def test_the_plan_checks_its_sizes():
    with pytest.raises(ValueError, match="KVPlan.contexts"):
        KVPlan(contexts=(16000, 4000))
    with pytest.raises(ValueError, match="KVPlan.prompts"):
        KVPlan(prompts=1)
    with pytest.raises(ValueError, match="KVPlan.rss_fill"):
        KVPlan(rss_context=1024, rss_fill=2048)
    assert "kv" in WORKLOADS
    assert len(leading_paragraphs(1100).split()) >= 1100


def test_a_reply_parts_at_its_first_differing_token_with_float16_s_margin_there():
    ref = FormatQuality("float16", replies=[[1, 2, 3], [4, 5, 6], [7, 8, 9]],
                        top_two_gaps=[[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9]])
    assert partings(ref, [[1, 2, 3], [4, 9, 6], [7, 8]]) == [
        Parting(1, 1, 0.5), Parting(2, 2, 0.9)]  # a reply cut short parts where it ends
    assert partings(ref, [[0, 2, 3], [4, 5, 6], [7, 8, 9]]) == [Parting(0, 0, 0.1)]
    assert partings(ref, ref.replies) == []
    ref.top_two_gaps = []  # a reference without them still says where
    assert partings(ref, [[1, 2, 0], [4, 5, 6], [7, 8, 9]]) == [Parting(0, 2, None)]


def test_teacher_forcing_the_same_cache_twice_gives_no_divergence(tiny_file, threads_kept):
    # float16 against float16: the same distributions at every position, the same replies;
    # float32 (a finer cache) moves them a little, never below zero.
    text, ref, got = quality(str(tiny_file), 1, "stored", ("float16", "float32"),
                             text_tokens=20, context_words=20, prompts=2, reply_tokens=3)
    assert len(text) == 20 and len(ref.replies) == 2 and len(ref.replies[0]) == 3
    assert got["float16"].mean_kl == pytest.approx(0.0, abs=1e-9)
    # The reference asks for log-probabilities (float16's margins), the other does not:
    # the replies are the same.
    assert got["float16"].greedy_equal == 2 and got["float16"].partings == []
    assert [len(gaps) for gaps in ref.top_two_gaps] == [3, 3]
    assert all(gap >= 0 for gaps in ref.top_two_gaps for gap in gaps)
    assert 0.0 <= got["float32"].mean_kl < 0.05
    assert got["float32"].bytes_per_token == 2 * ref.bytes_per_token == 2048


def test_the_quick_plan_end_to_end_on_a_tiny_shape(tiny_file, tmp_path, monkeypatch,
                                                   threads_kept):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(synthetic.SIZES, "1b", TINY)
    monkeypatch.setitem(synthetic.SIZES, "3b", TINY)
    monkeypatch.setattr(kv_bench, "llama_python", lambda: (None, "llama.cpp skipped: test"))
    ctx = BenchContext.create(BenchSettings(model=str(tiny_file), threads=1,
                                            sizes=("1b", "3b")))
    result = bench_kv(ctx, QUICK)
    assert result["workload"] == "kv" and result["summary"]["cpu"]
    status = {row["figure"]: row["status"] for row in result["rows"]}
    name = tiny_file.stem
    assert status[f"KV bytes per token, int8 / float16, {name}"] == "met"
    assert status["KV bytes per token, int4 / float16, 1B shape"] == "met"
    speed = result["figures"]["speed"]["folio float16"]
    assert speed["decode_tok_s_40"] > 0 and speed["ttft_s_80"] > 0
    # int8 and int4 load once the engine takes them; until then their rows say why.
    for fmt in ("int8", "int4"):
        kl = status[f"{name}, teacher-forced 24 tokens, mean KL vs float16, {fmt} (nats)"]
        assert kl in ("met", "not met") or kl == f"n/a: {fmt} did not load (see the notes)"
    figures = result["figures"]
    for fmt, equal in figures["greedy"].items():  # each reply not equal says where it parts
        assert len(figures["partings"][fmt]) == QUICK.prompts - equal
    llama = status["1B shape at 40 tokens, decode Folio float16 / llama.cpp q8_0"]
    assert llama.startswith("n/a: not measured (llama.cpp")
    assert "llama.cpp skipped: test" in result["notes"]
    text = format_result(result)
    assert "cpu: " in text and "status" in text


def test_a_context_s_decode_is_the_best_of_its_rounds_the_formats_taking_turns(monkeypatch):
    """The speed side loads each format, lets them answer each context's prompt in turn,
    DECODE_ROUNDS rounds (the repeats find it cached), and keeps each one's fastest decode;
    the prefill time is each one's first answer's."""
    from engine.bench import kv_sides
    from engine.bench.baselines import Reply

    # Seconds between tokens, per answer: 32 ids (a, b, a, b, a, b), then 64 ids.
    gaps = iter([0.5, 0.4, 0.1, 0.2, 0.25, 0.3, 0.2, 0.1, 0.4, 0.5, 0.3, 0.25])
    asked: list[tuple[str, list[int]]] = []

    def load(side, path, threads, kv, n_ctx):
        assert n_ctx == 64 + 4 + 16
        return kv, reply

    def reply(kv, ids, tokens):
        asked.append((kv, ids))
        if len(ids) == kv_sides.WARMUP_TOKENS:
            return Reply([1] * tokens, 0.01, len(ids), len(ids), [0.0, 0.01])
        gap = next(gaps)
        first = sum(len(i) == len(ids) and k == kv for k, i in asked) == 1
        return Reply([1] * tokens, (2.0 if kv == "a" else 3.0) if first else 0.05, len(ids),
                     len(ids), [i * gap for i in range(tokens)])

    emitted: dict = {}
    monkeypatch.setattr(kv_sides, "_load", load)
    monkeypatch.setattr(kv_sides, "emit", emitted.update)
    assert kv_sides.DECODE_ROUNDS == 3
    kv_sides.speed("folio", "model.gguf", 1, ["a", "b"], [64, 32], tokens=4, vocab=1000,
                   seed=5)
    w = kv_sides.WARMUP_TOKENS
    assert [(kv, len(ids)) for kv, ids in asked] == [
        ("a", w), ("b", w), *[(kv, 32) for _ in range(3) for kv in "ab"],
        *[(kv, 64) for _ in range(3) for kv in "ab"]]
    assert len({tuple(ids) for _, ids in asked[2:8]}) == 1  # one prompt per context
    assert emitted["a ttft_s_32"] == emitted["a ttft_s_64"] == 2.0
    assert emitted["b ttft_s_32"] == emitted["b ttft_s_64"] == 3.0
    assert emitted["a decode_tok_s_32"] == pytest.approx(10.0)  # gaps 0.5, 0.1, 0.25
    assert emitted["b decode_tok_s_32"] == pytest.approx(5.0)   # gaps 0.4, 0.2, 0.3
    assert emitted["a decode_tok_s_64"] == pytest.approx(1 / 0.2)  # 0.2, 0.4, 0.3
    assert emitted["b decode_tok_s_64"] == pytest.approx(10.0)  # 0.1, 0.5, 0.25
