"""engine/runner/heap.py: a freed activation-sized tensor comes back without page faults."""

from __future__ import annotations

import platform
import resource

import pytest
import torch

from engine.runner import heap

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="glibc's mallopt only")


def _faults_of_a_filled_tensor(mib: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(mib << 18, dtype=torch.float32)  # mib MiB
    t.fill_(1.0)
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@glibc
def test_freed_prefill_sized_tensors_are_reused_without_faults():
    assert heap.keep_freed_memory()
    _faults_of_a_filled_tensor(16)  # the heap grows once
    # A 16 MiB tensor is 4,096 pages: served by a fresh mapping, each of them faults.
    assert _faults_of_a_filled_tensor(16) < 64


@glibc
def test_past_the_threshold_memory_goes_back_to_the_system():
    assert heap.keep_freed_memory()
    # A KV pool's size: its own mapping, faulted in when touched and unmapped when freed.
    assert _faults_of_a_filled_tensor(64) >= (64 << 8) // 2
    assert _faults_of_a_filled_tensor(64) >= (64 << 8) // 2
