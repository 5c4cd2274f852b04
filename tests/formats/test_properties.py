"""Message properties as RocketMQ serialises them (rocketmq-store.md §1.5)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats._core import property_columns
from mqstore.formats.javahash import tags_code
from mqstore.formats.properties import (
    KEYS,
    TAGS,
    UNIQ_KEY,
    decode_properties,
    encode_properties,
    property_value,
    split_keys,
)

text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=30,
)


def test_every_pair_ends_with_0x02_including_the_last() -> None:
    raw = encode_properties({"TAGS": "TagA", "KEYS": "k1 k2"})
    assert raw == b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02"
    assert raw.endswith(b"\x02")
    assert raw.count(b"\x02") == 2 and raw.count(b"\x01") == 2


def test_encoding_is_utf8_and_keeps_the_mappings_order() -> None:
    raw = encode_properties({"b": "ü", "a": "日本"})
    assert raw == "b\x01ü\x02a\x01日本\x02".encode()
    assert len(raw) == 1 + 1 + 2 + 1 + 1 + 1 + 6 + 1  # the length field counts bytes


@pytest.mark.parametrize("props", [None, {}])
def test_no_properties_encode_to_nothing(props: dict[str, str] | None) -> None:
    assert encode_properties(props) == b""
    assert decode_properties(b"") == {}


def test_entries_with_an_empty_value_are_skipped() -> None:
    assert encode_properties({"A": "", "B": "1", "C": ""}) == b"B\x011\x02"


@pytest.mark.parametrize(
    ("key", "value"),
    [("K\x01", "v"), ("K", "v\x01"), ("K\x02", "v"), ("K", "a\x02b"), ("\x01", "v")],
)
def test_separators_inside_keys_or_values_are_refused(key: str, value: str) -> None:
    with pytest.raises(ValueError, match="separator"):
        encode_properties({key: value})


@settings(max_examples=200, deadline=None)
@given(props=st.dictionaries(text, text, max_size=10))
def test_encode_then_decode_round_trips(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


def test_decode_accepts_bytes_memoryview_and_str_alike() -> None:
    raw = b"K\x01v\x02"
    assert decode_properties(raw) == decode_properties(memoryview(raw)) == {"K": "v"}
    assert decode_properties("K\x01v\x02") == {"K": "v"}


# -- the parser quirks of string2messageProperties ----------------------------------------------


@pytest.mark.parametrize("segment", ["", "a", "ab", "\x01a", "a\x01"])
def test_segments_shorter_than_3_chars_are_ignored(segment: str) -> None:
    assert decode_properties(segment + "\x02K\x01v\x02") == {"K": "v"}


def test_a_3_char_segment_is_the_shortest_that_counts() -> None:
    assert decode_properties("a\x01b\x02") == {"a": "b"}


@pytest.mark.parametrize(
    "segment",
    ["\x01ab", "ab\x01", "abc", "\x01\x01\x01"],
    ids=["empty-key", "empty-value", "no-separator", "only-separators"],
)
def test_the_first_0x01_must_lie_strictly_inside_the_segment(segment: str) -> None:
    assert decode_properties(segment + "\x02") == {}


def test_only_the_first_0x01_splits_key_from_value() -> None:
    assert decode_properties("k\x01v\x01w\x02") == {"k": "v\x01w"}


def test_a_last_pair_without_its_0x02_still_parses() -> None:
    # RocketMQ's split tolerates a missing final separator; so do we.
    assert decode_properties(b"A\x011\x02B\x012") == {"A": "1", "B": "2"}


def test_a_repeated_key_keeps_the_last_value() -> None:
    assert decode_properties("K\x011\x02K\x012\x02") == {"K": "2"}


def test_invalid_utf8_never_raises() -> None:
    got = decode_properties(b"K\x01\xff\xfe\x02G\x01ok\x02")
    assert got["G"] == "ok" and "K" in got


def test_an_empty_key_is_refused_rather_than_silently_lost() -> None:
    # RocketMQ's Message.putUserProperty refuses blank names; a store that accepts one loses
    # it on the way back, because the parser requires a non-empty key.
    with pytest.raises(ValueError):
        encode_properties({"": "value"})


# -- split_keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (None, []),
        ("", []),
        ("k1", ["k1"]),
        ("k1 k2", ["k1", "k2"]),
        ("  k1   k2 ", ["k1", "k2"]),
        ("k1 k1", ["k1", "k1"]),  # no dedup: RocketMQ indexes a repeated key twice
        ("k1\tk2", ["k1\tk2"]),  # the separator is a space, nothing else
    ],
)
def test_split_keys_returns_the_non_empty_space_separated_tokens(
    keys: str | None, expected: list[str]
) -> None:
    assert split_keys(keys) == expected


# Fragments that make every shape the parser treats specially: separators in every position,
# names that are prefixes or suffixes of others, bytes that are not UTF-8 or cut a sequence.
_FRAGMENTS = st.sampled_from(
    [
        *(b"KEYS", b"TAGS", b"UNIQ_KEY", b"K", b"S", b"\x01", b"\x02", b"a", b" "),
        *(b"\xe2", b"\xe2\x82", b"\xff", "ü".encode(), "日".encode(), "😀".encode()),
    ]
)


@settings(max_examples=600)
@given(
    raws=st.lists(st.lists(_FRAGMENTS, max_size=16).map(b"".join), max_size=5),
    name=st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "K"]),
)
def test_one_property_is_found_as_the_full_parser_finds_it(raws: list[bytes], name: str) -> None:
    expected = [decode_properties(raw).get(name, "") for raw in raws]
    assert [property_value(raw, name) for raw in raws] == expected


@settings(max_examples=600)
@given(raws=st.lists(st.lists(_FRAGMENTS, max_size=16).map(b"".join), max_size=5))
def test_the_compiled_columns_are_property_values(raws: list[bytes]) -> None:
    """The compiled core's lookup (what dispatch frames carry): TAGS as tags_code hashes it."""
    tags_codes, keys, uniq_keys = property_columns(raws)
    assert tags_codes == [tags_code(property_value(raw, TAGS) or None) for raw in raws]
    assert keys == [property_value(raw, KEYS) for raw in raws]
    assert uniq_keys == [property_value(raw, UNIQ_KEY) for raw in raws]


def test_a_producers_batch_has_its_values_whatever_bytes_they_hold() -> None:
    """What Producer.send_batch sends: common properties, then a UNIQ_KEY each (and a value
    ending in NUL bytes, which a fixed-width bytes view would drop)."""
    prefix = encode_properties({TAGS: "blue", "x": "y"}) + b"UNIQ_KEY\x01"
    raws = [prefix + b"7F0000010000%04X" % i + b"\x02" for i in range(300)]
    raws.append(prefix + b"7F00000100000\x00\x00\x00\x02")
    tags_codes, keys, uniq_keys = property_columns(raws)
    assert tags_codes == [tags_code("blue")] * 301 and keys == [""] * 301
    assert uniq_keys[5] == "7F00000100000005" and uniq_keys[-1] == "7F00000100000\x00\x00\x00"
