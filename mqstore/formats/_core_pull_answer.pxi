# A FOUND pull's columns as PullResponse wire bytes: included by _core.pyx.
#
#   pull_answer_wire(queue_offsets, sizes) -> bytes    fields 6 (queue_offsets, packed int64)
#                                                      and 8 (record_sizes, packed int32)
#
# `queue_offsets`, `sizes`: int64 buffers of one length, the units a pull serves (UnitColumns).
# The servicer sends the bytes after its PullResponse's own (cq_svc/servicer._Answer: fields
# may come in any order), not a Python int made and converted for each of a thousand records.
# The protobuf runtime is the reference: tests/formats/test_pull_answer_wire.py pins these
# bytes to what it serializes from the same fields (an empty column: no field, as it writes).

cdef enum:
    PULL_WIRE_QUEUE_OFFSETS = 6 << 3 | 2
    PULL_WIRE_RECORD_SIZES = 8 << 3 | 2


def pull_answer_wire(const int64_t[::1] queue_offsets, const int64_t[::1] sizes):
    """Fields 6 and 8 of a PullResponse (comment above); ValueError for columns of different
    lengths or a size that is no int32 (the runtime refuses it too)."""
    cdef Py_ssize_t n = queue_offsets.shape[0]
    cdef Py_ssize_t i, offsets_len = 0, sizes_len = 0, total = 0
    cdef unsigned char *w
    if sizes.shape[0] != n:
        raise ValueError(f"{n} queue offsets but {sizes.shape[0]} sizes")
    for i in range(n):
        if sizes[i] < INT32_MIN or sizes[i] > INT32_MAX:
            raise ValueError(f"a record size of {sizes[i]} is no int32")
        offsets_len += _wire_varint_len(<uint64_t>queue_offsets[i])
        # An int32 field's negative value is sign-extended: 10 bytes, as an int64's.
        sizes_len += _wire_varint_len(<uint64_t>sizes[i])
    if n:
        total = (2 + _wire_varint_len(<uint64_t>offsets_len) + offsets_len
                 + _wire_varint_len(<uint64_t>sizes_len) + sizes_len)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    w = <unsigned char *>PyBytes_AS_STRING(out)
    if n:
        w += _field(w, PULL_WIRE_QUEUE_OFFSETS, <uint64_t>offsets_len)
        for i in range(n):
            w += _write_varint(w, <uint64_t>queue_offsets[i])
        w += _field(w, PULL_WIRE_RECORD_SIZES, <uint64_t>sizes_len)
        for i in range(n):
            w += _write_varint(w, <uint64_t>sizes[i])
    return out
