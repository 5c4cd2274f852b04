# Dispatch columns straight from a segment's records, and from the appends' held runs
# (commitlog_svc/dispatch_scan.py): included by _core.pyx, whose header definitions it reads
# records with.

from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.string cimport memchr

# Why dispatch_columns stopped.
cdef enum:
    DISPATCH_END_ = 0  # at the limit, or rows_max rows / bytes_max bytes taken
    DISPATCH_PAST_ = 1  # at a valid record that ends past the limit: the next call's
    DISPATCH_RECORD_ = 2  # at a record it does not take: read_record decides what is there

DISPATCH_END = DISPATCH_END_
DISPATCH_PAST = DISPATCH_PAST_
DISPATCH_RECORD = DISPATCH_RECORD_

# The properties a dispatch entry carries (properties.py's TAGS, KEYS, UNIQ_KEY).
cdef enum:
    PROP_TAGS = 0
    PROP_KEYS = 1
    PROP_UNIQ = 2
cdef const char *PROP_NAMES[3]
PROP_NAMES[:] = [b"TAGS", b"KEYS", b"UNIQ_KEY"]
cdef Py_ssize_t PROP_NAME_BYTES[3]
PROP_NAME_BYTES[:] = [4, 4, 8]


cdef void _find_values(
    const unsigned char *q, Py_ssize_t n, int names, Py_ssize_t *at
) noexcept nogil:
    """properties.property_value's match for the first `names` names of PROP_NAMES over q[:n]:
    at[k] is where the value of the last segment that starts with name k, 0x01 and a byte
    other than 0x02 begins, -1 when there is none. A segment starts at 0 and after each 0x02."""
    cdef Py_ssize_t seg = 0, k, m
    cdef const unsigned char *sep
    for k in range(names):
        at[k] = -1
    while True:
        for k in range(names):
            m = PROP_NAME_BYTES[k]
            if (
                seg + m + 1 < n
                and q[seg + m] == 0x01
                and q[seg + m + 1] != 0x02
                and memcmp(q + seg, PROP_NAMES[k], <size_t>m) == 0
            ):
                at[k] = seg + m + 1
        sep = <const unsigned char *>memchr(q + seg, 0x02, <size_t>(n - seg))
        if sep == NULL:
            return
        seg = sep - q + 1


cdef inline Py_ssize_t _value_end(const unsigned char *q, Py_ssize_t n, Py_ssize_t at) noexcept:
    cdef const unsigned char *sep = <const unsigned char *>memchr(q + at, 0x02, <size_t>(n - at))
    return n if sep == NULL else sep - q


cdef str _value(const unsigned char *q, Py_ssize_t n, Py_ssize_t at):
    """property_value's value that begins at q[at] ("" at -1)."""
    if at < 0:
        return ""
    return PyUnicode_DecodeUTF8(<const char *>(q + at), _value_end(q, n, at) - at, "replace")


cdef int32_t _tags_code(const unsigned char *q, Py_ssize_t n, Py_ssize_t at) except? -1:
    """javahash.tags_code of the value that begins at q[at] (0 at -1), decoded as _value
    decodes it: Java's String.hashCode over its UTF-16 code units."""
    if at < 0:
        return 0
    cdef Py_ssize_t end = _value_end(q, n, at)
    if _is_utf8(q + at, end - at):
        return <int32_t>_java_hash_utf8(0, q + at, end - at)
    return <int32_t>_java_hash_more(0, _value(q, n, at))  # U+FFFD for what is no UTF-8


# The DispatchBatch fields (commitlog.proto) dispatch_columns writes, as wire-format keys:
# field number << 3 | wire type (0: varint, 2: length-delimited).
cdef enum:
    WIRE_TOPIC_INDEX = 4 << 3
    WIRE_QUEUE_ID = 5 << 3
    WIRE_QUEUE_OFFSET = 6 << 3
    WIRE_OFFSET = 7 << 3
    WIRE_SIZE = 8 << 3
    WIRE_TAGS_CODE = 9 << 3
    WIRE_STORE_TIMESTAMP = 10 << 3
    WIRE_SYS_FLAG = 11 << 3
    WIRE_KEYS = 12 << 3 | 2
    WIRE_UNIQ_KEY = 13 << 3 | 2

