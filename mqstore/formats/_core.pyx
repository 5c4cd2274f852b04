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

This file holds the header definition and what every operation shares; each operation is in
an included file of its own (the list at the bottom):
    crc32(data, value=0)    zlib's CRC-32 (formats/crc.py's values), folded with PCLMULQDQ
    _core_walk.pxi          walk(...): the recovery walk (record_columns.scan_run_fast)
    _core_check.pxi         check(...), chain(...): whole records checked, their fields
    _core_encode.pxi        encode(...): a batch of records (record_batch.py)
    _core_frames.pxi        decode_response(...) and the apply of dispatch frames
    _core_arrow.pxi         read_log_columns(...): the Spark log source's Arrow columns
    _core_pull.pxi          pull_walk(...): a pull's walk over consume-queue units
    _core_pull_answer.pxi   pull_answer_wire(...): a FOUND pull's queue offsets and record
                            sizes as PullResponse wire bytes (the protobuf runtime is their
                            reference)
    _core_segment_runs.pxi  segment_runs(...): the runs of commit-log ranges a read beside
                            the log's writer copies (storage/segment_reads.py)
    _core_dispatch.pxi      dispatch_columns(...), dispatch_of_runs(...): dispatch frames
                            from the segment and from held appends (dispatch_scan.py)
    _core_ids.pxi           uniq_ids(...), uniq_properties(...): a producer batch's unique
                            ids (msgid.py) and their UNIQ_KEY properties (client/batch.py)
    _core_append.pxi        append_request_wire(...), append_response_wire(...),
                            read_append_response(...): the wire bytes of an append and its
                            answer (the protobuf runtime is their reference);
                            share_bounds(...), widest_bytes(...): a producer batch cut into
                            requests and measured (formats/append_wire.py)
    _core_index.pxi         index_message_keys(...), index_put_keys(...), index_rows(...):
                            the index hashes of a frame's keys (from its UTF-8 columns), a
                            batch put into an index file and the rows a frame writes
                            (formats/keyhash.py, formats/index_file.py, index_svc/engine.py)

Built by setup.py (pip install, `make setup`) with gcc; the README's "The two commands" says
what a machine needs.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.ref cimport PyObject
from libc.stdint cimport (
    INT64_MIN, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t, uintptr_t,
)
from libc.stdlib cimport realloc
from libc.string cimport memcmp, memset


cdef extern from "_core_support.h" nogil:
    uint32_t mq_be_u32(const unsigned char *p)
    int32_t mq_be_i32(const unsigned char *p)
    int16_t mq_be_i16(const unsigned char *p)
    int64_t mq_be_i64(const unsigned char *p)
    uint32_t mq_crc32(uint32_t crc, const unsigned char *buf, size_t length)

# Big-endian field writes, as _core_support.h reads them.
cdef extern from *:
    """
    #define MQ_PUT_BE(bits) static inline void mq_put_be##bits(unsigned char *p, \\
        uint##bits##_t v) { v = __builtin_bswap##bits(v); memcpy(p, &v, bits / 8); }
    MQ_PUT_BE(16) MQ_PUT_BE(32) MQ_PUT_BE(64)
    """
    void mq_put_be16(unsigned char *p, uint16_t v) nogil
    void mq_put_be32(unsigned char *p, uint32_t v) nogil
    void mq_put_be64(unsigned char *p, uint64_t v) nogil


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
    BORN_TIMESTAMP_POS = 40
    BORN_HOST_POS_ = 48  # then the store timestamp (8 bytes), the store host, RECONSUMETIMES
    IPV4_HOST_BYTES = 8  # address and port; IPv6: V6_EXTRA_BYTES more
    TIMESTAMP_BYTES = 8
    HEADER_V4_V4_BYTES = 88  # TOTALSIZE .. BODYLENGTH with IPv4 born and store hosts
    V6_EXTRA_BYTES = 12  # an IPv6 host (16 + 4) over an IPv4 one (4 + 4)
    RECORD_BYTES_MIN_ = 91  # the IPv4/IPv4 header, a topic length byte, a properties length
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    TRANSACTION_MASK = 0xC
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_COMMIT_TYPE = 0x8
    TRANSACTION_ROLLBACK_TYPE = 0xC
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
BORN_HOST_POS = BORN_HOST_POS_
HEADER_V4_V4_SIZE = HEADER_V4_V4_BYTES
RECORD_BYTES_MIN = RECORD_BYTES_MIN_
MAGIC_V1 = MAGIC_V1_
MAGIC_V2 = MAGIC_V2_
PROPERTIES_END_BYTE = PROPERTIES_END_BYTE_
RECORD_CRC_BYTES = RECORD_CRC_BYTES_
RECORD_CRC_HEAD = RECORD_CRC_HEAD_[:RECORD_CRC_HEAD_BYTES]
NO_RECORD_CRC = NO_RECORD_CRC_
DAMAGED_RECORD_CRC = DAMAGED_RECORD_CRC_


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


