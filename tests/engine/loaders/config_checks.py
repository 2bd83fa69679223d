"""What the config tests of the loaders share: the attributes the engine reads of a
config while it loads and runs a model, and the transformers modules a fresh process
imports to load a model and answer with it."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engine import loaders
from engine.loaders.gguf.file_config import FileConfig

REPO = Path(__file__).resolve().parents[3]
T = TypeVar("T")

_CHILD = textwrap.dedent("""
    import sys
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams
    with LLM(sys.argv[1], max_model_len=64, num_gpu_blocks=16, block_size=16) as llm:
        llm.generate(["hello"], SamplingParams(max_tokens=2, temperature=0))
        llm.chat([{"role": "user", "content": "hello"}], SamplingParams(max_tokens=2))
    print(sorted(m for m in sys.modules if m.split(".")[0] == "transformers"))
""")


def engine_reads(monkeypatch, loader: str, config: FileConfig,
                 run: Callable[[], T]) -> tuple[set[str], T]:
    """``run()`` with every model that ``engine.loaders.<loader>`` (load_gguf,
    load_hf_folder) loads given a copy of ``config``; the names of the attributes read of
    it (found or not, ``to_dict`` aside), and what ``run`` returned."""
    names: set[str] = set()

    class Recording(FileConfig):
        def __getattribute__(self, name: str):
            if not name.startswith("_") and name != "to_dict":
                names.add(name)
            return super().__getattribute__(name)

    real_load = getattr(loaders, loader)

    def load_recording(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        loaded.config = Recording(config.to_dict())
        return loaded

    monkeypatch.setattr(loaders, loader, load_recording)
    result = run()
    assert names  # the engine did read the config through the recorder
    return names, result


def transformers_imported(model: Path, cache_dir: Path,
                          under: str = "transformers.models") -> list[str]:
    """The modules ``under`` the given transformers package a fresh process imports to load
    ``model`` (with the conversion cache at ``cache_dir``), generate and chat."""
    env = {"FOLIO_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(model)], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = ast.literal_eval(done.stdout.strip().splitlines()[-1])  # the child's list
    return [m for m in imported if m == under or m.startswith(under + ".")]
