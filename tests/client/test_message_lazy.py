"""Messages decoded a batch at a time (message.decode_records) and lazily (fields on first
read): the verdict on every record is read_record's, and a lazily built Message is the value
the record-by-record decode (read_record, then Message._of) builds.

No service runs here: the records are encoded with the store's own codec."""

from __future__ import annotations

import gc
import pickle
import struct
import sys
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mqstore.client.compression import Compression, compress
from mqstore.client.errors import DataLoss
from mqstore.client.message import (
    FIELDS,
    Message,
    MessageRun,
    PolledBatch,
    decode_batch,
    decode_record_list,
    decode_records,
    decode_run,
)
from mqstore.formats._core import lazy_messages
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import (
    HEADERS,
    Record,
    encode_record,
    host_bytes_for_flag,
    pack_host,
    read_record,
    record_crc_property,
    without_body,
)
from mqstore.formats.record import record_crc as whole_record_crc
from mqstore.limits import MessageLimits

V6_HOST = pack_host("2001:db8::7", 10911)
LONG_TOPICS = MessageLimits(topic_bytes_max=255)  # a V2 record: a topic over 127 characters


def record(
    i: int,
    *,
    topic: str = "orders",
    body: bytes | None = None,
    props: dict[str, str] | None = None,
    compression: Compression = Compression.NONE,
    born_host: bytes = b"\x0a\x00\x00\x05\x00\x00\x30\x39",
    store_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f",
    record_crc: bool = True,
) -> bytes:
    body = f"body-{i}".encode() * (i % 5) if body is None else body
    sys_flag = 0
    if compression is not Compression.NONE:
        body, sys_flag = compress(body, compression)
        assert sys_flag, "the test body must shrink"
    return encode_record(
        topic=topic,
        queue_id=3,
        body=body,
        properties=encode_properties(
            {"UNIQ_KEY": f"U{i}", "TAGS": f"t{i % 3}", "KEYS": "a b"} if props is None else props
        ),
        flag=i,
        queue_offset=100 + i,
        physical_offset=5_000 + 300 * i,
        sys_flag=sys_flag,
        born_timestamp_ms=1_700_000_000_000 + i,
        born_host=born_host,
        store_timestamp_ms=1_700_000_000_500 + i,
        store_host=store_host,
        reconsume_times=i % 2,
        limits=LONG_TOPICS,
        record_crc=record_crc,
    )


def eager(raw: bytes) -> Message:
    """What the SDK built before: read_record, then every field at once."""
    decoded = read_record(raw, 0, len(raw))
    assert isinstance(decoded, Record), decoded
    return Message._of(decoded)


def accepted(raw: bytes) -> bool:
    """read_record takes it, and it is one whole record (nothing after it in its slot)."""
    got = read_record(raw, 0, len(raw))
    return isinstance(got, Record) and got.total_size == len(raw)


def made_at(run: MessageRun, i: int) -> MessageRun:
    """The run with its i-th Message made already (as PolledBatch.of holds an answer's
    Messages in the `records` form)."""
    return MessageRun(run._bodies, run._raws, {i: run[i]})


def assorted() -> list[bytes]:
    """Every shape a record takes: hosts of both sizes, a V2 topic, each compression, empty
    body, empty properties, a second topic."""
    repetitive = b"0123456789abcdef" * 64
    return [
        record(0),
        record(1, body=b""),
        record(2, props={}),
        record(3, born_host=V6_HOST),
        record(4, store_host=V6_HOST),
        record(5, born_host=V6_HOST, store_host=V6_HOST),
        record(6, topic="T" * 200),  # over 127 characters: MAGIC V2, a 2-byte topic length
        record(7, body=repetitive, compression=Compression.ZLIB),
        record(8, body=repetitive, compression=Compression.LZ4),
        record(9, body=repetitive, compression=Compression.ZSTD),
        record(10, topic="other"),
        record(11, body=bytes(range(256))),
    ]


# -- the value ------------------------------------------------------------------------------------