cdef inline bint _gets_queue_offset(int64_t sys_flag) noexcept nogil:
    """sysflag.gets_queue_offset: a plain message's record or a committed transaction's."""
    cdef int64_t kind = sys_flag & TRANSACTION_MASK
    return kind == TRANSACTION_NOT_TYPE or kind == TRANSACTION_COMMIT_TYPE


# Why a record fails read_record's checks, in read_record's order of checks: check()'s answer
# names them (record_columns turns each, with the numbers beside it, into read_record's reason);
# the walks only stop at any of them.
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

cdef int32_t BLANK_MAGIC_ = <int32_t>0xCBD43194


# A record's framing, as record_frame reads it.
cdef struct Frame:
    int32_t magic
    int32_t flags
    int64_t total
    int64_t header  # the bytes before the body (TOTALSIZE .. BODYLENGTH)
    int64_t body_len
    int64_t topic_at  # the topic's first byte
    int64_t topic_len
    int64_t props_len
    int64_t a  # the figures a failure names
    int64_t b


cdef inline int record_frame(const unsigned char *p, int64_t room, Frame *f) noexcept nogil:
    """read_record's checks of the record at `p`, `room` bytes before its slot or range ends,
    up to the properties length adding up to TOTALSIZE: 0, or the first FAIL_ code (with f.a,
    f.b). The topic's own check, the properties' end, the CRC and the offset come after."""
    if room < 8:
        return FAIL_FEW_BYTES
    f.total = mq_be_i32(p + TOTALSIZE_POS)
    f.magic = mq_be_i32(p + MAGIC_POS)
    if f.magic == BLANK_MAGIC_:
        return FAIL_BLANK
    if f.magic != MAGIC_V1_ and f.magic != MAGIC_V2_:
        f.a = f.magic
        return FAIL_MAGIC
    if f.total < RECORD_BYTES_MIN_ or f.total > room:
        f.a, f.b = f.total, room
        return FAIL_TOTAL_FIT
    f.flags = mq_be_i32(p + SYSFLAG_POS_)
    f.header = HEADER_V4_V4_BYTES
    if f.flags & BORNHOST_V6:
        f.header += V6_EXTRA_BYTES
    if f.flags & STOREHOST_V6:
        f.header += V6_EXTRA_BYTES
    if f.total < f.header + 3:
        f.a = f.total
        return FAIL_SHORT_HEADER
    f.body_len = mq_be_i32(p + f.header - 4)
    if f.body_len < 0 or f.header + f.body_len > f.total:
        f.a = f.body_len
        return FAIL_BODY_LEN
    f.topic_at = f.header + f.body_len
    if f.magic == MAGIC_V2_:
        if f.topic_at + 2 > f.total:
            return FAIL_TOPIC_LEN_PAST
        f.topic_len = mq_be_i16(p + f.topic_at)
        f.topic_at += 2
    else:
        if f.topic_at + 1 > f.total:
            return FAIL_TOPIC_LEN_PAST
        f.topic_len = p[f.topic_at]
        f.topic_at += 1
    if f.topic_len < 0 or f.topic_at + f.topic_len + 2 > f.total:
        f.a = f.topic_len
        return FAIL_TOPIC_LEN
    f.props_len = mq_be_i16(p + f.topic_at + f.topic_len)
    if f.props_len < 0:
        f.a = f.props_len
        return FAIL_PROPS_NEG
    if f.topic_at + f.topic_len + 2 + f.props_len != f.total:
        f.a, f.b = f.total, f.topic_at + f.topic_len + 2 + f.props_len
        return FAIL_ADD_UP
    return 0


