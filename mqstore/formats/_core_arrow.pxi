# Read records for the Spark log source into Arrow column buffers (log_source.read_batches):
# included by _core.pyx, whose header definitions it reads records with.

from cpython.buffer cimport PyBuffer_FillInfo
from libc.stdlib cimport free
from libc.string cimport memcpy


cdef class ColumnBuffer:
    """Bytes of one Arrow buffer, grown in place while a batch is read, then exported to
    pyarrow (pa.py_buffer) without a copy: the memory lives as long as the arrays over it."""

    cdef char *data
    cdef Py_ssize_t size
    cdef Py_ssize_t cap

    def __dealloc__(self):
        free(self.data)

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self.data if self.data != NULL else <char *>"", self.size,
                          1, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __len__(self):
        return self.size

    cdef char *reserve(self, Py_ssize_t more) except NULL:
        """Room for `more` bytes at the end; the pointer to them (valid until the next call)."""
        if self.size + more > self.cap or self.data == NULL:
            _grow(<void **>&self.data, &self.cap, self.size + more, 1, 64)
        return self.data + self.size

    cdef inline int put(self, const void *src, Py_ssize_t n) except -1:
        memcpy(self.reserve(n), src, <size_t>n)
        self.size += n
        return 0

    cdef inline int put_i32(self, int32_t v) except -1:
        (<int32_t *>self.reserve(4))[0] = v
        self.size += 4
        return 0


# The columns read_log_columns fills, in this order: (name, width in bytes) of the fixed ones.
LOG_FIXED_COLUMNS = (
    ("commitLogOffset", 8),
    ("totalSize", 4),
    ("topic", 4),  # index into `topics`
    ("queueId", 4),
    ("queueOffset", 8),
    ("sysFlag", 4),
    ("flag", 4),
    ("bodyCrc", 4),
    ("bornTimestampMs", 8),
    ("bornHost", 4),  # index into `hosts`
    ("storeTimestampMs", 8),
    ("storeHost", 4),  # index into `hosts`
    ("reconsumeTimes", 4),
    ("preparedTxOffset", 8),
    ("tags", 4),  # index of the row's TAGS pair, -1: none
    ("keys", 4),
    ("uniqKey", 4),
)
cdef enum:
    C_OFFSET = 0
    C_TOTAL = 1
    C_TOPIC = 2
    C_QUEUE_ID = 3
    C_QUEUE_OFFSET = 4
    C_SYS_FLAG = 5
    C_FLAG = 6
    C_BODY_CRC = 7
    C_BORN_TS = 8
    C_BORN_HOST = 9
    C_STORE_TS = 10
    C_STORE_HOST = 11
    C_RECONSUME = 12
    C_PREPARED = 13
    C_TAGS = 14
    C_KEYS = 15
    C_UNIQ = 16
    FIXED_COLUMNS = 17
    # The variable-width ones, after the fixed: Arrow offsets (int32), data.
    C_BODY_OFFSETS = 17
    C_BODY_DATA = 18
    C_PROPS_OFFSETS = 19
    C_KEY_OFFSETS = 20
    C_KEY_DATA = 21
    C_VALUE_OFFSETS = 22
    C_VALUE_DATA = 23
    C_MSGID_OFFSETS = 24
    C_MSGID_DATA = 25
    ALL_COLUMNS = 26

# Why read_log_columns stopped.
cdef enum:
    STOP_END = 0  # at `end` or `stop`: nothing more to read here
    STOP_FULL = 1  # rows_max rows read
    STOP_RECORD = 2  # at a record it does not read: read_record decides what is there
    # Topics looked for among those of the batch by comparing bytes before a dict look-up.
    TOPICS_SCANNED_MAX = 16

LOG_STOP_END = STOP_END
LOG_STOP_FULL = STOP_FULL
LOG_STOP_RECORD = STOP_RECORD


cdef int32_t _host_index(dict seen, list hosts, const unsigned char *p, Py_ssize_t n) except -1:
    cdef bytes raw = PyBytes_FromStringAndSize(<const char *>p, n)
    cdef object found = seen.get(raw)
    if found is None:
        found = len(hosts)
        seen[raw] = found
        hosts.append(raw)
    return found


