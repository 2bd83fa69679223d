"""scripts/device_bundle.py (``make device-bundle``) and what the device check builds on
it, where this suite runs: the vocabulary-only GGUF of the starter, a tiny synthetic model
written from it through engine/bench/gpu_e2e.py on the CPU, and scripts/gpu_check.sh
refusing to start without a bundle. Downloading the wheels needs the network, so that part
runs in `make device-emulation` only."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def device_bundle():
    spec = importlib.util.spec_from_file_location("device_bundle_script",
                                                  ROOT / "scripts" / "device_bundle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vocab_gguf(device_bundle, tmp_path_factory):
    from engine.loaders.catalog import starter_path

    path = tmp_path_factory.mktemp("bundle") / device_bundle.VOCAB_NAME
    device_bundle.write_vocab_gguf(starter_path(), path)
    return path


def test_the_vocabulary_gguf_holds_the_starters_tokenizer_and_no_tensors(vocab_gguf):
    import gguf

    from engine.loaders.catalog import starter_path

    vocab, starter = gguf.GGUFReader(vocab_gguf), gguf.GGUFReader(starter_path())
    assert len(vocab.tensors) == 0 and vocab_gguf.stat().st_size < 4 << 20
    keys = [k for k in starter.fields if k.startswith("tokenizer.")]
    assert keys and [k for k in vocab.fields if k.startswith("tokenizer.")] == keys
    for key in keys:
        assert vocab.fields[key].contents() == starter.fields[key].contents(), key
    assert vocab.fields["general.architecture"].contents() == "llama"


def test_the_end_to_end_step_runs_a_model_written_from_it(vocab_gguf, tmp_path):
    from engine.bench.gpu_e2e import LOGIT_TOLERANCE, run_e2e

    result = run_e2e("tiny", vocab_gguf, tmp_path, device="cpu")
    assert (result.device, result.tok_s_graphs, result.peak_bytes) == ("cpu", None, None)
    # The CPU's default backend against the PyTorch one, on the same weights and pool.
    assert result.logits_ok and result.logits_rel_err <= LOGIT_TOLERANCE
    assert result.ttft_s > 0 and result.tok_s_eager > 0 and result.write_s > 0
    assert result.budget_bytes > result.weights_bytes > 0
    assert '"logits_ok": true' in result.to_json()
    with pytest.raises(ValueError, match="size must be 'tiny' or one of"):
        run_e2e("70b", vocab_gguf, tmp_path)


def test_the_device_entry_refuses_to_start_without_a_bundle(tmp_path):
    env = dict(os.environ, FOLIO_DEVICE_BUNDLE=str(tmp_path / "none"),
               FOLIO_DEVICE_PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "no device bundle" in proc.stderr and "make device-bundle" in proc.stderr
