# The index service's per-key work for a dispatch batch, in one pass each: included by _core.pyx.
#   index_message_keys(...)      the index hashes of a dispatch frame's keys, straight from its
#                                UTF-8 string columns; its specification is
#                                keyhash.message_key_hashes_reference (message_keys, then
#                                javahash.index_key_hash, key by key)
#   index_put_keys(...)          a batch of entries and slots written into an index file; its
#                                specification is index_file.put_keys_reference (numpy)
#   index_rows(...)              which rows of a dispatch frame the index writes; its
#                                specification is IndexEngine.apply's walk over entries
# The tests pin both to their references (tests/formats/test_index_core.py).

cdef extern from "Python.h":
    # Named apart from _core_ids.pxi's PyUnicode_DATA declaration, which takes the same name.
    int mq_unicode_kind "PyUnicode_KIND"(object o)
    void *mq_unicode_data "PyUnicode_DATA"(object o)
    uint32_t mq_unicode_read "PyUnicode_READ"(int kind, const void *data, Py_ssize_t index)
    Py_ssize_t mq_unicode_length "PyUnicode_GET_LENGTH"(object o)

cdef enum:
    INDEX_HEADER_BYTES_ = 40  # formats/index_file.py's HEADER
    INDEX_SLOT_BYTES_ = 4
    INDEX_ENTRY_BYTES_ = 20
    UTF16_SUPPLEMENTARY_ = 0x10000  # code points from here take a surrogate pair
    UTF16_HIGH_SURROGATE_ = 0xD800
    UTF16_LOW_SURROGATE_ = 0xDC00

cdef uint32_t JAVA_HASH_POW2_ = 31 * 31
cdef uint32_t JAVA_HASH_POW3_ = 31 * 31 * 31
cdef uint32_t JAVA_HASH_POW4_ = 31 * 31 * 31 * 31
cdef int64_t INDEX_INT32_MAX_ = 2147483647
cdef int64_t INDEX_INT32_MIN_ = -2147483648


cdef inline uint32_t _java_hash_more(uint32_t h, object s) noexcept:
    """Java's h = 31 * h + unit, continued over the UTF-16 code units of the str `s` (a
    topic's "topic#" prefix: its state once a frame, each key continuing it)."""
    cdef int kind = mq_unicode_kind(s)
    cdef const void *data = mq_unicode_data(s)
    cdef const unsigned char *latin
    cdef Py_ssize_t i, n = mq_unicode_length(s)
    cdef uint32_t c  # a code point (Cython would treat a Py_UCS4 as a one-character str)
    if kind == 1:
        # Four units a step: h * 31**4 + (u0 * 31**3 + u1 * 31**2 + u2 * 31 + u3) is the same
        # value mod 2**32, and the four products do not wait on each other (~37 -> ~15 ns for
        # a 44-character key).
        latin = <const unsigned char *>data
        i = 0
        while i + 4 <= n:
            h = h * JAVA_HASH_POW4_ + (
                latin[i] * JAVA_HASH_POW3_ + latin[i + 1] * JAVA_HASH_POW2_
                + latin[i + 2] * 31 + latin[i + 3]
            )
            i += 4
        while i < n:
            h = h * 31 + latin[i]
            i += 1
        return h
    for i in range(n):
        c = mq_unicode_read(kind, data, i)
        if c >= UTF16_SUPPLEMENTARY_:
            c -= UTF16_SUPPLEMENTARY_
            h = h * 31 + (UTF16_HIGH_SURROGATE_ + (c >> 10))
            h = h * 31 + (UTF16_LOW_SURROGATE_ + (c & 0x3FF))
        else:
            h = h * 31 + c
    return h