def test_a_batch_decodes_to_the_messages_the_record_by_record_decode_builds() -> None:
    raws = assorted() + [record(i) for i in range(12, 40)]
    got = decode_records(b"".join(raws), [len(r) for r in raws])
    assert got == [eager(r) for r in raws]
    for message, raw in zip(got, raws, strict=True):
        want = eager(raw)
        for name in FIELDS:  # field by field, each read first on its own message
            fresh = decode_records(raw, [len(raw)])[0]
            assert getattr(fresh, name) == getattr(want, name), name
        assert (message.tags, message.keys, message.uniq_key) == (
            want.tags,
            want.keys,
            want.uniq_key,
        )
        assert message.to_json() == want.to_json()


def test_decode_batch_gives_each_records_queue_offset_and_the_list_form_agrees() -> None:
    raws = assorted()
    messages, offsets = decode_batch(b"".join(raws), [len(r) for r in raws])
    assert offsets == [m.queue_offset for m in messages] == [100 + i for i in range(len(raws))]
    assert decode_record_list(raws) == messages
    assert decode_record_list([]) == []
    assert decode_records(b"", []) == []


def test_a_run_makes_the_messages_decode_batch_makes_as_they_are_asked_for() -> None:
    raws = assorted()
    blob, sizes = b"".join(raws), [len(r) for r in raws]
    messages, offsets = decode_batch(blob, sizes)
    run, run_offsets = decode_run(blob, sizes)
    assert run_offsets == offsets and len(run) == len(messages) and bool(run)
    assert list(run) == messages == [eager(r) for r in raws]
    assert run[-1] == messages[-1] and run[1:3] == messages[1:3] and run[::-2] == messages[::-2]
    assert run[0] == run[0] and run[0] is not run[0]  # made each time, equal
    assert run[6] == run[6] and run[6] is not run[6]  # a V2 record's as well
    made = made_at(run, 6)
    assert made[6] is made[6] and list(made) == messages
    with pytest.raises(IndexError):
        run[len(raws)]
    with pytest.raises(IndexError):
        run[-len(raws) - 1]
    assert [m.body for m in run] == [m.body for m in messages]
    with pytest.raises(DataLoss):
        decode_run(blob[:-1], [*sizes[:-1], sizes[-1] - 1])
    plain = [record(i) for i in range(20, 30)]  # every one passed by the columns
    plain_run, _ = decode_run(b"".join(plain), [len(r) for r in plain])
    assert plain_run[2:7] == [eager(r) for r in plain[2:7]]
    assert plain_run[::-3][0] == eager(plain[-1])
    empty, none = decode_run(b"", [])
    assert len(empty) == 0 and none == [] and not empty


def test_the_compiled_builder_makes_each_message_from_its_body_and_the_rest_of_its_record() -> None:
    """_core.lazy_messages (MessageRun.made): records from several blobs (a run joined from
    two answers), each Message the record-by-record decode's value, holding a copy of its
    record without the body (not its answer's blob, not a second copy of the body), out of
    the cycle collector, and nothing leaked."""
    first, second = assorted(), [record(i) for i in range(50, 60)]
    run = decode_run(b"".join(first), [len(r) for r in first])[0]
    run.extend(decode_run(b"".join(second), [len(r) for r in second])[0])
    raws = run._raws
    want = [eager(r) for r in first + second]
    for start, stop in [(0, len(want)), (3, 9), (11, 14), (5, 5)]:
        got = lazy_messages(Message, run._bodies, raws.blobs, raws.starts, raws.ends, start, stop)
        assert got == want[start:stop]
        records_of = iter((first + second)[start:stop])
        for message in got:  # (not zip or enumerate: their reused tuple holds a reference)
            raw = next(records_of)
            assert not gc.is_tracked(message)
            assert sys.getrefcount(message) == 3  # the list's, the loop's, getrefcount's
            rest = message._rest
            stored = read_record(raw, 0, len(raw))
            assert isinstance(stored, Record)
            assert rest == without_body(raw) and len(rest) == len(raw) - len(stored.body)
            assert sys.getrefcount(rest) == 3  # the slot's, `rest`'s, getrefcount's
    made = [run.made(k, k + 4) for k in range(0, len(want), 4)]
    assert [m for chunk in made for m in chunk] == want == list(run.iter_from(0))
    assert list(run.iter_from(len(want) - 2)) == want[-2:] and run.made(20, 99) == want[20:]
    for start, stop in [(0, len(want) + 1), (-1, 3), (4, 3)]:
        with pytest.raises(IndexError):
            lazy_messages(Message, run._bodies, raws.blobs, raws.starts, raws.ends, start, stop)
    with pytest.raises(IndexError):  # a record's bounds outside its blob
        lazy_messages(Message, [b"x"], [b"abc"], [1], [9], 0, 1)
    whole = record(3)
    for wrong in (whole[:80], whole[:95]):  # shorter than its header; than its body
        with pytest.raises(IndexError):
            lazy_messages(Message, [b"x"], [wrong], [0], [len(wrong)], 0, 1)