cdef inline int record_tail(
    const unsigned char *p, const Frame *f, bint check_crc, int64_t *stored
) noexcept:
    """read_record's checks after the topic's: the properties' end byte, then (`check_crc`)
    the whole-record CRC where the record carries the property, else the body's. 0, or the
    FAIL_ code. `stored`: the whole-record CRC the record holds (stored_record_crc), once the
    properties end as they must."""
    if f.props_len and p[f.total - 1] != PROPERTIES_END_BYTE_:
        return FAIL_PROPS_END
    stored[0] = stored_record_crc(p + f.total, <int>f.props_len)
    if not check_crc:
        return 0
    if stored[0] == DAMAGED_RECORD_CRC_:
        return FAIL_CRC_DAMAGED
    if stored[0] >= 0:
        if (mq_crc32(0, p, <size_t>(f.total - RECORD_CRC_BYTES_)) & CRC_MASK) != stored[0]:
            return FAIL_RECORD_CRC
    elif f.body_len > 0:
        if <int64_t>(mq_crc32(0, p + f.header, <size_t>f.body_len) & CRC_MASK) != mq_be_i32(
            p + BODYCRC_POS
        ):
            return FAIL_BODY_CRC
    return 0


cdef inline bint _same(object raw, const unsigned char *p, Py_ssize_t n) noexcept:
    """Whether bytes `raw` (None: no) are p[:n]: most records name the record before's topic,
    compared in place."""
    return (
        raw is not None
        and PyBytes_GET_SIZE(raw) == n
        and memcmp(PyBytes_AS_STRING(raw), p, <size_t>n) == 0
    )


cdef object _topic_of(bytes raw, int *fail):
    """The topic `raw` names, None when read_record refuses it: `fail` then holds why
    (FAIL_TOPIC_UTF8, or FAIL_TOPIC_EMPTY: empty or with a NUL)."""
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        fail[0] = FAIL_TOPIC_UTF8
        return None
    if not name or "\x00" in name:
        fail[0] = FAIL_TOPIC_EMPTY
        return None
    return name


cdef class _Buffer:
    """A held buffer (Py_buffer), released by `release` or on collection: a function's local
    one when the function returns or raises, so that none needs a try/finally of its own."""

    cdef Py_buffer view
    cdef bint held

    def __cinit__(self, object data, int flags=PyBUF_SIMPLE):
        PyObject_GetBuffer(data, &self.view, flags)
        self.held = True

    cdef void release(self) noexcept:
        if self.held:
            PyBuffer_Release(&self.view)
            self.held = False

    def __dealloc__(self):
        self.release()


cdef int _grow(
    void **data, Py_ssize_t *cap, Py_ssize_t want, size_t item_bytes, Py_ssize_t cap_min
) except -1:
    """*data, *cap items of `item_bytes` now, reallocated to hold `want` at least: at least
    doubled (and `cap_min`), so that appends stay linear."""
    cdef Py_ssize_t grown_cap = max(want, cap[0] * 2, cap_min)
    cdef void *grown = realloc(data[0], <size_t>grown_cap * item_bytes)
    if grown == NULL:
        raise MemoryError()
    data[0] = grown
    cap[0] = grown_cap
    return 0


def crc32(object data, uint32_t value=0):
    """zlib.crc32(data, value): CRC-32 of any contiguous buffer."""
    cdef _Buffer held = _Buffer(data)
    cdef uint32_t crc
    with nogil:
        crc = mq_crc32(value, <const unsigned char *>held.view.buf, <size_t>held.view.len)
    return crc


# Each operation lives in a file of its own, compiled into this one module.
include "_core_walk.pxi"
include "_core_check.pxi"
include "_core_encode.pxi"
include "_core_frames.pxi"
include "_core_arrow.pxi"
include "_core_pull.pxi"
include "_core_dispatch.pxi"
include "_core_ids.pxi"
include "_core_append.pxi"
include "_core_index.pxi"
include "_core_pull_answer.pxi"
include "_core_segment_runs.pxi"
