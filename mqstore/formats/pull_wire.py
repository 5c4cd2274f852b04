"""A pull's answer as wire bytes: its PullResponse, records_blob spliced in last.

    PullResponse     head                     the message serialized without records_blob
                     0x3a  varint(n)  records  records_blob (field 7, length-delimited): the
                                               n bytes of the records, end to end
    FollowResponse   per answer:
                     0x0a  varint(m)  answer   answers (field 1): a PullResponse as above,
                                               m bytes long

Protobuf lets a field come after the others and a message be written as the concatenation of
its parts (a parser merges them): these bytes parse as the message with records_blob set. The
servicer keeps each answer's records aside from its message and joins head, field header and
records into the bytes handed to gRPC in one b"".join: the records are copied once on their
way out, not into the message, out of it by SerializeToString and into gRPC's buffer. The
protobuf runtime is the specification: tests/formats/test_pull_wire.py parses these bytes
and compares them with the message filled field by field.
"""

from __future__ import annotations

from collections.abc import Sequence

# Field keys: (field number << 3) | wire type 2 (length-delimited), one byte each.
PULL_RECORDS_BLOB_KEY = bytes([7 << 3 | 2])  # PullResponse.records_blob
FOLLOW_ANSWERS_KEY = bytes([1 << 3 | 2])  # FollowResponse.answers

Chunk = bytes | memoryview


def varint(value: int) -> bytes:
    """`value` (0 <= value < 2**64) as a protobuf base-128 varint, low groups first."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"{value} is no unsigned 64-bit varint")
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def put_pull_answer(out: list[Chunk], head: bytes, records: Sequence[Chunk]) -> int:
    """A PullResponse's pieces appended to `out` (module docstring): `head`, then, when there
    are records, records_blob's key, length and the records (none: no field, as the runtime
    writes an empty bytes field). Returns the bytes appended."""
    out.append(head)
    size = sum(map(len, records))
    if not size:
        return len(head)
    length = varint(size)
    out.append(PULL_RECORDS_BLOB_KEY)
    out.append(length)
    out.extend(records)
    return len(head) + 1 + len(length) + size


def pull_answer(head: bytes, records: Sequence[Chunk]) -> bytes:
    """A PullResponse's wire bytes: `head` with records_blob = the records joined."""
    out: list[Chunk] = []
    put_pull_answer(out, head, records)
    return b"".join(out)


def follow_answers(answers: Sequence[tuple[bytes, Sequence[Chunk]]]) -> bytes:
    """A FollowResponse's wire bytes: each (head, records) a PullResponse in `answers`."""
    out: list[Chunk] = []
    for head, records in answers:
        out.append(FOLLOW_ANSWERS_KEY)
        at = len(out)
        out.append(b"")  # the answer's length, known once its pieces are in
        out[at] = varint(put_pull_answer(out, head, records))
    return b"".join(out)