# The int columns dispatch_columns writes, in order.
_ENTRY_COLUMNS = (WIRE_TOPIC_INDEX, WIRE_QUEUE_ID, WIRE_QUEUE_OFFSET, WIRE_OFFSET, WIRE_SIZE,
                  WIRE_TAGS_CODE, WIRE_STORE_TIMESTAMP, WIRE_SYS_FLAG)


cdef inline Py_ssize_t _write_varint(unsigned char *out, uint64_t v) noexcept nogil:
    """A value as a varint (a negative int32 or int64: 10 bytes); the bytes written."""
    cdef Py_ssize_t n = 0
    while v >= 0x80:
        out[n] = <unsigned char>(v | 0x80)
        v >>= 7
        n += 1
    out[n] = <unsigned char>v
    return n + 1


cdef inline Py_ssize_t _field(unsigned char *out, unsigned char key, uint64_t v) noexcept nogil:
    """A field's key, then a value as a varint."""
    out[0] = key
    return 1 + _write_varint(out + 1, v)


cdef inline int _put_varint(ColumnBuffer out, uint64_t v) except -1:
    if out.cap - out.size < 10:
        out.reserve(10)
    out.size += _write_varint(<unsigned char *>(out.data + out.size), v)
    return 0


cdef int _put_string(ColumnBuffer out, unsigned char key, str value) except -1:
    cdef Py_ssize_t n
    cdef const char *utf8 = PyUnicode_AsUTF8AndSize(value, &n)
    cdef unsigned char *w = <unsigned char *>out.reserve(11 + n)
    cdef Py_ssize_t head = _field(w, key, <uint64_t>n)  # the value's length
    memcpy(w + head, utf8, <size_t>n)
    out.size += head + n
    return 0


