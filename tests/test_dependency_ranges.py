"""pyproject.toml's torch / Triton / transformers ranges are what Folio is run on at both
ends: the high end here (`make setup` installs it, `make test` runs it), the low end the
lent GPU machine's own versions, which `make device-emulation` installs and runs
(scripts/device_emulation.py reads them from the same ranges)."""

from __future__ import annotations

import importlib.util
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
RANGED = ("torch", "triton", "transformers")


def ranges() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = (Requirement(dep) for dep in deps)
    return {req.name: req for req in reqs if req.name in RANGED}


def test_the_installed_versions_are_the_high_ends():
    for name, req in ranges().items():
        installed = Version(version(name))
        upper = next(Version(s.version) for s in req.specifier if s.operator == "<")
        assert installed in req.specifier, (name, installed, req)
        # The last minor release below the cap: the range's top is what runs here.
        assert (installed.major, installed.minor + 1) == (upper.major, upper.minor), name


def test_the_emulation_installs_the_low_ends():
    spec = importlib.util.spec_from_file_location("device_emulation_script",
                                                  ROOT / "scripts" / "device_emulation.py")
    emulation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(emulation)
    bounds = emulation.lower_bounds()
    assert emulation.pins(bounds) == ["torch==2.11.0", "triton==3.6.0", "transformers==5.17.0"]
    for name, req in ranges().items():
        low = next(Version(s.version) for s in req.specifier if s.operator == ">=")
        assert Version(bounds[name]) == low