class _NoSlots:
    body: bytes = b""

    @property
    def _rest(self) -> bytes:
        return b""


def test_the_compiled_builder_stores_into_writable_object_slots_only() -> None:
    """lazy_messages stores the body and the rest where the class's slot descriptors say,
    as their setattr would: a class whose fields are not such slots is a TypeError, before
    any instance is made."""
    raw = record(1)
    for cls in (_NoSlots, int):
        with pytest.raises(TypeError):
            lazy_messages(cls, [b"x"], [raw], [0], [len(raw)], 0, 1)


# -- the compiled builder pinned to its reference, on arbitrary records ---------------------------


def lazy_messages_reference(
    bodies: list[bytes],
    blobs: list[bytes],
    starts: list[int],
    ends: list[int],
    start: int,
    stop: int,
) -> list[Message]:
    """What _core.lazy_messages makes, in Python: a Message without __init__, its body and
    its record without the body (record.without_body), every other slot unset."""
    out = []
    for i in range(start, stop):
        m = Message.__new__(Message)
        m.body = bodies[i]
        m._rest = without_body(blobs[i][starts[i] : ends[i]])
        out.append(m)
    return out


def unset_slots(m: Message) -> list[str]:
    """The fields whose slots hold nothing yet (read past Message.__getattr__)."""
    unset = []
    for name in FIELDS:
        try:
            getattr(Message, name).__get__(m, Message)
        except AttributeError:
            unset.append(name)
    return unset


def with_topic(raw: bytes, topic: bytes) -> bytes:
    """`raw` with its topic's bytes replaced by as many others (non-ASCII ones: encode_record
    takes the names a producer may send, the store's records may hold any UTF-8), its
    whole-record CRC made again where it has one."""
    (sys_flag,) = struct.unpack_from(">i", raw, 36)
    header = HEADERS[host_bytes_for_flag(sys_flag)].size
    (body_len,) = struct.unpack_from(">i", raw, header - 4)
    at = header + body_len + (1 if len(topic) <= 127 else 2)
    out = raw[:at] + topic + raw[at + len(topic) :]
    if out.endswith(record_crc_property(whole_record_crc(raw, 0, len(raw)))):
        out = out[:-20] + record_crc_property(whole_record_crc(out, 0, len(out)))
    return out


LAZY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Keys and values without the separators, any other text (empty ones: test_properties.py).
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=12,
)
any_topics = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=60
).filter(lambda t: len(t.encode()) <= 255)
ipv4 = st.binary(min_size=8, max_size=8)
ipv6 = st.binary(min_size=16, max_size=16).map(lambda a: a + b"\x00\x00\x27\x0f")


@st.composite
def records(draw: st.DrawFn) -> bytes:
    topic = draw(any_topics).encode()
    body = draw(st.binary(max_size=1500) | st.just(b"0123456789abcdef" * 80))
    compression = draw(st.sampled_from(list(Compression)))
    sys_flag = 0
    if compression is not Compression.NONE:
        body, sys_flag = compress(body, compression)
    raw = encode_record(
        topic="T" * len(topic),
        queue_id=draw(st.integers(0, 65535)),
        body=body,
        properties=encode_properties(draw(st.dictionaries(prop_text, prop_text, max_size=5))),
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        queue_offset=draw(st.integers(0, 2**63 - 1)),
        physical_offset=draw(st.integers(0, 2**63 - 1)),
        sys_flag=sys_flag,
        born_timestamp_ms=draw(st.integers(0, 2**63 - 1)),
        born_host=draw(ipv4 | ipv6),
        store_timestamp_ms=draw(st.integers(0, 2**63 - 1)),
        store_host=draw(ipv4 | ipv6),
        reconsume_times=draw(st.integers(0, 2**31 - 1)),
        limits=LONG_TOPICS,
        record_crc=draw(st.booleans()),
    )
    return with_topic(raw, topic)


