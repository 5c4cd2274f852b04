# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""mqstore's compiled record core: the per-record loops, in C, over the commit-log record
format of record.py.

What belongs here: every operation that touches each record of a run one at a time (encode a
batch, check whole records, the recovery walk, dispatch frames, the pull walk, the Spark log
reader), and the one definition of the record's fixed header they all read it with (below).
What does not: anything that runs once per call rather than once per record (argument checks,
error objects and their messages, I/O): that stays in the Python module that calls in here.
record.py's `read_record`, `scan_run` and encoder stay the executable specification; the tests
pin each operation here to them, verdict for verdict.

Operations so far:
    crc32(data, value=0)    zlib's CRC-32 (formats/crc.py's values), folded with PCLMULQDQ
    walk(...)               the recovery walk (record_walk.scan_run_fast)

Built by setup.py (pip install, `make setup`) with gcc; the README's "The two commands" says
what a machine needs.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.ref cimport PyObject
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcmp, memset


cdef extern from "_core_support.h" nogil:
    uint32_t mq_be_u32(const unsigned char *p)
    int32_t mq_be_i32(const unsigned char *p)
    int16_t mq_be_i16(const unsigned char *p)
    int64_t mq_be_i64(const unsigned char *p)
    uint32_t mq_crc32(uint32_t crc, const unsigned char *buf, size_t length)
    int mq_can_fold()


# The record's fixed header (record.py's layout table), the one definition of the compiled code.
cdef enum:
    TOTALSIZE_POS = 0
    MAGIC_POS = 4
    BODYCRC_POS = 8
    QUEUE_ID_POS_ = 12
    FLAG_POS = 16
    QUEUE_OFFSET_POS_ = 20
    PHYSICAL_OFFSET_POS_ = 28
    SYSFLAG_POS_ = 36
    HEADER_V4_V4_BYTES = 88  # TOTALSIZE .. BODYLENGTH with IPv4 born and store hosts
    V6_EXTRA_BYTES = 12  # an IPv6 host (16 + 4) over an IPv4 one (4 + 4)
    RECORD_BYTES_MIN_ = 91  # the IPv4/IPv4 header, a topic length byte, a properties length
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    TRANSACTION_MASK = 0xC
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_COMMIT_TYPE = 0x8
    PROPERTIES_END_BYTE_ = 0x02
    RECORD_CRC_BYTES_ = 20  # the whole-record CRC property: key, 0x01, ten digits, 0x02
    RECORD_CRC_HEAD_BYTES = 9
    RECORD_CRC_DIGITS_ = 10
    RECORD_CRC_FIXED_BYTES_KEPT_MIN_ = 9

cdef int32_t MAGIC_V1_ = <int32_t>0xDAA320A7
cdef int32_t MAGIC_V2_ = <int32_t>0xDAA320AB
cdef int64_t NO_RECORD_CRC_ = -1
cdef int64_t DAMAGED_RECORD_CRC_ = -2
cdef uint32_t CRC_MASK = 0x7FFFFFFF
cdef const char *RECORD_CRC_HEAD_ = b"__CRC32#\x01"

# For the tests that pin this definition to record.py's.
QUEUE_ID_POS = QUEUE_ID_POS_
QUEUE_OFFSET_POS = QUEUE_OFFSET_POS_
PHYSICAL_OFFSET_POS = PHYSICAL_OFFSET_POS_
SYSFLAG_POS = SYSFLAG_POS_
HEADER_V4_V4_SIZE = HEADER_V4_V4_BYTES
RECORD_BYTES_MIN = RECORD_BYTES_MIN_
MAGIC_V1 = MAGIC_V1_
MAGIC_V2 = MAGIC_V2_
PROPERTIES_END_BYTE = PROPERTIES_END_BYTE_
RECORD_CRC_BYTES = RECORD_CRC_BYTES_
RECORD_CRC_HEAD = RECORD_CRC_HEAD_[:RECORD_CRC_HEAD_BYTES]
NO_RECORD_CRC = NO_RECORD_CRC_
DAMAGED_RECORD_CRC = DAMAGED_RECORD_CRC_
CRC_FOLDED = bool(mq_can_fold())


