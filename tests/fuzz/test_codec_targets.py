"""Short forms of the decoder fuzz targets: record, dispatch, metafiles, ids.

Each test feeds bytes (or structured values) to the target's own check, so a failure here is a
finding of the same rule `python -m fuzz <target>` checks; the long forms run behind `make fuzz`.
tests/formats/ already shows that read_record never raises on arbitrary bytes; these add that a
record read back writes to the same bytes, that scan_run and read_record agree, and the other
decoders.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cq_svc import receipts
from fuzz.draw import Draw
from fuzz.targets import dispatch, ids, metafiles, record
from mqstore.dispatch import DispatchEntry
from mqstore.formats.record import Blank, encode_blank, scan_run
from mqstore.rpc.dispatch_codec import encode_dispatch
from tests.fuzz.support import CODEC, unless_known

# -- record ------------------------------------------------------------------------------------

RECORDS = record.sample_records()


@CODEC
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_decode_to_record_blank_or_bad_and_scan_agrees(data: bytes) -> None:
    record.one_input(data)


@CODEC
@given(
    changes=st.lists(
        st.tuples(st.integers(0, len(RECORDS) - 1), st.integers(0, 255)), min_size=1, max_size=4
    ),
    cut=st.integers(0, len(RECORDS)),
    start=st.sampled_from([0, 0, 0, 1, 91]),
    check_crc=st.booleans(),
)
def test_damaged_runs_of_valid_records_are_read_alike_by_scan_and_read(
    changes: list[tuple[int, int]], cut: int, start: int, check_crc: bool
) -> None:
    """Random bytes rarely look like a record: start from valid ones, change a few bytes and cut
    the run short, and every record still read must write back to its bytes."""
    buf = bytearray(RECORDS)
    for pos, value in changes:
        buf[pos] = value
    record.check_buffer(bytes(buf[:cut]), start, 0, check_crc)


def test_the_sample_run_reads_as_three_records_and_a_blank() -> None:
    """The seeds reach deep: the sample is whole and valid, so mutations start from records."""
    end, count, stop = scan_run(RECORDS, 0, len(RECORDS), 0)
    assert (count, stop) == (3, Blank(64))
    assert end == len(RECORDS) - len(encode_blank(64))
    for seed in record.seeds():
        record.one_input(seed)


# -- dispatch ----------------------------------------------------------------------------------


@CODEC
@given(data=st.binary(max_size=300))
def test_dispatch_frames_from_wire_bytes_decode_or_are_refused_typed(data: bytes) -> None:
    unless_known(dispatch.one_input, b"\x01" + data)


@CODEC
@given(data=st.binary(max_size=300))
def test_dispatch_frames_built_column_by_column_decode_or_are_refused_typed(data: bytes) -> None:
    unless_known(dispatch.one_input, b"\x00" + data)


@CODEC
@given(
    entries=st.lists(st.sampled_from(dispatch.sample_entries()), min_size=0, max_size=6),
    include_keys=st.booleans(),
)
def test_well_formed_dispatch_frames_decode_to_what_was_encoded(
    entries: list[DispatchEntry], include_keys: bool
) -> None:
    frame = encode_dispatch(entries, start_offset=0, next_offset=1, include_keys=include_keys)
    decoded = dispatch.check_batch(frame)
    assert decoded is not None and len(decoded) == len(entries)


# -- metadata files ----------------------------------------------------------------------------


@pytest.mark.parametrize("decoder", metafiles.DECODERS, ids=lambda d: d.name)
@CODEC
@given(data=st.binary(max_size=300), framed=st.booleans(), version_pick=st.integers(0, 3))
def test_metadata_decoders_answer_a_value_or_corrupt_file(
    decoder: metafiles.Decoder, data: bytes, framed: bool, version_pick: int
) -> None:
    if framed and decoder.magic:
        version = decoder.versions[version_pick % len(decoder.versions)]
        data = metafiles.framed(decoder, version, data)
    unless_known(decoder.check, data)


@pytest.mark.parametrize("seed", metafiles.seeds(), ids=lambda s: metafiles.DECODERS[s[0]].name)
def test_each_metadata_seed_is_a_valid_file_so_mutations_reach_the_payload_parser(
    seed: bytes,
) -> None:
    draw = Draw(seed)
    decoder = draw.choice(metafiles.DECODERS)
    mode = draw.byte()
    if decoder.magic:
        assert mode & 3 == 3
        data = metafiles.framed(decoder, draw.choice(decoder.versions), draw.rest())
    else:
        data = draw.rest()
    value = decoder.decode(data)  # CorruptFile here: the seed never reaches the payload parser
    assert value
    decoder.check(data)


# -- ids ---------------------------------------------------------------------------------------


@CODEC
@given(data=st.binary(max_size=200))
def test_properties_msg_ids_and_receipts_decode_or_are_refused_typed(data: bytes) -> None:
    ids.one_input(data)


@CODEC
@given(text=st.text(max_size=80))
def test_properties_given_as_text_never_raise_and_round_trip(text: str) -> None:
    ids.check_properties(text)


@CODEC
@given(msg_id=st.text(alphabet="0123456789abcdefABCDEF", min_size=30, max_size=58))
def test_hex_msg_ids_of_every_length_decode_or_are_invalid_argument(msg_id: str) -> None:
    ids.check_msg_id(msg_id)


@CODEC
@given(
    offset=st.integers(-1, 2**63 - 1),
    count=st.integers(-1, 2**31 - 1),
    queue_id=st.integers(0, 9),
    at=st.integers(0, 22),
    char=st.characters(blacklist_categories=["Cs"]),
)
def test_a_receipt_with_one_character_changed_is_refused_or_means_the_same(
    offset: int, count: int, queue_id: int, at: int, char: str
) -> None:
    handle = receipts.encode("g", "T", queue_id, offset, count)
    ids.check_receipt(handle, "g", "T", queue_id)
    ids.check_receipt(handle[:at] + char + handle[at + 1 :], "g", "T", queue_id)
