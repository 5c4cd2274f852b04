# Check whole records laid end to end, every check read_record makes, returning their fields
# (record_columns.check_records): included by _core.pyx, whose header definitions it reads
# records with.

from cpython.bytearray cimport (
    PyByteArray_AS_STRING,
    PyByteArray_FromStringAndSize,
    PyByteArray_Resize,
)
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyObject_CheckBuffer
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.string cimport memcpy

# What check() says of a record that fails, in read_record's order of checks: record_columns
# turns each (with the numbers beside it) into read_record's reason.
cdef enum:
    FAIL_FEW_BYTES = 1  # fewer than 8 bytes
    FAIL_BLANK = 2  # the end-of-file blank
    FAIL_MAGIC = 3  # a: the magic code
    FAIL_TOTAL_FIT = 4  # a: TOTALSIZE, b: the bytes of its slot
    FAIL_SHORT_HEADER = 5  # a: TOTALSIZE
    FAIL_BODY_LEN = 6  # a: BODYLENGTH
    FAIL_TOPIC_LEN_PAST = 7
    FAIL_TOPIC_LEN = 8  # a: the topic length
    FAIL_PROPS_NEG = 9  # a: the properties length
    FAIL_ADD_UP = 10  # a: TOTALSIZE, b: what the fields add up to
    FAIL_TOPIC_UTF8 = 11
    FAIL_TOPIC_EMPTY = 12
    FAIL_PROPS_END = 13
    FAIL_CRC_DAMAGED = 14
    FAIL_RECORD_CRC = 15
    FAIL_BODY_CRC = 16
    FAIL_OFFSET = 17  # a: PHYSICALOFFSET, b: the offset expected
    FAIL_NOT_WHOLE = 18  # a record shorter than its slot: a: TOTALSIZE, b: the slot

# The columns of check()'s answer, each n int64s, one after the other.
cdef enum:
    COL_START = 0
    COL_END = 1
    COL_QUEUE_ID = 2
    COL_QUEUE_OFFSET = 3
    COL_PHYSICAL_OFFSET = 4
    COL_SYS_FLAG = 5
    COL_BODY_START = 6
    COL_BODY_END = 7
    CHECK_COLUMNS_ = 8

cdef int32_t BLANK_MAGIC_ = <int32_t>0xCBD43194
CHECK_COLUMNS = CHECK_COLUMNS_


cdef int64_t *_int64s(object values, Py_ssize_t n) except NULL:
    """`values` (a sequence of n ints, or a buffer of n int64s) as a new C array (PyMem_Free)."""
    cdef int64_t *out = <int64_t *>PyMem_Malloc(<size_t>(n if n > 0 else 1) * sizeof(int64_t))
    cdef Py_buffer view
    cdef Py_ssize_t i
    if out == NULL:
        raise MemoryError()
    cdef bint copied = False, held = False
    if PyObject_CheckBuffer(values):
        try:
            PyObject_GetBuffer(values, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)
            held = True
        except (BufferError, ValueError, TypeError):
            pass  # not contiguous: read as a sequence
    if held:
        try:
            # int64s (numpy's int64 is "l" here): copied whole; any other items read one by one
            if (
                view.itemsize == 8
                and view.format != NULL
                and view.format[0] in (b"q", b"l", b"=", b"<", b"@")
                and view.format[view.format[0] in (b"=", b"<", b"@")] in (b"q", b"l")
                and view.len == n * <Py_ssize_t>sizeof(int64_t)
            ):
                memcpy(out, view.buf, <size_t>view.len)
                copied = True
        finally:
            PyBuffer_Release(&view)
    if copied:
        return out
    try:
        i = 0
        for value in values:
            if i == n:
                raise ValueError(f"more than {n} values")
            out[i] = value
            i += 1
        if i != n:
            raise ValueError(f"{i} values, not {n}")
    except BaseException:
        PyMem_Free(out)
        raise
    return out


cdef int _topic_verdict(dict topics, bytes raw) except -1:
    """0 when `raw` is a topic read_record accepts, else its FAIL_ code; remembered in
    `topics`."""
    cdef int verdict = 0
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        verdict = FAIL_TOPIC_UTF8
    else:
        if not name or "\x00" in name:
            verdict = FAIL_TOPIC_EMPTY
    topics[raw] = verdict
    return verdict


