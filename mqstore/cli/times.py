"""Times as a person types them, turned into epoch milliseconds (the store's clock unit).

    2026-11-21T10:00:00Z            ISO 8601 with a zone (Z, +01:00, ...)
    2026-11-21T10:00:00, 2026-11-21 ISO 8601 without one: local time
    1763719200000                   epoch milliseconds (a bare number)
    now                             the current time
    10 minutes ago, 2h ago, 1 day ago, 90s ago, 1 week ago, 1.5 hours ago

Used by `consume --from-time`, `query key --begin/--end` and `offsets reset --to-time`. Pure
functions: `now_ms` and the local zone can be passed in, so the tests need no clock.
Anything else is a click.BadParameter with a one-line message (exit 2, no traceback).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, tzinfo
from typing import Final

import click

MS_PER_UNIT: Final[dict[str, int]] = {}
for _names, _ms in (
    (("ms", "msec", "msecs", "millisecond", "milliseconds"), 1),
    (("s", "sec", "secs", "second", "seconds"), 1_000),
    (("m", "min", "mins", "minute", "minutes"), 60_000),
    (("h", "hr", "hrs", "hour", "hours"), 3_600_000),
    (("d", "day", "days"), 86_400_000),
    (("w", "wk", "wks", "week", "weeks"), 7 * 86_400_000),
):
    for _name in _names:
        MS_PER_UNIT[_name] = _ms

_AGO: Final = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-z]+)\s+ago$")
_AGO_MISSING: Final = re.compile(r"^\d+(?:\.\d+)?\s*[a-z]+$")
_DIGITS: Final = re.compile(r"^\d+$")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

# A bare number from 10^9 up to 10^11 is, as milliseconds, a moment in 1970-1973: nobody means
# that, but it is what `date +%s` prints now (epoch seconds, 10 digits until 2286). Refusing it
# turns a silent "everything since 1970" into a message that says what to type instead.
EPOCH_SECONDS_LOOKALIKE_MIN: Final = 10**9
EPOCH_SECONDS_LOOKALIKE_MAX: Final = 10**11
# datetime's own range ends in year 9999; 2**63 ms is further still, so anything parsed fits
# the store's int64 timestamps.
EPOCH_MS_MAX: Final = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z

FORMS_HELP: Final = (
    'ISO 8601 ("2026-11-21T10:00:00Z"; local time when no zone), epoch milliseconds, '
    '"now", or "10 minutes ago" / "2h ago" / "1 day ago"'
)


# How much of a bad value an error message repeats: enough to recognise it, one line in all.
ECHO_CHARS_MAX: Final = 40


def _bad(text: str, why: str) -> click.BadParameter:
    shown = text if len(text) <= ECHO_CHARS_MAX else text[: ECHO_CHARS_MAX - 3] + "..."
    return click.BadParameter(f"{shown!r}: {why}")


def parse_time_ms(text: str, *, now_ms: int | None = None, local: tzinfo | None = None) -> int:
    """Epoch milliseconds for `text`. `now_ms` defaults to the clock, `local` (the zone of a
    time written without one) to the machine's zone, DST included."""
    raw = text
    text = text.strip().lower()
    if not text:
        raise _bad(raw, f"empty time; give {FORMS_HELP}")
    if text == "now":
        return _now(now_ms)
    if _DIGITS.match(text):
        if len(text) > len(str(EPOCH_MS_MAX)):  # int() refuses over 4,300 digits
            raise _bad(raw, "epoch milliseconds past the year 9999")
        return _epoch_ms(raw, int(text))
    ago = _AGO.match(text)
    if ago is not None:
        return _ago(raw, float(ago.group(1)), ago.group(2), _now(now_ms))
    if _AGO_MISSING.match(text):
        raise _bad(raw, f"a duration needs 'ago' ({text} ago); durations count back from now")
    return _iso(raw, text, local)


def _now(now_ms: int | None) -> int:
    return time.time_ns() // 1_000_000 if now_ms is None else now_ms


def _epoch_ms(raw: str, value: int) -> int:
    if EPOCH_SECONDS_LOOKALIKE_MIN <= value < EPOCH_SECONDS_LOOKALIKE_MAX:
        raise _bad(
            raw,
            f"looks like epoch seconds; this takes epoch milliseconds ({value}000)",
        )
    if value > EPOCH_MS_MAX:
        raise _bad(raw, "epoch milliseconds past the year 9999")
    return value


def _ago(raw: str, amount: float, unit: str, now_ms: int) -> int:
    per = MS_PER_UNIT.get(unit)
    if per is None:
        units = "ms, s, m, h, d, w (or seconds, minutes, hours, days, weeks)"
        raise _bad(raw, f"unknown unit {unit!r}; use {units}")
    back_ms = amount * per
    if back_ms > now_ms:  # also catches a float overflowing to inf
        raise _bad(raw, "that is before 1970 (epoch milliseconds start at 0)")
    return now_ms - round(back_ms)


def _iso(raw: str, text: str, local: tzinfo | None) -> int:
    # fromisoformat wants the "T" and the zone in upper case ("2026-11-21t10:00z" is typed too).
    try:
        moment = datetime.fromisoformat(text.upper())
    except ValueError:
        raise _bad(raw, f"not a time; give {FORMS_HELP}") from None
    try:
        if moment.tzinfo is None:
            # astimezone() on a naive datetime takes it as the machine's local time.
            moment = moment.astimezone() if local is None else moment.replace(tzinfo=local)
        # Integer arithmetic: timestamp() is a float and would round some milliseconds.
        delta = moment - _EPOCH
    except (OverflowError, ValueError, OSError):  # years 1 and 9999 at the edges of local time
        raise _bad(raw, "out of the range of times this can take") from None
    at = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    if at < 0:
        raise _bad(raw, "that is before 1970 (epoch milliseconds start at 0)")
    return at


def format_time_ms(ms: int) -> str:
    """Local time with milliseconds, as the human outputs print store timestamps."""
    moment = datetime.fromtimestamp(ms / 1000).astimezone()
    return moment.isoformat(timespec="milliseconds")


class TimeType(click.ParamType[int]):
    """A click parameter type: the value arrives as epoch milliseconds."""

    name = "TIME"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_time_ms(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


TIME: Final = TimeType()
