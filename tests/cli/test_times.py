"""Times as people type them: each accepted form to epoch ms, a one-line refusal for the rest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import click
import click.testing
import pytest

from mqstore.cli.times import (
    EPOCH_MS_MAX,
    TIME,
    format_time_ms,
    parse_time_ms,
)

NOW_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z: a fixed clock
PLUS_2 = timezone(timedelta(hours=2))
MINUS_5 = timezone(timedelta(hours=-5))
# 2026-11-21T10:00:00Z in epoch ms, the example of docs/client.md.
DOC_EXAMPLE_MS = 1_795_255_200_000


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("2026-11-21T10:00:00Z", DOC_EXAMPLE_MS),
        ("2026-11-21T10:00:00z", DOC_EXAMPLE_MS),  # typed in lower case
        ("2026-11-21t10:00:00Z", DOC_EXAMPLE_MS),
        ("2026-11-21T10:00:00+00:00", DOC_EXAMPLE_MS),
        ("2026-11-21T12:00:00+02:00", DOC_EXAMPLE_MS),
        ("2026-11-21T05:00:00-05:00", DOC_EXAMPLE_MS),
        ("2026-11-21 10:00:00Z", DOC_EXAMPLE_MS),  # a space instead of the T
        ("2026-11-21T10:00Z", DOC_EXAMPLE_MS),  # no seconds
        ("2026-11-21T10:00:00.123Z", DOC_EXAMPLE_MS + 123),
        ("2026-11-21T10:00:00.999999Z", DOC_EXAMPLE_MS + 999),  # microseconds truncate
        ("  2026-11-21T10:00:00Z  ", DOC_EXAMPLE_MS),
        ("1970-01-01T00:00:00Z", 0),
        ("9999-12-31T23:59:59.999Z", EPOCH_MS_MAX),
    ],
)
def test_iso_8601_with_a_zone_is_that_moment(text: str, expected_ms: int) -> None:
    assert parse_time_ms(text, now_ms=NOW_MS) == expected_ms


def test_iso_8601_without_a_zone_is_local_time() -> None:
    assert parse_time_ms("2026-11-21T12:00:00", local=PLUS_2) == DOC_EXAMPLE_MS
    assert parse_time_ms("2026-11-21T05:00:00", local=MINUS_5) == DOC_EXAMPLE_MS
    assert parse_time_ms("2026-11-21", local=PLUS_2) == DOC_EXAMPLE_MS - 12 * 3_600_000


def test_without_a_zone_the_machines_zone_applies() -> None:
    # datetime's own reading of a naive time as local is the reference (DST included).
    expected = int(datetime(2026, 7, 1, 9, 30).timestamp() * 1000)
    assert parse_time_ms("2026-07-01T09:30:00") == expected


def test_a_zone_in_the_text_wins_over_the_local_zone() -> None:
    assert parse_time_ms("2026-11-21T10:00:00Z", local=PLUS_2) == DOC_EXAMPLE_MS


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("0", 0),
        ("1795255200000", DOC_EXAMPLE_MS),
        ("999999999", 999_999_999),  # under the epoch-seconds look-alikes: taken as ms
        ("100000000000", 100_000_000_000),  # from 10^11 on: ms again (1973)
        (str(EPOCH_MS_MAX), EPOCH_MS_MAX),
    ],
)
def test_a_bare_number_is_epoch_milliseconds(text: str, expected_ms: int) -> None:
    assert parse_time_ms(text, now_ms=NOW_MS) == expected_ms


@pytest.mark.parametrize("text", ["now", "NOW", " Now "])
def test_now_is_the_clock(text: str) -> None:
    assert parse_time_ms(text, now_ms=NOW_MS) == NOW_MS


def test_now_reads_the_real_clock_by_default() -> None:
    before = int(datetime.now(UTC).timestamp() * 1000)
    at = parse_time_ms("now")
    after = int(datetime.now(UTC).timestamp() * 1000)
    assert before - 1 <= at <= after + 1


@pytest.mark.parametrize(
    ("text", "back_ms"),
    [
        ("10 minutes ago", 600_000),
        ("2h ago", 7_200_000),
        ("1 day ago", 86_400_000),
        ("90s ago", 90_000),
        ("1 week ago", 604_800_000),
        ("2 weeks ago", 1_209_600_000),
        ("1.5 hours ago", 5_400_000),
        ("500ms ago", 500),
        ("3 d ago", 3 * 86_400_000),
        ("1 MIN AGO", 60_000),
        ("0s ago", 0),
        ("  5m   ago ", 300_000),
    ],
)
def test_durations_ago_count_back_from_now(text: str, back_ms: int) -> None:
    assert parse_time_ms(text, now_ms=NOW_MS) == NOW_MS - back_ms


@pytest.mark.parametrize(
    ("text", "message_part"),
    [
        ("", "empty time"),
        ("   ", "empty time"),
        ("yesterday", "not a time"),
        ("-5", "not a time"),
        ("1e5", "not a time"),
        ("2026-13-01", "not a time"),
        ("2026-11-21T25:00:00Z", "not a time"),
        ("10 minutes", "needs 'ago'"),
        ("10 fortnights ago", "unknown unit 'fortnights'"),
        ("ago", "not a time"),
        ("1763719200", "looks like epoch seconds"),  # what `date +%s` prints
        ("99999999999", "looks like epoch seconds"),
        (str(EPOCH_MS_MAX + 1), "past the year 9999"),
        ("9" * 5000, "past the year 9999"),  # int() itself refuses over 4,300 digits
        ("1969-12-31T23:59:59Z", "before 1970"),
        ("100 weeks ago", "before 1970"),  # with the clock at 1970-01-01T00:00:01
        ("1" + "0" * 400 + " weeks ago", "before 1970"),  # a float overflowing to inf
        ("0001-01-01", "out of the range"),
    ],
)
def test_anything_else_is_a_one_line_bad_parameter(text: str, message_part: str) -> None:
    now = 1_000 if text == "100 weeks ago" else NOW_MS
    with pytest.raises(click.BadParameter) as raised:
        parse_time_ms(text, now_ms=now)
    message = raised.value.format_message()
    assert message_part in message
    assert "\n" not in message


def test_a_long_bad_value_is_shortened_in_the_message() -> None:
    with pytest.raises(click.BadParameter) as raised:
        parse_time_ms("x" * 1000, now_ms=NOW_MS)
    message = raised.value.format_message()
    assert "x" * 40 not in message and "x" * 30 + "..." in message


def test_epoch_seconds_refusal_says_what_to_type() -> None:
    with pytest.raises(click.BadParameter, match="1763719200000"):
        parse_time_ms("1763719200", now_ms=NOW_MS)


def test_the_click_type_names_the_option_in_its_error() -> None:
    @click.command()
    @click.option("--from-time", type=TIME)
    def cmd(from_time: int) -> None:
        click.echo(str(from_time))

    ok = click.testing.CliRunner().invoke(cmd, ["--from-time", "2026-11-21T10:00:00Z"])
    assert ok.exit_code == 0 and ok.output.strip() == str(DOC_EXAMPLE_MS)
    bad = click.testing.CliRunner().invoke(cmd, ["--from-time", "soon"])
    assert bad.exit_code == 2
    assert "Invalid value for '--from-time': 'soon': not a time" in bad.output


def test_format_time_ms_round_trips_through_parse() -> None:
    for ms in (0, DOC_EXAMPLE_MS, DOC_EXAMPLE_MS + 7, NOW_MS):
        assert parse_time_ms(format_time_ms(ms)) == ms
