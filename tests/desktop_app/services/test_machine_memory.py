"""Whether a model fits this machine, computed from injected memory figures."""

from __future__ import annotations

import pytest

from desktop_app.services.machine_memory import (
    FITS,
    TIGHT,
    TOO_LARGE,
    Fit,
    MachineMemory,
    fit,
    gigabytes,
    read_machine_memory,
)

GB = 1 << 30
LAPTOP = MachineMemory(ram_total=24 * GB, ram_available=20 * GB)


@pytest.mark.parametrize("needed, level, label", [
    (4 * GB, FITS, "Fits"),
    (int(19.2 * GB), FITS, "Fits"),  # exactly the 80% share, and free
    (20 * GB, TIGHT, "Tight: close other programs first"),  # over 80% of 24 GB
    (24 * GB, TIGHT, "Tight: close other programs first"),  # all of it
    (24 * GB + 1, TOO_LARGE, "Too large for this computer's 24 GB"),
])
def test_fit_against_ram(needed, level, label):
    assert fit(needed, LAPTOP) == Fit(level, label)


def test_little_free_memory_makes_a_small_model_tight():
    busy = MachineMemory(ram_total=24 * GB, ram_available=3 * GB)
    assert fit(4 * GB, busy).level == TIGHT
    unknown_free = MachineMemory(ram_total=24 * GB)  # a system that does not say
    assert fit(4 * GB, unknown_free).level == FITS


def test_with_a_gpu_the_gpu_decides_and_ram_is_the_fallback():
    workstation = MachineMemory(ram_total=64 * GB, ram_available=60 * GB,
                                gpu_name="NVIDIA RTX 4090", gpu_total=24 * GB,
                                gpu_free=23 * GB)
    assert fit(10 * GB, workstation).label == "Fits"
    assert fit(22 * GB, workstation).level == TIGHT
    too_big_for_gpu = fit(30 * GB, workstation)
    assert too_big_for_gpu.level == FITS
    assert too_big_for_gpu.label == "Fits on the CPU (too large for this GPU's 24 GB)"
    assert fit(100 * GB, workstation).label == "Too large for this GPU's 24 GB"


def test_bad_input_and_the_words_for_sizes():
    with pytest.raises(ValueError, match="needed"):
        fit(-1, LAPTOP)
    assert (gigabytes(24 * GB), gigabytes(int(7.5 * GB))) == ("24 GB", "7.5 GB")
    assert LAPTOP.describe() == "This computer: 24 GB of memory, 20 GB free"


def test_this_machine_has_some_memory(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    memory = read_machine_memory()
    assert memory.ram_total > GB and memory.gpu_total == 0
    assert memory.ram_available is None or 0 < memory.ram_available <= memory.ram_total
