"""Decoders of small encoded strings a caller hands in: message properties, offset msg ids, and
cq_svc's receipt handles.

Input: a selector byte, then the value (and, for receipts, the queue it is presented for).
Rules:

    decode_properties   never raises (bytes or text); a decoded map whose values hold no 0x01
                        encodes and decodes to itself; split_keys of any value never raises
    decode_offset_msg_id  (host, offset >= 0) or InvalidArgument naming msg_id; a decoded id
                        re-encodes to the same id (upper case)
    receipts.decode     (queue offset >= 0, delivery count >= 1) or InvalidArgument naming the
                        field; what decodes is what encode issues for that queue
"""

from __future__ import annotations

from collections.abc import Callable

from cq_svc import receipts
from fuzz.draw import INT32_MAX, INT64_MAX, Draw
from fuzz.findings import check
from mqstore.errors import InvalidArgument
from mqstore.formats.msgid import decode_offset_msg_id, offset_msg_id
from mqstore.formats.properties import (
    NAME_VALUE_SEPARATOR,
    decode_properties,
    encode_properties,
    split_keys,
)

DESCRIPTION = (
    "properties, offset msg ids and receipt handles: never an untyped error, and what decodes "
    "re-encodes to itself"
)
# Packages atheris instruments for coverage (fuzz/engine.py).
INSTRUMENT = ("mqstore", "cq_svc")


def check_properties(raw: bytes | str) -> None:
    props = decode_properties(raw)
    check(
        all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in props.items()),
        "ids.properties-empty-name-or-value",
        f"{props!r}",
    )
    for value in props.values():
        split_keys(value)
    if not any(NAME_VALUE_SEPARATOR in v for v in props.values()):
        again = decode_properties(encode_properties(props))
        check(again == props, "ids.properties-round-trip", f"{again!r} != {props!r}")


def check_msg_id(text: str) -> None:
    try:
        host, offset = decode_offset_msg_id(text)
    except InvalidArgument as err:
        check(err.field == "msg_id", "ids.msg-id-field", f"field {err.field!r}")
        return
    check(offset >= 0, "ids.msg-id-negative-offset", f"{text!r} -> {offset}")
    again = offset_msg_id(host, offset)
    check(again == text.upper(), "ids.msg-id-round-trip", f"{text!r} -> {again!r}")


def check_receipt(handle: str, group: str, topic: str, queue_id: int) -> None:
    try:
        offset, count = receipts.decode(handle, group, topic, queue_id)
    except InvalidArgument as err:
        check(err.field == "receipt_handle", "ids.receipt-field", f"field {err.field!r}")
        return
    check(offset >= 0 and count >= 1, "ids.receipt-range", f"{handle!r} -> {offset}, {count}")
    # Base64 leaves 2 bits of the last character unused, so another spelling of the same
    # handle may decode too: compare what it means, not its spelling.
    reissued = receipts.encode(group, topic, queue_id, offset, count)
    again = receipts.decode(reissued, group, topic, queue_id)
    check(again == (offset, count), "ids.receipt-round-trip", f"{handle!r}")


def one_input(data: bytes) -> None:
    draw = Draw(data)
    kind = draw.byte() % 4
    if kind == 0:
        check_properties(draw.rest())
    elif kind == 1:
        check_properties(draw.text(200))
    elif kind == 2:
        check_msg_id(draw.rest().decode("utf-8", "replace"))
    else:
        group, topic = draw.text(8), draw.text(8)
        queue_id = draw.integer(0, 8, (-1, INT32_MAX))
        if draw.boolean():
            # A real handle, then a few of its characters replaced.
            handle = list(
                receipts.encode(
                    group,
                    topic,
                    queue_id,
                    draw.integer(0, 1 << 20, (INT64_MAX,)),
                    draw.integer(1, 9),
                )
            )
            for _ in range(draw.integer(0, 3)):
                handle[draw.integer(0, len(handle) - 1)] = draw.text(1) or "A"
            check_receipt("".join(handle), group, topic, queue_id)
        else:
            check_receipt(draw.text(30, (22, 23, 24)), group, topic, queue_id)


def setup() -> Callable[[bytes], None]:
    return one_input


def seeds() -> list[bytes]:
    return [
        b"\x00KEYS\x01a b\x02TAGS\x01t\x02UNIQ_KEY\x01U1\x02",
        b"\x02" + b"7F000001000027100000000000000064",
        b"\x02" + b"00000000000000000000000000000001000027100000000000000064",
        b"\x03\x03\x01g\x01T\x00\x01",
    ]
