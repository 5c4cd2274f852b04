"""Java's String.hashCode, as tagsCode and the index key hash use it (§3.2, §4.2).

Expected values are computed here from the UTF-16 code units written out by hand, with the
recurrence h = 31*h + c reduced to int32, or are well-known JVM results.
"""

from __future__ import annotations

import pytest

from mqstore.formats.javahash import index_key_hash, java_string_hash, tags_code


def int32_hash_of_units(units: list[int]) -> int:
    """The JVM's String.hashCode over explicit UTF-16 code units: sum c_i * 31^(n-1-i), int32."""
    n = len(units)
    total = sum(c * 31 ** (n - 1 - i) for i, c in enumerate(units)) % 2**32
    return int(total - 2**32 if total >= 2**31 else total)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("Aa", 65 * 31 + 97),  # 2112
        ("BB", 66 * 31 + 66),  # 2112: the classic collision
        ("hello", 99162322),
        ("TagA", 2598919),  # rocketmq-store.md §3.2
        ("hello world", 1794106052),  # overflows int32 on the way, ends positive
    ],
)
def test_java_string_hash_matches_the_jvm(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected
    assert int32_hash_of_units([ord(c) for c in text]) == expected


def test_aa_and_bb_collide_as_in_java() -> None:
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112


def test_a_hash_that_overflows_to_a_negative_int32() -> None:
    # Eight 'Z' (90): 90 * (31^8 - 1) / 30 = 2558673112320, which reduces to a negative int32.
    units = [90] * 8
    expected = int32_hash_of_units(units)
    assert expected == -1127396096
    assert java_string_hash("ZZZZZZZZ") == expected


@pytest.mark.parametrize(
    ("text", "units", "expected"),
    [
        ("é", [0x00E9], 233),
        ("日本", [0x65E5, 0x672C], 0x65E5 * 31 + 0x672C),  # 835047
        # U+1F600 is two UTF-16 code units, a surrogate pair, and Java hashes both.
        ("\U0001f600", [0xD83D, 0xDE00], 0xD83D * 31 + 0xDE00),  # 1772899
        ("a\U0001f600b", [0x61, 0xD83D, 0xDE00, 0x62], None),
    ],
    ids=["latin1", "cjk-bmp", "surrogate-pair", "pair-inside-ascii"],
)
def test_non_ascii_strings_hash_over_utf16_code_units(
    text: str, units: list[int], expected: int | None
) -> None:
    assert text.encode("utf-16-be") == b"".join(u.to_bytes(2, "big") for u in units)
    want = int32_hash_of_units(units)
    if expected is not None:
        assert want == expected
    assert java_string_hash(text) == want


def test_a_lone_surrogate_hashes_as_its_code_unit() -> None:
    # Java strings may hold unpaired surrogates; Python str can too.
    assert java_string_hash("\ud800x") == 0xD800 * 31 + ord("x")


@pytest.mark.parametrize("tags", [None, ""])
def test_tags_code_is_zero_without_tags(tags: str | None) -> None:
    assert tags_code(tags) == 0


def test_tags_code_is_the_hash_of_the_whole_tags_string() -> None:
    assert tags_code("TagA") == 2598919
    assert tags_code("TagA||TagB") == java_string_hash("TagA||TagB")
    assert tags_code("ZZZZZZZZ") == -1127396096  # negative codes are kept as they are


def min_value_preimage() -> str:
    """A string whose Java hash is Integer.MIN_VALUE, constructed rather than searched for.

    For five code units the hash is c0*31^4 + c1*31^3 + c2*31^2 + c3*31 + c4 (no wrap-around
    while every c_i <= 0xFFFF and the sum stays below 2^32). Writing 2^31 in "base 31" with
    the greedy digits gives units that fit, and 2^31 reduced to int32 is -2^31.
    """
    rest = 2**31
    units = []
    for power in (4, 3, 2, 1, 0):
        digit, rest = divmod(rest, 31**power)
        units.append(digit)
    assert units == [2325, 9, 30, 12, 2]
    assert sum(c * 31 ** (4 - i) for i, c in enumerate(units)) == 2**31
    return "".join(map(chr, units))


def test_index_key_hash_maps_integer_min_value_to_zero() -> None:
    s = min_value_preimage()
    assert java_string_hash(s) == -(2**31)
    assert index_key_hash(s) == 0
    # The well-known JVM example agrees.
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert index_key_hash("polygenelubricants") == 0


@pytest.mark.parametrize("key", ["TopicA#order-1", "ZZZZZZZZ", "hello", "", "日本"])
def test_index_key_hash_is_abs_of_the_java_hash_otherwise(key: str) -> None:
    h = java_string_hash(key)
    assert index_key_hash(key) == abs(h)
    assert 0 <= index_key_hash(key) <= 2**31 - 1


def test_index_key_hash_of_a_negative_hash_is_its_negation() -> None:
    assert index_key_hash("ZZZZZZZZ") == 1127396096