def dispatch_columns(
    object buf,
    Py_ssize_t pos,
    Py_ssize_t limit,
    Py_ssize_t readable,
    int64_t base_offset,
    dict topic_index,
    list topics,
    bint include_keys,
    Py_ssize_t rows_max,
    int64_t bytes_max,
):
    """The dispatch entries of the records from buf[pos:] (whose first byte sits at commit-log
    offset `base_offset`) that end by `limit`, each accepted by every check read_record(buf,
    pos, readable, check_crc=True, expected_offset=base_offset + pos) makes: at most `rows_max`
    of them, and none once `bytes_max` bytes of records are taken. A topic not yet in
    `topic_index` (raw bytes -> index into `topics`) is added to both.

    Returns (why it stopped, where, bytes taken, entries, columns, keys): the entries as
    DispatchBatch fields in wire format, a piece of the frame's batch: `columns` their topic
    indexes, queue ids, queue offsets, commit-log offsets, sizes, tags codes
    (javahash.tags_code of the TAGS value), store timestamps and sysflags, each column one
    packed field (as protobuf writes it: a key per column, not per entry); `keys` with
    `include_keys` their KEYS and UNIQ_KEY values (property_value's), else empty. Apart, so
    that one scan gives the frame with keys and the frame without (dispatch_frame). At
    DISPATCH_RECORD the record at the returned position is one read_record does not return as
    a Record."""
    cdef _Buffer held = _Buffer(buf)
    if pos < 0 or limit > readable or readable > held.view.len:
        raise ValueError(f"[{pos}, {limit}) of {readable} readable in {held.view.len} bytes")
    cdef const unsigned char *data = <const unsigned char *>held.view.buf
    cdef const unsigned char *p
    cdef const unsigned char *q
    cdef ColumnBuffer columns = ColumnBuffer(), keys = ColumnBuffer()
    # Each int column, one packed field.
    cdef ColumnBuffer c_topic = ColumnBuffer(), c_queue = ColumnBuffer()
    cdef ColumnBuffer c_queue_offset = ColumnBuffer(), c_offset = ColumnBuffer()
    cdef ColumnBuffer c_size = ColumnBuffer(), c_tags = ColumnBuffer()
    cdef ColumnBuffer c_stamp = ColumnBuffer(), c_flag = ColumnBuffer()
    cdef Py_ssize_t rows = 0, props_len
    cdef Py_ssize_t at[3]
    cdef int names = 3 if include_keys else 1
    cdef int64_t taken = 0, stored
    cdef int why = DISPATCH_END_, fail
    cdef Frame f
    cdef bytes last_raw = None, raw
    cdef object index = None, name
    while pos < limit and rows < rows_max and taken < bytes_max:
        why = DISPATCH_RECORD_
        p = data + pos
        if record_frame(p, readable - pos, &f) or record_tail(p, &f, True, &stored):
            break
        if mq_be_i64(p + PHYSICAL_OFFSET_POS_) != base_offset + pos:
            break
        name = None  # a new topic: the frame's once its record is taken
        if not _same(last_raw, p + f.topic_at, f.topic_len):
            raw = PyBytes_FromStringAndSize(<const char *>(p + f.topic_at), f.topic_len)
            index = topic_index.get(raw)
            if index is None:
                name = _topic_of(raw, &fail)
                if name is None:
                    break
        if pos + f.total > limit:
            why = DISPATCH_PAST_
            break
        if name is not None:
            index = len(topics)
            topics.append(name)
            topic_index[raw] = index
        last_raw = raw
        why = DISPATCH_END_
        # The properties as read_record returns them: without the whole-record CRC's.
        q = p + f.topic_at + f.topic_len + 2
        props_len = f.props_len - (RECORD_CRC_BYTES_ if stored >= 0 else 0)
        _find_values(q, props_len, names, at)
        _put_varint(c_topic, <int64_t>index)
        _put_varint(c_queue, mq_be_i32(p + QUEUE_ID_POS_))
        _put_varint(c_queue_offset, mq_be_i64(p + QUEUE_OFFSET_POS_))
        _put_varint(c_offset, base_offset + pos)
        _put_varint(c_size, f.total)
        _put_varint(c_tags, _tags_code(q, props_len, at[PROP_TAGS]))
        _put_varint(c_stamp, mq_be_i64(p + BORN_HOST_POS_ + IPV4_HOST_BYTES
                                       + (V6_EXTRA_BYTES if f.flags & BORNHOST_V6 else 0)))
        _put_varint(c_flag, f.flags)
        if include_keys:
            _put_string(keys, WIRE_KEYS, _value(q, props_len, at[PROP_KEYS]))
            _put_string(keys, WIRE_UNIQ_KEY, _value(q, props_len, at[PROP_UNIQ]))
        rows += 1
        taken += f.total
        pos += f.total
    if rows:
        for key, column in zip(_ENTRY_COLUMNS, (c_topic, c_queue, c_queue_offset, c_offset,
                                                c_size, c_tags, c_stamp, c_flag)):
            _put_packed(columns, key, column)
    return why, pos, taken, rows, _taken(columns), _taken(keys)


def property_columns(object blobs):
    """(tags codes, KEYS values, UNIQ_KEY values) of each properties blob of `blobs` (bytes),
    as dispatch_columns finds them in a record (append_frames.py: the columns of an append's
    messages, read before they are written)."""
    cdef list tags_codes = [], keys = [], uniq_keys = []
    cdef Py_ssize_t n
    cdef Py_ssize_t at[3]
    cdef const unsigned char *q
    cdef bytes raw
    for blob in blobs:
        raw = blob if type(blob) is bytes else bytes(blob)
        q = <const unsigned char *>PyBytes_AS_STRING(raw)
        n = PyBytes_GET_SIZE(raw)
        _find_values(q, n, 3, at)
        tags_codes.append(_tags_code(q, n, at[PROP_TAGS]))
        keys.append(_value(q, n, at[PROP_KEYS]))
        uniq_keys.append(_value(q, n, at[PROP_UNIQ]))
    return tags_codes, keys, uniq_keys