cdef inline int64_t stored_record_crc(const unsigned char *record_end, int props_len) noexcept:
    """record.stored_record_crc: the CRC the record's last 20 bytes hold, NO_RECORD_CRC when
    they are not the property, DAMAGED_RECORD_CRC when they recognisably are but malformed."""
    if props_len < RECORD_CRC_BYTES_:
        return NO_RECORD_CRC_
    cdef const unsigned char *tail = record_end - RECORD_CRC_BYTES_
    cdef int i, kept = 0
    cdef int64_t value = 0, scale = 1
    cdef bint digits = True
    for i in range(RECORD_CRC_DIGITS_):
        if tail[RECORD_CRC_HEAD_BYTES + i] < 48 or tail[RECORD_CRC_HEAD_BYTES + i] > 57:
            digits = False
            break
        value += (tail[RECORD_CRC_HEAD_BYTES + i] - 48) * scale  # least significant first
        scale *= 10
    for i in range(RECORD_CRC_HEAD_BYTES):
        kept += tail[i] == <unsigned char>RECORD_CRC_HEAD_[i]
    kept += tail[RECORD_CRC_BYTES_ - 1] == PROPERTIES_END_BYTE_
    if digits and kept == RECORD_CRC_HEAD_BYTES + 1:
        return value
    return DAMAGED_RECORD_CRC_ if kept >= RECORD_CRC_FIXED_BYTES_KEPT_MIN_ else NO_RECORD_CRC_


cdef class _Buffer:
    """A held buffer (Py_buffer), released by `release` or on collection."""

    cdef Py_buffer view
    cdef bint held

    def __cinit__(self, object data):
        PyObject_GetBuffer(data, &self.view, PyBUF_SIMPLE)
        self.held = True

    cdef void release(self) noexcept:
        if self.held:
            PyBuffer_Release(&self.view)
            self.held = False

    def __dealloc__(self):
        self.release()


def crc32(object data, uint32_t value=0):
    """zlib.crc32(data, value): CRC-32 of any contiguous buffer."""
    cdef _Buffer held = _Buffer(data)
    cdef uint32_t crc
    try:
        with nogil:
            crc = mq_crc32(value, <const unsigned char *>held.view.buf, <size_t>held.view.len)
    finally:
        held.release()
    return crc


cdef object _topic_of(dict topics, bytes raw):
    """The topic `raw` names, None when read_record refuses it (not UTF-8, empty, a NUL)."""
    cdef object name
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        name = None
    if not name or "\x00" in name:
        name = None
    topics[raw] = name
    return name


cdef void _raise_queue(dict queue_table, object topic, int32_t queue_id, int64_t top) except *:
    """scan_run's update for the records of one queue whose highest queue offset is `top`: each
    raised the queue's next offset to its queue offset + 1 when that was higher, so together
    they leave it at max(next offset, top + 1), in whatever order they came."""
    cdef dict queues = queue_table.setdefault(topic, {})
    if queues.get(queue_id, 0) <= top:
        queues[queue_id] = <object>top + 1  # a Python int: no overflow at the int64 maximum


# The walk gathers each queue's highest queue offset in a small open-addressed table of C
# slots, and writes the Python table once per queue at the end (or when a probe finds no
# room): a dict update per record would cost more than all the record's checks.
cdef enum:
    QUEUE_SLOTS = 1024  # a power of two
    QUEUE_PROBES = 8


cdef struct QueueSlot:
    PyObject *topic  # borrowed from the walk's topic cache, which outlives the slots; NULL: free
    int32_t queue_id
    int64_t top


cdef inline Py_ssize_t _home(PyObject *topic, int32_t queue_id) noexcept:
    """The first slot probed for (topic, queue_id): a multiplicative hash of both."""
    cdef uint64_t key = <uint64_t><uintptr_t>topic ^ <uint64_t><uint32_t>queue_id
    return <Py_ssize_t>((key * 0x9E3779B97F4A7C15ULL) >> 40)


cdef inline QueueSlot *_slot_of(QueueSlot *slots, PyObject *topic, int32_t queue_id) noexcept:
    """The slot of (topic, queue_id), a free one, or NULL when every probed slot holds another
    queue."""
    cdef Py_ssize_t i, at, home = _home(topic, queue_id)
    for i in range(QUEUE_PROBES):
        at = (home + i) & (QUEUE_SLOTS - 1)
        if slots[at].topic == NULL or (slots[at].topic == topic and slots[at].queue_id == queue_id):
            return &slots[at]
    return NULL


cdef void _flush(dict queue_table, QueueSlot *slot) except *:
    if slot.topic != NULL:
        _raise_queue(queue_table, <object>slot.topic, slot.queue_id, slot.top)
        slot.topic = NULL


