"""Quantities with units: parse what people write, print what people read.

Inside softsyn everything is SI: seconds, bytes, plain fractions. This module is
the only place where unit strings are read or written.

Parsing (`parse_time`, `parse_bytes`, `parse_percent`) accepts a number, optional
spaces and a unit: ``"600ms"``, ``"2 s"``, ``"250us"``, ``"250µs"``, ``"1.5min"``,
``"80GB"``, ``"80 GiB"``, ``"5%"``. Exponents are allowed (``"1e-3 s"``).

Decisions:

* Times and sizes need a unit. A bare number (``600`` or ``"600"``) is an error,
  because people mix up ms and s, and GB and GiB.
* Time units: ns, us (also µs / μs), ms, s, min. Matched case-insensitively
  (``"2S"`` is 2 s, ``"600MS"`` is 600 ms: nobody means megaseconds).
* Byte units: B; KB, MB, GB, TB are decimal (1e3 .. 1e12, as disk and GPU
  vendors write them: an H200 has "141 GB"); KiB, MiB, GiB, TiB are binary
  (2**10 .. 2**40). Matched case-insensitively (``"80gb"`` is 80 GB). Bits are
  never meant. ``parse_bytes`` returns an int (rounded to the nearest byte).
* Percentages: ``"5%"`` is 0.05. A bare number (``0.05`` or ``"0.05"``) is read as
  a fraction and must lie in 0..1, so ``5`` is rejected (write ``"5%"``), because
  it is unclear whether 5 means 5 % or 500 %.
* Signs are parsed (``"-5ms"`` is -0.005 s); callers check ranges.
* A value that is not a finite number (``"1e400ms"`` overflows, ``.inf``, ``.nan``) raises
  `NotFiniteError`, a `UnitError` callers can answer with the valid range.
* `UnitError` is both a `ValueError` and a `SoftsynError`, so the CLI prints it
  without a traceback.

Formatting: `fmt_time` prints in a fixed unit (default ms) or ``unit="auto"``;
`fmt_bytes` picks the unit and is decimal by default (``"16.38 GB"``), binary
with ``binary=True`` (``"15.26 GiB"``); `fmt_count` prints decimal SI prefixes
(``"8.19 G"``); `fmt_percent` prints ``"5.00%"``.
"""
from __future__ import annotations

import math
import re

from softsyn.errors import SoftsynError

__all__ = [
    "UnitError",
    "NotFiniteError",
    "TIME_UNITS",
    "BYTE_UNITS",
    "parse_time",
    "parse_bytes",
    "parse_percent",
    "parse_rate",
    "RATE_UNITS",
    "fmt_time",
    "fmt_bytes",
    "fmt_count",
    "fmt_percent",
]


class UnitError(SoftsynError, ValueError):
    """A quantity could not be parsed: the message says what was given and what is valid."""


class NotFiniteError(UnitError):
    """A quantity is infinite or NaN (``"1e400ms"``, ``.inf``): the caller adds the valid range."""


# unit -> seconds. Keys are the canonical spellings printed in messages.
TIME_UNITS: dict[str, float] = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}
_TIME_ALIASES: dict[str, str] = {"µs": "us", "μs": "us"}  # micro sign U+00B5, Greek mu U+03BC
_TIME_VALID = "ns, us (µs), ms, s, min"

# unit -> bytes
BYTE_UNITS: dict[str, int] = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}
_BYTES_BY_LOWER = {k.lower(): k for k in BYTE_UNITS}
_BYTES_VALID = "B, KB, MB, GB, TB (decimal, 1000), KiB, MiB, GiB, TiB (binary, 1024)"

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY = re.compile(rf"^\s*({_NUMBER})\s*([^\d\s.+-][^\s]*)?\s*$")


def _clip(text):
    """What was written, for a message: a long string cut to 40 characters."""
    return text if not isinstance(text, str) or len(text) <= 40 else text[:37] + "..."


