"""``folio bench moe`` on a tiny synthetic OLMoE: the writer's tensors and mix, the file in
Folio and in llama.cpp (the same greedy tokens: both read the experts, router and q/k
norms alike), the best-of-runs figures and the workload end to end. Nothing here checks
how fast anything was."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.bench import synthetic, synthetic_moe
from engine.bench.moe import BARS, bench_moe, moe_target
from engine.bench.setup import BenchContext, BenchSettings
from engine.bench.targets import ISSUE_TARGETS, targets_table
from engine.loaders.catalog import model_info, starter_path

LLAMA = importlib.util.find_spec("llama_cpp") is not None
TINY = synthetic_moe.MoEShape(layers=2, hidden=256, heads=2, kv_heads=2, head_dim=128,
                              experts=4, experts_used=2, intermediate=256, context=256)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path, written = synthetic.ensure_synthetic_gguf(
        starter_path(), TINY, root=tmp_path_factory.mktemp("moe"))
    assert written
    return path


@pytest.fixture()
def threads_kept():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_default_shape_is_olmoe_1b_7b():
    shape = synthetic_moe.OLMOE_1B_7B
    plan = synthetic.tensor_plan(shape, 50304)  # OLMoE's own vocabulary
    shapes = {name: dims for name, dims, _ in plan}
    from engine.models.experts import active_parameters

    config = {"num_experts": shape.experts, "num_experts_per_tok": shape.experts_used}
    total = sum(int(torch.tensor(d).prod()) for d in shapes.values())
    # allenai/OLMoE-1B-7B: 6.92B parameters, 1.28B active.
    assert round(total / 1e9, 2) == 6.92
    assert round(active_parameters(shapes, config) / 1e9, 2) == 1.28


def test_the_file_has_olmoes_tensors_in_the_q4_k_m_mix(tiny_file):
    import gguf

    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(tiny_file).tensors}
    for i in range(TINY.layers):
        assert types[f"blk.{i}.ffn_gate_inp.weight"] == "F32"
        assert types[f"blk.{i}.ffn_gate_exps.weight"] == types[f"blk.{i}.ffn_up_exps.weight"] == (
            "Q4_K")
        assert types[f"blk.{i}.attn_q_norm.weight"] == "F32"
    info = model_info(tiny_file)
    assert info.architecture == "olmoe" and info.active_parameters < info.num_parameters


@pytest.mark.skipif(not LLAMA, reason="llama-cpp-python is not installed")
def test_folio_and_llama_cpp_decode_the_file_alike(tiny_file, threads_kept):
    from llama_cpp import Llama

    from engine import LLM, SamplingParams

    prompt = [300, 4000, 512, 77, 9000, 1234]
    llm = LLM(str(tiny_file), device="cpu", num_gpu_blocks=16, num_threads=1)
    ours = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0,
                                                 ignore_eos=True))[0].outputs[0].token_ids
    llama = Llama(model_path=str(tiny_file), n_ctx=64, n_threads=1, verbose=False)
    llama.eval(prompt)
    theirs = []
    for _ in range(6):
        theirs.append(llama.sample(temp=0))
        llama.eval(theirs[-1:])
    assert ours == theirs


def test_bench_moe_end_to_end_on_a_tiny_shape(tmp_path, monkeypatch, threads_kept):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(synthetic_moe, "OLMOE_1B_7B", TINY)
    ctx = BenchContext.create(BenchSettings(threads=1, sizes_prompt_tokens=24, sizes_tokens=3,
                                            sizes_followup_tokens=8, sizes_timeout_s=300,
                                            moe_runs=1))
    result = bench_moe(ctx)
    assert result["workload"] == "moe"
    assert not [n for n in result["notes"] if ", run 1:" in n], result["notes"]
    rows = {row["figure"]: row for row in result["rows"]}
    assert rows["decode tok/s"]["folio"] > 0
    assert result["summary"]["shape"] == TINY.label
    (run,) = result["summary"]["each_run"]["folio"]  # moe_runs=1
    assert run["decode_tok_s"] > 0 and run["ttft_s"] > 0
    assert result["summary"]["active_parameters"] < result["summary"]["num_parameters"]
    if LLAMA:
        assert [t["name"] for t in result["targets"]] == [moe_target(m) for m in BARS]
        table = {row["target"]: row for row in targets_table({"moe": result}, True)}
        for spec in ISSUE_TARGETS:
            if spec.workload == "moe":
                assert table[spec.label]["status"] in ("met", "not met")
    else:
        assert result["targets"] == []


def test_moe_runs_is_a_checked_setting():
    with pytest.raises(ValueError, match="moe_runs must be an integer >= 1"):
        BenchSettings(moe_runs=0)
