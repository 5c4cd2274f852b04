# Apply a dispatch frame to the consume queues: included by _core.pyx.
#
#   queue_runs(topic_indexes, queue_ids, sys_flags)     the rows that take a queue offset,
#                                                       grouped by (topic, queue)
#   plain_start(rows, queue_offsets, offsets, sizes,    where a queue's run starts to be
#               expect, last_end)                       written (-1: not plain)
#   pack_units(rows, start, offsets, sizes, tags,       the run's 20-byte units and 8-byte time
#              stamps, last_time)                       entries (cq_unit.py, cq_time.py)
#   time_entries_ok(units, entries)                     which stored time entries pass their
#                                                       check (the audit)
#
# The columns are int64 buffers of one length (a decoded DispatchColumns' numpy arrays); `rows`
# an int64 buffer of row numbers. The Python reference (tests/cq/frames_reference.py) is what
# the tests pin these to.

from cpython.bytearray cimport PyByteArray_FromStringAndSize
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy


cdef enum:
    TIME_ENTRY_BYTES = 8
    TIME_STORED = 6
    UNIT_SIZE = 20
    RUN_SLOTS_MIN = 16

cdef int64_t TIME_MAX = (<int64_t>1 << 48) - 1
cdef uint32_t _crc32c_table[256]


cdef void _crc32c_init() noexcept:
    cdef uint32_t c, n, k
    for n in range(256):
        c = n
        for k in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        _crc32c_table[n] = c


_crc32c_init()


cdef inline uint32_t _crc32c(const unsigned char *p, size_t n) noexcept nogil:
    cdef uint32_t c = <uint32_t>0xFFFFFFFF
    cdef size_t i
    for i in range(n):
        c = _crc32c_table[(c ^ p[i]) & 0xFF] ^ (c >> 8)
    return c ^ <uint32_t>0xFFFFFFFF


cdef inline void _put_be(unsigned char *p, uint64_t v, int width) noexcept nogil:
    cdef int i
    for i in range(width):
        p[width - 1 - i] = <unsigned char>(v >> (8 * i))


cdef class _Columns:
    """Held int64 buffers, each of `n` rows at least."""

    cdef list held
    cdef Py_ssize_t n

    def __cinit__(self):
        self.held = []
        self.n = -1

    cdef const int64_t *take(self, object column, Py_ssize_t n) except NULL:
        cdef _Buffer b = _Buffer(column)
        self.held.append(b)
        if b.view.len < n * 8 or b.view.len % 8:
            raise ValueError(f"a column of {b.view.len} bytes for {n} int64 rows")
        return <const int64_t *>b.view.buf

    cdef void release(self) noexcept:
        cdef _Buffer b
        for b in self.held:
            b.release()
        self.held = []


cdef Py_ssize_t _rows_of(object rows, _Columns cols, const int64_t **out) except -1:
    cdef _Buffer b = _Buffer(rows)
    cols.held.append(b)
    if b.view.len % 8:
        raise ValueError(f"rows of {b.view.len} bytes")
    out[0] = <const int64_t *>b.view.buf
    return b.view.len // 8


cdef int _check_rows(const int64_t *rows, Py_ssize_t m, Py_ssize_t n) except -1:
    cdef Py_ssize_t i
    for i in range(m):
        if rows[i] < 0 or rows[i] >= n:
            raise IndexError(f"row {rows[i]} of {n}")
    return 0


