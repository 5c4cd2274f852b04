# Check whole records laid end to end, every check read_record makes, returning their fields
# (record_columns.check_records): included by _core.pyx, whose header definitions it reads
# records with.

from cpython.bytearray cimport (
    PyByteArray_AS_STRING,
    PyByteArray_FromStringAndSize,
    PyByteArray_Resize,
)
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyObject_CheckBuffer
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport Py_TYPE, PyTypeObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.string cimport memcpy

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
    cdef int64_t start = 0, slot, stored
    cdef Frame f
    cdef int64_t flags_any = 0
    cdef int fail
    for i in range(n):
        slot = size[i]
        p = data + start
        col[COL_START * n + i] = start
        col[COL_END * n + i] = start + slot
        f.a = f.b = 0
        # read_record's checks, in its order.
        fail = record_frame(p, slot, &f)
        if not fail:
            if not _same(last_raw, p + f.topic_at, f.topic_len):
                raw = PyBytes_FromStringAndSize(<const char *>(p + f.topic_at), f.topic_len)
                verdict_of = topics.get(raw)
                if verdict_of is None:
                    _topic_of(raw, &fail)
                    verdict_of = topics[raw] = fail
                fail = verdict_of
                if not fail:
                    last_raw = raw
        if not fail:
            fail = record_tail(p, &f, check_crc, &stored)
        if not fail and expected != NULL and expected[i] >= 0:
            if mq_be_i64(p + PHYSICAL_OFFSET_POS_) != expected[i]:
                fail = FAIL_OFFSET
                f.a, f.b = mq_be_i64(p + PHYSICAL_OFFSET_POS_), expected[i]
        if not fail and f.total != slot:
            fail = FAIL_NOT_WHOLE
            f.a, f.b = f.total, slot
        if fail:
            failed.append((i, fail, f.a, f.b))
            if want_bodies:
                bodies.append(b"")
        else:
            col[COL_QUEUE_ID * n + i] = mq_be_i32(p + QUEUE_ID_POS_)
            col[COL_QUEUE_OFFSET * n + i] = mq_be_i64(p + QUEUE_OFFSET_POS_)
            col[COL_PHYSICAL_OFFSET * n + i] = mq_be_i64(p + PHYSICAL_OFFSET_POS_)
            col[COL_SYS_FLAG * n + i] = f.flags
            col[COL_BODY_START * n + i] = start + f.header
            col[COL_BODY_END * n + i] = start + f.header + f.body_len
            flags_any |= f.flags
            if want_bodies:
                bodies.append(PyBytes_FromStringAndSize(<const char *>(p + f.header), f.body_len))
        start += slot
    return columns, bodies, failed, flags_any


def chain(object buf, Py_ssize_t pos, Py_ssize_t end, int64_t base_offset):
    """(the starts of the chain of records from `pos` (a record boundary) whose records end
    by `end`, as int64s; where the chain stops: the end of its last record, or `pos` when none
    fits). `buf[0]` sits at commit-log offset `base_offset`.

    Only the framing is followed: TOTALSIZE, the magic and PHYSICALOFFSET equal to the
    record's own offset; nothing else is checked (no CRC): this finds boundaries, read_record
    and walk judge records. The chain stops at `end`, at the end-of-file blank, or where the
    bytes do not frame a record. Used by a replicated log's leader to cut a chunk at a record
    boundary and by a follower to find the records of a chunk (commitlog_svc/replica_chunk.py)."""
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
    return memoryview(starts).cast("q"), pos


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)
    # What a class statement's type allocates with (type_new sets tp_alloc to it).
    PyObject *PyType_GenericAlloc(PyTypeObject *tp, Py_ssize_t nitems) except NULL
    # A __slots__ entry's descriptor (cpython/descrobject.h): where the slot sits in an instance.
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member
    PyTypeObject PyMemberDescr_Type

cdef enum:
    T_OBJECT_EX_ = 16  # structmember.h: an object slot, AttributeError while unset
    READONLY_ = 1


