"""Read and GetMessage: statuses per record, CRC-checked, never bad bytes; typed errors."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from commitlog_svc import metrics
from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.record import pack_host
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.answers import records_of
from tests.commitlog_svc.support import (
    FILE_BYTES,
    Running,
    batch,
    damage_body,
    parse,
    rpc_error,
)


def crc_mismatches(source: str) -> float:
    return metrics.CRC_MISMATCHES.labels(source)._value.get()


def test_read_returns_each_record_whole_or_a_status_for_it(svc: Running) -> None:
    stored = svc.append_ok(batch(0, 5))
    offsets, sizes = list(stored.commit_log_offsets), list(stored.sizes)
    end = offsets[-1] + sizes[-1]
    read = svc.stub.Read(
        pb.ReadRequest(
            offsets=[offsets[3], end, offsets[0], offsets[1], 10 * FILE_BYTES],
            sizes=[sizes[3], 100, sizes[0], sizes[1] + 1, 100],
        )
    )
    assert list(read.statuses) == [
        pb.READ_OK,
        pb.READ_OUT_OF_RANGE,  # not written yet
        pb.READ_OK,
        pb.READ_CORRUPT,  # the range is not one whole record: never served
        pb.READ_OUT_OF_RANGE,
    ]
    assert parse(records_of(read)[0]).body == stored_body(svc, offsets[3])
    assert parse(records_of(read)[2]).physical_offset == offsets[0]
    assert [records_of(read)[i] for i in (1, 3, 4)] == [b"", b"", b""]


def stored_body(svc: Running, offset: int) -> bytes:
    body: bytes = svc.engine.read_record(offset).body
    return body


def test_a_damaged_record_reads_as_corrupt_and_its_neighbours_as_ok(svc: Running) -> None:
    stored = svc.append_ok(batch(0, 3))
    before = crc_mismatches("read")
    damage_body(svc.data_dir, stored.commit_log_offsets[1])
    read = svc.stub.Read(pb.ReadRequest(offsets=stored.commit_log_offsets, sizes=stored.sizes))
    assert list(read.statuses) == [pb.READ_OK, pb.READ_CORRUPT, pb.READ_OK]
    assert records_of(read)[1] == b""
    assert crc_mismatches("read") == before + 1


def test_a_record_below_the_minimum_reads_as_out_of_range(start: Callable[..., Running]) -> None:
    svc = start(file_reserved_hours=0.0, delete_when_hours=list(range(24)))
    first = svc.append_ok(batch(0, 1))
    while svc.status().max_offset < 3 * FILE_BYTES:
        svc.append_ok(batch(1, 50))
    report = svc.engine.clean_expired(manual=True)
    assert report.deleted_files >= 2
    read = svc.stub.Read(pb.ReadRequest(offsets=first.commit_log_offsets, sizes=first.sizes))
    assert list(read.statuses) == [pb.READ_OUT_OF_RANGE]


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.ReadRequest(offsets=[0, 1], sizes=[10]), "sizes"),
        (pb.ReadRequest(offsets=[0], sizes=[-1]), "sizes"),
        (pb.ReadRequest(offsets=[-1], sizes=[10]), "offsets"),
    ],
    ids=["lengths-differ", "negative-size", "negative-offset"],
)
def test_a_malformed_read_is_invalid_argument_naming_the_field(
    svc: Running, request_: pb.ReadRequest, field: str
) -> None:
    code, _, got = rpc_error(lambda: svc.stub.Read(request_, timeout=10))
    assert (code, got) == (grpc.StatusCode.INVALID_ARGUMENT, field)


def test_size_zero_reads_the_whole_record_at_the_offset(svc: Running) -> None:
    """For callers that keep offsets only (the index): one Read, sizes unknown."""
    stored = svc.append_ok(batch(0, 3))
    offsets = list(stored.commit_log_offsets)
    end = offsets[-1] + stored.sizes[-1]
    damage_body(svc.data_dir, offsets[2])
    read = svc.stub.Read(
        pb.ReadRequest(
            offsets=[offsets[1], offsets[0], offsets[0] + 1, end, offsets[2]], sizes=[0] * 5
        )
    )
    assert list(read.statuses) == [
        pb.READ_OK,
        pb.READ_OK,
        pb.READ_CORRUPT,  # no record starts there
        pb.READ_OUT_OF_RANGE,
        pb.READ_CORRUPT,  # damaged
    ]
    assert [len(r) for r in records_of(read)[:2]] == [stored.sizes[1], stored.sizes[0]]
    assert parse(records_of(read)[0]).physical_offset == offsets[1]


def test_whole_record_reads_count_against_the_answer_limit(start: Callable[..., Running]) -> None:
    svc = start(max_message_bytes=1 << 20)
    stored = svc.append_ok(batch(0, 1, body_bytes=10_000))
    fits = (1 << 20) // (stored.sizes[0] + 8)
    offsets = [stored.commit_log_offsets[0]] * (fits + 1)
    code, message, _ = rpc_error(
        lambda: svc.stub.Read(pb.ReadRequest(offsets=offsets, sizes=[0] * len(offsets)), timeout=10)
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
    read = svc.stub.Read(pb.ReadRequest(offsets=offsets[:fits], sizes=[0] * fits))
    assert set(read.statuses) == {pb.READ_OK}


def test_a_read_larger_than_one_answer_is_resource_exhausted(
    start: Callable[..., Running],
) -> None:
    svc = start(max_message_bytes=1 << 20)
    stored = svc.append_ok(batch(0, 1))
    fits = (1 << 20) // (stored.sizes[0] + 8)
    ok = svc.stub.Read(
        pb.ReadRequest(
            offsets=[stored.commit_log_offsets[0]] * fits, sizes=[stored.sizes[0]] * fits
        )
    )
    assert set(ok.statuses) == {pb.READ_OK}
    code, message, _ = rpc_error(
        lambda: svc.stub.Read(
            pb.ReadRequest(
                offsets=[stored.commit_log_offsets[0]] * (fits + 1),
                sizes=[stored.sizes[0]] * (fits + 1),
            ),
            timeout=10,
        )
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message


# -- GetMessage ------------------------------------------------------------------------------


def test_get_message_decodes_the_record_an_offset_msg_id_names(svc: Running) -> None:
    stored = svc.append_ok(batch(0, 2, flag=7, born_host="10.0.0.1:1234"))
    msg_id = offset_msg_id(stored.store_host, stored.commit_log_offsets[1])
    got = svc.stub.GetMessage(pb.GetMessageRequest(msg_id=msg_id))
    assert got.msg_id == msg_id
    assert got.commit_log_offset == stored.commit_log_offsets[1]
    assert got.size == stored.sizes[1]
    assert got.queue_id == 1 and got.queue_offset == 0 and got.flag == 7
    assert got.born_host == "10.0.0.1:1234"
    assert got.store_host == f"127.0.0.1:{svc.service.host.port}"
    assert (got.keys, got.tags, got.uniq_key) == ("key-1", "tag1", "U00000001")
    assert got.properties["KEYS"] == "key-1"


@pytest.mark.parametrize(
    "msg_id",
    ["", "XYZ", "0" * 31, "G" * 32, offset_msg_id(pack_host("1.2.3.4", 5), 0)[:-2] + "GG"],
)
def test_a_malformed_msg_id_is_invalid_argument(svc: Running, msg_id: str) -> None:
    code, _, field = rpc_error(
        lambda: svc.stub.GetMessage(pb.GetMessageRequest(msg_id=msg_id), timeout=10)
    )
    assert (code, field) == (grpc.StatusCode.INVALID_ARGUMENT, "msg_id")


def test_a_msg_id_that_names_no_record_of_this_store_is_not_found(svc: Running) -> None:
    stored = svc.append_ok(batch(0, 2))
    host = stored.store_host
    offset = stored.commit_log_offsets[1]
    other_host = pack_host("127.0.0.1", svc.service.host.port + 1)
    for msg_id in (
        offset_msg_id(host, offset + 1),  # inside a record
        offset_msg_id(host, 10 * FILE_BYTES),  # beyond the end
        offset_msg_id(other_host, offset),  # a record, but another store's id
    ):
        code, message, _ = rpc_error(
            lambda m=msg_id: svc.stub.GetMessage(pb.GetMessageRequest(msg_id=m), timeout=10)
        )
        assert code == grpc.StatusCode.NOT_FOUND, (msg_id, message)


def test_a_damaged_message_is_data_loss(svc: Running) -> None:
    stored = svc.append_ok(batch(0, 2))
    damage_body(svc.data_dir, stored.commit_log_offsets[0])
    code, message, _ = rpc_error(
        lambda: svc.stub.GetMessage(
            pb.GetMessageRequest(
                msg_id=offset_msg_id(stored.store_host, stored.commit_log_offsets[0])
            ),
            timeout=10,
        )
    )
    assert code == grpc.StatusCode.DATA_LOSS, message
    assert "CRC" in message


def test_msg_ids_of_an_earlier_port_still_find_their_records(
    start: Callable[..., Running],
) -> None:
    svc = start()
    stored = svc.append_ok(batch(0, 1))
    svc.stop()
    again = start()  # port 0: another port, another store host for new records
    assert again.service.host.port != 0
    msg_id = offset_msg_id(stored.store_host, stored.commit_log_offsets[0])
    got = again.stub.GetMessage(pb.GetMessageRequest(msg_id=msg_id))
    assert got.commit_log_offset == stored.commit_log_offsets[0]