def queue_runs(object topic_indexes, object queue_ids, object sys_flags):
    """The rows that go to a consume queue (transaction type NOT or COMMIT), grouped by (topic
    index, queue id) in the order each queue first appears, each group in frame order:
    [(topic index, queue id, rows as native int64 bytes)]."""
    cdef _Columns cols = _Columns()
    cdef Py_ssize_t n = len(topic_indexes)
    cdef const int64_t *ti
    cdef const int64_t *qi
    cdef const int64_t *sf
    cdef Py_ssize_t i, r, runs = 0, slots = RUN_SLOTS_MIN, at
    cdef int64_t kind
    cdef uint64_t h
    cdef int64_t *slot_ti = NULL
    cdef int64_t *slot_qi = NULL
    cdef Py_ssize_t *slot_run = NULL
    cdef Py_ssize_t *row_run = NULL
    cdef Py_ssize_t *run_count = NULL
    cdef Py_ssize_t *run_fill = NULL
    cdef int64_t *run_ti = NULL
    cdef int64_t *run_qi = NULL
    cdef list out = []
    cdef list bufs
    cdef bytearray rows
    cdef int64_t *dst
    try:
        ti = cols.take(topic_indexes, n)
        qi = cols.take(queue_ids, n)
        sf = cols.take(sys_flags, n)
        while slots < 2 * n:
            slots <<= 1
        slot_ti = <int64_t *>malloc(slots * sizeof(int64_t))
        slot_qi = <int64_t *>malloc(slots * sizeof(int64_t))
        slot_run = <Py_ssize_t *>malloc(slots * sizeof(Py_ssize_t))
        row_run = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
        run_count = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
        run_ti = <int64_t *>malloc((n + 1) * sizeof(int64_t))
        run_qi = <int64_t *>malloc((n + 1) * sizeof(int64_t))
        run_fill = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
        if not (slot_ti and slot_qi and slot_run and row_run and run_count and run_ti
                and run_qi and run_fill):
            raise MemoryError()
        for i in range(slots):
            slot_run[i] = -1
        for i in range(n):
            kind = sf[i] & TRANSACTION_MASK
            if kind != TRANSACTION_NOT_TYPE and kind != TRANSACTION_COMMIT_TYPE:
                row_run[i] = -1
                continue
            if runs and run_ti[runs - 1] == ti[i] and run_qi[runs - 1] == qi[i]:
                r = runs - 1  # most rows follow one of their queue
            else:
                h = (<uint64_t>ti[i] * 0x9E3779B97F4A7C15ULL) ^ (<uint64_t>qi[i] * 0xC2B2AE3D27D4EB4FULL)
                at = <Py_ssize_t>((h >> 17) & <uint64_t>(slots - 1))
                while slot_run[at] >= 0 and not (slot_ti[at] == ti[i] and slot_qi[at] == qi[i]):
                    at = (at + 1) & (slots - 1)
                if slot_run[at] < 0:
                    slot_run[at] = runs
                    slot_ti[at] = ti[i]
                    slot_qi[at] = qi[i]
                    run_ti[runs] = ti[i]
                    run_qi[runs] = qi[i]
                    run_count[runs] = 0
                    runs += 1
                r = slot_run[at]
            row_run[i] = r
            run_count[r] += 1
        bufs = []
        for r in range(runs):
            rows = bytearray(run_count[r] * 8)
            bufs.append(rows)
            run_fill[r] = 0
            out.append((run_ti[r], run_qi[r], rows))
        for i in range(n):
            r = row_run[i]
            if r >= 0:
                dst = <int64_t *>(<char *>(<bytearray>bufs[r]))
                dst[run_fill[r]] = i
                run_fill[r] += 1
    finally:
        cols.release()
        free(slot_ti)
        free(slot_qi)
        free(slot_run)
        free(row_run)
        free(run_count)
        free(run_ti)
        free(run_qi)
        free(run_fill)
    return out


def plain_start(
    object rows,
    object queue_offsets,
    object offsets,
    object sizes,
    int64_t expect,
    int64_t last_end,
):
    """Where a queue's run starts to be written when it is plain, -1 when it is not (then it
    is applied entry by entry, its gaps filled and its replays skipped). An entry is skipped
    when it ends at or below `last_end` or its queue offset is below `expect`; the run is
    plain when, after a prefix of skipped entries, the queue offsets count up by one from
    `expect` and the ends strictly increase. len(rows): nothing is written."""
    cdef _Columns cols = _Columns()
    cdef const int64_t *rw
    cdef const int64_t *qo
    cdef const int64_t *ph
    cdef const int64_t *sz
    cdef Py_ssize_t m, n = len(queue_offsets), k = 0, j
    cdef int64_t row, prev_end
    try:
        m = _rows_of(rows, cols, &rw)
        qo = cols.take(queue_offsets, n)
        ph = cols.take(offsets, n)
        sz = cols.take(sizes, n)
        _check_rows(rw, m, n)
        while k < m:
            row = rw[k]
            if ph[row] + sz[row] > last_end and qo[row] >= expect:
                break
            k += 1
        if k == m:
            return m
        row = rw[k]
        if qo[row] != expect:
            return -1
        prev_end = ph[row] + sz[row]
        for j in range(k + 1, m):
            row = rw[j]
            if qo[row] != expect + (j - k) or ph[row] + sz[row] <= prev_end:
                return -1
            prev_end = ph[row] + sz[row]
        return k
    finally:
        cols.release()