cdef Py_ssize_t _slot_offset(type cls, str name) except -1:
    """Where `cls`'s instances hold their __slots__ entry `name`: a new instance's slots are
    NULL, so storing there is what the slot's descriptor does on setattr, without the type
    lookup and the descriptor call (two setattrs were ~25 ns of a message's ~150 at 1 KiB)."""
    descr = getattr(cls, name, None)
    if Py_TYPE(descr) != &PyMemberDescr_Type:
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    cdef PyMemberDef *member = (<PyMemberDescrObject *>descr).d_member
    if member.type != T_OBJECT_EX_ or member.flags & READONLY_:
        raise TypeError(f"{cls.__name__}.{name} is not a writable object slot")
    return member.offset


cdef inline void _set_new_slot(PyObject *made, Py_ssize_t offset, object value) noexcept:
    Py_INCREF(value)
    (<PyObject **>(<char *>made + offset))[0] = <PyObject *>value


def lazy_messages(
    type cls, list bodies, list blobs, list starts, list ends, Py_ssize_t start, Py_ssize_t stop
):
    """[m_start, ..., m_stop-1]: for each i an instance of `cls` (a class of __slots__ without
    __init__ side effects: the SDK's Message) made without __init__, its `body` bodies[i] and its
    `_rest` the record blobs[i][starts[i]:ends[i]] with its body cut out (record.without_body's
    bytes, a copy: a message kept holds no blob; the body, bodies[i], is a copy already, so the
    record's body is not copied a second time: at 1 KiB the rest is ~150 bytes, a pymalloc
    block, where the whole record was a ~1.2 KB malloc), every other slot unset (filled on
    first read, message.py). The two are stored into the slots their descriptors name
    (_slot_offset; TypeError when `cls` has no such writable slots). The records are ones
    check() accepted; a record whose header does not frame a body inside its bounds is an
    IndexError.

    Each is left out of the cycle collector: it holds bytes, and once decoded ints, strs and a
    dict of strs, none of which can lead back to it. A consumer's batch of a thousand made at
    once would otherwise be scanned by the youngest generation's collections and moved to the
    older ones while it is handed out."""
    if stop > len(bodies) or stop > len(blobs) or stop > len(starts) or stop > len(ends):
        raise IndexError("stop past the columns")
    if start < 0 or start > stop:
        raise IndexError("start outside the columns")
    cdef PyTypeObject *tp = <PyTypeObject *>cls
    cdef list out = PyList_New(stop - start)
    cdef Py_ssize_t i
    cdef PyObject *made
    cdef object m
    cdef bytes blob, rest
    cdef const unsigned char *p
    cdef char *to
    cdef Py_ssize_t a, b, header, body_len
    cdef int32_t flags
    cdef Py_ssize_t body_at = _slot_offset(cls, "body"), rest_at = _slot_offset(cls, "_rest")
    for i in range(start, stop):
        blob = blobs[i]
        a = starts[i]
        b = ends[i]
        if not (0 <= a <= b <= PyBytes_GET_SIZE(blob)):
            raise IndexError(f"record {i} [{a}, {b}) outside its blob")
        if b - a < HEADER_V4_V4_BYTES:
            raise IndexError(f"record {i}: {b - a} bytes, shorter than any header")
        p = <const unsigned char *>PyBytes_AS_STRING(blob) + a
        flags = mq_be_i32(p + SYSFLAG_POS_)
        header = HEADER_V4_V4_BYTES
        if flags & BORNHOST_V6:
            header += V6_EXTRA_BYTES
        if flags & STOREHOST_V6:
            header += V6_EXTRA_BYTES
        if header > b - a:
            raise IndexError(f"record {i}: a {header}-byte header in {b - a} bytes")
        body_len = mq_be_i32(p + header - 4)
        if body_len < 0 or body_len > b - a - header:
            raise IndexError(f"record {i}: a {body_len}-byte body in {b - a} bytes")
        rest = PyBytes_FromStringAndSize(NULL, b - a - body_len)
        to = PyBytes_AS_STRING(rest)
        memcpy(to, p, <size_t>header)
        memcpy(to + header, p + header + body_len, <size_t>(b - a - header - body_len))
        made = PyType_GenericAlloc(tp, 0)
        m = <object>made
        Py_DECREF(m)  # <object> took a reference of its own: the one tp_alloc made goes
        PyObject_GC_UnTrack(made)
        _set_new_slot(made, body_at, bodies[i])
        _set_new_slot(made, rest_at, rest)
        Py_INCREF(m)
        PyList_SET_ITEM(out, i - start, m)
    return out