cdef const char *HEX_DIGITS = b"0123456789ABCDEF"


cdef inline bint _named(const unsigned char *key, Py_ssize_t n, int name) noexcept:
    """Whether key[:n] is PROP_NAMES[name] (_core_dispatch.pxi's TAGS, KEYS, UNIQ_KEY)."""
    return n == PROP_NAME_BYTES[name] and memcmp(key, PROP_NAMES[name], <size_t>n) == 0


def read_log_columns(
    object buf,
    Py_ssize_t pos,
    Py_ssize_t end,
    Py_ssize_t stop,
    int64_t base_offset,
    bint check_crc,
    bint include_body,
    object topics_kept,
    Py_ssize_t rows_max,
):
    """Read the records of buf[pos:end] (whose first byte sits at commit-log offset
    `base_offset`) that start before `stop`, each accepted by every check read_record makes with
    expected_offset = base_offset + its position, into column buffers (LOG_FIXED_COLUMNS, then
    body, properties map, msgId): at most `rows_max` rows, only the records whose topic is in
    `topics_kept` (None: all). Returns (why it stopped, position where it stopped, rows, pairs,
    buffers, topics, hosts): `topics` the distinct topic names the topic column indexes,
    `hosts` the distinct packed born and store hosts the host columns index.

    At LOG_STOP_RECORD, the record at the returned position is one read_record does not return
    as a Record, or one it does whose properties are not ASCII or repeat a key (their map is
    decode_properties' to build): the caller reads it with read_record."""
    cdef _Buffer held = _Buffer(buf)
    cdef Py_ssize_t size = held.view.len
    if pos < 0 or end > size or rows_max < 1:
        raise ValueError(f"read of [{pos}, {end}) over a buffer of {size} bytes")
    cdef const unsigned char *data = <const unsigned char *>held.view.buf
    cdef const unsigned char *p
    cdef const unsigned char *q
    cdef const unsigned char *seg
    cdef Py_ssize_t rows = 0, pairs = 0, i, k, seg_len, sep, first_pair
    cdef int64_t total, header, body_len, at, topic_len, props_len, stored, props_end
    cdef int64_t offset
    cdef int32_t flags, born_len, store_len, store_at, topic_index = -1, tags, keys, uniq
    cdef Frame f
    cdef int why = STOP_END, fail
    cdef bint keep = True, ascii
    cdef list cols = [ColumnBuffer() for _ in range(ALL_COLUMNS)]
    cdef ColumnBuffer body_data = cols[C_BODY_DATA]
    cdef ColumnBuffer key_data = cols[C_KEY_DATA]
    cdef ColumnBuffer value_data = cols[C_VALUE_DATA]
    cdef ColumnBuffer key_offsets = cols[C_KEY_OFFSETS]
    cdef ColumnBuffer value_offsets = cols[C_VALUE_OFFSETS]
    cdef ColumnBuffer msgid_data = cols[C_MSGID_DATA]
    cdef Py_ssize_t key_mark, value_mark, keys_mark, values_mark
    cdef char *fixed[FIXED_COLUMNS]
    cdef int32_t *body_offsets
    cdef int32_t *props_offsets
    cdef int32_t *msgid_offsets
    cdef char *hex_out
    cdef dict topic_of = {}  # raw topic -> index into topic_names, or None: not a topic
    cdef list topic_names = []
    cdef list topic_keep = []
    cdef list topic_raws = []
    cdef Py_ssize_t j
    cdef object last_raw = None
    cdef dict host_of = {}
    cdef list hosts = []
    cdef object last_born = None, last_store = None
    cdef int32_t born_index = 0, store_index = 0
    cdef unsigned char id_bytes[28]
    for i in range(FIXED_COLUMNS):
        fixed[i] = (<ColumnBuffer>cols[i]).reserve(rows_max * LOG_FIXED_COLUMNS[i][1])
    body_offsets = <int32_t *>(<ColumnBuffer>cols[C_BODY_OFFSETS]).reserve((rows_max + 1) * 4)
    props_offsets = <int32_t *>(<ColumnBuffer>cols[C_PROPS_OFFSETS]).reserve((rows_max + 1) * 4)
    msgid_offsets = <int32_t *>(<ColumnBuffer>cols[C_MSGID_OFFSETS]).reserve((rows_max + 1) * 4)
    body_offsets[0] = props_offsets[0] = msgid_offsets[0] = 0
    key_offsets.put_i32(0)
    value_offsets.put_i32(0)
    while True:
        if pos >= end or pos >= stop:
            why = STOP_END
            break
        if rows == rows_max:
            why = STOP_FULL
            break
        why = STOP_RECORD
        # Every check of read_record, as _core_walk.pxi's walk makes them.
        p = data + pos
        if record_frame(p, end - pos, &f):
            break
        total, header, body_len, flags = f.total, f.header, f.body_len, f.flags
        at, topic_len, props_len = f.topic_at, f.topic_len, f.props_len
        born_len = IPV4_HOST_BYTES + (V6_EXTRA_BYTES if flags & BORNHOST_V6 else 0)
        store_len = IPV4_HOST_BYTES + (V6_EXTRA_BYTES if flags & STOREHOST_V6 else 0)
        if not _same(last_raw, p + at, topic_len):
            found = None
            for j in range(min(len(topic_raws), TOPICS_SCANNED_MAX)):
                if _same(topic_raws[j], p + at, topic_len):
                    found = j
                    raw = topic_raws[j]
                    break
            if found is None:
                raw = PyBytes_FromStringAndSize(<const char *>(p + at), topic_len)
                found = topic_of.get(raw, topic_of)
                if found is topic_of:
                    name = _topic_of(raw, &fail)
                    if name is None:
                        found = None
                    else:
                        found = len(topic_names)
                        topic_names.append(name)
                        topic_raws.append(raw)
                        topic_keep.append(topics_kept is None or name in topics_kept)
                    topic_of[raw] = found
                if found is None:
                    break
            last_raw = raw
            topic_index = found
            keep = topic_keep[topic_index]
        if record_tail(p, &f, check_crc, &stored):
            break
        offset = base_offset + pos
        if mq_be_i64(p + PHYSICAL_OFFSET_POS_) != offset:
            break
        if not keep:
            pos += total
            continue
        # The properties: decode_properties' pairs, for ASCII bytes without a repeated key.
        props_end = at + topic_len + 2 + props_len - (RECORD_CRC_BYTES_ if stored >= 0 else 0)
        q = p + at + topic_len + 2
        ascii = True
        for i in range(props_end - (at + topic_len + 2)):
            if q[i] & 0x80:
                ascii = False
                break
        if not ascii:
            break
        key_mark, value_mark = key_data.size, value_data.size
        keys_mark, values_mark = key_offsets.size, value_offsets.size
        first_pair = pairs
        tags = keys = uniq = -1
        seg = q
        k = 0
        while seg + k <= p + props_end:
            if seg + k < p + props_end and seg[k] != 0x02:
                k += 1
                continue
            seg_len = k
            if seg_len >= 3:
                sep = 0
                while sep < seg_len and seg[sep] != 0x01:
                    sep += 1
                if 0 < sep < seg_len - 1:
                    for i in range(first_pair, pairs):
                        if (
                            (<int32_t *>key_offsets.data)[i + 1]
                            - (<int32_t *>key_offsets.data)[i] == sep
                            and memcmp(
                                key_data.data + (<int32_t *>key_offsets.data)[i], seg, sep
                            ) == 0
                        ):
                            ascii = False  # a repeated key: decode_properties' dict decides
                            break
                    if not ascii:
                        break
                    key_data.put(seg, sep)
                    key_offsets.put_i32(<int32_t>key_data.size)
                    value_data.put(seg + sep + 1, seg_len - sep - 1)
                    value_offsets.put_i32(<int32_t>value_data.size)
                    if _named(seg, sep, PROP_TAGS):
                        tags = <int32_t>pairs
                    elif _named(seg, sep, PROP_KEYS):
                        keys = <int32_t>pairs
                    elif _named(seg, sep, PROP_UNIQ):
                        uniq = <int32_t>pairs
                    pairs += 1
            seg += k + 1
            k = 0
        if not ascii:
            key_data.size, value_data.size = key_mark, value_mark
            key_offsets.size, value_offsets.size = keys_mark, values_mark
            pairs = first_pair
            break
        props_offsets[rows + 1] = <int32_t>pairs
        # Hosts: most records carry the same two as the record before.
        store_at = BORN_HOST_POS_ + born_len + TIMESTAMP_BYTES  # the store host
        if not _same(last_born, p + BORN_HOST_POS_, born_len):
            born_index = _host_index(host_of, hosts, p + BORN_HOST_POS_, born_len)
            last_born = hosts[born_index]
        if not _same(last_store, p + store_at, store_len):
            store_index = _host_index(host_of, hosts, p + store_at, store_len)
            last_store = hosts[store_index]
        (<int64_t *>fixed[C_OFFSET])[rows] = offset
        (<int32_t *>fixed[C_TOTAL])[rows] = <int32_t>total
        (<int32_t *>fixed[C_TOPIC])[rows] = topic_index
        (<int32_t *>fixed[C_QUEUE_ID])[rows] = mq_be_i32(p + QUEUE_ID_POS_)
        (<int64_t *>fixed[C_QUEUE_OFFSET])[rows] = mq_be_i64(p + QUEUE_OFFSET_POS_)
        (<int32_t *>fixed[C_SYS_FLAG])[rows] = flags
        (<int32_t *>fixed[C_FLAG])[rows] = mq_be_i32(p + FLAG_POS)
        (<int32_t *>fixed[C_BODY_CRC])[rows] = mq_be_i32(p + BODYCRC_POS)
        (<int64_t *>fixed[C_BORN_TS])[rows] = mq_be_i64(p + BORN_TIMESTAMP_POS)
        (<int32_t *>fixed[C_BORN_HOST])[rows] = born_index
        (<int64_t *>fixed[C_STORE_TS])[rows] = mq_be_i64(p + BORN_HOST_POS_ + born_len)
        (<int32_t *>fixed[C_STORE_HOST])[rows] = store_index
        (<int32_t *>fixed[C_RECONSUME])[rows] = mq_be_i32(p + store_at + store_len)
        (<int64_t *>fixed[C_PREPARED])[rows] = mq_be_i64(p + store_at + store_len + 4)  # after RECONSUMETIMES
        (<int32_t *>fixed[C_TAGS])[rows] = tags
        (<int32_t *>fixed[C_KEYS])[rows] = keys
        (<int32_t *>fixed[C_UNIQ])[rows] = uniq
        if include_body:
            body_data.put(p + header, body_len)
        body_offsets[rows + 1] = <int32_t>body_data.size
        # msgId: offset_msg_id, the store host's ip and port then the offset, in hex.
        memcpy(id_bytes, p + store_at, <size_t>store_len)
        mq_put_be64(id_bytes + store_len, <uint64_t>offset)
        hex_out = msgid_data.reserve(2 * (store_len + 8))
        for i in range(store_len + 8):
            hex_out[2 * i] = HEX_DIGITS[id_bytes[i] >> 4]
            hex_out[2 * i + 1] = HEX_DIGITS[id_bytes[i] & 15]
        msgid_data.size += 2 * (store_len + 8)
        msgid_offsets[rows + 1] = <int32_t>msgid_data.size
        rows += 1
        pos += total
    for i in range(FIXED_COLUMNS):
        (<ColumnBuffer>cols[i]).size = rows * LOG_FIXED_COLUMNS[i][1]
    for i in (C_BODY_OFFSETS, C_PROPS_OFFSETS, C_MSGID_OFFSETS):
        (<ColumnBuffer>cols[i]).size = (rows + 1) * 4
    return why, pos, rows, pairs, cols, topic_names, hosts