def _split(text, what: str, example: str) -> tuple[float, str | None]:
    """Split ``"600 ms"`` into (600.0, "ms"); a bare number gives (x, None)."""
    if isinstance(text, bool) or text is None:
        raise UnitError(f"{what} must be a number with a unit, e.g. {example}; got {_clip(text)!r}")
    if isinstance(text, (int, float)):
        if isinstance(text, float) and not math.isfinite(text):
            raise NotFiniteError(f"{what} {_clip(text)!r} is not a finite number")
        if isinstance(text, int) and abs(text) > 1e300:
            raise NotFiniteError(f"{what} of {len(str(abs(text)))} digits is not a finite number")
        return float(text), None
    if not isinstance(text, str):
        raise UnitError(f"{what} must be a string like {example}; got {type(text).__name__} {_clip(text)!r}")
    m = _QUANTITY.match(text)
    if not m:
        raise UnitError(f"cannot read {what} {_clip(text)!r}: expected a number and a unit, e.g. {example}")
    value = float(m.group(1))
    if not math.isfinite(value):  # "1e400": float() overflows to inf
        raise NotFiniteError(f"{what} {_clip(text)!r} is not a finite number")
    return value, m.group(2)


def _bare(value: float) -> str:
    return f"{value:g}"


def parse_time(text: str | float) -> float:
    """``"600ms"`` -> 0.6 seconds. Units: ns, us/µs, ms, s, min. A bare number is an error."""
    value, unit = _split(text, "time", "'600ms'")
    if unit is None:
        n = _bare(value)
        raise UnitError(
            f"time {_clip(text)!r} needs a unit, e.g. '{n}ms' or '{n}s'; valid units: {_TIME_VALID}"
        )
    key = unit.lower()
    key = _TIME_ALIASES.get(key, key)
    if key not in TIME_UNITS:
        raise UnitError(f"unknown time unit {_clip(unit)!r} in {_clip(text)!r}; valid units: {_TIME_VALID}")
    factor = TIME_UNITS[key]
    # divide by an exact power of ten for sub-second units: "100us" -> 1e-4, not 9.999999999999999e-05
    seconds = value / round(1.0 / factor) if factor < 1 else value * factor
    if not math.isfinite(seconds):
        raise NotFiniteError(f"time {_clip(text)!r} is not a finite number")
    return seconds


def parse_bytes(text: str | float) -> int:
    """``"80GB"`` -> 80_000_000_000; ``"80GiB"`` -> 80 * 2**30. A bare number is an error."""
    value, unit = _split(text, "size", "'80GB'")
    if unit is None:
        n = _bare(value)
        raise UnitError(
            f"size {_clip(text)!r} needs a unit, e.g. '{n}GB' or '{n}GiB'; valid units: {_BYTES_VALID}"
        )
    key = _BYTES_BY_LOWER.get(unit.lower())
    if key is None:
        raise UnitError(f"unknown size unit {_clip(unit)!r} in {_clip(text)!r}; valid units: {_BYTES_VALID}")
    b = value * BYTE_UNITS[key]
    if not math.isfinite(b):
        raise NotFiniteError(f"size {_clip(text)!r} is not a finite number")
    return int(round(b))


def parse_percent(text: str | float) -> float:
    """``"5%"`` -> 0.05. A bare number is a fraction and must lie in 0..1 (``0.05`` -> 0.05)."""
    value, unit = _split(text, "percentage", "'5%'")
    if unit is None:
        if not 0.0 <= value <= 1.0:
            n = _bare(value)
            raise UnitError(
                f"percentage {_clip(text)!r}: a bare number is read as a fraction and must lie in 0..1; "
                f"write '{n}%' for {n} percent"
            )
        return value
    if unit != "%":
        raise UnitError(f"unknown percentage unit {_clip(unit)!r} in {_clip(text)!r}; "
                        "valid: '%' (e.g. '5%') or a fraction 0..1")
    return value / 100.0


