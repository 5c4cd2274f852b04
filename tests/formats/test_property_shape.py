"""formats/property_shape.py: the fast batch check agrees with the grammar's regex, and a blob
the grammar accepts reads back (decode_properties) as exactly the pairs it holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mqstore.formats._core import malformed_properties
from mqstore.formats.properties import decode_properties, encode_properties
from mqstore.formats.property_shape import malformed_reason, well_formed

# Blobs made mostly of separators and a couple of letters, so every shape comes up.
pieces = st.sampled_from([b"\x01", b"\x02", b"a", b"bc", b"\xc3\xa9"])
blobs = st.lists(pieces, max_size=8).map(b"".join)


@given(st.lists(blobs, min_size=1, max_size=6))
def test_the_batch_check_finds_exactly_the_blobs_the_grammar_refuses(batch: list[bytes]) -> None:
    assert malformed_properties(batch) == [
        i for i, blob in enumerate(batch) if not well_formed(blob)
    ]


def text(excluded: str, min_size: int = 0) -> st.SearchStrategy[str]:
    """Text that UTF-8 can encode (no lone surrogates), without the `excluded` characters."""
    chars = st.characters(blacklist_categories=("Cs",), blacklist_characters=excluded)
    return st.text(chars, min_size=min_size, max_size=6)


@given(st.lists(st.tuples(text("\x01\x02", min_size=1), text("\x02")), max_size=5))
def test_a_well_formed_blob_reads_back_as_its_pairs(pairs: list[tuple[str, str]]) -> None:
    blob = "".join(f"{k}\x01{v}\x02" for k, v in pairs).encode()
    assert well_formed(blob) and malformed_properties([blob]) == []
    expected: dict[str, str] = {}
    for k, v in pairs:
        if v:  # an empty value is written by RocketMQ and skipped by its parser
            expected[k] = v
    assert decode_properties(blob) == expected


@given(st.dictionaries(text("\x01\x02", min_size=1), text("\x01\x02")))
def test_whatever_the_sdk_encodes_is_well_formed(props: dict[str, str]) -> None:
    assert malformed_properties([encode_properties(props)]) == []


def test_a_blob_without_its_last_0x02_is_caught_beside_one_that_would_complete_it() -> None:
    # Joined, these read "a 0x01 b 0x02": each alone is malformed.
    assert malformed_properties([b"a\x01b", b"\x02"]) == [0, 1]


def test_the_reason_names_the_first_bad_pair() -> None:
    assert (
        malformed_reason(b"K\x01v\x02junk\x02")
        == "pair 1 ('junk') has no 0x01 between its key and value"
    )
    assert malformed_reason(b"\x01v\x02") == "pair 0 ('\\x01v') has an empty key"
    assert "after the last 0x02" in malformed_reason(b"K\x01v\x02tail")