def check(
    object blob,
    object sizes,
    object expected_offsets,
    bint bodies,
    bint check_crc=True,
):
    """Check the records laid end to end in `blob`, `sizes[i]` bytes each (adding up to its
    length: ValueError otherwise), each as read_record(record, check_crc=check_crc,
    expected_offset=expected_offsets[i]) checks it, and as filling its slot exactly.

    Returns (columns, bodies, failed, flags_any): `columns` a bytearray of CHECK_COLUMNS
    columns of n native int64s each (start, end, queue id, queue offset, physical offset,
    sysflag, body start, body end; zeros past the start and end of a record that failed);
    `bodies` each record's body (b"" where it failed), None unless asked for; `failed` a list
    of (index, FAIL_ code, a, b) in order; `flags_any` the OR of the passed records' sysflags.
    `sizes` and `expected_offsets` (None: no offset check; an offset below 0 checks none, as
    in read_record) are sequences of ints or buffers of int64s."""
    cdef Py_ssize_t n = len(sizes)
    if expected_offsets is not None and len(expected_offsets) != n:
        raise ValueError(f"{len(expected_offsets)} offsets for {n} records")
    cdef int64_t *size = _int64s(sizes, n)
    cdef int64_t *expected = NULL
    cdef _Buffer held = None
    try:
        if expected_offsets is not None:
            expected = _int64s(expected_offsets, n)
        held = _Buffer(blob)
        return _check(
            <const unsigned char *>held.view.buf, held.view.len, size, expected, n, bodies,
            check_crc
        )
    finally:
        if held is not None:
            held.release()
        PyMem_Free(size)
        PyMem_Free(expected)


cdef tuple _check(
    const unsigned char *data,
    Py_ssize_t length,
    const int64_t *size,
    const int64_t *expected,
    Py_ssize_t n,
    bint want_bodies,
    bint check_crc,
):
    cdef Py_ssize_t i
    cdef int64_t at = 0
    for i in range(n):
        if size[i] < 0 or size[i] > length - at:
            raise ValueError(f"{n} record sizes do not add up to {length} bytes")
        at += size[i]
    if at != length:
        raise ValueError(f"{n} record sizes do not add up to {length} bytes")
    cdef bytearray columns = PyByteArray_FromStringAndSize(
        NULL, n * CHECK_COLUMNS_ * <Py_ssize_t>sizeof(int64_t)
    )
    cdef int64_t *col = <int64_t *>PyByteArray_AS_STRING(columns)
    memset(col, 0, <size_t>(n * CHECK_COLUMNS_) * sizeof(int64_t))
    cdef list bodies = [] if want_bodies else None
    cdef list failed = []
    cdef dict topics = {}
    cdef bytes last_raw = None
    cdef bytes raw
    cdef object verdict_of
    cdef const unsigned char *p
    cdef int64_t start = 0, slot, total, header, body_len, topic_at, topic_len, props_len
    cdef int64_t stored, a, b
    cdef int32_t magic, flags
    cdef int64_t flags_any = 0
    cdef int fail
    cdef uint32_t crc
    for i in range(n):
        slot = size[i]
        p = data + start
        col[COL_START * n + i] = start
        col[COL_END * n + i] = start + slot
        fail = 0
        a = b = 0
        body_len = 0
        header = HEADER_V4_V4_BYTES
        # read_record's checks, in its order.
        if slot < 8:
            fail = FAIL_FEW_BYTES
        else:
            total = mq_be_i32(p + TOTALSIZE_POS)
            magic = mq_be_i32(p + MAGIC_POS)
            if magic == BLANK_MAGIC_:
                fail = FAIL_BLANK
            elif magic != MAGIC_V1_ and magic != MAGIC_V2_:
                fail, a = FAIL_MAGIC, magic
            elif total < RECORD_BYTES_MIN_ or total > slot:
                fail, a, b = FAIL_TOTAL_FIT, total, slot
        if not fail:
            flags = mq_be_i32(p + SYSFLAG_POS_)
            if flags & BORNHOST_V6:
                header += V6_EXTRA_BYTES
            if flags & STOREHOST_V6:
                header += V6_EXTRA_BYTES
            if total < header + 3:
                fail, a = FAIL_SHORT_HEADER, total
        if not fail:
            body_len = mq_be_i32(p + header - 4)
            if body_len < 0 or header + body_len > total:
                fail, a = FAIL_BODY_LEN, body_len
        if not fail:
            topic_at = header + body_len
            if magic == MAGIC_V2_:
                if topic_at + 2 > total:
                    fail = FAIL_TOPIC_LEN_PAST
                else:
                    topic_len = mq_be_i16(p + topic_at)
                    topic_at += 2
            else:
                if topic_at + 1 > total:
                    fail = FAIL_TOPIC_LEN_PAST
                else:
                    topic_len = p[topic_at]
                    topic_at += 1
        if not fail and (topic_len < 0 or topic_at + topic_len + 2 > total):
            fail, a = FAIL_TOPIC_LEN, topic_len
        if not fail:
            props_len = mq_be_i16(p + topic_at + topic_len)
            if props_len < 0:
                fail, a = FAIL_PROPS_NEG, props_len
            elif topic_at + topic_len + 2 + props_len != total:
                fail, a, b = FAIL_ADD_UP, total, topic_at + topic_len + 2 + props_len
        if not fail:
            # The topic: most records name the one before's, compared in place.
            if (
                last_raw is None
                or PyBytes_GET_SIZE(last_raw) != topic_len
                or memcmp(PyBytes_AS_STRING(last_raw), p + topic_at, <size_t>topic_len) != 0
            ):
                raw = PyBytes_FromStringAndSize(<const char *>(p + topic_at), topic_len)
                verdict_of = topics.get(raw)
                fail = _topic_verdict(topics, raw) if verdict_of is None else verdict_of
                if not fail:
                    last_raw = raw
        if not fail and props_len and p[total - 1] != PROPERTIES_END_BYTE_:
            fail = FAIL_PROPS_END
        if not fail and check_crc:
            stored = stored_record_crc(p + total, <int>props_len)
            if stored == DAMAGED_RECORD_CRC_:
                fail = FAIL_CRC_DAMAGED
            elif stored >= 0:
                crc = mq_crc32(0, p, <size_t>(total - RECORD_CRC_BYTES_)) & CRC_MASK
                if crc != stored:
                    fail = FAIL_RECORD_CRC
            elif body_len > 0:
                crc = mq_crc32(0, p + header, <size_t>body_len) & CRC_MASK
                if <int64_t>crc != mq_be_i32(p + BODYCRC_POS):
                    fail = FAIL_BODY_CRC
        if not fail and expected != NULL and expected[i] >= 0:
            if mq_be_i64(p + PHYSICAL_OFFSET_POS_) != expected[i]:
                fail, a, b = FAIL_OFFSET, mq_be_i64(p + PHYSICAL_OFFSET_POS_), expected[i]
        if not fail and total != slot:
            fail, a, b = FAIL_NOT_WHOLE, total, slot
        if fail:
            failed.append((i, fail, a, b))
            if want_bodies:
                bodies.append(b"")
        else:
            col[COL_QUEUE_ID * n + i] = mq_be_i32(p + QUEUE_ID_POS_)
            col[COL_QUEUE_OFFSET * n + i] = mq_be_i64(p + QUEUE_OFFSET_POS_)
            col[COL_PHYSICAL_OFFSET * n + i] = mq_be_i64(p + PHYSICAL_OFFSET_POS_)
            col[COL_SYS_FLAG * n + i] = flags
            col[COL_BODY_START * n + i] = start + header
            col[COL_BODY_END * n + i] = start + header + body_len
            flags_any |= flags
            if want_bodies:
                bodies.append(PyBytes_FromStringAndSize(<const char *>(p + header), body_len))
        start += slot
    return columns, bodies, failed, flags_any