cdef inline uint32_t _java_hash_utf8(uint32_t h, const unsigned char *p, Py_ssize_t n) except? 0xFFFFFFFF:
    """_java_hash_more over the str whose UTF-8 bytes are p[:n] (read as _utf8_char reads
    them: the str Python's strict decoder would make, in UTF-16 code units), without making
    it. Bytes that are no UTF-8: ValueError (decode_response refuses such a frame first)."""
    cdef Py_ssize_t i = 0, k
    cdef uint32_t c
    while True:
        # ASCII four bytes a step, as _java_hash_more does Latin-1 (the usual key is ASCII).
        while i + 4 <= n and ((p[i] | p[i + 1] | p[i + 2] | p[i + 3]) & 0x80) == 0:
            h = h * JAVA_HASH_POW4_ + (
                p[i] * JAVA_HASH_POW3_ + p[i + 1] * JAVA_HASH_POW2_ + p[i + 2] * 31 + p[i + 3]
            )
            i += 4
        if i >= n:
            return h
        k = _utf8_char(p + i, n - i, &c)
        if k == 0:
            raise ValueError("index keys: a key that is no UTF-8")
        i += k
        if c >= UTF16_SUPPLEMENTARY_:
            c -= UTF16_SUPPLEMENTARY_
            h = h * 31 + (UTF16_HIGH_SURROGATE_ + (c >> 10))
            h = h * 31 + (UTF16_LOW_SURROGATE_ + (c & 0x3FF))
        else:
            h = h * 31 + c


cdef inline int64_t _index_of_java(uint32_t h) noexcept nogil:
    """RocketMQ's indexKeyHashMethod of a hashCode: abs, Integer.MIN_VALUE -> 0."""
    cdef int64_t v = <int32_t>h
    return 0 if v == INDEX_INT32_MIN_ else (-v if v < 0 else v)


cdef enum:
    KEY_TOKEN_SEPARATOR_ = 0x20  # " ": KEYS holds space-separated tokens (one UTF-8 byte)


cdef const unsigned char *_string_column(
    const unsigned char[::1] data, const int64_t[::1] offsets, Py_ssize_t n, str name
) except NULL:
    """The bytes of a string column of n strings (offsets: none, or n + 1 rising within data)."""
    cdef Py_ssize_t i
    if offsets.shape[0] != 0:
        if offsets.shape[0] != n + 1 or offsets[0] != 0 or offsets[n] > data.shape[0]:
            raise ValueError(f"index keys: a {name} column that is not {n} strings")
        for i in range(n):
            if offsets[i + 1] < offsets[i]:
                raise ValueError(f"index keys: a {name} column that is not {n} strings")
    return &data[0] if data.shape[0] else <const unsigned char *>""


