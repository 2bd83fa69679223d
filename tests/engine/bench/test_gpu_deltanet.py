"""engine/bench/gpu_deltanet.py, the device check's Gated DeltaNet step, run tiny on the
CPU (Triton interpreted): both paths agree, and every figure the table reads is there."""

from __future__ import annotations

import importlib.util
import json

from engine.bench.gpu_deltanet import run_deltanet_bench
from engine.layers.gated_deltanet import DeltaNetShape


def test_tiny_run_agrees_and_reports_every_figure():
    shape = DeltaNetShape(32, 1, 2, 16, 16, 4, 1e-6)
    reports = []
    result = run_deltanet_bench("cpu", shape, seqs=2, tokens=24, batch=2, snapshot_every=16,
                                reps=1, report=lambda r: reports.append(r.to_json()))
    assert result.prefill_rel_err < 1e-5 and result.decode_rel_err < 1e-5
    assert min(result.prefill_torch_s, result.prefill_triton_s, result.decode_torch_s,
               result.decode_triton_s) > 0
    if importlib.util.find_spec("fla") is None:
        assert result.fla == "not installed" and result.prefill_fla_s is None
        assert reports == [result.to_json()]  # once, before fla-core would have run
    assert set(json.loads(result.to_json())) >= {"prefill_torch_s", "decode_triton_s", "fla"}

