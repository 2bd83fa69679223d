"""The bench's own-process probes: the peak-RSS reader and the report channel, including a
probe that fails after reporting part of its figures."""

from __future__ import annotations

import sys

from engine.bench.probe import MARK, parse_reports, peak_rss_bytes, run_probe


def test_peak_rss_reads_vmhwm(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t  123456 kB\nVmRSS:\t 1 kB\n")
    assert peak_rss_bytes(str(status)) == 123456 * 1024
    status.write_text("Name:\tpython\n")
    assert peak_rss_bytes(str(status)) is None
    assert peak_rss_bytes(str(tmp_path / "missing")) is None
    if sys.platform == "linux":  # this process's own peak: at least what it holds now
        assert peak_rss_bytes() > 10 * 2**20


def test_reports_merge_and_survive_a_failure():
    text = f"noise\n{MARK}{{\"a\": 1, \"b\": 2}}\n{MARK}{{\"b\": 3}}\n"
    assert parse_reports(text) == {"a": 1, "b": 3}
    assert parse_reports(text.encode()) == {"a": 1, "b": 3}
    assert parse_reports(None) == {}
    # A probe that reports, then raises: the report survives, the error says what failed.
    got = run_probe("engine.bench.probe:emit", {"values": {"x": 1}}, 60)
    assert got == {"x": 1}
    got = run_probe("engine.bench.probe:emit", {"values": {"x": 1}, "bad": 2}, 60)
    assert "x" not in got and got["error"].startswith("exit status 1: TypeError")
