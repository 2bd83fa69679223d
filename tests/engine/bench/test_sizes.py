"""``folio bench sizes`` on a tiny synthetic shape: the shape table, the writer's Q4_K_M mix
on a custom shape that Folio loads, the worker's JSON line, the targets table's rows for
the sizes and the ``--sizes`` option. Nothing here checks how fast anything was."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from engine.bench import synthetic
from engine.bench.probe import MARK
from engine.bench.setup import BenchContext, BenchSettings, Target
from engine.bench.sizes import BARS, bench_sizes, best_of, each_run, prompt_ids, size_target, worker
from engine.bench.targets import LLAMA_MISSING, SIZE_TARGETS, targets_table

LLAMA = importlib.util.find_spec("llama_cpp") is not None
TINY = synthetic.Shape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
                       intermediate=512, context=256)
FIELDS = {"side", "threads", "n_ctx", "import_s", "load_s", "warmup_s", "ttft_s",
          "followup_ttft_s", "decode_tok_s", "prompt_tokens", "followup_prompt_tokens",
          "followup_computed_tokens", "generated_tokens", "peak_rss_bytes"}


def test_shape_table_is_the_issues():
    sizes = synthetic.SIZES
    assert list(sizes) == ["1b", "3b", "8b"]
    one, three, eight = sizes["1b"], sizes["3b"], sizes["8b"]
    assert (one.layers, one.hidden, one.heads, one.kv_heads, one.head_dim,
            one.intermediate) == (16, 2048, 32, 8, 64, 8192)
    assert (three.layers, three.hidden, three.heads, three.kv_heads, three.head_dim,
            three.intermediate) == (28, 3072, 24, 8, 128, 8192)
    assert eight is synthetic.LLAMA3_8B and eight == synthetic.Shape()
    assert (eight.layers, eight.hidden, eight.intermediate) == (32, 4096, 14336)
    assert len({shape.label for shape in sizes.values()}) == 3  # a file each
    for shape in sizes.values():
        assert shape.heads * shape.head_dim == shape.hidden
        plan = synthetic.tensor_plan(shape, 49152)
        assert sum(synthetic.tensor_nbytes(d, k) for _, d, k in plan) > 0  # whole blocks


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    from engine.loaders.catalog import starter_path

    path, written = synthetic.ensure_synthetic_gguf(
        starter_path(), TINY, root=tmp_path_factory.mktemp("sizes"))
    assert written
    return path


@pytest.fixture()
def threads_kept():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_custom_shape_follows_the_mix_and_loads_in_folio(tiny_file, threads_kept):
    import gguf

    from engine.bench.setup import folio_config
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(tiny_file).tensors}
    assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
    for i in range(TINY.layers):
        more = "Q6_K" if synthetic.use_more_bits(i, TINY.layers) else "Q4_K"
        assert (types[f"blk.{i}.attn_v.weight"], types[f"blk.{i}.ffn_down.weight"]) == (
            more, more)
        assert {types[f"blk.{i}.{n}.weight"] for n in ("attn_q", "attn_k", "attn_output",
                                                       "ffn_gate", "ffn_up")} == {"Q4_K"}
        assert types[f"blk.{i}.attn_norm.weight"] == types[f"blk.{i}.ffn_norm.weight"] == "F32"
    llm = LLM(str(tiny_file), folio_config(1, "stored", max_model_len=64))
    out = llm.generate([list(range(300, 308))],
                       SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 3
    assert llm.memory_stats().weights_bytes > 0


def test_prompt_ids_are_fixed_and_in_the_vocabulary():
    prompt, follow, warm = prompt_ids(49152, 512, 64, seed=0)
    assert (len(prompt), len(follow), len(warm)) == (512, 64, 8)
    assert (prompt, follow, warm) == prompt_ids(49152, 512, 64, seed=0)
    assert all(256 <= t < 49152 for t in prompt + follow + warm)
    assert warm[0] != prompt[0]


def test_worker_prints_one_json_line_with_every_field(tiny_file, threads_kept, capsys):
    prompt, follow, warm = prompt_ids(49152, 40, 8, seed=1)
    worker("folio", str(tiny_file), 1, prompt, follow, warm, tokens=4, n_ctx=128)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(MARK)
    got = json.loads(lines[0][len(MARK):])
    assert FIELDS | {"weights_bytes"} <= set(got)
    assert got["side"] == "folio" and got["generated_tokens"] == [4, 4]
    assert got["prompt_tokens"] == 40 and got["followup_prompt_tokens"] == 40 + 4 + 8
    # The follow-up finds every token turn 1 computed (40 + 3: 2 blocks of 16 and the
    # partial third block's 11), as llama.cpp does.
    assert got["followup_computed_tokens"] == 52 - 43
    assert all(got[k] > 0 for k in ("load_s", "ttft_s", "followup_ttft_s", "decode_tok_s",
                                    "peak_rss_bytes"))


def test_llama_worker_imports_no_torch():
    # The llama.cpp side's memory must be llama.cpp's: its modules leave torch out.
    code = ("import sys, engine.bench.sizes, engine.bench.baselines, engine.bench.probe; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_bench_sizes_end_to_end_on_a_tiny_shape(tmp_path, monkeypatch, threads_kept):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(synthetic.SIZES, "1b", TINY)
    ctx = BenchContext.create(BenchSettings(threads=1, sizes=("1b",), sizes_prompt_tokens=24,
                                            sizes_tokens=3, sizes_followup_tokens=8,
                                            sizes_timeout_s=300, sizes_runs=2))
    result = bench_sizes(ctx)
    assert result["workload"] == "sizes" and result["group_rows_by"] == "size"
    assert not [n for n in result["notes"] if n.startswith("1b folio")], result["notes"]
    assert result["summary"]["runs"] == 2
    assert "each figure is the best of 2 runs per side (a shared machine)" in result["notes"]
    rows = {row["figure"]: row for row in result["rows"]}
    assert {row["size"] for row in result["rows"]} == {"1b"}
    assert rows["decode tok/s"]["folio"] > 0 and rows["peak RSS MiB"]["folio"] > 0
    assert result["summary"]["sizes"] == ["1b"]
    assert result["summary"]["1b"]["shape"] == TINY.label
    # Every run's figures, each side's best among them in the rows.
    each = result["summary"]["1b"]["each_run"]
    assert len(each["folio"]) == 2
    best = max(r["decode_tok_s"] for r in each["folio"])
    assert rows["decode tok/s"]["folio"] == pytest.approx(best, abs=0.011)
    if LLAMA:
        assert rows["decode tok/s"]["folio/llama_cpp"] > 0
        assert [t["name"] for t in result["targets"]] == [size_target("1b", m) for m in BARS]
    else:
        assert rows["decode tok/s"]["llama_cpp"] == "n/a"
        assert result["targets"] == []
        assert any("llama_cpp is not installed" in n for n in result["notes"])
    from engine.bench.cli import format_result

    text = format_result(result)
    assert "-- size 1b --" in text and "folio/llama_cpp" in text


def _sizes_result(sizes: list[str], *targets: Target) -> dict:
    return {"targets": [t.as_dict() for t in targets], "notes": [],
            "summary": {"sizes": sizes}}


def test_targets_table_rows_for_the_sizes():
    assert len(SIZE_TARGETS) == 11  # 1B and 3B: five each; 8B: decode only
    assert {(s.size, s.name) for s in SIZE_TARGETS} >= {
        ("8b", size_target("8b", "decode_tok_s")), ("3b", size_target("3b", "load_s"))}
    results = {"sizes": _sizes_result(
        ["1b", "8b"],
        Target(size_target("1b", "decode_tok_s"), 1.2, 1.1, ">="),
        Target(size_target("1b", "ttft_s"), 0.95, 0.9, "<="),
        Target(size_target("1b", "peak_rss_bytes"), 1.05, 1.1, "<="))}
    rows = {row["target"]: row for row in targets_table(results, llama_installed=True)
            if row["target"].startswith("synthetic ") and "Q4_K_M " in row["target"]}

    def status(size: str, metric: str) -> str:
        spec = next(s for s in SIZE_TARGETS if s.size == size and
                    s.name == size_target(size, metric))
        return rows[spec.label]["status"]

    assert status("1b", "decode_tok_s") == "met"
    assert status("1b", "ttft_s") == "not met"
    assert status("1b", "peak_rss_bytes") == "met"
    assert status("1b", "load_s") == "n/a: not measured (see the workload's notes)"
    assert status("3b", "ttft_s") == "n/a: 3b not run (--sizes)"
    assert status("8b", "decode_tok_s") == "n/a: not measured (see the workload's notes)"
    no_llama = targets_table({"sizes": _sizes_result(["1b", "3b"])}, llama_installed=False)
    by = {row["target"]: row["status"] for row in no_llama}
    assert {by[s.label] for s in SIZE_TARGETS if s.size != "8b"} == {LLAMA_MISSING}
    assert by[next(s.label for s in SIZE_TARGETS if s.size == "8b")] == (
        "n/a: 8b not run (--sizes)")
    assert {row["status"] for row in targets_table({}, True)
            if row["target"] in {s.label for s in SIZE_TARGETS}} == {"n/a: sizes did not run"}


def test_best_of_takes_each_figures_best_run():
    runs = [{"load_s": 2.0, "ttft_s": 1.0, "decode_tok_s": 5.0, "peak_rss_bytes": 300,
             "side": "folio", "generated_tokens": [4, 4]},
            {"load_s": 1.5, "ttft_s": 1.2, "decode_tok_s": 6.0, "peak_rss_bytes": 310},
            {"error": "timed out"}]
    assert best_of(runs) == {"load_s": 1.5, "ttft_s": 1.0, "decode_tok_s": 6.0,
                             "peak_rss_bytes": 300, "side": "folio",
                             "generated_tokens": [4, 4], "error": "timed out"}


def test_each_run_keeps_every_runs_table_figures_rounded():
    runs = {"folio": [{"load_s": 0.33312, "decode_tok_s": 71.7049, "peak_rss_bytes": 300,
                       "side": "folio", "generated_tokens": [4, 4]},
                      {"error": "timed out"}],
            "llama_cpp": [{"load_s": 0.44, "followup_computed_tokens": 65}]}
    assert each_run(runs) == {
        "folio": [{"load_s": 0.333, "decode_tok_s": 71.705, "peak_rss_bytes": 300}, {}],
        "llama_cpp": [{"load_s": 0.44, "followup_computed_tokens": 65}]}


def test_cli_parses_sizes_and_names_an_unknown_one(monkeypatch, capsys):
    from engine.bench import cli

    seen = {}

    def fake(ctx):
        seen["sizes"] = ctx.settings.sizes
        return {"workload": "sizes", "setup": {"model": "none"}, "rows": [], "summary": {},
                "targets": [], "notes": []}

    monkeypatch.setitem(cli.WORKLOADS, "sizes", fake)
    threads = torch.get_num_threads()
    assert cli.main(["sizes", "--sizes", "1b, 3B", "--threads", "1"]) == 0
    assert seen["sizes"] == ("1b", "3b")
    assert cli.main(["sizes", "--threads", "1"]) == 0
    assert seen["sizes"] == ("1b", "3b", "8b")
    torch.set_num_threads(threads)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sizes", "--sizes", "1b,4b"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--sizes" in err and "unknown size '4b'" in err and "1b, 3b, 8b" in err
    with pytest.raises(ValueError, match="unknown size '70b'"):
        BenchSettings(sizes=("70b",))
    assert "sizes" in cli.WORKLOAD_NAMES



def test_sizes_runs_is_a_checked_setting():
    assert BenchSettings().sizes_runs == 2
    with pytest.raises(ValueError, match="sizes_runs must be an integer >= 1"):
        BenchSettings(sizes_runs=0)


def test_activation_bits_are_a_checked_setting():
    from engine.bench.setup import BenchSettings

    assert BenchSettings().cpu_activation_bits == 16
    with pytest.raises(ValueError, match="cpu_activation_bits must be 8 or 16"):
        BenchSettings(cpu_activation_bits=12)