def pack_units(
    object rows,
    Py_ssize_t start,
    object offsets,
    object sizes,
    object tags_codes,
    object store_timestamps_ms,
    int64_t last_time,
):
    """The consume-queue units (offset, size, tags code: 20 bytes big-endian) of rows[start:]
    and their time entries (the running maximum of the clamped store times, from `last_time`,
    as u48 and the low 16 bits of CRC32C(unit + those 6 bytes)): (units, times, the last
    indexed time)."""
    cdef _Columns cols = _Columns()
    cdef const int64_t *rw
    cdef const int64_t *ph
    cdef const int64_t *sz
    cdef const int64_t *tg
    cdef const int64_t *ts
    cdef Py_ssize_t m, n = len(offsets), j, count
    cdef int64_t row, t
    cdef bytes units, times
    cdef unsigned char *u
    cdef unsigned char *tm
    cdef unsigned char check[UNIT_SIZE + TIME_STORED]
    cdef uint32_t c
    try:
        m = _rows_of(rows, cols, &rw)
        ph = cols.take(offsets, n)
        sz = cols.take(sizes, n)
        tg = cols.take(tags_codes, n)
        ts = cols.take(store_timestamps_ms, n)
        _check_rows(rw, m, n)
        if start < 0 or start > m:
            raise ValueError(f"start {start} of {m} rows")
        count = m - start
        units = PyBytes_FromStringAndSize(NULL, count * UNIT_SIZE)
        times = PyBytes_FromStringAndSize(NULL, count * TIME_ENTRY_BYTES)
        u = <unsigned char *>PyBytes_AS_STRING(units)
        tm = <unsigned char *>PyBytes_AS_STRING(times)
        with nogil:
            for j in range(count):
                row = rw[start + j]
                _put_be(u, <uint64_t>ph[row], 8)
                _put_be(u + 8, <uint64_t>sz[row], 4)
                _put_be(u + 12, <uint64_t>tg[row], 8)
                t = ts[row]
                if t < 0:
                    t = 0
                if t > TIME_MAX:
                    t = TIME_MAX
                if t > last_time:
                    last_time = t
                memcpy(check, u, UNIT_SIZE)
                _put_be(check + UNIT_SIZE, <uint64_t>last_time, TIME_STORED)
                c = _crc32c(check, UNIT_SIZE + TIME_STORED)
                memcpy(tm, check + UNIT_SIZE, TIME_STORED)
                _put_be(tm + TIME_STORED, c & 0xFFFF, 2)
                u += UNIT_SIZE
                tm += TIME_ENTRY_BYTES
    finally:
        cols.release()
    return units, times, last_time