@LAZY
@given(first=st.lists(records(), min_size=1, max_size=5), second=st.lists(records(), max_size=3))
def test_the_compiled_builder_is_its_reference_and_the_values_the_record_by_record_decode(
    first: list[bytes], second: list[bytes]
) -> None:
    """On arbitrary records (hosts of both sizes, any UTF-8 topic, V1 and V2, properties, each
    compression, with and without the whole-record CRC) in two answers joined: each Message
    _core.lazy_messages makes holds the body and the rest its reference holds, byte for byte,
    and nothing else yet; and it is the value read_record then Message._of builds, whichever
    field is read first, pickled and hashed alike."""
    assume(all(accepted(r) for r in first + second))
    run = decode_run(b"".join(first), [len(r) for r in first])[0]
    run.extend(decode_run(b"".join(second), [len(r) for r in second])[0])
    raws = run._raws
    n = len(run)
    got = lazy_messages(Message, run._bodies, raws.blobs, raws.starts, raws.ends, 0, n)
    want = lazy_messages_reference(run._bodies, raws.blobs, raws.starts, raws.ends, 0, n)
    eagers = [eager(r) for r in first + second]
    for g, w, e, raw in zip(got, want, eagers, first + second, strict=True):
        assert g.body is w.body and g._rest == w._rest == without_body(raw)
        assert unset_slots(g) == unset_slots(w) == [f for f in FIELDS if f != "body"]
        assert g == w == e and hash(g) == hash(e) and repr(g) == repr(e)
        assert pickle.loads(pickle.dumps(g)) == e
    for name in FIELDS:  # each field read first on a fresh message
        fresh = lazy_messages(Message, run._bodies, raws.blobs, raws.starts, raws.ends, 0, n)
        assert [getattr(m, name) for m in fresh] == [getattr(e, name) for e in eagers], name


@pytest.mark.parametrize("start", [0, 3, 6, 7, 12])
def test_a_runs_rest_joined_to_the_next_run_is_both_in_order(start: int) -> None:
    """MessageRun.after (a consumer's buffer meeting the next answer of its queue): the
    messages from `start` on, then the next run's, the ones made already kept at their new
    places."""
    first = assorted()
    second = [record(i) for i in range(40, 44)] + [record(44, topic="T" * 200)]
    a = made_at(decode_run(b"".join(first), [len(r) for r in first])[0], 6)
    b = made_at(decode_run(b"".join(second), [len(r) for r in second])[0], 4)
    joined = a.after(start, b)
    want = [eager(r) for r in first[start:] + second]
    assert len(joined) == len(want) and list(joined) == want and joined[:] == want
    if start <= 6:
        assert joined[6 - start] is a[6]  # the made Message moved, not made again
    assert joined[-1] is b[-1]


def test_a_run_extended_in_place_holds_both_runs_in_order_with_made_messages_moved() -> None:
    """MessageRun.extend (a second answer for a queue met in the same look as the first):
    the same run grows; the next run's Message made already keeps its object."""
    first = [record(i) for i in range(10, 13)]
    second = assorted()
    a, _ = decode_run(b"".join(first), [len(r) for r in first])
    b = made_at(decode_run(b"".join(second), [len(r) for r in second])[0], 6)
    a.extend(b)
    want = [eager(r) for r in first + second]
    assert len(a) == len(want) and list(a) == want and a[:] == want
    assert a[3 + 6] is b[6]
    a.extend(decode_run(b"", [])[0])
    assert list(a) == want