def walk(
    object buf,
    Py_ssize_t pos,
    Py_ssize_t end,
    int64_t base_offset,
    bint check_crc,
    object queue_table,
    int64_t apply_from,
):
    """Accept the valid records of buf[pos:end] one after the other, each by every check
    read_record makes with expected_offset = base_offset + its position, and return (position
    after the last accepted record, how many). With `queue_table` (a dict), the records at or
    after `apply_from` that take a queue offset update it as record.scan_run does. The record
    at the returned position, if any, is one read_record does not return as a Record."""
    cdef _Buffer held = _Buffer(buf)
    cdef Py_ssize_t size = held.view.len
    if pos < 0 or end > size:
        held.release()
        raise ValueError(f"walk of [{pos}, {end}) over a buffer of {size} bytes")
    cdef const unsigned char *data = <const unsigned char *>held.view.buf
    cdef const unsigned char *p
    cdef Py_ssize_t remaining, count = 0
    cdef int64_t total, header, body_len, at, topic_len, props_len, stored, queue_offset
    cdef int32_t magic, flags, queue_id
    cdef uint32_t crc
    cdef bint v2
    cdef dict topics = {}
    cdef dict table = queue_table
    cdef bytes last_raw = None
    cdef bytes raw
    cdef object topic = None
    cdef object name
    cdef QueueSlot slots[QUEUE_SLOTS]
    cdef QueueSlot *slot
    cdef Py_ssize_t i
    memset(slots, 0, sizeof(slots))
    try:
        while pos < end:
            remaining = end - pos
            if remaining < 8:
                break
            p = data + pos
            magic = mq_be_i32(p + MAGIC_POS)
            if magic != MAGIC_V1_ and magic != MAGIC_V2_:
                break  # a blank, or no record
            total = mq_be_i32(p + TOTALSIZE_POS)
            if total < RECORD_BYTES_MIN_ or total > remaining:
                break
            flags = mq_be_i32(p + SYSFLAG_POS_)
            header = HEADER_V4_V4_BYTES
            if flags & BORNHOST_V6:
                header += V6_EXTRA_BYTES
            if flags & STOREHOST_V6:
                header += V6_EXTRA_BYTES
            if total < header + 3:
                break
            body_len = mq_be_i32(p + header - 4)
            if body_len < 0 or header + body_len > total:
                break
            at = header + body_len
            v2 = magic == MAGIC_V2_
            if v2:
                if at + 2 > total:
                    break
                topic_len = mq_be_i16(p + at)
                at += 2
            else:
                if at + 1 > total:
                    break
                topic_len = p[at]
                at += 1
            if topic_len < 0 or at + topic_len + 2 > total:
                break
            props_len = mq_be_i16(p + at + topic_len)
            if props_len < 0 or at + topic_len + 2 + props_len != total:
                break
            if props_len and p[total - 1] != PROPERTIES_END_BYTE_:
                break
            # The topic: most records name the one before's, compared in place.
            if (
                last_raw is None
                or PyBytes_GET_SIZE(last_raw) != topic_len
                or memcmp(PyBytes_AS_STRING(last_raw), p + at, <size_t>topic_len) != 0
            ):
                raw = PyBytes_FromStringAndSize(<const char *>(p + at), topic_len)
                name = topics.get(raw, topics)
                if name is topics:
                    name = _topic_of(topics, raw)
                if name is None:
                    break
                last_raw = raw
                topic = name
            if check_crc:
                stored = stored_record_crc(p + total, <int>props_len)
                if stored == DAMAGED_RECORD_CRC_:
                    break
                if stored >= 0:
                    crc = mq_crc32(0, p, <size_t>(total - RECORD_CRC_BYTES_)) & CRC_MASK
                    if crc != stored:
                        break
                elif body_len > 0:
                    crc = mq_crc32(0, p + header, <size_t>body_len) & CRC_MASK
                    if <int64_t>crc != mq_be_i32(p + BODYCRC_POS):
                        break
            if mq_be_i64(p + PHYSICAL_OFFSET_POS_) != base_offset + pos:
                break
            if (
                table is not None
                and base_offset + pos >= apply_from
                and (
                    flags & TRANSACTION_MASK == TRANSACTION_NOT_TYPE
                    or flags & TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE
                )
            ):
                queue_id = mq_be_i32(p + QUEUE_ID_POS_)
                queue_offset = mq_be_i64(p + QUEUE_OFFSET_POS_)
                slot = _slot_of(slots, <PyObject *>topic, queue_id)
                if slot == NULL:  # a crowded probe: write its first slot out and take it
                    slot = &slots[_home(<PyObject *>topic, queue_id) & (QUEUE_SLOTS - 1)]
                    _flush(table, slot)
                if slot.topic == NULL:
                    slot.topic = <PyObject *>topic
                    slot.queue_id = queue_id
                    slot.top = queue_offset
                elif queue_offset > slot.top:
                    slot.top = queue_offset
            pos += total
            count += 1
        if table is not None:
            for i in range(QUEUE_SLOTS):
                _flush(table, &slots[i])
    finally:
        held.release()
    return pos, count
