"""Whether a model fits this machine: its memory read once (RAM, and the first CUDA GPU's
when the engine would run there) and a verdict per model for the models dialog.

The verdict compares the bytes a model needs (desktop_app.data.model_catalog.memory_needed)
with the memory of the device the engine picks by default, the GPU when there is one:

- "Fits": it needs at most FITS_SHARE of that memory and no more than is free now;
- "Tight": it fits in that memory, but only with other programs closed (more than
  FITS_SHARE of it, or more than is free now);
- "Too large for this computer's 16 GB" (or "this GPU's") otherwise. A model too large for
  the GPU that fits in RAM gets RAM's verdict, said to be on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

FITS, TIGHT, TOO_LARGE = "fits", "tight", "too_large"
# The share of a device's memory a model may take and still leave the system, the app and
# the other programs room to work.
FITS_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class MachineMemory:
    ram_total: int
    ram_available: int | None = None  # None where the system does not say
    gpu_name: str = ""
    gpu_total: int = 0  # 0: no CUDA GPU
    gpu_free: int | None = None

    def describe(self) -> str:
        """The dialog's line about this machine ("This computer: 16 GB of memory, 9 GB
        free · GPU: NVIDIA H100, 80 GB")."""
        ram = f"This computer: {gigabytes(self.ram_total)} of memory"
        if self.ram_available is not None:
            ram += f", {gigabytes(self.ram_available)} free"
        if self.gpu_total:
            ram += f" · GPU: {self.gpu_name}, {gigabytes(self.gpu_total)}"
        return ram


@dataclass(frozen=True, slots=True)
class Fit:
    level: str  # FITS, TIGHT or TOO_LARGE
    label: str


def gigabytes(n: int) -> str:
    """Memory as a system's settings show it: "24 GB" (binary gigabytes, like the OS)."""
    value = n / 2**30
    return f"{value:.0f} GB" if value >= 10 else f"{value:.1f} GB"


def fit(needed: int, memory: MachineMemory) -> Fit:
    """The verdict of the module doc for a model needing ``needed`` bytes."""
    if needed < 0:
        raise ValueError(f"needed must be >= 0 bytes, got {needed}")
    ram = _verdict(needed, memory.ram_total, memory.ram_available, "this computer's")
    if not memory.gpu_total:
        return ram
    gpu = _verdict(needed, memory.gpu_total, memory.gpu_free, "this GPU's")
    if gpu.level != TOO_LARGE or ram.level == TOO_LARGE:
        return gpu
    word = "Fits" if ram.level == FITS else "Tight"
    return Fit(ram.level, f"{word} on the CPU (too large for this GPU's "
                          f"{gigabytes(memory.gpu_total)})")


def _verdict(needed: int, total: int, free: int | None, whose: str) -> Fit:
    if needed > total:
        return Fit(TOO_LARGE, f"Too large for {whose} {gigabytes(total)}")
    if needed <= FITS_SHARE * total and (free is None or needed <= free):
        return Fit(FITS, "Fits")
    return Fit(TIGHT, "Tight: close other programs first")


def models_budget() -> int:
    """The app's one memory budget for its local models, weights and KV pools together
    (services.model_shelf): FITS_SHARE of the memory of the device the engine picks."""
    memory = read_machine_memory()
    return int(FITS_SHARE * (memory.gpu_total or memory.ram_total))


def read_machine_memory() -> MachineMemory:
    """This machine's RAM (and the first CUDA GPU's memory when there is one)."""
    total, available = _ram()
    gpu_name, gpu_total, gpu_free = "", 0, None
    try:
        import torch

        if torch.cuda.is_available():
            gpu_name = torch.cuda.get_device_name(0)
            gpu_free, gpu_total = torch.cuda.mem_get_info(0)
    except (ImportError, RuntimeError):
        pass  # a broken CUDA setup: the engine will run on the CPU
    return MachineMemory(total, available, gpu_name, gpu_total, gpu_free)


def _ram() -> tuple[int, int | None]:
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():  # Linux: MemAvailable counts the caches the kernel can drop
        fields = {}
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * 1024
        if "MemTotal" in fields:
            return fields["MemTotal"], fields.get("MemAvailable")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), None
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows)
        return _windows_ram()


def _windows_ram() -> tuple[int, int | None]:
    import ctypes

    class MemoryStatus(ctypes.Structure):
        _fields_ = [("length", ctypes.c_ulong), ("load", ctypes.c_ulong),
                    ("total", ctypes.c_ulonglong), ("available", ctypes.c_ulonglong),
                    ("page_total", ctypes.c_ulonglong), ("page_free", ctypes.c_ulonglong),
                    ("virtual_total", ctypes.c_ulonglong),
                    ("virtual_free", ctypes.c_ulonglong), ("extended", ctypes.c_ulonglong)]

    status = MemoryStatus()
    status.length = ctypes.sizeof(MemoryStatus)
    ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))  # type: ignore[attr-defined]
    return int(status.total), int(status.available)
