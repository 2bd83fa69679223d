import math

import pytest

from engine.hosting import parse_keep_alive


@pytest.mark.parametrize("value, seconds", [
    (0, 0.0), (30, 30.0), (2.5, 2.5), ("0", 0.0), ("300", 300.0), ("30s", 30.0),
    ("5m", 300.0), ("1h", 3600.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1.5m", 90.0),
    (" 10s ", 10.0),
])
def test_durations_are_seconds(value, seconds):
    assert parse_keep_alive(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [-1, -0.5, "-1", "-5m", math.inf, None])
def test_negative_keeps_forever(value):
    assert parse_keep_alive(value) is None


@pytest.mark.parametrize("value", ["", "5 minutes", "m", "5x", "1h-3m", True, [], "nan",
                                   math.nan, {"s": 1}])
def test_bad_values_name_the_field(value):
    with pytest.raises(ValueError, match="^ttl must"):
        parse_keep_alive(value, "ttl")
