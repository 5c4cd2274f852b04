"""A byte changed in any field of a stored record is never served (issue 23, item 5).

The records end with the whole-record CRC (__CRC32#, formats/record.py), so damage to any
field is found wherever a record is served or trusted. With real service processes: a record
per field is damaged on disk, one byte each (every other record of one queue, so that each is
its own corrupt range), and then

- commitlog_svc's Read answers READ_CORRUPT for each and GetMessage DATA_LOSS (a damaged magic
  code too: the record's PHYSICALOFFSET field still says one starts there);
- cq_svc never hands out damaged bytes: a pull at a damaged record's queue offset is DATA_LOSS
  or holds only the bytes as they were written (a pull served from the appends' own copy);
- index_svc's answer for a damaged record's key does not include it (its confirmation Read);
- a cq_svc and an index_svc that subscribe only now are dispatched every record but the
  damaged ones (dispatch skips them as corrupt ranges);
- `mqstore log verify` exits 1 naming each damaged record's offset and the field;
- restarted, commitlog_svc's recovery reports each as corruption in the middle of the log
  (below the checkpoint, valid records after it: reported, nothing cut) and still refuses it.

Before the whole-record CRC only the body, BODYCRC and the length fields were covered: a
changed born time, queue id, flag, host, topic or property byte was served as sound.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc

from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.properties import encode_properties
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.index.v1 import index_pb2 as ix
from mqstore.testing.cluster import SMALL_INDEX_ARGS, Cluster, start_store
from tests.answers import records_of
from tests.cli.segments import one_byte_in_each_field
from tests.e2e.support import CALL_TIMEOUT_S, eventually

TOPIC = "damaged"
SEGMENT_BYTES = 1 << 20


def _segment(cluster: Cluster) -> Path:
    return Path(cluster.commitlog.data_dir) / "commitlog" / f"{0:020d}"


def _pull_one(cluster: Cluster, name: str, queue_offset: int) -> tuple[str, bytes | None]:
    """A pull of one message at `queue_offset`: ("ok", its record), ("status", None) or (an
    error code's name, None)."""
    try:
        answer = cluster.cq_stub(name).Pull(
            cq.PullRequest(topic=TOPIC, queue_id=0, offset=queue_offset, max_messages=1),
            timeout=CALL_TIMEOUT_S,
        )
    except grpc.RpcError as err:
        return err.code().name, None
    if answer.status != cq.FOUND:
        return cq.GetMessageStatus.Name(answer.status), None
    records = records_of(answer)
    assert answer.queue_offsets[0] == queue_offset
    return "ok", records[0]


def _keys_found(cluster: Cluster, name: str, key: str) -> list[int]:
    answer = cluster.index_stub(name).QueryByKey(
        ix.QueryByKeyRequest(topic=TOPIC, key=key, max_messages=10), timeout=CALL_TIMEOUT_S
    )
    return [m.commit_log_offset for m in answer.messages]


def test_a_byte_changed_in_any_field_of_a_record_is_never_served(tmp_path: Path) -> None:
    cluster = start_store(tmp_path, extra={"commitlog_svc": ["--file-bytes", str(SEGMENT_BYTES)]})
    try:
        _run(cluster)
    finally:
        cluster.stop_all()


def _run(cluster: Cluster) -> None:
    stub = cluster.commitlog_stub()
    count = 2 * 21 + 1  # a damaged record (one per field), then an intact one, ...
    bodies = [b"body %02d " % i * (1 + i % 3) for i in range(count)]
    keys = [f"key-{i}" for i in range(count)]
    props = [encode_properties({"KEYS": k, "TAGS": "t"}) for k in keys]
    answer = stub.Append(
        cl.AppendRequest(
            batches=[
                cl.MessageBatch(
                    topic=TOPIC,
                    queue_ids=[0] * count,
                    bodies=bodies,
                    properties=props,
                    born_host="10.9.8.7:4242",
                )
            ]
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert list(answer.statuses) == [cl.PUT_OK] * count
    offsets, sizes = list(answer.commit_log_offsets), list(answer.sizes)
    segment = _segment(cluster)
    written = segment.read_bytes()
    raws = [written[o : o + z] for o, z in zip(offsets, sizes, strict=True)]
    fields = one_byte_in_each_field(raws[0])  # 21: the 20 of RocketMQ's layout, __CRC32#
    # Everything is dispatched before the damage, so the first cq_svc and index_svc hold units
    # and keys for the records that are then damaged.
    eventually(lambda: _pull_one(cluster, "cq", count - 1)[0] == "ok")
    eventually(lambda: _keys_found(cluster, "index", keys[count - 1]) == [offsets[count - 1]])

    damaged = {}  # record index -> field
    with segment.open("r+b") as f:
        for k, field in enumerate(fields):
            i = 2 * k
            at = offsets[i] + one_byte_in_each_field(raws[i])[field]
            f.seek(at)
            f.write(bytes([written[at] ^ 0x01]))
            damaged[i] = field
    intact = [i for i in range(count) if i not in damaged]

    _check_serving(cluster, offsets, sizes, raws, keys, damaged, intact, answer.store_host)

    # Followers that subscribe now are dispatched every intact record and no damaged one.
    cluster.add("cq_svc", "cq-late")
    cluster.add("index_svc", "index-late", *SMALL_INDEX_ARGS)
    cluster.start_many("cq-late", "index-late")
    eventually(lambda: _pull_one(cluster, "cq-late", intact[-1])[0] == "ok")
    for i in intact:
        assert _pull_one(cluster, "cq-late", i) == ("ok", raws[i]), i
    for i, field in damaged.items():
        got, record = _pull_one(cluster, "cq-late", i)
        assert record is None, (field, got)
    eventually(lambda: _keys_found(cluster, "index-late", keys[intact[-1]]) != [])
    for i, field in damaged.items():
        assert _keys_found(cluster, "index-late", keys[i]) == [], field

    # The offline check names every damaged record and its field.
    done = subprocess.run(
        [sys.executable, "-m", "mqstore.cli", "log", "verify", str(segment.parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout
    for i, field in damaged.items():
        line = next(x for x in done.stderr.splitlines() if f"bad offset {offsets[i]}:" in x)
        assert f"explains it: {field} at " in line, line

    # Recovery: corruption below the checkpoint with valid records after it is reported and
    # nothing is cut; the damaged records stay unreadable.
    end = offsets[-1] + sizes[-1]
    cluster.commitlog.stop()
    cluster.restart_commitlog()
    status = cluster.commitlog_stub().GetStatus(cl.GetStatusRequest(), timeout=CALL_TIMEOUT_S)
    assert status.max_offset == end
    reported = Path(cluster.commitlog.log_path).read_text()
    for i, field in damaged.items():
        range_reported = (
            f"corrupt record in the middle of the log: [{offsets[i]}, {offsets[i + 1]})"
        )
        assert range_reported in reported, field
    # cq_svc answers UNAVAILABLE until it has shaken hands with the restarted log again, and
    # a damaged record's pull (which asks the log's Read) until its channel has reconnected.
    eventually(lambda: _pull_one(cluster, "cq", intact[-1]) == ("ok", raws[intact[-1]]))
    eventually(lambda: _pull_one(cluster, "cq", min(damaged))[0] != "UNAVAILABLE")
    _check_serving(cluster, offsets, sizes, raws, keys, damaged, intact, answer.store_host)


def _check_serving(
    cluster: Cluster,
    offsets: list[int],
    sizes: list[int],
    raws: list[bytes],
    keys: list[str],
    damaged: dict[int, str],
    intact: list[int],
    store_host: bytes,
) -> None:
    stub = cluster.commitlog_stub()
    read = stub.Read(cl.ReadRequest(offsets=offsets, sizes=sizes), timeout=CALL_TIMEOUT_S)
    for i, status in enumerate(read.statuses):
        if i in damaged:
            assert status == cl.READ_CORRUPT, damaged[i]
        else:
            assert status == cl.READ_OK and records_of(read)[i] == raws[i], i
    for i, field in damaged.items():
        msg_id = offset_msg_id(store_host, offsets[i])
        try:
            stub.GetMessage(cl.GetMessageRequest(msg_id=msg_id), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.DATA_LOSS, (field, err.code())
        else:
            raise AssertionError(f"GetMessage served the record with a damaged {field}")
    for i, field in damaged.items():
        got, record = _pull_one(cluster, "cq", i)
        # DATA_LOSS, or served from the appends' own copy: the bytes as written, never others.
        assert got == "DATA_LOSS" or record == raws[i], (field, got)
        assert offsets[i] not in _keys_found(cluster, "index", keys[i]), field
    for i in intact[:3]:
        assert _pull_one(cluster, "cq", i) == ("ok", raws[i])
        assert _keys_found(cluster, "index", keys[i]) == [offsets[i]]
