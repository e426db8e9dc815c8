"""MySQL's binary formats of values in rows events: DECIMAL and the temporal types.

Each function returns the bytes MySQL 8 writes for one non-NULL value of a column
(``decimal2bin``; ``DATETIME2``, ``TIMESTAMP2``, ``TIME2`` with ``fsp`` fractional digits;
``DATE`` in three bytes), after MySQL's ``strings/decimal.cc`` and ``my_time.cc``.

Contract: exact or nothing. A value the column cannot hold exactly (more fractional
digits than the scale or ``fsp``, an integer part too wide, a TIME beyond 838:59:59)
raises ``ValueError``; the caller (:func:`databus.binlog.rowevents.row_image`) turns it
into a :class:`~databus.core.errors.SchemaError` naming the column. Pure functions.
"""

from __future__ import annotations

import datetime as dt
import decimal

_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def decimal_bin(value: decimal.Decimal, precision: int, scale: int) -> bytes:
    """MySQL's binary DECIMAL (decimal2bin) of ``value``, which must fit (p, s) exactly."""
    if not value.is_finite():
        raise ValueError(f"{value} is not a finite decimal")
    q = value.quantize(decimal.Decimal(1).scaleb(-scale), context=decimal.Context(prec=200))
    if q != value:
        raise ValueError(f"{value} has more than {scale} fractional digits")
    sign, digits, exp = q.as_tuple()
    text = "".join(map(str, digits))
    assert isinstance(exp, int)
    intg = precision - scale
    int_digits = text[: len(text) + exp] if exp < 0 else text + "0" * exp
    frac_digits = text[len(text) + exp:] if exp < 0 else ""
    int_digits = int_digits.lstrip("0")
    if len(int_digits) > intg:
        raise ValueError(f"{value} does not fit DECIMAL({precision},{scale})")
    int_digits = int_digits.rjust(intg, "0")
    frac_digits = frac_digits.ljust(scale, "0")
    out = bytearray()
    lead = intg % 9
    if lead:
        out += int(int_digits[:lead]).to_bytes(_DIG2BYTES[lead], "big")
    for i in range(lead, intg, 9):
        out += int(int_digits[i:i + 9]).to_bytes(4, "big")
    full = scale - scale % 9
    for i in range(0, full, 9):
        out += int(frac_digits[i:i + 9]).to_bytes(4, "big")
    if scale % 9:
        out += int(frac_digits[full:]).to_bytes(_DIG2BYTES[scale % 9], "big")
    if sign and any(digits):
        out = bytearray(b ^ 0xFF for b in out)
    out[0] ^= 0x80
    return bytes(out)


def _frac(us: int, fsp: int) -> bytes:
    if fsp == 0:
        if us:
            raise ValueError("fractional seconds in a column without them")
        return b""
    div = 10 ** (6 - fsp)
    if us % div:
        raise ValueError(f"more than {fsp} fractional digits")
    n = (fsp + 1) // 2
    scale: int = 10 ** (6 - 2 * n)
    return (us // scale).to_bytes(n, "big")


def datetime2(v: dt.datetime, fsp: int) -> bytes:
    ym = v.year * 13 + v.month
    intpart = (((ym << 5) | v.day) << 17) | (v.hour << 12) | (v.minute << 6) | v.second
    return (intpart + 0x8000000000).to_bytes(5, "big") + _frac(v.microsecond, fsp)


def timestamp2(v: dt.datetime, fsp: int) -> bytes:
    if v.tzinfo is None:
        v = v.replace(tzinfo=dt.UTC)
    ts = v.timestamp()
    seconds = int(ts // 1)
    return seconds.to_bytes(4, "big") + _frac(v.microsecond, fsp)


def time2(us_total: int, fsp: int) -> bytes:
    """TIME2 of a signed duration in microseconds."""
    neg = us_total < 0
    a = -us_total if neg else us_total
    secs, us = divmod(a, 1_000_000)
    h, rest = divmod(secs, 3600)
    m, s = divmod(rest, 60)
    if h > 838:
        raise ValueError("TIME beyond 838:59:59")
    div = 10 ** (6 - fsp)
    if us % div:
        raise ValueError(f"more than {fsp} fractional digits")
    packed = (((h << 12) | (m << 6) | s) << 24) | us
    if neg:
        packed = -packed
    intpart = packed >> 24
    frac = packed - (intpart << 24)  # floor remainder
    if fsp == 0:
        return (intpart + 0x800000).to_bytes(3, "big")
    if fsp <= 4:
        # MySQL stores INT_PART and the C remainder of the packed value: for a negative
        # value with a fraction, the int part is one higher and the fraction negative
        if neg and frac:
            intpart += 1
            frac -= 1 << 24
        width = (fsp + 1) // 2  # bytes of the fraction: hundredths or ten-thousandths
        part = int(frac / 10 ** (6 - 2 * width)) & ((1 << 8 * width) - 1)
        return (intpart + 0x800000).to_bytes(3, "big") + part.to_bytes(width, "big")
    return (packed + 0x800000000000).to_bytes(6, "big")


def date3(v: dt.date) -> bytes:
    return (v.day | (v.month << 5) | (v.year << 9)).to_bytes(3, "little")
