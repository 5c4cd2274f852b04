# The wire bytes of an AppendRequest and of an AppendResponse, written from columns, and an
# AppendResponse read back (the protobuf runtime is their reference: tests/formats/
# test_append_wire.py); a send_batch cut into shares and its bytes measured
# (formats/append_wire.py is their reference). Included by _core.pyx.

from cpython.long cimport PyLong_AsLongLong, PyLong_AsUnsignedLongLong
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

cdef enum:
    WIRE_LEN = 2  # length-delimited
    WIRE_VARINT = 0
# Every field number written here is below 16, so its key is one byte (the core's _field).


cdef inline Py_ssize_t _wire_varint_len(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v > 0x7F:
        v >>= 7
        n += 1
    return n


cdef inline int64_t _wire_int(object value, int64_t lo, int64_t hi) except? -1:
    """A Python int in [lo, hi] (an int32 or int64 field's range), as the reference checks."""
    cdef int64_t v = PyLong_AsLongLong(value)
    if v < lo or v > hi:
        raise ValueError(f"{value} is out of range [{lo}, {hi}]")
    return v


cdef Py_ssize_t _wire_packed_len(list values, int64_t lo, int64_t hi) except -1:
    """The payload bytes of a packed int field (0: left out)."""
    cdef Py_ssize_t n = 0
    for value in values:
        n += _wire_varint_len(<uint64_t>_wire_int(value, lo, hi))
    return n


cdef unsigned char *_wire_put_packed(
    unsigned char *w, uint32_t field, list values, Py_ssize_t payload
) except NULL:
    """A packed int field whose payload `_wire_packed_len` measured (nothing when it is 0)."""
    if payload == 0:
        return w
    w += _field(w, field << 3 | WIRE_LEN, <uint64_t>payload)
    for value in values:
        w += _write_varint(w, <uint64_t>PyLong_AsLongLong(value))  # checked by _wire_packed_len
    return w


cdef inline Py_ssize_t _wire_delimited_len(uint32_t field, Py_ssize_t payload) noexcept nogil:
    return _wire_varint_len(field << 3 | WIRE_LEN) + _wire_varint_len(<uint64_t>payload) + payload


cdef inline unsigned char *_wire_put_delimited(
    unsigned char *w, uint32_t field, const char *data, Py_ssize_t length
) noexcept nogil:
    w += _field(w, field << 3 | WIRE_LEN, <uint64_t>length)
    memcpy(w, data, <size_t>length)
    return w + length


cdef inline Py_ssize_t _wire_scalar_len(uint32_t field, int64_t v) noexcept nogil:
    return _wire_varint_len(field << 3 | WIRE_VARINT) + _wire_varint_len(<uint64_t>v) if v else 0


cdef inline unsigned char *_wire_put_scalar(unsigned char *w, uint32_t field, uint64_t v) noexcept nogil:
    if v:
        w += _field(w, field << 3 | WIRE_VARINT, v)
    return w


cdef Py_ssize_t _wire_blobs_len(uint32_t field, list blobs, list keep) except -1:
    """The bytes of a repeated bytes field (every blob, empty ones too)."""
    cdef Py_ssize_t n = 0, length
    for item in blobs:
        _bytes_of(item, keep, &length)
        n += _wire_delimited_len(field, length)
    return n


cdef unsigned char *_wire_put_blobs(unsigned char *w, uint32_t field, list blobs, list keep) except NULL:
    cdef Py_ssize_t length
    cdef const unsigned char *data
    for item in blobs:
        data = _bytes_of(item, keep, &length)
        w = _wire_put_delimited(w, field, <const char *>data, length)
    return w


cdef inline Py_ssize_t _refusal_len(
    int64_t index, int64_t status, Py_ssize_t reason_n, Py_ssize_t field_n
) noexcept nogil:
    """The bytes of a Refusal's fields (index, status, reason, field; each left out empty)."""
    return (
        _wire_scalar_len(1, index)
        + _wire_scalar_len(2, status)
        + (_wire_delimited_len(3, reason_n) if reason_n else 0)
        + (_wire_delimited_len(4, field_n) if field_n else 0)
    )


def append_request_wire(str producer_id, object sequence, list batches):
    """An AppendRequest's bytes from each batch's columns
    (topic, queue ids, bodies, properties, sys flags, born ms), one copy of every body."""
    cdef uint64_t seq = PyLong_AsUnsignedLongLong(sequence)
    cdef Py_ssize_t pid_n, topic_n, total = 0, k, nb = len(batches)
    cdef const char *pid = PyUnicode_AsUTF8AndSize(producer_id, &pid_n)
    cdef const char *topic
    cdef list keep = []
    cdef list bodies, properties
    cdef int64_t born
    # Per batch: its fields' bytes, then its packed queue ids' and sys flags' payloads.
    cdef Py_ssize_t *sizes = <Py_ssize_t *>malloc(<size_t>(3 * nb + 1) * sizeof(Py_ssize_t))
    if sizes == NULL:
        raise MemoryError()
    cdef bytes out
    cdef unsigned char *w
    try:
        for k in range(nb):
            batch = batches[k]
            topic_b, queue_ids, bodies, properties, sys_flags, born_ms = batch
            PyUnicode_AsUTF8AndSize(topic_b, &topic_n)
            sizes[3 * k + 1] = _wire_packed_len(queue_ids, INT32_MIN, INT32_MAX)
            sizes[3 * k + 2] = _wire_packed_len(sys_flags, INT32_MIN, INT32_MAX)
            born = _wire_int(born_ms, INT64_MIN, INT64_MAX)
            sizes[3 * k] = (
                (_wire_delimited_len(1, topic_n) if topic_n else 0)
                + (_wire_delimited_len(2, sizes[3 * k + 1]) if sizes[3 * k + 1] else 0)
                + _wire_blobs_len(3, bodies, keep)
                + _wire_blobs_len(4, properties, keep)
                + (_wire_delimited_len(5, sizes[3 * k + 2]) if sizes[3 * k + 2] else 0)
                + _wire_scalar_len(8, born)
            )
            total += _wire_delimited_len(1, sizes[3 * k])
        total += (_wire_delimited_len(2, pid_n) if pid_n else 0) + _wire_scalar_len(3, <int64_t>seq)
        out = PyBytes_FromStringAndSize(NULL, total)
        w = <unsigned char *>PyBytes_AS_STRING(out)
        for k in range(nb):
            topic_b, queue_ids, bodies, properties, sys_flags, born_ms = batches[k]
            w += _field(w, 1 << 3 | WIRE_LEN, <uint64_t>sizes[3 * k])
            topic = PyUnicode_AsUTF8AndSize(topic_b, &topic_n)
            if topic_n:
                w = _wire_put_delimited(w, 1, topic, topic_n)
            w = _wire_put_packed(w, 2, queue_ids, sizes[3 * k + 1])
            w = _wire_put_blobs(w, 3, bodies, keep)
            w = _wire_put_blobs(w, 4, properties, keep)
            w = _wire_put_packed(w, 5, sys_flags, sizes[3 * k + 2])
            w = _wire_put_scalar(w, 8, <uint64_t>PyLong_AsLongLong(born_ms))
        if pid_n:
            w = _wire_put_delimited(w, 2, pid, pid_n)
        w = _wire_put_scalar(w, 3, seq)
        if w != <unsigned char *>PyBytes_AS_STRING(out) + total:
            raise AssertionError("an append request's bytes were miscounted")
        return out
    finally:
        free(sizes)


def append_response_wire(
    list statuses,
    list offsets,
    list sizes,
    list queue_offsets,
    int64_t store_timestamp_ms,
    bytes store_host,
    list refusals,
    bint duplicate,
    object sequence,
):
    """An AppendResponse's bytes from the result columns."""
    cdef uint64_t seq = PyLong_AsUnsignedLongLong(sequence)
    cdef Py_ssize_t st_n = _wire_packed_len(statuses, INT32_MIN, INT32_MAX)
    cdef Py_ssize_t off_n = _wire_packed_len(offsets, INT64_MIN, INT64_MAX)
    cdef Py_ssize_t size_n = _wire_packed_len(sizes, INT32_MIN, INT32_MAX)
    cdef Py_ssize_t qo_n = _wire_packed_len(queue_offsets, INT64_MIN, INT64_MAX)
    cdef Py_ssize_t host_n = PyBytes_GET_SIZE(store_host), reason_n, field_n, r_n
    cdef Py_ssize_t total = 0
    cdef const char *reason
    cdef const char *field
    cdef int64_t index, status
    total += _wire_delimited_len(1, st_n) if st_n else 0
    total += _wire_delimited_len(2, off_n) if off_n else 0
    total += _wire_delimited_len(3, size_n) if size_n else 0
    total += _wire_delimited_len(4, qo_n) if qo_n else 0
    total += _wire_scalar_len(5, store_timestamp_ms)
    total += _wire_delimited_len(6, host_n) if host_n else 0
    for refusal in refusals:
        index_o, status_o, reason_o, field_o = refusal
        index = _wire_int(index_o, INT32_MIN, INT32_MAX)
        status = _wire_int(status_o, INT32_MIN, INT32_MAX)
        PyUnicode_AsUTF8AndSize(reason_o, &reason_n)
        PyUnicode_AsUTF8AndSize(field_o, &field_n)
        total += _wire_delimited_len(7, _refusal_len(index, status, reason_n, field_n))
    total += _wire_scalar_len(8, 1 if duplicate else 0) + _wire_scalar_len(9, <int64_t>seq)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING(out)
    w = _wire_put_packed(w, 1, statuses, st_n)
    w = _wire_put_packed(w, 2, offsets, off_n)
    w = _wire_put_packed(w, 3, sizes, size_n)
    w = _wire_put_packed(w, 4, queue_offsets, qo_n)
    w = _wire_put_scalar(w, 5, <uint64_t>store_timestamp_ms)
    if host_n:
        w = _wire_put_delimited(w, 6, PyBytes_AS_STRING(store_host), host_n)
    for refusal in refusals:
        index_o, status_o, reason_o, field_o = refusal
        index = PyLong_AsLongLong(index_o)
        status = PyLong_AsLongLong(status_o)
        reason = PyUnicode_AsUTF8AndSize(reason_o, &reason_n)
        field = PyUnicode_AsUTF8AndSize(field_o, &field_n)
        r_n = _refusal_len(index, status, reason_n, field_n)
        w += _field(w, 7 << 3 | WIRE_LEN, <uint64_t>r_n)
        w = _wire_put_scalar(w, 1, <uint64_t>index)
        w = _wire_put_scalar(w, 2, <uint64_t>status)
        if reason_n:
            w = _wire_put_delimited(w, 3, reason, reason_n)
        if field_n:
            w = _wire_put_delimited(w, 4, field, field_n)
    w = _wire_put_scalar(w, 8, 1 if duplicate else 0)
    w = _wire_put_scalar(w, 9, seq)
    if w != <unsigned char *>PyBytes_AS_STRING(out) + total:
        raise AssertionError("an append response's bytes were miscounted")
    return out


def share_bounds(
    list bodies, list properties, Py_ssize_t overhead, Py_ssize_t share_messages,
    Py_ssize_t share_bytes,
):
    """append_wire.share_bounds: a send_batch's messages split into requests' shares, each
    message weighing its body, its properties and `overhead` bytes; (first, end, weight) each."""
    cdef Py_ssize_t n = len(bodies), i, first = 0, end, lo, hi, mid
    if len(properties) != n:
        raise ValueError(f"{len(properties)} properties for {n} bodies")
    if share_messages < 1:
        raise ValueError("a share holds at least one message")
    cdef int64_t *totals = <int64_t *>malloc(<size_t>(n + 1) * sizeof(int64_t))
    if totals == NULL:
        raise MemoryError()
    cdef list shares = []
    try:
        totals[0] = 0
        for i in range(n):
            totals[i + 1] = totals[i] + len(bodies[i]) + len(properties[i]) + overhead
        while first < n:
            end = min(n, first + share_messages)
            if totals[end] - totals[first] > share_bytes:
                # The longest run from `first` within share_bytes (at least one message).
                lo = first + 1
                hi = end
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if totals[mid] - totals[first] <= share_bytes:
                        lo = mid
                    else:
                        hi = mid - 1
                end = lo
            shares.append((first, end, totals[end] - totals[first]))
            first = end
        return shares
    finally:
        free(totals)


cdef const unsigned char *_wire_next_field(
    const unsigned char *p, const unsigned char *end, uint64_t *field, int *wire_type,
    uint64_t *value, const unsigned char **payload, int depth,
) except NULL:
    """The field at p: its number, wire type and varint value or payload (length in value);
    a fixed-width field or a group is stepped over (nothing read). `depth`: how deep in
    sub-messages p is (protobuf's nesting limit counts them and groups alike)."""
    cdef uint64_t key
    p = _varint(p, end, &key)
    field[0] = key >> 3
    wire_type[0] = <int>(key & 7)
    if key > 0xFFFFFFFF or field[0] == 0:
        raise WireError("a bad tag")
    if wire_type[0] == WIRE_VARINT:
        return _varint(p, end, value)
    if wire_type[0] == WIRE_LEN:
        p = _varint(p, end, value)
        if value[0] > <uint64_t>(end - p):
            raise ValueError("a truncated length-delimited field")
        payload[0] = p
        return p + value[0]
    return _skip(p, end, wire_type[0], <uint32_t>field[0], depth)  # fixed-width, a group


cdef inline object _wire_signed(uint64_t v, int bits):
    if bits == 32:
        return <int32_t>(<uint32_t>v)
    return <int64_t>v


cdef int _wire_numbers(
    list out, int wire_type, uint64_t value, const unsigned char *payload, int bits
) except -1:
    cdef const unsigned char *end
    cdef uint64_t v
    if wire_type == WIRE_VARINT:
        out.append(_wire_signed(value, bits))
        return 0
    end = payload + value
    while payload < end:
        payload = _varint(payload, end, &v)
        out.append(_wire_signed(v, bits))
    return 0


cdef str _wire_text(const unsigned char *payload, uint64_t length):
    """A string field's text; bytes that are no UTF-8 raise ValueError, as protobuf refuses
    them (proto3 strings are checked)."""
    return (<const char *>payload)[:length].decode("utf-8")


cdef int _wire_merge(list into, const unsigned char *p, const unsigned char *end) except -1:
    """A Refusal's or RequestError's fields into `into`."""
    cdef uint64_t field, value
    cdef int wire_type
    cdef const unsigned char *payload = NULL
    while p < end:
        p = _wire_next_field(p, end, &field, &wire_type, &value, &payload, 1)
        if field < 1 or field > <uint64_t>len(into):
            continue
        if type(into[field - 1]) is int and wire_type == WIRE_VARINT:
            into[field - 1] = _wire_signed(value, 32)
        elif type(into[field - 1]) is str and wire_type == WIRE_LEN:
            into[field - 1] = _wire_text(payload, value)
    return 0


def read_append_response(bytes data):
    """An AppendResponse's fields from its bytes, as protobuf parses them: a repeated number
    packed or not, the last of a scalar field, a sub-message's occurrences merged, unknown
    fields (groups too) skipped. Returns (statuses, commit-log offsets, sizes, queue offsets,
    store time, store host, refusals as (index, status, reason, field), duplicate, sequence,
    the request's error as (code, message, field) or None). Malformed bytes, and text that is
    not UTF-8, raise ValueError."""
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef const unsigned char *end = p + PyBytes_GET_SIZE(data)
    cdef const unsigned char *payload = NULL
    cdef uint64_t field, value
    cdef int wire_type
    cdef list statuses = [], offsets = [], sizes = [], queue_offsets = [], refusals = []
    cdef object store_ts = 0, sequence = 0
    cdef bytes host = b""
    cdef bint duplicate = False
    cdef list error = None
    cdef list refusal
    while p < end:
        p = _wire_next_field(p, end, &field, &wire_type, &value, &payload, 0)
        if 1 <= field <= 4 and (wire_type == WIRE_VARINT or wire_type == WIRE_LEN):
            if field == 1:
                _wire_numbers(statuses, wire_type, value, payload, 32)
            elif field == 2:
                _wire_numbers(offsets, wire_type, value, payload, 64)
            elif field == 3:
                _wire_numbers(sizes, wire_type, value, payload, 32)
            else:
                _wire_numbers(queue_offsets, wire_type, value, payload, 64)
        elif wire_type == WIRE_VARINT:
            if field == 5:
                store_ts = <int64_t>value
            elif field == 8:
                duplicate = value != 0
            elif field == 9:
                sequence = value
        elif wire_type == WIRE_LEN:
            if field == 6:
                host = PyBytes_FromStringAndSize(<const char *>payload, <Py_ssize_t>value)
            elif field == 7:
                refusal = [0, 0, "", ""]
                _wire_merge(refusal, payload, payload + value)
                refusals.append(tuple(refusal))
            elif field == 10:
                if error is None:
                    error = [0, "", ""]
                _wire_merge(error, payload, payload + value)
    return (
        statuses, offsets, sizes, queue_offsets, store_ts, host, refusals, duplicate, sequence,
        None if error is None else tuple(error),
    )


def widest_bytes(list items):
    """append_wire.widest_bytes: the length of the longest item (0 for none), or -1 when an
    item is not exactly bytes."""
    cdef Py_ssize_t widest = 0, n
    for item in items:
        if not PyBytes_CheckExact(item):
            return -1
        n = PyBytes_GET_SIZE(item)
        if n > widest:
            widest = n
    return widest


cdef tuple _wire_batch(const unsigned char *p, const unsigned char *end):
    """One MessageBatch's fields as protobuf parses them (read_append_request)."""
    cdef const unsigned char *payload = NULL
    cdef uint64_t field, value
    cdef int wire_type
    cdef str topic = "", born_host = ""
    cdef list queue_ids = [], bodies = [], properties = [], sys_flags = []
    cdef object sys_flag = 0, flag = 0, born_ms = 0, reconsume = 0, prepared = 0
    while p < end:
        p = _wire_next_field(p, end, &field, &wire_type, &value, &payload, 1)
        if (field == 2 or field == 5) and (wire_type == WIRE_VARINT or wire_type == WIRE_LEN):
            _wire_numbers(queue_ids if field == 2 else sys_flags, wire_type, value, payload, 32)
        elif wire_type == WIRE_LEN:
            if field == 3:
                bodies.append(PyBytes_FromStringAndSize(<const char *>payload, <Py_ssize_t>value))
            elif field == 4:
                properties.append(
                    PyBytes_FromStringAndSize(<const char *>payload, <Py_ssize_t>value)
                )
            elif field == 1:
                topic = _wire_text(payload, value)
            elif field == 9:
                born_host = _wire_text(payload, value)
        elif wire_type == WIRE_VARINT:
            if field == 6:
                sys_flag = <int32_t>(<uint32_t>value)
            elif field == 7:
                flag = <int32_t>(<uint32_t>value)
            elif field == 8:
                born_ms = <int64_t>value
            elif field == 10:
                reconsume = <int32_t>(<uint32_t>value)
            elif field == 11:
                prepared = <int64_t>value
    return (
        topic, queue_ids, bodies, properties, sys_flags, sys_flag, flag, born_ms, born_host,
        reconsume, prepared,
    )


def read_append_request(bytes data):
    """An AppendRequest's fields from its bytes, as protobuf parses them, straight into the
    columns a MessageBatch takes (no protobuf message, no copy of a repeated field into a
    list): a repeated number packed or not, the last of a scalar field, each batch its own,
    unknown fields (groups too) and known ones of another wire type skipped. Returns
    (batches, producer id, sequence); a batch is (topic, queue ids, bodies, properties,
    sys flags, sys flag, flag, born ms, born host, reconsume times, prepared tx offset), its
    repeated fields lists (empty when absent). Malformed bytes, and text that is not UTF-8,
    raise ValueError."""
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef const unsigned char *end = p + PyBytes_GET_SIZE(data)
    cdef const unsigned char *payload = NULL
    cdef uint64_t field, value
    cdef int wire_type
    cdef list batches = []
    cdef str producer_id = ""
    cdef object sequence = 0
    while p < end:
        p = _wire_next_field(p, end, &field, &wire_type, &value, &payload, 0)
        if wire_type == WIRE_LEN:
            if field == 1:
                batches.append(_wire_batch(payload, payload + value))
            elif field == 2:
                producer_id = _wire_text(payload, value)
        elif wire_type == WIRE_VARINT and field == 3:
            sequence = value
    return batches, producer_id, sequence
