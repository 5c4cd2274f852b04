"""write_ledger's digest of a write's rows, without Spark: the same rows in any order or split
digest alike, any change to a row is named, a manifest round-trips."""

from __future__ import annotations

import random

from mqstore.spark.write_ledger import Manifest, WriteDigest, merged

Row = tuple[str, int | None, bytes, str | None, list[str], dict[str, str]]


def rows(n: int) -> list[Row]:
    return [
        (f"t{i % 2}", None if i % 3 else i % 4, f"b{i}".encode(), "tag" if i % 5 else None,
         [f"k{i}"], {"n": str(i)})
        for i in range(n)
    ]  # fmt: skip


def digest_of(parts: list[list[Row]]) -> WriteDigest:
    digests = []
    for part in parts:
        d = WriteDigest()
        for row in part:
            d.add(*row)
        digests.append(d)
    return merged(digests)


def test_the_same_rows_in_any_order_and_partitioning_digest_alike() -> None:
    every = rows(200)
    one = digest_of([every])
    rng = random.Random(7)
    for k in (2, 5, 13):
        shuffled = list(every)
        rng.shuffle(shuffled)
        split = [shuffled[i::k] for i in range(k)]
        assert digest_of(split) == one
        assert digest_of(split).differences(one) == []


def test_each_change_is_named() -> None:
    every = rows(50)
    base = digest_of([every])
    r = every[10]
    cases = {
        "the topics differ": (("t9", *r[1:]),),
        "the queueIds differ": ((r[0], 3 if r[1] != 3 else 2, *r[2:]),),
        "the bodies differ": ((*r[:2], b"other", *r[3:]),),
        "the tags differ": ((*r[:3], "other", *r[4:]),),
        "the keys differ": ((*r[:4], ["k10", "more"], r[5]),),
        "the properties differ": ((*r[:5], {"n": "x"}),),
    }
    for named, (changed,) in cases.items():
        d = digest_of([[*every[:10], changed, *every[11:]]])
        assert named in d.differences(base), named
    twice = digest_of([[*every, every[0]]])
    assert "50 rows then, 51 now" in twice.differences(base)
    # Two rows trading their bodies: every field's sum is the same, the rows are not.
    a, b = every[0], every[1]
    traded = digest_of([[(*a[:2], b[2], *a[3:]), (*b[:2], a[2], *b[3:]), *every[2:]]])
    assert traded.differences(base) == ["the rows pair their fields differently"]


def test_a_manifest_round_trips() -> None:
    m = Manifest("job-1", digest_of([rows(30)]), 28, 2, 1_700_000_000_000)
    back = Manifest.decode(m.encode())
    assert back == m
