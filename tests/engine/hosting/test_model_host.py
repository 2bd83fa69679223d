"""ModelHost with fake models (a worker stand-in of known size) and a fake clock: loading
on demand, keep-alive, idle and memory-pressure unloading, and concurrent leases."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from engine.config import EngineConfig
from engine.hosting import ModelHost, ModelWontFit
from engine.hosting.events import ModelLoaded, ModelUnloaded

GIB = 1 << 30


@dataclass
class FakeStats:
    weights_bytes: int
    kv_pool_bytes: int
    state_pool_bytes: int = 0


class FakeWorker:
    def __init__(self, name: str, weights: int, kv: int) -> None:
        self.name, self.stats, self.stopped = name, FakeStats(weights, kv), False

    def memory_stats(self) -> FakeStats:
        return self.stats

    def shutdown(self) -> None:
        self.stopped = True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Library:
    """Model sizes in GiB as (weights, kv); records every load."""

    def __init__(self, **sizes: tuple[int, int]) -> None:
        self.sizes, self.loads, self.workers = sizes, [], {}

    def load(self, name: str) -> FakeWorker:
        if name not in self.sizes:
            raise KeyError(name)
        self.loads.append(name)
        weights, kv = self.sizes[name]
        self.workers[name] = FakeWorker(name, weights * GIB, kv * GIB)
        return self.workers[name]

    def estimate(self, name: str) -> int:
        if name not in self.sizes:
            raise KeyError(name)
        return sum(self.sizes[name]) * GIB


def make_host(library: Library, budget_gib: int | None = 10, **kwargs) -> ModelHost:
    kwargs.setdefault("clock", Clock())
    return ModelHost(EngineConfig(), None if budget_gib is None else budget_gib * GIB,
                     load=library.load, estimate=library.estimate, **kwargs)


def states(host: ModelHost) -> dict[str, str]:
    return {m.name: m.state for m in host.models()}


def test_loads_on_demand_once_and_reports_measured_memory():
    library = Library(a=(2, 1))
    host = make_host(library)
    assert host.models() == []
    with host.lease("a") as lease:
        assert lease.worker is library.workers["a"]
        (model,) = host.models()
        assert (model.name, model.state, model.running, model.idle_s) == ("a", "loaded", 1, None)
        assert (model.weights_bytes, model.kv_bytes, model.total_bytes) == (2 * GIB, GIB,
                                                                             3 * GIB)
    with host.lease("a"):
        pass
    assert library.loads == ["a"]
    assert host.models()[0].running == 0


def test_unknown_model_raises_and_leaves_nothing_behind():
    host = make_host(Library())
    with pytest.raises(KeyError):
        host.lease("nope")
    assert host.models() == []


def test_idle_models_are_reaped_after_their_keep_alive():
    library, clock = Library(a=(1, 1), b=(1, 1)), Clock()
    host = make_host(library, clock=clock, keep_alive_s=60)
    host.lease("a").release()
    host.lease("b", keep_alive_s=300).release()
    clock.now += 59
    assert host.reap() == []
    assert host.models()[0].idle_s == pytest.approx(59)
    clock.now += 1
    assert host.reap() == ["a"]
    assert library.workers["a"].stopped and not library.workers["b"].stopped
    clock.now += 240
    assert host.reap() == ["b"]
    assert host.models() == []


def test_a_leased_model_is_never_reaped_and_its_idle_time_starts_at_release():
    library, clock = Library(a=(1, 1)), Clock()
    host = make_host(library, clock=clock, keep_alive_s=10)
    lease = host.lease("a")
    clock.now += 100
    assert host.reap() == []
    lease.release()
    lease.release()  # a second release changes nothing
    assert host.models()[0].running == 0
    clock.now += 9
    assert host.reap() == []


def test_keep_alive_none_keeps_a_model_forever():
    library, clock = Library(a=(1, 1)), Clock()
    host = make_host(library, clock=clock, keep_alive_s=None)
    host.lease("a").release()
    clock.now += 10 ** 9
    assert host.reap() == []


def test_keep_alive_zero_unloads_when_the_last_lease_ends():
    library = Library(a=(1, 1))
    host = make_host(library)
    first = host.lease("a", keep_alive_s=0)
    second = host.lease("a", keep_alive_s=0)
    first.release()
    assert states(host) == {"a": "loaded"}  # another request still runs on it
    second.release()
    assert host.models() == [] and library.workers["a"].stopped


def test_memory_pressure_unloads_the_least_recently_used_idle_model():
    library, clock = Library(a=(2, 1), b=(2, 1), c=(2, 1), d=(2, 1)), Clock()
    events = []
    host = make_host(library, budget_gib=9, clock=clock)
    host.set_listener(events.append)
    for name in "abc":
        clock.now += 1
        host.lease(name).release()
    clock.now += 1
    host.lease("a").release()  # a is now the most recent: b is the oldest
    clock.now += 1
    host.lease("d").release()
    assert states(host) == {"a": "loaded", "c": "loaded", "d": "loaded"}
    assert library.workers["b"].stopped
    assert ModelUnloaded("b", "room") in events
    assert ModelLoaded("d", 3 * GIB) in events
    assert host.used_bytes() == 9 * GIB


def test_memory_pressure_skips_busy_models():
    library, clock = Library(a=(2, 1), b=(2, 1), c=(2, 1), d=(2, 1)), Clock()
    host = make_host(library, budget_gib=9, clock=clock)
    clock.now += 1
    busy = host.lease("a")  # the oldest, but running
    for name in "bc":
        clock.now += 1
        host.lease(name).release()
    host.lease("d").release()
    assert states(host) == {"a": "loaded", "c": "loaded", "d": "loaded"}
    assert not library.workers["a"].stopped
    busy.release()


def test_a_model_that_cannot_fit_says_so_before_loading_anything():
    library = Library(a=(3, 1), b=(3, 1), big=(5, 1), huge=(20, 1))
    host = make_host(library, budget_gib=10)
    a, b = host.lease("a"), host.lease("b")
    with pytest.raises(ModelWontFit) as info:
        host.lease("big")
    message = str(info.value)
    assert "'big' needs 6.00 GiB" in message and "10.00 GiB" in message
    assert "a (4.00 GiB, busy)" in message and "b (4.00 GiB, busy)" in message
    assert library.loads == ["a", "b"] and states(host) == {"a": "loaded", "b": "loaded"}
    with pytest.raises(ModelWontFit, match="more than the whole memory budget"):
        host.lease("huge")
    a.release()
    # Now a is idle: it makes room, and b (busy) is kept.
    host.lease("big").release()
    assert states(host) == {"b": "loaded", "big": "loaded"}
    b.release()


def test_a_lease_arriving_while_its_model_loads_waits_for_that_load():
    started, finish = threading.Event(), threading.Event()
    library = Library(a=(1, 1))
    plain_load = library.load

    def slow_load(name):
        started.set()
        assert finish.wait(10)
        return plain_load(name)

    host = ModelHost(EngineConfig(), 10 * GIB, clock=Clock(), load=slow_load,
                     estimate=library.estimate)
    leases = []
    first = threading.Thread(target=lambda: leases.append(host.lease("a")))
    first.start()
    assert started.wait(10)
    assert states(host) == {"a": "loading"}
    assert host.models()[0].total_bytes == 2 * GIB  # the estimate, while loading
    second = threading.Thread(target=lambda: leases.append(host.lease("a")))
    second.start()
    second.join(0.05)
    assert second.is_alive()  # waiting for the load, not loading again
    finish.set()
    first.join(10)
    second.join(10)
    assert library.loads == ["a"]
    assert [lease.worker for lease in leases] == [library.workers["a"]] * 2
    assert host.models()[0].running == 2


def test_callers_waiting_on_a_failed_load_get_its_error():
    started, finish = threading.Event(), threading.Event()

    def failing_load(name):
        started.set()
        assert finish.wait(10)
        raise OSError("the file is gone")

    host = ModelHost(EngineConfig(), None, load=failing_load, estimate=lambda name: 1)
    errors = []

    def lease():
        try:
            host.lease("a")
        except OSError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=lease) for _ in range(2)]
    threads[0].start()
    assert started.wait(10)
    threads[1].start()
    finish.set()
    for thread in threads:
        thread.join(10)
    assert errors == ["the file is gone"] * 2
    assert host.models() == []


def test_unload_and_shutdown():
    library = Library(a=(1, 1), b=(1, 1))
    host = make_host(library, budget_gib=None)
    held = host.lease("a")
    host.lease("b").release()
    assert not host.unload("a")  # a request holds it
    assert host.unload("b") and not host.unload("b")
    held.release()
    host.shutdown()
    assert host.models() == [] and library.workers["a"].stopped
    with pytest.raises(RuntimeError, match="shut down"):
        host.lease("a")


@pytest.mark.parametrize("field, kwargs", [
    ("budget_bytes", {"budget_bytes": 0}), ("budget_bytes", {"budget_bytes": 1.5}),
    ("keep_alive_s", {"keep_alive_s": -1}), ("keep_alive_s", {"keep_alive_s": "5m"}),
])
def test_bad_settings_name_the_field(field, kwargs):
    with pytest.raises(ValueError, match=f"^{field} must"):
        ModelHost(EngineConfig(), **kwargs)