def test_lazy_and_hand_built_messages_are_equal_hashable_values_with_one_repr() -> None:
    raw = record(1)
    lazy = decode_records(raw, [len(raw)])[0]
    built = eager(raw)
    assert lazy == built and hash(lazy) == hash(built)
    assert repr(decode_records(raw, [len(raw)])[0]) == repr(built)
    assert repr(built).startswith("Message(topic='orders', queue_id=3, queue_offset=101,")
    assert len({lazy, built, decode_records(raw, [len(raw)])[0]}) == 1
    other = eager(record(2))
    assert lazy != other
    assert lazy != "not a message"


def test_a_hand_built_message_has_the_defaults_and_positional_order_of_before() -> None:
    m = Message("t", 1, 2, 3, b"x")
    assert (m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, m.body) == (
        "t",
        1,
        2,
        3,
        b"x",
    )
    assert (m.properties, m.store_host, m.msg_id, m.size, m.sys_flag) == ({}, "", "", 0, 0)
    assert m.properties is not Message("t", 1, 2, 3, b"x").properties  # one dict each
    assert Message(topic="t", queue_id=1, queue_offset=2, commit_log_offset=3, body=b"x") == m
    with pytest.raises(AttributeError):
        _ = m.no_such_field  # type: ignore[attr-defined]
    match m:
        case Message("t", 1, 2):
            pass
        case _:
            pytest.fail("positional match on the fields")


def test_a_message_pickles_as_its_decoded_value() -> None:
    raw = record(4, store_host=V6_HOST)
    lazy = decode_records(raw, [len(raw)])[0]
    copy = pickle.loads(pickle.dumps(lazy))
    assert copy == eager(raw)
    assert copy.msg_id == eager(raw).msg_id and copy.store_host.startswith("[2001:db8::7]")


def test_from_record_accepts_one_whole_record_and_nothing_else() -> None:
    raw = record(3)
    assert Message.from_record(raw) == eager(raw)
    # read_record(raw, 0, len(raw)) would read TOTALSIZE bytes and ignore what follows: bytes
    # after the record are not one whole record.
    for wrong in (raw + b"\x00" * 7, raw[:-1]):
        with pytest.raises(DataLoss, match=r"not one whole record|does not fit"):
            Message.from_record(wrong)


# -- the verdict ----------------------------------------------------------------------------------

Damage = Callable[[bytes], bytes]


def _set(at: int, value: int) -> Damage:
    return lambda raw: raw[:at] + bytes([value]) + raw[at + 1 :]


def _xor(at: int, mask: int) -> Damage:
    return lambda raw: raw[:at] + bytes([raw[at] ^ mask]) + raw[at + 1 :]


def _cut(n: int) -> Damage:
    return lambda raw: raw[:n]


def damages(raw: bytes) -> list[tuple[str, Damage]]:
    """Every byte zeroed, set to 0xFF and its low bit flipped; every truncation; garbage after."""
    out: list[tuple[str, Damage]] = []
    for at in range(len(raw)):
        out += [(f"zero@{at}", _set(at, 0)), (f"ff@{at}", _set(at, 0xFF))]
        out.append((f"flip@{at}", _xor(at, 1)))
    out += [(f"cut@{n}", _cut(n)) for n in range(len(raw))]
    out.append(("garbage after", lambda r: r + b"\x02junk"))
    return out


@pytest.mark.parametrize("index", [0, 3, 6, 7])  # IPv4, IPv6 born host, V2 topic, zlib
def test_a_damaged_record_gets_read_records_verdict_wherever_the_damage_is(index: int) -> None:
    """The damaged record sits between good ones. Where read_record refuses it the batch is
    DataLoss; where it accepts it (a field changed, not a check broken), the batch decodes to
    the record-by-record messages, the damaged record's changed fields included."""
    good = assorted()
    before, target, after = good[:index], good[index], good[index + 1 :]
    refused = kept = 0
    for name, damage in damages(target):
        bad = damage(target)
        raws = [*before, bad, *after]
        blob = b"".join(raws)
        sizes = [len(r) for r in raws]
        if accepted(bad):
            try:
                want = [eager(r) for r in raws]
            except DataLoss:  # the record is sound but its compressed body is not
                with pytest.raises(DataLoss):
                    decode_records(blob, sizes)
                continue
            assert decode_records(blob, sizes) == want, name
            kept += 1
        else:
            with pytest.raises(DataLoss):
                decode_records(blob, sizes)
            refused += 1
    assert refused > len(target) and kept > 0  # both verdicts were exercised