cdef bint _pairs(const unsigned char *q, Py_ssize_t n) noexcept nogil:
    """property_shape.well_formed: q[:n] is key 0x01 value 0x02 pairs, every key non-empty
    and free of 0x01 and 0x02, every value free of 0x02."""
    cdef Py_ssize_t i = 0
    cdef const unsigned char *end
    while i < n:
        if q[i] == 0x01 or q[i] == PROPERTIES_END_BYTE_:
            return False  # an empty key, or an empty segment
        while i < n and q[i] != 0x01:
            if q[i] == PROPERTIES_END_BYTE_:
                return False  # a segment without 0x01
            i += 1
        if i == n:
            return False  # bytes after the last 0x02
        end = <const unsigned char *>memchr(q + i + 1, PROPERTIES_END_BYTE_, <size_t>(n - i - 1))
        if end == NULL:
            return False
        i = end - q + 1
    return True


def malformed_properties(object blobs):
    """Indices of the properties blobs (bytes) that are not key 0x01 value 0x02 pairs
    (property_shape.py's grammar), in order: [] for the usual batch."""
    cdef list bad = []
    cdef Py_ssize_t i = 0
    cdef bytes raw
    for blob in blobs:
        raw = blob if type(blob) is bytes else bytes(blob)
        if not _pairs(<const unsigned char *>PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw)):
            bad.append(i)
        i += 1
    return bad


# The int columns of a held run (commitlog_svc/append_frames.py's AppendedRun) that
# dispatch_of_runs copies as they are: (attribute, field key, whether the field is an int32).
_RUN_COLUMNS = (
    ("queue_ids", WIRE_QUEUE_ID, True),
    ("queue_offsets", WIRE_QUEUE_OFFSET, False),
    ("offsets", WIRE_OFFSET, False),
    ("sizes", WIRE_SIZE, True),
    ("sys_flags", WIRE_SYS_FLAG, True),
)


cdef int _put_packed(ColumnBuffer out, unsigned char key, ColumnBuffer values) except -1:
    """`values` (varints) as one packed repeated field: the key with wire type 2, the length,
    the varints. Empties `values` for the next column."""
    cdef unsigned char *w = <unsigned char *>out.reserve(11 + values.size)
    cdef Py_ssize_t head = _field(w, key | 2, <uint64_t>values.size)
    memcpy(w + head, values.data, <size_t>values.size)
    out.size += head + values.size
    values.size = 0
    return 0


cdef int _span_ok(Py_ssize_t lo, Py_ssize_t hi, list values) except -1:
    if not 0 <= lo <= hi <= len(values):
        raise IndexError(f"entries [{lo}, {hi}) of a column of {len(values)}")
    return 0


cdef int _put_varints(
    ColumnBuffer out, list values, Py_ssize_t lo, Py_ssize_t hi, bint int32
) except -1:
    """values[lo:hi] as varints; an int32 field's values must fit in 32 bits, as its setter
    requires (OverflowError)."""
    _span_ok(lo, hi, values)
    cdef unsigned char *w = <unsigned char *>out.reserve((hi - lo) * 10)
    cdef Py_ssize_t i, k = 0
    for i in range(lo, hi):
        if int32:
            k += _write_varint(w + k, <uint64_t><int64_t><int32_t>values[i])
        else:
            k += _write_varint(w + k, <uint64_t><int64_t>values[i])
    out.size += k
    return 0


cdef int _put_repeated(ColumnBuffer out, int64_t value, Py_ssize_t count) except -1:
    """`value` as a varint `count` times."""
    cdef unsigned char one[10]
    cdef Py_ssize_t i, n = _write_varint(one, <uint64_t>value)
    cdef unsigned char *w = <unsigned char *>out.reserve(count * n)
    for i in range(count):
        memcpy(w + i * n, one, <size_t>n)
    out.size += count * n
    return 0