def time_entries_ok(const unsigned char[::1] units, const unsigned char[::1] entries):
    """Whether each of the 8-byte time entries in `entries` passes its check against the
    20-byte unit at the same place in `units` (cq_time.decode_time is not None): one byte per
    entry, 1 or 0. Entries past the last whole unit are not looked at."""
    cdef Py_ssize_t i, n = min(entries.shape[0] // TIME_ENTRY_BYTES, units.shape[0] // UNIT_SIZE)
    cdef bytearray out = PyByteArray_FromStringAndSize(NULL, n)
    cdef unsigned char *ok = <unsigned char *>(<char *>out)
    cdef unsigned char check[UNIT_SIZE + TIME_STORED]
    cdef const unsigned char *e
    with nogil:
        for i in range(n):
            e = &entries[i * TIME_ENTRY_BYTES]
            memcpy(check, &units[i * UNIT_SIZE], UNIT_SIZE)
            memcpy(check + UNIT_SIZE, e, TIME_STORED)
            ok[i] = (
                (_crc32c(check, UNIT_SIZE + TIME_STORED) & 0xFFFF)
                == ((<uint32_t>e[TIME_STORED] << 8) | e[TIME_STORED + 1])
            )
    return out


# -- decode: a SubscribeResponse's wire bytes to a dispatch frame's columns ---------------------
#
# The protobuf wire format (protobuf.dev/programming-guides/encoding) of commitlog.proto's
# SubscribeResponse {oneof frame {Handshake handshake = 1; DispatchBatch batch = 2;}}, read as
# upb reads it: repeated numbers packed or not, a scalar's last value wins, a submessage given
# twice merges (its repeated fields concatenate), a field of a known number with another wire
# type and unknown fields are skipped (groups included), int32 fields keep a varint's low 32
# bits, strings must be UTF-8.

cdef enum:
    FRAME_COLUMNS = 10  # topic_indexes .. sys_flags (fields 4-11), corrupt starts and ends
    VARINT_BYTES_MAX = 10
    GROUP_DEPTH_MAX = 100

# DispatchBatch's field number -> its column (-1: not a number column), and whether int32.
cdef int _COLUMN_OF[16]
cdef bint _INT32_FIELD[16]
_COLUMN_OF[:] = [-1, -1, -1, -1, 0, 1, 2, 3, 4, 5, 6, 7, -1, -1, 8, 9]
_INT32_FIELD[:] = [0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0]


class WireError(ValueError):
    """Bytes that are no SubscribeResponse (the Python side makes it a MalformedFrame)."""


cdef struct Column64:
    int64_t *data
    Py_ssize_t n
    Py_ssize_t cap


cdef int _push(Column64 *c, int64_t v) except -1:
    cdef int64_t *grown
    if c.n == c.cap:
        c.cap = c.cap * 2 if c.cap else 64
        grown = <int64_t *>realloc(c.data, c.cap * sizeof(int64_t))
        if grown == NULL:
            raise MemoryError()
        c.data = grown
    c.data[c.n] = v
    c.n += 1
    return 0


cdef inline const unsigned char *_varint(
    const unsigned char *p, const unsigned char *end, uint64_t *out
) except NULL:
    cdef uint64_t v = 0
    cdef unsigned char byte
    cdef int i
    for i in range(VARINT_BYTES_MAX):
        if p >= end:
            raise WireError("a varint runs past its end")
        byte = p[0]
        v |= <uint64_t>(byte & 0x7F) << (7 * i)
        p += 1
        if not (byte & 0x80):
            out[0] = v
            return p
    raise WireError("a varint of more than 10 bytes")


cdef const unsigned char *_skip(
    const unsigned char *p, const unsigned char *end, int wire, uint32_t number, int depth
) except NULL:
    """Past the value of an unknown field (a group: past its end tag)."""
    cdef uint64_t v, tag
    if wire == 0:
        return _varint(p, end, &v)
    if wire == 1 or wire == 5:
        if end - p < (8 if wire == 1 else 4):
            raise WireError("a fixed-width value runs past its end")
        return p + (8 if wire == 1 else 4)
    if wire == 2:
        p = _varint(p, end, &v)
        if v > <uint64_t>(end - p):
            raise WireError("a length runs past its end")
        return p + v
    if wire == 3:
        if depth >= GROUP_DEPTH_MAX:
            raise WireError("groups nested too deep")
        while True:
            p = _varint(p, end, &tag)
            if tag > 0xFFFFFFFF or tag >> 3 == 0:
                raise WireError("a bad tag")
            if (tag & 7) == 4:
                if (tag >> 3) != number:
                    raise WireError("a group ends with another number")
                return p
            p = _skip(p, end, <int>(tag & 7), <uint32_t>(tag >> 3), depth + 1)
    raise WireError(f"wire type {wire}")


cdef str _utf8(const unsigned char *p, Py_ssize_t n):
    try:
        return (<const char *>p)[:n].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("a string that is no UTF-8") from None


cdef class _Batch:
    cdef Column64 cols[FRAME_COLUMNS]
    cdef int64_t start_offset, next_offset
    cdef list topics, keys, uniq_keys
    cdef object records

    def __cinit__(self):
        memset(self.cols, 0, sizeof(self.cols))
        self.clear()

    cdef void clear(self) noexcept:
        cdef int i
        for i in range(FRAME_COLUMNS):
            self.cols[i].n = 0
        self.start_offset = self.next_offset = 0
        self.topics = []
        self.keys = []
        self.uniq_keys = []
        self.records = b""

    def __dealloc__(self):
        cdef int i
        for i in range(FRAME_COLUMNS):
            free(self.cols[i].data)

    cdef int merge(self, const unsigned char *p, const unsigned char *end) except -1:
        """Read one DispatchBatch's bytes into what was read (a merge)."""
        cdef uint64_t tag, v, length
        cdef uint32_t number
        cdef int wire, col
        cdef const unsigned char *stop
        while p < end:
            p = _varint(p, end, &tag)
            if tag > 0xFFFFFFFF or tag >> 3 == 0:
                raise WireError("a bad tag")
            number = <uint32_t>(tag >> 3)
            wire = <int>(tag & 7)
            col = _COLUMN_OF[number] if number < 16 else -1
            if col >= 0 and wire == 0:
                p = _varint(p, end, &v)
                _push(&self.cols[col], <int32_t>v if _INT32_FIELD[number] else <int64_t>v)
            elif col >= 0 and wire == 2:
                p = _varint(p, end, &length)
                if length > <uint64_t>(end - p):
                    raise WireError("a length runs past its end")
                stop = p + length
                while p < stop:
                    p = _varint(p, stop, &v)
                    _push(&self.cols[col], <int32_t>v if _INT32_FIELD[number] else <int64_t>v)
            elif (number == 1 or number == 2) and wire == 0:
                p = _varint(p, end, &v)
                if number == 1:
                    self.start_offset = <int64_t>v
                else:
                    self.next_offset = <int64_t>v
            elif (number == 3 or number == 12 or number == 13 or number == 16) and wire == 2:
                p = _varint(p, end, &length)
                if length > <uint64_t>(end - p):
                    raise WireError("a length runs past its end")
                if number == 16:
                    self.records = PyBytes_FromStringAndSize(<const char *>p, <Py_ssize_t>length)
                else:
                    (self.topics if number == 3 else self.keys if number == 12 else
                     self.uniq_keys).append(_utf8(p, <Py_ssize_t>length))
                p += length
            elif wire == 4:
                raise WireError("a group ends that never began")
            else:
                p = _skip(p, end, wire, number, 0)
        return 0

    cdef tuple result(self):
        cdef list columns = []
        cdef int i
        for i in range(FRAME_COLUMNS):
            columns.append(PyByteArray_FromStringAndSize(
                <const char *>self.cols[i].data, self.cols[i].n * 8))
        return (self.start_offset, self.next_offset, self.topics, columns, self.keys,
                self.uniq_keys, self.records)


def decode_response(object data):
    """A SubscribeResponse's wire bytes: None when it holds no batch (a handshake, or
    nothing), else the batch as (start_offset, next_offset, topics, columns, keys, uniq_keys,
    records), the columns native int64 bytearrays: topic_indexes, queue_ids, queue_offsets,
    commit_log_offsets, sizes, tags_codes, store_timestamps_ms, sys_flags, corrupt_starts,
    corrupt_ends. WireError when the bytes are no SubscribeResponse."""
    cdef _Buffer held = _Buffer(data)
    cdef const unsigned char *p = <const unsigned char *>held.view.buf
    cdef const unsigned char *end = p + held.view.len
    cdef uint64_t tag, length
    cdef uint32_t number
    cdef int wire, case = 0
    cdef _Batch batch = _Batch()
    try:
        while p < end:
            p = _varint(p, end, &tag)
            if tag > 0xFFFFFFFF or tag >> 3 == 0:
                raise WireError("a bad tag")
            number = <uint32_t>(tag >> 3)
            wire = <int>(tag & 7)
            if (number == 1 or number == 2) and wire == 2:
                p = _varint(p, end, &length)
                if length > <uint64_t>(end - p):
                    raise WireError("a length runs past its end")
                if number == 2:
                    if case != 2:
                        batch.clear()
                    batch.merge(p, p + length)
                case = <int>number  # a handshake: Python reads it (FromString)
                p += length
            elif wire == 4:
                raise WireError("a group ends that never began")
            else:
                p = _skip(p, end, wire, number, 0)
    finally:
        held.release()
    return batch.result() if case == 2 else None