def index_message_keys(
    list prefixes,
    const int64_t[::1] topic_indexes,
    const int64_t[::1] rows,
    const unsigned char[::1] uniq_data,
    const int64_t[::1] uniq_offsets,
    const unsigned char[::1] keys_data,
    const int64_t[::1] keys_offsets,
):
    """The index keys of a dispatch frame's `rows`, hashed: for each row in order, the index
    hash of prefixes[topic] + its unique id when it has one, then of prefixes[topic] + each
    non-empty token of its KEYS split on " " (keyhash.message_keys' keys and order). The
    unique ids and KEYS are decode_response's string columns (UTF-8 bytes and offsets, empty
    offsets for a frame without them), hashed from their bytes: no str per key. Returns (the
    hashes, the row of each key), both native int64 bytes."""
    cdef Py_ssize_t n = topic_indexes.shape[0], m = rows.shape[0], t, i, j, r, a, b, total = 0
    cdef Py_ssize_t topic_count = len(prefixes)
    cdef const unsigned char *uniq = _string_column(uniq_data, uniq_offsets, n, "unique id")
    cdef const unsigned char *keys = _string_column(keys_data, keys_offsets, n, "KEYS")
    cdef bint has_uniq = uniq_offsets.shape[0] != 0, has_keys = keys_offsets.shape[0] != 0
    cdef bytes hashes, key_rows
    cdef int64_t *h_out
    cdef int64_t *r_out
    cdef uint32_t *states = <uint32_t *>PyMem_Malloc(max(topic_count, 1) * sizeof(uint32_t))
    if states == NULL:
        raise MemoryError()
    try:
        for t in range(topic_count):
            if type(prefixes[t]) is not str:
                raise TypeError(f"index prefixes are str, not {type(prefixes[t]).__name__}")
            states[t] = _java_hash_more(0, prefixes[t])
        # First pass: how many keys (checking rows and topics), so the output is sized once.
        for j in range(m):
            r = rows[j]
            if r < 0 or r >= n or topic_indexes[r] < 0 or topic_indexes[r] >= topic_count:
                raise ValueError(f"index keys: row {r} of {n}, or its topic, out of range")
            if has_uniq and uniq_offsets[r + 1] > uniq_offsets[r]:
                total += 1
            if has_keys:
                a, b = keys_offsets[r], keys_offsets[r + 1]
                for i in range(a, b):
                    if keys[i] != KEY_TOKEN_SEPARATOR_ and (
                        i == a or keys[i - 1] == KEY_TOKEN_SEPARATOR_
                    ):
                        total += 1
        hashes = PyBytes_FromStringAndSize(NULL, total * 8)
        key_rows = PyBytes_FromStringAndSize(NULL, total * 8)
        h_out = <int64_t *>PyBytes_AS_STRING(hashes)
        r_out = <int64_t *>PyBytes_AS_STRING(key_rows)
        total = 0
        for j in range(m):
            r = rows[j]
            t = topic_indexes[r]
            if has_uniq and uniq_offsets[r + 1] > uniq_offsets[r]:
                a = uniq_offsets[r]
                h_out[total] = _index_of_java(_java_hash_utf8(states[t], uniq + a, uniq_offsets[r + 1] - a))
                r_out[total] = r
                total += 1
            if has_keys:
                a, b = keys_offsets[r], keys_offsets[r + 1]
                while a < b:
                    i = a
                    while i < b and keys[i] != KEY_TOKEN_SEPARATOR_:
                        i += 1
                    if i > a:
                        h_out[total] = _index_of_java(_java_hash_utf8(states[t], keys + a, i - a))
                        r_out[total] = r
                        total += 1
                    a = i + 1
    finally:
        PyMem_Free(states)
    return hashes, key_rows


def java_hashes(list keys):
    """Java String.hashCode() of each str (over its UTF-16 code units), as native int64 bytes
    holding the signed int32 values: javahash.java_string_hash's, key by key."""
    cdef Py_ssize_t i, m = len(keys)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, m * 8)
    cdef int64_t *o = <int64_t *>PyBytes_AS_STRING(out)
    for i in range(m):
        key = keys[i]
        if type(key) is not str:
            raise TypeError(f"keys are str, not {type(key).__name__}")
        o[i] = <int32_t>_java_hash_more(0, key)
    return out


def java_hashes_utf8(const unsigned char[::1] data, const int64_t[::1] offsets):
    """java_hashes of the strings whose UTF-8 bytes are data[offsets[i]:offsets[i + 1]] (an
    Arrow string column's buffers: offsets rise within data, from anywhere), hashed from the
    bytes without a str made. ValueError for offsets out of place or bytes that are no UTF-8."""
    cdef Py_ssize_t i, m = offsets.shape[0] - 1 if offsets.shape[0] else 0
    cdef const unsigned char *p = &data[0] if data.shape[0] else <const unsigned char *>""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, m * 8)
    cdef int64_t *o = <int64_t *>PyBytes_AS_STRING(out)
    for i in range(m):
        if not 0 <= offsets[i] <= offsets[i + 1] <= data.shape[0]:
            raise ValueError(f"java hashes: string {i}'s offsets are not within the data")
        o[i] = <int32_t>_java_hash_utf8(0, p + offsets[i], offsets[i + 1] - offsets[i])
    return out


