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
    _core_walk.pxi          walk(...): the recovery walk (record_walk.scan_run_fast)

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


# Each operation lives in a file of its own, compiled into this one module.
include "_core_walk.pxi"
include "_core_check.pxi"
include "_core_encode.pxi"
include "_core_frames.pxi"
include "_core_arrow.pxi"