def chain(object buf, Py_ssize_t pos, Py_ssize_t end, int64_t base_offset):
    """(the starts of the chain of records from `pos` whose records end by `end`, as a
    bytearray of native int64s; where it stops) (record_chain.record_starts): framing only,
    TOTALSIZE, the magic and PHYSICALOFFSET equal to the record's own offset (`buf[0]` sits at
    `base_offset`)."""
    cdef _Buffer held = _Buffer(buf)
    if pos < 0 or pos > end or end > held.view.len:
        held.release()
        raise ValueError(f"range [{pos}, {end}) outside a {held.view.len}-byte buffer")
    cdef const unsigned char *data = <const unsigned char *>held.view.buf
    cdef const unsigned char *p
    cdef int64_t total
    cdef int32_t magic
    cdef Py_ssize_t count = 0, room = 64
    cdef bytearray starts = PyByteArray_FromStringAndSize(NULL, room * sizeof(int64_t))
    try:
        while end - pos >= RECORD_BYTES_MIN_:
            p = data + pos
            total = mq_be_i32(p + TOTALSIZE_POS)
            magic = mq_be_i32(p + MAGIC_POS)
            if magic != MAGIC_V1_ and magic != MAGIC_V2_:
                break
            if total < RECORD_BYTES_MIN_ or total > end - pos:
                break
            if mq_be_i64(p + PHYSICAL_OFFSET_POS_) != base_offset + pos:
                break
            if count == room:
                room *= 2
                PyByteArray_Resize(starts, room * sizeof(int64_t))
            (<int64_t *>PyByteArray_AS_STRING(starts))[count] = pos
            count += 1
            pos += total
    finally:
        held.release()
    PyByteArray_Resize(starts, count * sizeof(int64_t))
    return starts, pos
