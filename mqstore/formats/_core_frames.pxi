# Apply a dispatch frame to the consume queues: included by _core.pyx.
#
#   queue_runs(topic_indexes, queue_ids, sys_flags)     the rows that take a queue offset,
#                                                       grouped by (topic, queue)
#   pack_runs(rows, bounds, queue_offsets, offsets,     for every queue's run at once: where
#             sizes, tags, stamps, states, prefixes)     it starts to be written (-1: not plain),
#                                                       what it ends at, and its units with
#                                                       their times, laid out for the file or
#                                                       the RocksDB store
#   pack_units(rows, start, offsets, sizes, tags,       a run's 20-byte units and 8-byte time
#              stamps, last_time)                       entries (cq_unit.py, cq_time.py)
#   time_entries_ok(units, entries)                     which stored time entries pass their
#                                                       check (the audit)
#
# The columns are int64 buffers of one length (a decoded DispatchColumns' numpy arrays); `rows`
# an int64 buffer of row numbers. The Python references in tests/cq/test_apply_columns.py are
# what the tests pin these to.

from cpython.bytearray cimport PyByteArray_FromStringAndSize
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy


cdef enum:
    TIME_ENTRY_BYTES = 8
    TIME_STORED = 6
    UNIT_SIZE = 20
    RUN_SLOTS_MIN = 16

cdef int64_t TIME_MAX = (<int64_t>1 << 48) - 1
# Slicing-by-8 (Intel's, as in zlib's crc32 braids): table k maps a byte to its CRC after k
# more zero bytes, so 8 bytes fold in one step of independent lookups instead of a chain of 8.
# A time entry's check covers 26 bytes: 3 steps and 2 bytes, about 3 times faster than bytewise.
cdef uint32_t _crc32c_table[8][256]


cdef void _crc32c_init() noexcept:
    cdef uint32_t c, n, k
    for n in range(256):
        c = n
        for k in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        _crc32c_table[0][n] = c
    for n in range(256):
        for k in range(1, 8):
            c = _crc32c_table[k - 1][n]
            _crc32c_table[k][n] = (c >> 8) ^ _crc32c_table[0][c & 0xFF]


_crc32c_init()