# per-second factor of a rate's time unit: "20/s", "1200/min", "200 tok/s" (a word before the slash names what is
# counted and is not checked)
RATE_UNITS: dict[str, float] = {"s": 1.0, "min": 1 / 60.0, "ms": 1e3}
_RATE = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z]*)\s*/\s*([A-Za-z]+)\s*$")


def parse_rate(text: str | float) -> float:
    """``"20/s"`` -> 20.0 per second; ``"1200/min"`` -> 20.0; ``"200 tok/s"`` -> 200.0. A bare number is an error
    (per second or per minute?)."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise UnitError(f"rate must be a number per time unit, e.g. '20/s'; got {_clip(text)!r}")
    m = _RATE.match(str(text))
    if not m:
        raise UnitError(f"cannot read rate {_clip(text)!r}: expected a number per time unit, e.g. '20/s', "
                        "'1200/min', '200 tok/s'")
    unit = m.group(3).lower()
    if unit not in RATE_UNITS:
        raise UnitError(f"unknown rate unit '/{_clip(m.group(3))}' in {_clip(text)!r}; valid: /s, /min, /ms")
    value = float(m.group(1)) * RATE_UNITS[unit]
    if not math.isfinite(value):
        raise NotFiniteError(f"rate {_clip(text)!r} is not a finite number")
    return value


# ---------------------------------------------------------------------------- formatting

_TIME_FMT_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}


def _auto_time_unit(seconds: float) -> str:
    a = abs(seconds)
    if a == 0 or a >= 1.0:
        return "s" if a < 600 else "min"
    if a >= 1e-3:
        return "ms"
    if a >= 1e-6:
        return "us"
    return "ns"


def fmt_time(seconds: float, unit: str = "ms", digits: int = 3, suffix: bool = True) -> str:
    """0.6 -> ``"600.000 ms"``. ``unit`` is ns, us/µs, ms, s, min or ``"auto"``;
    ``digits`` is the number of decimals; ``suffix=False`` leaves the unit off (report columns)."""
    if unit == "auto":
        unit = _auto_time_unit(seconds)
    if unit not in _TIME_FMT_UNITS:
        raise UnitError(f"unknown time unit {unit!r} for printing; valid units: {_TIME_VALID}, auto")
    factor = _TIME_FMT_UNITS[unit]
    scaled = seconds * round(1.0 / factor) if factor < 1 else seconds / factor
    text = f"{scaled:.{digits}f}"
    return f"{text} {unit}" if suffix else text


def fmt_bytes(b: float, digits: int = 2, binary: bool = False) -> str:
    """Bytes with an automatic unit: 16_384_000_000 -> ``"16.38 GB"`` (decimal by default);
    ``binary=True`` -> ``"15.26 GiB"``. Below one kilobyte: ``"512 B"``."""
    units = ["KiB", "MiB", "GiB", "TiB"] if binary else ["KB", "MB", "GB", "TB"]
    base = 1024.0 if binary else 1000.0
    a = abs(b)
    if a < base:
        return f"{b:.0f} B" if float(b).is_integer() else f"{b:.{digits}f} B"
    value, name = float(b), "B"
    for u in units:
        value /= base
        name = u
        if abs(value) < base:
            break
    return f"{value:.{digits}f} {name}"


_COUNT_PREFIXES = ["K", "M", "G", "T", "P", "E"]


def fmt_count(n: float, digits: int = 2) -> str:
    """A count (FLOPs, parameters, elements) with a decimal SI prefix: 8.192e9 -> ``"8.19 G"``.
    Below 1000: ``"512"`` (integers) or ``"0.50"``."""
    a = abs(n)
    if a < 1000:
        return f"{n:.0f}" if float(n).is_integer() else f"{n:.{digits}f}"
    value, name = float(n), ""
    for p in _COUNT_PREFIXES:
        value /= 1000.0
        name = p
        if abs(value) < 1000:
            break
    return f"{value:.{digits}f} {name}"


def fmt_percent(fraction: float, digits: int = 2) -> str:
    """0.05 -> ``"5.00%"``."""
    return f"{fraction * 100:.{digits}f}%"