cdef int _put_topic_indexes(
    ColumnBuffer out, object indexes, list mapping, Py_ssize_t lo, Py_ssize_t hi
) except -1:
    """The frame's topic index of entries [lo, hi): mapping[i] is the frame's index of the
    run's topic i; `indexes` None when every entry has the run's topic 0."""
    cdef Py_ssize_t i, t, k = 0
    cdef unsigned char *w
    cdef list run_indexes
    if not mapping:
        raise IndexError("a run without topics")  # boundscheck is off: mapping[0] unchecked
    if indexes is None:
        return _put_repeated(out, <int32_t>mapping[0], hi - lo)
    run_indexes = indexes
    _span_ok(lo, hi, run_indexes)
    w = <unsigned char *>out.reserve((hi - lo) * 10)
    for i in range(lo, hi):
        t = run_indexes[i]
        if not 0 <= t < len(mapping):
            raise IndexError(f"topic index {t} of a run of {len(mapping)} topics")
        k += _write_varint(w + k, <uint64_t><int64_t><int32_t>mapping[t])
    out.size += k
    return 0


def dispatch_of_runs(
    object slices,
    bint include_keys,
    int64_t start_offset,
    int64_t next_offset,
    list records,
):
    """The dispatch frame of held runs, as SubscribeResponse wire bytes ready to send
    (commitlog_svc/dispatch_scan.py's frame_of_runs). `slices`: RunSlices of
    commitlog_svc/append_frames.py, entries [lo, hi) of `run`, an AppendedRun whose columns are
    lists. The frame's topics are each run's in turn, in order of first use.

    Its batch written column by column, each int column as one packed field over all the
    slices: topic indexes (the run's, mapped to the frame's), queue ids, queue offsets,
    commit-log offsets, sizes, sysflags, tags codes, the run's store timestamp per entry; then
    with `include_keys` each KEYS and each UNIQ_KEY value as a string field, in entry order;
    then as dispatch_tail the offsets and topics, and `records` (bytes, back to back) as the
    records field. A parser appends each packed field's values to the field's, as it does an
    unpacked field's."""
    cdef ColumnBuffer out = ColumnBuffer(), column = ColumnBuffer()
    cdef dict topics = {}  # name -> the frame's index
    cdef list held = []
    cdef Py_ssize_t lo, hi, i
    cdef list values
    cdef str name
    cdef unsigned char key
    cdef bint int32
    out.reserve(FRAME_HEAD_BYTES_MAX)
    out.size = FRAME_HEAD_BYTES_MAX  # room for the head, written once the length is known
    for piece in slices:
        run = piece.run
        mapping = [topics.setdefault(t, len(topics)) for t in run.topics]
        held.append((run, <Py_ssize_t>piece.lo, <Py_ssize_t>piece.hi, mapping))
    for run, lo, hi, mapping in held:
        _put_topic_indexes(column, run.topic_indexes, mapping, lo, hi)
    _put_packed(out, WIRE_TOPIC_INDEX, column)
    for name, key, int32 in _RUN_COLUMNS:
        for run, lo, hi, mapping in held:
            _put_varints(column, getattr(run, name), lo, hi, int32)
        _put_packed(out, key, column)
    for run, lo, hi, mapping in held:
        _put_varints(column, run.props.tags_codes, lo, hi, False)
    _put_packed(out, WIRE_TAGS_CODE, column)
    for run, lo, hi, mapping in held:
        _put_repeated(column, run.store_timestamp_ms, hi - lo)
    _put_packed(out, WIRE_STORE_TIMESTAMP, column)
    if include_keys:
        for name, key in (("keys", WIRE_KEYS), ("uniq_keys", WIRE_UNIQ_KEY)):
            for run, lo, hi, mapping in held:
                values = getattr(run.props, name)
                _span_ok(lo, hi, values)
                for i in range(lo, hi):
                    _put_string(out, key, values[i])
    _put_tail(out, start_offset, next_offset, list(topics), [], [], records)
    return _framed(out)


# The DispatchBatch fields after the entries, and SubscribeResponse's `batch`, as wire-format
# keys (field 16's key takes two bytes as a varint).
cdef enum:
    WIRE_START_OFFSET = 1 << 3
    WIRE_NEXT_OFFSET = 2 << 3
    WIRE_TOPIC = 3 << 3 | 2
    WIRE_CORRUPT_START = 14 << 3
    WIRE_CORRUPT_END = 15 << 3
    WIRE_RECORDS = 16 << 3 | 2
    WIRE_BATCH = 2 << 3 | 2
    FRAME_HEAD_BYTES_MAX = 11  # the batch's key and its length, a varint of at most 10 bytes


