"""The log's history (mqstore/history.py) and its file (mqstore/formats/epoch_file.py).

`agreed_offset` is held to its definition, byte by byte over small logs: the largest P such
that every byte below P has the same epoch in both histories where both know it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.errors import CorruptFile, InvalidArgument
from mqstore.formats.epoch_file import decode_epochs, encode_epochs
from mqstore.history import EPOCHS_MAX, LogHistory

STORE = b"S" * 16


@st.composite
def histories(draw: st.DrawFn, span: int = 60) -> LogHistory:
    count = draw(st.integers(0, 6))
    epochs = sorted(draw(st.sets(st.integers(0, 12), min_size=count, max_size=count)))
    starts = sorted(draw(st.lists(st.integers(0, span), min_size=count, max_size=count)))
    return LogHistory(zip(epochs, starts, strict=True))


def agreed_by_definition(a: LogHistory, b: LogHistory, end: int) -> int:
    for byte in range(max(end, 0)):
        mine, theirs = a.epoch_at(byte), b.epoch_at(byte)
        if mine is not None and theirs is not None and mine != theirs:
            return byte
    return max(end, 0)


@settings(max_examples=400, deadline=None)
@given(histories(), histories(), st.integers(-1, 70))
def test_agreed_offset_is_the_first_byte_whose_epochs_differ(
    a: LogHistory, b: LogHistory, end: int
) -> None:
    assert a.agreed_offset(b, end) == agreed_by_definition(a, b, end)
    assert a.agreed_offset(b, end) == b.agreed_offset(a, end)


def test_a_cut_then_regrown_log_disagrees_from_the_cut_on() -> None:
    """The reproduction of issue 23 item 1 in histories: a follower confirmed 3,379,081 in
    epoch 4; recovery cut the log to 3,353,561 and epoch 5 began there; the log regrew to
    3,491,924. The follower must drop everything from the cut on, not trust its offset."""
    follower = LogHistory([(1, 0), (4, 2_000_000)])
    log = follower.begin(5, 3_353_561)
    assert log.agreed_offset(follower, 3_491_924) == 3_353_561
    # A follower that took the new history agrees all the way.
    assert log.agreed_offset(log, 3_491_924) == 3_491_924


def test_an_epoch_that_wrote_nothing_is_replaced_by_the_next() -> None:
    history = LogHistory([(1, 0), (2, 100)]).begin(3, 100)
    assert list(history) == list(LogHistory([(1, 0), (3, 100)]))
    assert history.epoch_at(99) == 1 and history.epoch_at(100) == 3


def test_the_epoch_of_a_confirmed_offset_is_that_of_its_last_byte() -> None:
    history = LogHistory([(1, 0), (2, 100)])
    assert history.epoch_before(100) == 1  # [0, 100) was confirmed in epoch 1
    assert history.epoch_before(101) == 2
    assert history.epoch_before(0) == -1
    assert LogHistory([(3, 50)]).epoch_before(50) == -1  # before the first entry: unknown


def test_compaction_keeps_the_entry_that_covers_the_minimum() -> None:
    history = LogHistory([(1, 0), (2, 100), (3, 200), (4, 300)])
    assert list(history.compacted(250)) == list(LogHistory([(3, 200), (4, 300)]))
    assert list(history.compacted(200)) == list(LogHistory([(3, 200), (4, 300)]))
    assert history.compacted(0) == history


def test_truncation_drops_the_epochs_starting_at_or_past_the_cut() -> None:
    history = LogHistory([(1, 0), (2, 100), (3, 200)])
    assert history.truncated(200) == LogHistory([(1, 0), (2, 100)])
    assert history.truncated(150) == LogHistory([(1, 0), (2, 100)])


def test_begin_keeps_at_most_the_bound_dropping_the_oldest() -> None:
    history = LogHistory((e, e) for e in range(EPOCHS_MAX))
    grown = history.begin(EPOCHS_MAX, EPOCHS_MAX)
    assert len(grown) == EPOCHS_MAX
    assert grown.epochs[0] == 1 and grown.last_epoch == EPOCHS_MAX


@pytest.mark.parametrize(
    "entries",
    [
        [(2, 0), (1, 10)],  # epochs go back
        [(1, 0), (1, 10)],  # an epoch twice
        [(1, 10), (2, 5)],  # starts go back
        [(-1, 0)],
        [(1, -5)],
    ],
)
def test_a_malformed_history_is_refused_naming_the_field(entries: list[tuple[int, int]]) -> None:
    with pytest.raises(InvalidArgument) as info:
        LogHistory(entries)
    assert info.value.field == "history"


@given(histories())
def test_the_epoch_file_round_trips(history: LogHistory) -> None:
    assert decode_epochs(encode_epochs(STORE, history)) == (STORE, history)


def test_every_damaged_byte_of_an_epoch_file_is_corrupt_file() -> None:
    data = encode_epochs(STORE, LogHistory([(1, 0), (2, 4096), (7, 10_000)]))
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        with pytest.raises(CorruptFile):
            decode_epochs(bytes(damaged))
    for cut in range(len(data)):
        with pytest.raises(CorruptFile):
            decode_epochs(data[:cut])