def test_sizes_that_do_not_add_up_to_the_blob_are_data_loss() -> None:
    raws = [record(1), record(2)]
    blob = b"".join(raws)
    for sizes in ([len(raws[0])], [len(raws[0]), len(raws[1]) + 1], [len(blob) + 5, -5]):
        with pytest.raises(DataLoss):
            decode_records(blob, sizes)
    with pytest.raises(DataLoss):
        decode_records(b"x", [])


def test_records_split_at_the_wrong_places_are_data_loss() -> None:
    raws = [record(1), record(2), record(3)]
    blob = b"".join(raws)
    a, b, _ = (len(r) for r in raws)
    with pytest.raises(DataLoss):
        decode_records(blob, [a + 4, b - 4, len(blob) - a - b])
    # Two records given as one: not one whole record (read_record alone would read the first
    # and drop the second unseen).
    with pytest.raises(DataLoss, match="not one whole record"):
        decode_records(blob, [a, len(blob) - a])


@pytest.mark.parametrize("record_crc", [True, False], ids=["record-crc", "body-crc-only"])
def test_a_body_crc_mismatch_is_data_loss_and_an_empty_bodys_crc_is_not_checked(
    record_crc: bool,
) -> None:
    """A changed BODYCRC is found by the body CRC, or by the whole-record CRC that covers it;
    an empty body's BODYCRC is not checked (RocketMQ's rule) in a record without the
    whole-record CRC, and is covered like any field in one with it."""
    raw = record(7, record_crc=record_crc)
    body_crc_at = 8
    (crc,) = struct.unpack_from(">i", raw, body_crc_at)
    wrong = raw[:body_crc_at] + struct.pack(">i", crc ^ 4) + raw[body_crc_at + 4 :]
    with pytest.raises(DataLoss, match="CRC"):
        decode_records(wrong, [len(wrong)])
    empty = record(1, body=b"", record_crc=record_crc)
    any_crc = empty[:body_crc_at] + struct.pack(">i", 12345) + empty[body_crc_at + 4 :]
    if record_crc:
        with pytest.raises(DataLoss, match="record CRC"):
            decode_records(any_crc, [len(any_crc)])
        return
    assert accepted(any_crc)
    assert decode_records(any_crc, [len(any_crc)]) == [eager(any_crc)]


def test_a_byte_changed_in_any_field_is_data_loss_in_the_sdk() -> None:
    """The SDK's checks (record_columns.check_records) refuse a record whose born time,
    queue id, flag, hosts, topic or properties changed: the whole-record CRC covers them. Each
    byte of a record, as one of a batch of like records and alone."""
    batch = [record(i, body=b"x" * 40) for i in range(40)]
    sizes = [len(r) for r in batch]
    for at in range(len(batch[0])):
        damaged = list(batch)
        damaged[20] = batch[20][:at] + bytes([batch[20][at] ^ 0x10]) + batch[20][at + 1 :]
        with pytest.raises(DataLoss):
            decode_records(b"".join(damaged), sizes)
        with pytest.raises(DataLoss):
            decode_records(damaged[20], [sizes[20]])


def test_a_polled_batchs_bodies_hold_the_records_only_read_record_passed() -> None:
    """A long (V2) topic's records: their bodies are in the bodies column as in the Messages
    (found by a review: the column held b"" for them when a second check decoded them)."""
    topic = "%RETRY%" + "g" * 130
    raws = [
        encode_record(topic=topic, queue_id=0, body=b"body-%d" % i, queue_offset=i)
        for i in range(3)
    ]
    run, offsets = decode_run(b"".join(raws), [len(r) for r in raws])
    batch = PolledBatch.of([(0, run.tail(0), offsets)])
    assert batch.bodies == [b"body-0", b"body-1", b"body-2"] == [m.body for m in batch]
    assert [m.topic for m in batch] == [topic] * 3 and batch.queue_offsets == [0, 1, 2]