cdef int _put_tail(
    ColumnBuffer out,
    int64_t start_offset,
    int64_t next_offset,
    list topics,
    list corrupt_starts,
    list corrupt_ends,
    list records,
) except -1:
    """The batch's fields after its entries, in field order, each left out at its default as
    proto3 does."""
    cdef ColumnBuffer column = ColumnBuffer()
    cdef unsigned char *w = <unsigned char *>out.reserve(2 * 11)
    cdef Py_ssize_t k = 0, total = 0
    cdef bytes piece
    if start_offset:
        k += _field(w, WIRE_START_OFFSET, <uint64_t>start_offset)
    if next_offset:
        k += _field(w + k, WIRE_NEXT_OFFSET, <uint64_t>next_offset)
    out.size += k
    for name in topics:
        _put_string(out, WIRE_TOPIC, name)
    for values, key in ((corrupt_starts, WIRE_CORRUPT_START), (corrupt_ends, WIRE_CORRUPT_END)):
        if values:
            _put_varints(column, values, 0, len(values), False)
            _put_packed(out, key, column)
    for piece in records:
        total += len(piece)
    if total:
        w = <unsigned char *>out.reserve(2 + 10 + total)
        k = _write_varint(w, WIRE_RECORDS)
        k += _write_varint(w + k, <uint64_t>total)
        for piece in records:
            memcpy(w + k, PyBytes_AS_STRING(piece), <size_t>len(piece))
            k += len(piece)
        out.size += k
    return 0


def dispatch_tail(
    int64_t start_offset,
    int64_t next_offset,
    list topics,
    list corrupt_starts,
    list corrupt_ends,
):
    """A scanned frame's DispatchBatch fields after its entries (dispatch_columns' pieces), in
    wire format: the start and next offsets, the topics (str) and the corrupt ranges."""
    cdef ColumnBuffer out = ColumnBuffer()
    _put_tail(out, start_offset, next_offset, topics, corrupt_starts, corrupt_ends, [])
    return _taken(out)


cdef bytes _taken(ColumnBuffer out):
    return PyBytes_FromStringAndSize(out.data, out.size)


cdef bytes _framed(ColumnBuffer out):
    """The SubscribeResponse of the batch in `out` after FRAME_HEAD_BYTES_MAX free bytes: the
    batch's key and length written just before it."""
    cdef unsigned char head[FRAME_HEAD_BYTES_MAX]
    cdef Py_ssize_t n = _field(head, WIRE_BATCH, <uint64_t>(out.size - FRAME_HEAD_BYTES_MAX))
    cdef char *start = out.data + FRAME_HEAD_BYTES_MAX - n
    memcpy(start, head, <size_t>n)
    return PyBytes_FromStringAndSize(start, n + out.size - FRAME_HEAD_BYTES_MAX)


def dispatch_frame(tuple pieces):
    """The SubscribeResponse wire bytes whose batch is `pieces` (DispatchBatch fields in wire
    format, bytes) back to back: the batch's key and length, then the pieces, in one copy. A
    scanned frame is its columns, its tail, and its keys or not (dispatch_scan.py)."""
    cdef unsigned char head[FRAME_HEAD_BYTES_MAX]
    cdef Py_ssize_t total = 0, n, k
    cdef bytes piece, frame
    cdef char *w
    for piece in pieces:
        total += len(piece)
    n = _field(head, WIRE_BATCH, <uint64_t>total)
    frame = PyBytes_FromStringAndSize(NULL, n + total)
    w = PyBytes_AS_STRING(frame)
    memcpy(w, head, <size_t>n)
    k = n
    for piece in pieces:
        memcpy(w + k, PyBytes_AS_STRING(piece), <size_t>len(piece))
        k += len(piece)
    return frame