cdef inline uint32_t _le32(const unsigned char *p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint32_t _crc32c(const unsigned char *p, size_t n) noexcept nogil:
    cdef uint32_t c = <uint32_t>0xFFFFFFFF, hi
    while n >= 8:
        c ^= _le32(p)
        hi = _le32(p + 4)
        c = (_crc32c_table[7][c & 0xFF] ^ _crc32c_table[6][(c >> 8) & 0xFF]
             ^ _crc32c_table[5][(c >> 16) & 0xFF] ^ _crc32c_table[4][c >> 24]
             ^ _crc32c_table[3][hi & 0xFF] ^ _crc32c_table[2][(hi >> 8) & 0xFF]
             ^ _crc32c_table[1][(hi >> 16) & 0xFF] ^ _crc32c_table[0][hi >> 24])
        p += 8
        n -= 8
    while n:
        c = _crc32c_table[0][(c ^ p[0]) & 0xFF] ^ (c >> 8)
        p += 1
        n -= 1
    return c ^ <uint32_t>0xFFFFFFFF


def crc32c(object data):
    """CRC-32C of a contiguous buffer (the crc32c package's value): what the time entries'
    checks are cut from, exposed so that a property pins the compiled CRC to the package."""
    cdef _Buffer b = _Buffer(data)
    return _crc32c(<const unsigned char *>b.view.buf, <size_t>b.view.len)


cdef inline void _put_be48(unsigned char *p, uint64_t v) noexcept nogil:
    """A time entry's stored time: the low 48 bits of `v`, big-endian."""
    mq_put_be16(p, <uint16_t>(v >> 32))
    mq_put_be32(p + 2, <uint32_t>v)


cdef class _Columns:
    """Held int64 buffers, released with the _Columns; `take` checks one holds n rows."""

    cdef list held

    def __cinit__(self):
        self.held = []

    cdef const int64_t *take(self, object column, Py_ssize_t n) except NULL:
        cdef _Buffer b = _Buffer(column)
        self.held.append(b)
        if b.view.len < n * 8 or b.view.len % 8:
            raise ValueError(f"a column of {b.view.len} bytes for {n} int64 rows")
        return <const int64_t *>b.view.buf


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
    ([(topic index, queue id)], bounds, rows), bounds and rows native int64 bytearrays, group
    r being rows[bounds[r]:bounds[r + 1]]."""
    cdef _Columns cols = _Columns()
    cdef Py_ssize_t n = len(topic_indexes)
    cdef const int64_t *ti
    cdef const int64_t *qi
    cdef const int64_t *sf
    cdef Py_ssize_t i, r, runs = 0, slots = RUN_SLOTS_MIN, at
    cdef int64_t kind
    cdef uint64_t h
    cdef Py_ssize_t *slot_run = NULL
    cdef Py_ssize_t *row_run = NULL
    cdef Py_ssize_t *run_count = NULL
    cdef Py_ssize_t *run_fill = NULL
    cdef int64_t *run_ti = NULL
    cdef int64_t *run_qi = NULL
    cdef list out = []
    cdef bytearray rows, bounds
    cdef int64_t *dst
    cdef int64_t *bd
    try:
        ti = cols.take(topic_indexes, n)
        qi = cols.take(queue_ids, n)
        sf = cols.take(sys_flags, n)
        while slots < 2 * n:
            slots <<= 1
        slot_run = <Py_ssize_t *>malloc(slots * sizeof(Py_ssize_t))
        row_run = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
        run_count = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
        run_ti = <int64_t *>malloc((n + 1) * sizeof(int64_t))
        run_qi = <int64_t *>malloc((n + 1) * sizeof(int64_t))
        run_fill = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
        if not (slot_run and row_run and run_count and run_ti and run_qi and run_fill):
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
                r = slot_run[at]
                while r >= 0 and not (run_ti[r] == ti[i] and run_qi[r] == qi[i]):
                    at = (at + 1) & (slots - 1)
                    r = slot_run[at]
                if r < 0:
                    r = slot_run[at] = runs
                    run_ti[runs] = ti[i]
                    run_qi[runs] = qi[i]
                    run_count[runs] = 0
                    runs += 1
            row_run[i] = r
            run_count[r] += 1
        bounds = PyByteArray_FromStringAndSize(NULL, (runs + 1) * 8)
        bd = <int64_t *>(<char *>bounds)
        bd[0] = 0
        for r in range(runs):
            out.append((run_ti[r], run_qi[r]))
            bd[r + 1] = bd[r] + run_count[r]
            run_fill[r] = bd[r]
        rows = PyByteArray_FromStringAndSize(NULL, bd[runs] * 8)
        dst = <int64_t *>(<char *>rows)
        for i in range(n):
            r = row_run[i]
            if r >= 0:
                dst[run_fill[r]] = i
                run_fill[r] += 1
    finally:
        free(slot_run)
        free(row_run)
        free(run_count)
        free(run_ti)
        free(run_qi)
        free(run_fill)
    return out, bounds, rows


cdef Py_ssize_t _plain_start(
    const int64_t *rw, Py_ssize_t m, const int64_t *qo, const int64_t *ph, const int64_t *sz,
    int64_t expect, int64_t last_end,
) noexcept nogil:
    """Where a queue's run rw[:m] starts to be written when it is plain, -1 when it is not
    (then it is applied entry by entry, its gaps filled and its replays skipped). An entry is
    skipped when it ends at or below `last_end` or its queue offset is below `expect`; the run
    is plain when, after a prefix of skipped entries, the queue offsets count up by one from
    `expect` and the ends strictly increase. m: nothing is written."""
    cdef Py_ssize_t k = 0, j
    cdef int64_t row, prev_end
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


cdef int64_t _pack_rows(
    const int64_t *rw, Py_ssize_t count, const int64_t *ph, const int64_t *sz,
    const int64_t *tg, const int64_t *ts, int64_t last_time,
    unsigned char *u, Py_ssize_t stride, unsigned char *tm,
) noexcept nogil:
    """The units (offset, size, tags code: 20 bytes big-endian) of rows rw[:count] at `u`,
    `stride` bytes apart, each with its indexed time (the running maximum of the clamped store
    times, from `last_time`): as a time entry at `tm` (u48 and the low 16 bits of
    CRC32C(unit + those 6 bytes), 8 bytes apart) or, `tm` NULL, as an int64 right after its
    unit (rocks_layout.UNIT_VALUE). Returns the last indexed time."""
    cdef Py_ssize_t j
    cdef int64_t row, t
    cdef unsigned char check[UNIT_SIZE + TIME_STORED]
    cdef uint32_t c
    for j in range(count):
        row = rw[j]
        mq_put_be64(u, <uint64_t>ph[row])
        mq_put_be32(u + 8, <uint32_t>sz[row])
        mq_put_be64(u + 12, <uint64_t>tg[row])
        t = min(max(ts[row], 0), TIME_MAX)
        if t > last_time:
            last_time = t
        if tm == NULL:
            mq_put_be64(u + UNIT_SIZE, <uint64_t>last_time)
        else:
            memcpy(check, u, UNIT_SIZE)
            _put_be48(check + UNIT_SIZE, <uint64_t>last_time)
            c = _crc32c(check, UNIT_SIZE + TIME_STORED)
            memcpy(tm, check + UNIT_SIZE, TIME_STORED)
            mq_put_be16(tm + TIME_STORED, <uint16_t>c)
            tm += TIME_ENTRY_BYTES
        u += stride
    return last_time


def pack_runs(
    object rows,
    object bounds,
    object queue_offsets,
    object offsets,
    object sizes,
    object tags_codes,
    object store_timestamps_ms,
    object states,
    list prefixes=None,
):
    """Every queue's run of a frame at once (run r: rows[bounds[r]:bounds[r + 1]]; states[r] its
    queue's state before it, read here as the attributes max_offset (next offset), last_phy_end
    and last_time_ms): where the run starts to be written when it is plain, -1 when it is not
    (_plain_start), and the units of the rows written from there with their indexed times
    (_pack_rows). Returns (ends, a, b): ends[r] = (start, the queue's next offset after the
    run, the first and last written row's commit-log offset, the last one's size, the last
    indexed time), a run that writes nothing keeping its state (offsets -1, size 0), so that a
    store reads what it writes as ints, not numpy scalars; for the file store
    (`prefixes` None) a[r] and b[r] = run r's written units and time entries, back to back (20
    and 8 bytes a row), or for RocksDB (`prefixes`: each run's queue key prefix) a and b = the
    unit keys (prefix + queue offset, big-endian) and values (rocks_layout.UNIT_VALUE) of every
    written row."""
    cdef _Columns cols = _Columns()
    cdef const int64_t *rw
    cdef const int64_t *bd
    cdef const int64_t *qo
    cdef const int64_t *ph
    cdef const int64_t *sz
    cdef const int64_t *tg
    cdef const int64_t *ts
    cdef Py_ssize_t m, runs, n = len(queue_offsets), r, s, j, lo, count, plen
    cdef int64_t expect, last_time, first_phy, last_phy, last_size
    cdef list ends = [], a = [], b = []
    cdef bytes units, times, prefix, key
    cdef unsigned char value[UNIT_SIZE + 8]
    m = _rows_of(rows, cols, &rw)
    runs = _rows_of(bounds, cols, &bd) - 1
    qo = cols.take(queue_offsets, n)
    ph = cols.take(offsets, n)
    sz = cols.take(sizes, n)
    tg = cols.take(tags_codes, n)
    ts = cols.take(store_timestamps_ms, n)
    _check_rows(rw, m, n)
    if runs < 0 or bd[0] != 0 or bd[runs] != m:
        raise ValueError(f"bounds of {runs + 1} for {m} rows")
    for r in range(runs):
        if bd[r] > bd[r + 1]:
            raise ValueError(f"run {r} of bounds {bd[r]}..{bd[r + 1]}")
    if len(states) != runs:
        raise ValueError(f"{len(states)} queue states for {runs} runs")
    if prefixes is not None and len(prefixes) != runs:
        raise ValueError(f"{len(prefixes)} key prefixes for {runs} runs")
    for r in range(runs):
        st = states[r]
        expect, last_time = st.max_offset, st.last_time_ms
        s = _plain_start(rw + bd[r], bd[r + 1] - bd[r], qo, ph, sz, expect, st.last_phy_end)
        count = bd[r + 1] - bd[r] - s if s >= 0 else 0
        lo = bd[r + 1] - count
        first_phy, last_phy, last_size = -1, -1, 0
        if count:
            first_phy = ph[rw[lo]]
            last_phy, last_size = ph[rw[lo + count - 1]], sz[rw[lo + count - 1]]
        if prefixes is None:
            units = PyBytes_FromStringAndSize(NULL, count * UNIT_SIZE)
            times = PyBytes_FromStringAndSize(NULL, count * TIME_ENTRY_BYTES)
            last_time = _pack_rows(rw + lo, count, ph, sz, tg, ts, last_time,
                                   <unsigned char *>PyBytes_AS_STRING(units), UNIT_SIZE,
                                   <unsigned char *>PyBytes_AS_STRING(times))
            a.append(units)
            b.append(times)
        elif count:
            prefix = prefixes[r]
            if prefix is None:
                raise TypeError(f"run {r}: no key prefix")
            plen = len(prefix)
            for j in range(count):
                last_time = _pack_rows(rw + lo + j, 1, ph, sz, tg, ts, last_time,
                                       value, 0, NULL)
                b.append(PyBytes_FromStringAndSize(<char *>value, UNIT_SIZE + 8))
                key = PyBytes_FromStringAndSize(NULL, plen + 8)
                memcpy(PyBytes_AS_STRING(key), <char *>prefix, plen)
                mq_put_be64(<unsigned char *>PyBytes_AS_STRING(key) + plen, <uint64_t>(expect + j))
                a.append(key)
        ends.append((s, expect + count, first_phy, last_phy, last_size, last_time))
    return ends, a, b


def pack_units(
    object rows,
    Py_ssize_t start,
    object offsets,
    object sizes,
    object tags_codes,
    object store_timestamps_ms,
    int64_t last_time,
):
    """The consume-queue units of rows[start:] and their time entries (_pack_rows): (units,
    times, the last indexed time)."""
    cdef _Columns cols = _Columns()
    cdef const int64_t *rw
    cdef const int64_t *ph
    cdef const int64_t *sz
    cdef const int64_t *tg
    cdef const int64_t *ts
    cdef Py_ssize_t m, n = len(offsets), count
    cdef bytes units, times
    cdef unsigned char *u
    cdef unsigned char *tm
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
        last_time = _pack_rows(rw + start, count, ph, sz, tg, ts, last_time, u, UNIT_SIZE, tm)
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


cdef int _reserve(Column64 *c, Py_ssize_t more) except -1:
    """Room for `more` values after the column's n."""
    if c.n + more > c.cap:
        _grow(<void **>&c.data, &c.cap, c.n + more, sizeof(int64_t), 64)
    return 0


cdef inline int _push(Column64 *c, int64_t v) except -1:
    if c.n == c.cap:
        _reserve(c, 1)
    c.data[c.n] = v
    c.n += 1
    return 0


cdef inline const unsigned char *_varint(
    const unsigned char *p, const unsigned char *end, uint64_t *out
) except NULL:
    cdef uint64_t v = 0
    cdef unsigned char byte
    cdef int i
    if end - p >= VARINT_BYTES_MAX:  # the common case: no bounds check a byte
        for i in range(VARINT_BYTES_MAX):
            byte = p[i]
            v |= <uint64_t>(byte & 0x7F) << (7 * i)
            if not (byte & 0x80):
                out[0] = v
                return p + i + 1
        raise WireError("a varint of more than 10 bytes")
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


cdef inline Py_ssize_t _utf8_char(const unsigned char *p, Py_ssize_t n, uint32_t *cp) noexcept nogil:
    """The length of the UTF-8 sequence at p (n > 0 bytes left) and its code point in *cp, or
    0 when the bytes are no UTF-8 there. Strict as Python's decoder (Unicode's Table 3-7): no
    overlong forms, no surrogates (ED A0..BF), nothing above U+10FFFF (F4 90.., F5..FF)."""
    cdef unsigned char b0 = p[0], lo = 0x80, hi = 0xBF
    cdef Py_ssize_t k, i
    if b0 < 0x80:
        cp[0] = b0
        return 1
    if b0 < 0xC2:
        return 0  # a continuation byte, or C0/C1 (overlong two-byte forms)
    if b0 < 0xE0:
        k = 2
        cp[0] = b0 & 0x1F
    elif b0 < 0xF0:
        k = 3
        cp[0] = b0 & 0x0F
        if b0 == 0xE0:
            lo = 0xA0  # below: overlong
        elif b0 == 0xED:
            hi = 0x9F  # above: UTF-16 surrogates
    elif b0 < 0xF5:
        k = 4
        cp[0] = b0 & 0x07
        if b0 == 0xF0:
            lo = 0x90  # below: overlong
        elif b0 == 0xF4:
            hi = 0x8F  # above: beyond U+10FFFF
    else:
        return 0
    if n < k or p[1] < lo or p[1] > hi:
        return 0
    for i in range(1, k):
        if (p[i] & 0xC0) != 0x80:
            return 0
        cp[0] = (cp[0] << 6) | (p[i] & 0x3F)
    return k


cdef inline bint _is_utf8(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """Whether p[:n] is UTF-8 by _utf8_char's (Python's strict) rules. ASCII is taken eight
    bytes a step (a unique id is 32 ASCII characters)."""
    cdef Py_ssize_t i = 0, k
    cdef uint32_t cp
    cdef uint64_t word
    while i < n:
        while i + 8 <= n:
            memcpy(&word, p + i, 8)
            if word & 0x8080808080808080ULL:
                break
            i += 8
        if i >= n:
            break
        if p[i] < 0x80:
            i += 1
            continue
        k = _utf8_char(p + i, n - i, &cp)
        if k == 0:
            return False
        i += k
    return True


cdef struct Strings:
    # A string column as the wire gives it: the UTF-8 bytes back to back, and where each
    # string ends (ends.n strings; string i is data[ends[i - 1]:ends[i]], ends[-1] taken as 0).
    unsigned char *data
    Py_ssize_t n, cap
    Column64 ends


cdef int _strings_push(Strings *s, const unsigned char *p, Py_ssize_t length) except -1:
    """Append one string (checked UTF-8 first: a frame with one that is not is refused)."""
    if not _is_utf8(p, length):
        raise WireError("a string that is no UTF-8")
    if s.n + length > s.cap:
        _grow(<void **>&s.data, &s.cap, s.n + length, 1, 256)
    if length:
        memcpy(s.data + s.n, p, length)
    s.n += length
    _push(&s.ends, s.n)
    return 0


cdef tuple _strings_result(Strings *s):
    """(data bytes, offsets as native int64 bytes: 0 then every end; empty for no strings)."""
    cdef bytes offsets = b""
    cdef int64_t *w
    if s.ends.n:
        offsets = PyBytes_FromStringAndSize(NULL, (s.ends.n + 1) * 8)
        w = <int64_t *>PyBytes_AS_STRING(offsets)
        w[0] = 0
        memcpy(w + 1, s.ends.data, s.ends.n * 8)
    return PyBytes_FromStringAndSize(<const char *>s.data, s.n), offsets


cdef class _Batch:
    cdef Column64 cols[FRAME_COLUMNS]
    cdef int64_t start_offset, next_offset
    cdef Strings strings[2]  # keys (field 12), uniq_keys (field 13)
    cdef list topics
    cdef object records

    def __cinit__(self):
        memset(self.cols, 0, sizeof(self.cols))
        memset(self.strings, 0, sizeof(self.strings))
        self.clear()

    cdef void clear(self) noexcept:
        cdef int i
        for i in range(FRAME_COLUMNS):
            self.cols[i].n = 0
        self.start_offset = self.next_offset = 0
        self.strings[0].n = self.strings[1].n = 0
        self.strings[0].ends.n = self.strings[1].ends.n = 0
        self.topics = []
        self.records = b""

    def __dealloc__(self):
        cdef int i
        for i in range(FRAME_COLUMNS):
            free(self.cols[i].data)
        for i in range(2):
            free(self.strings[i].data)
            free(self.strings[i].ends.data)

    cdef int merge(self, const unsigned char *p, const unsigned char *end) except -1:
        """Read one DispatchBatch's bytes into what was read (a merge)."""
        cdef uint64_t tag, v, length
        cdef uint32_t number
        cdef int wire, col
        cdef bint int32
        cdef Column64 *c
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
                # A packed field of `length` bytes holds at most `length` values: room for all
                # at once, then each value stored without a check (a one-byte varint inline).
                c = &self.cols[col]
                _reserve(c, <Py_ssize_t>length)
                int32 = _INT32_FIELD[number]
                while p < stop:
                    if p[0] < 0x80:
                        v = p[0]
                        p += 1
                    else:
                        p = _varint(p, stop, &v)
                    c.data[c.n] = <int32_t>v if int32 else <int64_t>v
                    c.n += 1
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
                elif number == 3:
                    self.topics.append(_utf8(p, <Py_ssize_t>length))
                else:
                    _strings_push(&self.strings[number - 12], p, <Py_ssize_t>length)
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
        return (self.start_offset, self.next_offset, self.topics, columns,
                _strings_result(&self.strings[0]), _strings_result(&self.strings[1]),
                self.records)


def decode_response(object data):
    """A SubscribeResponse's wire bytes: None when it holds no batch (a handshake, or
    nothing), else the batch as (start_offset, next_offset, topics, columns, keys, uniq_keys,
    records), the columns native int64 bytearrays: topic_indexes, queue_ids, queue_offsets,
    commit_log_offsets, sizes, tags_codes, store_timestamps_ms, sys_flags, corrupt_starts,
    corrupt_ends. keys and uniq_keys are string columns (UTF-8 bytes back to back, native
    int64 offsets: 0 and each string's end, or empty when the frame has none): no str is made
    per message, and each string is checked to be UTF-8 as Python's strict decoder checks it.
    WireError when the bytes are no SubscribeResponse."""
    cdef _Buffer held = _Buffer(data)
    cdef const unsigned char *p = <const unsigned char *>held.view.buf
    cdef const unsigned char *end = p + held.view.len
    cdef uint64_t tag, length
    cdef uint32_t number
    cdef int wire, case = 0
    cdef _Batch batch = _Batch()
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
    return batch.result() if case == 2 else None