def index_put_keys(
    unsigned char[::1] buf,
    int64_t slot_num,
    int64_t count,
    int64_t begin_ts_ms,
    const int64_t[::1] key_hashes,
    const int64_t[::1] phys,
    const int64_t[::1] store_ts_ms,
):
    """Entries count, count + 1, ... for the keys (index hashes, commit-log offsets, store
    times) and their slots, written into the index file in `buf` (header untouched) exactly as
    index_file.put_keys_reference writes them. Returns (slots newly used, latest store time).

    Two passes. The first clears every slot the batch touches whose value is no entry before
    the batch (<= 0 or >= count: the reference's "empty"); the second walks the keys in order,
    RocketMQ's putKey: prev = the slot's value, the slot = this entry's number. A slot the
    batch already wrote holds a number >= count, so only a first visit can read 0."""
    cdef Py_ssize_t m = key_hashes.shape[0], i
    if phys.shape[0] != m or store_ts_ms.shape[0] != m:
        raise ValueError("index keys: columns of different lengths")
    if slot_num <= 0 or count < 1:
        raise ValueError(f"index keys: {slot_num} slots, index count {count}")
    if INDEX_HEADER_BYTES_ + slot_num * INDEX_SLOT_BYTES_ + (count + m) * INDEX_ENTRY_BYTES_ > buf.shape[0]:
        raise ValueError(f"index keys: {m} entries from {count} do not fit in {buf.shape[0]} bytes")
    cdef int64_t latest = INT64_MIN
    if m == 0:
        return 0, latest
    cdef unsigned char *slots = &buf[0] + INDEX_HEADER_BYTES_
    cdef unsigned char *entry = slots + slot_num * INDEX_SLOT_BYTES_ + count * INDEX_ENTRY_BYTES_
    cdef unsigned char *slot
    cdef int64_t s, value, diff, tdiff, used = 0
    with nogil:
        for i in range(m):
            s = key_hashes[i] % slot_num
            if s < 0:
                s += slot_num
            slot = slots + s * INDEX_SLOT_BYTES_
            value = mq_be_i32(slot)
            if value <= 0 or value >= count:
                mq_put_be32(slot, 0)
        for i in range(m):
            s = key_hashes[i] % slot_num
            if s < 0:
                s += slot_num
            slot = slots + s * INDEX_SLOT_BYTES_
            value = mq_be_i32(slot)
            if value == 0:
                used += 1
            tdiff = 0
            if begin_ts_ms > 0:
                diff = store_ts_ms[i] - begin_ts_ms
                if diff > 0:
                    tdiff = diff // 1000
                    if tdiff > INDEX_INT32_MAX_:
                        tdiff = INDEX_INT32_MAX_
            mq_put_be32(entry, <uint32_t>key_hashes[i])
            mq_put_be64(entry + 4, <uint64_t>phys[i])
            mq_put_be32(entry + 12, <uint32_t>tdiff)
            mq_put_be32(entry + 16, <uint32_t>value)
            mq_put_be32(slot, <uint32_t>(count + i))
            entry += INDEX_ENTRY_BYTES_
            if store_ts_ms[i] > latest:
                latest = store_ts_ms[i]
    return used, latest


def index_rows(
    const int64_t[::1] offsets,
    const int64_t[::1] sizes,
    const int64_t[::1] sys_flags,
    int64_t applied,
):
    """The rows of a dispatch frame whose keys the index writes, and the applied offset after
    the frame: IndexEngine.apply's walk over entries, its specification. A row that starts
    below the applied offset is a replay and is skipped; every other row moves the applied
    offset to its end, and is written unless it is a rolled-back transaction. Returns (the
    rows as native int64 bytes, the applied offset)."""
    cdef Py_ssize_t n = offsets.shape[0], i, taken = 0
    if sizes.shape[0] != n or sys_flags.shape[0] != n:
        raise ValueError("index rows: columns of different lengths")
    cdef bytes rows = PyBytes_FromStringAndSize(NULL, n * 8)
    cdef int64_t *w = <int64_t *>PyBytes_AS_STRING(rows)
    with nogil:
        for i in range(n):
            if offsets[i] < applied:
                continue
            applied = offsets[i] + sizes[i]
            if sys_flags[i] & TRANSACTION_MASK != TRANSACTION_ROLLBACK_TYPE:
                w[taken] = i
                taken += 1
    return rows[: taken * 8], applied
