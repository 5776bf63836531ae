"""softsyn.units: parsing what people write, printing what people read."""
import math

import pytest

from softsyn.errors import SoftsynError
from softsyn.units import (
    UnitError,
    fmt_bytes,
    fmt_count,
    fmt_percent,
    fmt_time,
    parse_bytes,
    parse_percent,
    parse_rate,
    parse_time,
)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("600ms", 0.6),
        ("2 s", 2.0),
        ("2s", 2.0),
        ("250us", 250e-6),
        ("250µs", 250e-6),  # micro sign
        ("250μs", 250e-6),  # Greek mu
        ("1.5 min", 90.0),
        ("40ns", 40e-9),
        (" 10 ms ", 0.01),
        ("1e-3 s", 1e-3),
        (".5s", 0.5),
        ("600MS", 0.6),
        ("-5ms", -0.005),
    ],
)
def test_parse_time(text, seconds):
    assert math.isclose(parse_time(text), seconds, rel_tol=1e-12)


def test_parse_time_exact_decimal():
    assert parse_time("100us") == 1e-4
    assert parse_time("600ms") == 0.6


@pytest.mark.parametrize(
    "bad, words",
    [
        ("600mss", ["'mss'", "'600mss'", "ns", "ms"]),
        ("600", ["needs a unit", "600ms"]),
        (600, ["needs a unit"]),
        (0.6, ["needs a unit"]),
        ("", ["cannot read"]),
        ("ms", ["cannot read"]),
        ("fast", ["cannot read"]),
        ("6 00ms", ["cannot read"]),
        (None, ["got None"]),
        (True, ["got True"]),
        ([1], ["string"]),
        ("2 sec", ["'sec'"]),
    ],
)
def test_parse_time_errors(bad, words):
    with pytest.raises(UnitError) as ei:
        parse_time(bad)
    msg = str(ei.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_unit_error_is_value_error_and_softsyn_error():
    with pytest.raises(ValueError):
        parse_time("1 parsec")
    with pytest.raises(SoftsynError):
        parse_bytes("1 parsec")


@pytest.mark.parametrize(
    "text, n",
    [
        ("80GB", 80 * 10**9),
        ("80 GiB", 80 * 2**30),
        ("80GiB", 80 * 2**30),
        ("80gb", 80 * 10**9),
        ("512B", 512),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("1.5 MB", 1_500_000),
        ("2MiB", 2 * 2**20),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        ("141GB", 141 * 10**9),
    ],
)
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n
    assert isinstance(parse_bytes(text), int)


@pytest.mark.parametrize(
    "bad, words",
    [
        ("80", ["needs a unit", "80GB", "80GiB"]),
        (80, ["needs a unit"]),
        ("80G", ["'G'", "GiB", "GB"]),
        ("80 gigs", ["'gigs'"]),
        ("lots", ["cannot read"]),
    ],
)
def test_parse_bytes_errors(bad, words):
    with pytest.raises(UnitError) as ei:
        parse_bytes(bad)
    for w in words:
        assert w in str(ei.value)


@pytest.mark.parametrize(
    "text, frac",
    [("5%", 0.05), ("1%", 0.01), ("99 %", 0.99), ("0.5%", 0.005), ("150%", 1.5),
     (0.05, 0.05), ("0.05", 0.05), (0, 0.0), (1, 1.0)],
)
def test_parse_percent(text, frac):
    assert math.isclose(parse_percent(text), frac)


@pytest.mark.parametrize("bad, words", [(5, ["fraction", "'5%'"]), ("5", ["fraction"]), ("5 pct", ["'pct'"]),
                                        ("x%", ["cannot read"]), (None, ["None"])])
def test_parse_percent_errors(bad, words):
    with pytest.raises(UnitError) as ei:
        parse_percent(bad)
    for w in words:
        assert w in str(ei.value)


def test_fmt_time():
    assert fmt_time(0.6) == "600.000 ms"
    assert fmt_time(0.6, unit="s", digits=1) == "0.6 s"
    assert fmt_time(250e-6, unit="us", digits=0) == "250 us"
    assert fmt_time(250e-6, unit="µs", digits=1) == "250.0 µs"
    assert fmt_time(0.0123, digits=2, suffix=False) == "12.30"
    assert fmt_time(-0.0015) == "-1.500 ms"
    assert fmt_time(250e-6, unit="auto") == "250.000 us"
    assert fmt_time(2.0, unit="auto", digits=1) == "2.0 s"
    assert fmt_time(40e-9, unit="auto", digits=0) == "40 ns"
    assert fmt_time(0.0, unit="auto", digits=0) == "0 s"
    with pytest.raises(UnitError):
        fmt_time(1.0, unit="fortnight")


def test_fmt_bytes():
    assert fmt_bytes(16_384_000_000) == "16.38 GB"
    assert fmt_bytes(80 * 2**30, binary=True) == "80.00 GiB"
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(1500) == "1.50 KB"
    assert fmt_bytes(2_000_000, digits=1) == "2.0 MB"
    assert fmt_bytes(3e15) == "3000.00 TB"  # largest unit
    assert fmt_bytes(-2e9) == "-2.00 GB"


def test_fmt_count_and_percent():
    assert fmt_count(8.192e9) == "8.19 G"
    assert fmt_count(512) == "512"
    assert fmt_count(1234) == "1.23 K"
    assert fmt_count(7.0e12, digits=1) == "7.0 T"
    assert fmt_percent(0.05) == "5.00%"
    assert fmt_percent(0.991, digits=1) == "99.1%"


def test_round_trip():
    for s in ["600ms", "2s", "250us"]:
        assert parse_time(fmt_time(parse_time(s), unit="auto")) == pytest.approx(parse_time(s))
    assert parse_bytes(fmt_bytes(16_380_000_000)) == 16_380_000_000


@pytest.mark.parametrize("text, rate", [("20/s", 20.0), ("1200/min", 20.0), ("200 tok/s", 200.0), (" 2.5 / ms", 2500.0)])
def test_parse_rate(text, rate):
    assert math.isclose(parse_rate(text), rate)


@pytest.mark.parametrize("text, message", [("20", "expected a number per time unit"), (20, "expected a number per"),
                                           ("20/h", "unknown rate unit '/h'"), ("1e400/s", "not a finite number")])
def test_parse_rate_refuses(text, message):
    with pytest.raises(UnitError, match=message):
        parse_rate(text)
