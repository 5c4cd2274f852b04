# Encode batches of records (record_batch.BatchEncoder.encode): included by _core.pyx, whose
# header definitions it writes records with.

from cpython.bytes cimport PyBytes_CheckExact
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cdef enum:
    HEADER_BYTES_MAX = HEADER_V4_V4_BYTES + 2 * V6_EXTRA_BYTES
    QUEUE_SLOTS_ENCODE = 16  # the queues of one batch counted in C before the dict is written


cdef struct Item:
    const unsigned char *body
    const unsigned char *props
    Py_ssize_t body_len
    Py_ssize_t props_len
    int64_t size  # 0: refused
    int64_t queue_offset
    int32_t queue_id
    int32_t sys_flag
    Py_ssize_t batch  # its batch's Shared


cdef struct Shared:
    # What the records of one batch share: the header but its first 40 bytes and BODYLENGTH
    # (MAGICCODE and FLAG in place), and the topic's length field and bytes.
    unsigned char header[HEADER_BYTES_MAX]
    Py_ssize_t header_len
    const unsigned char *prefix
    Py_ssize_t prefix_len


cdef struct QueueNext:
    int32_t queue_id
    int64_t next


cdef const unsigned char *_bytes_of(object item, list keep, Py_ssize_t *length) except NULL:
    """The bytes of a body or properties blob (a copy kept alive in `keep` when not bytes)."""
    if not PyBytes_CheckExact(item):
        item = bytes(item)
        keep.append(item)
    length[0] = PyBytes_GET_SIZE(item)
    return <const unsigned char *>PyBytes_AS_STRING(item)


cdef struct Queues:
    # The next queue offsets of one topic while a batch takes them: counted in C slots, and
    # written to the topic's dict (`queues`, borrowed; NULL until a message takes one) when the
    # slots are full and at the end of the batch.
    PyObject *queues
    int used
    QueueNext slots[QUEUE_SLOTS_ENCODE]


cdef int64_t _take(Queues *q, dict table, object topic, int32_t queue_id) except -1:
    cdef int i
    cdef int64_t offset
    for i in range(q.used):
        if q.slots[i].queue_id == queue_id:
            offset = q.slots[i].next
            q.slots[i].next = offset + 1
            return offset
    if q.queues == NULL:
        queues = table.setdefault(topic, {})
        q.queues = <PyObject *>queues  # held by the table
    if q.used == QUEUE_SLOTS_ENCODE:
        _give_back(q)
    offset = (<dict>q.queues).get(queue_id, 0)
    q.slots[q.used].queue_id = queue_id
    q.slots[q.used].next = offset + 1
    q.used += 1
    return offset


cdef int _give_back(Queues *q) except -1:
    cdef int i
    for i in range(q.used):
        (<dict>q.queues)[<object>q.slots[i].queue_id] = <object>q.slots[i].next
    q.used = 0
    return 0


cdef inline void _write_crc_property(unsigned char *record_end, uint32_t crc) noexcept nogil:
    """The property holding `crc`: its head, ten digits least significant first, 0x02."""
    cdef unsigned char *p = record_end - RECORD_CRC_BYTES_
    cdef int i
    memcpy(p, RECORD_CRC_HEAD_, RECORD_CRC_HEAD_BYTES)
    for i in range(RECORD_CRC_DIGITS_):
        p[RECORD_CRC_HEAD_BYTES + i] = 48 + crc % 10
        crc //= 10
    p[RECORD_CRC_BYTES_ - 1] = PROPERTIES_END_BYTE_


cdef void _write_records(
    const Item *items,
    Py_ssize_t count,
    const Shared *shared,
    unsigned char *out,
    int64_t base_offset,
    int64_t reserved,
    bint record_crc,
) noexcept nogil:
    """Write the accepted items back to back from out[0] (commit-log offset base_offset)."""
    cdef Py_ssize_t i, pos = 0
    cdef const Item *it
    cdef const Shared *sh
    cdef unsigned char *p
    cdef uint32_t crc
    for i in range(count):
        it = &items[i]
        if it.size == 0:
            continue
        sh = &shared[it.batch]
        p = out + pos
        memcpy(p, sh.header, sh.header_len - 4)
        mq_put_be32(p + TOTALSIZE_POS, <uint32_t>it.size)
        crc = mq_crc32(0, it.body, <size_t>it.body_len) & CRC_MASK
        mq_put_be32(p + BODYCRC_POS, crc)
        mq_put_be32(p + QUEUE_ID_POS_, <uint32_t>it.queue_id)
        mq_put_be64(p + QUEUE_OFFSET_POS_, <uint64_t>it.queue_offset)
        mq_put_be64(p + PHYSICAL_OFFSET_POS_, <uint64_t>(base_offset + pos))
        mq_put_be32(p + SYSFLAG_POS_, <uint32_t>it.sys_flag)
        mq_put_be32(p + sh.header_len - 4, <uint32_t>it.body_len)
        p += sh.header_len
        memcpy(p, it.body, it.body_len)
        p += it.body_len
        memcpy(p, sh.prefix, sh.prefix_len)
        p += sh.prefix_len
        mq_put_be16(p, <uint16_t>(it.props_len + reserved))
        if it.props_len:
            memcpy(p + 2, it.props, it.props_len)
        if record_crc:
            crc = mq_crc32(0, out + pos, <size_t>(it.size - RECORD_CRC_BYTES_)) & CRC_MASK
            _write_crc_property(out + pos + it.size, crc)
        pos += it.size


def encode(
    list batches,
    bytes store_host,
    int64_t store_timestamp_ms,
    int64_t base_offset,
    dict queue_table,
    bint record_crc,
    int64_t body_bytes_max,
    int64_t properties_bytes_max,
    int64_t queue_id_max,
    int64_t record_bytes_max,
):
    """Encode the messages of `batches` as consecutive records starting at commit-log offset
    `base_offset`, each exactly as record.encode_record writes it, and take their queue offsets
    from `queue_table` (topic -> {queue id -> next offset}) as the store assigns them.

    Each batch is a tuple (topic, first message number, bodies, queue ids, properties or None,
    sys flags or None, sys flag, flag, born timestamp, born host, reconsume times, prepared tx
    offset, topic prefix (its length field and bytes) or None when the topic is refused, V2
    magic, anything). `properties_bytes_max` is the limit less the CRC property's bytes when
    `record_crc`; `record_bytes_max` the largest whole record.

    Returns (records, offsets, sizes, queue offsets, sys flags) of the encoded messages and the
    refused ones as (message number, why, record size): why is "columns" (the batch's differ in
    length) or names prepare_message's first check that fails ("body", "topic", "queue_id",
    "properties_size", "properties_shape", "born_host", "record_size"). A refused message takes
    no queue offset."""
    cdef Py_ssize_t count = 0, n, k, b, pos = 0, total = 0
    cdef Shared *sh
    cdef int64_t reserved = RECORD_CRC_BYTES_ if record_crc else 0
    cdef Py_ssize_t store_len = PyBytes_GET_SIZE(store_host)
    if store_len != 8 and store_len != 20:
        raise ValueError("store host must be 8 or 20 bytes")
    for batch in batches:
        count += len(<list>batch[2])
    cdef Item *items = <Item *>malloc(max(count, 1) * sizeof(Item))
    cdef Shared *shared = <Shared *>malloc(max(len(batches), 1) * sizeof(Shared))
    if items == NULL or shared == NULL:
        free(items)
        free(shared)
        raise MemoryError()
    cdef list keep = []
    cdef list refused = []
    cdef list offsets = [], sizes = [], queue_offsets = [], sys_flags = []
    cdef list bodies, queue_ids
    cdef Item *it
    cdef int64_t queue_id, size, offset
    cdef int32_t v6_bits, sys_flag
    cdef int overflow
    cdef Py_ssize_t header_len, born_len, prefix_len, index
    cdef bint topic_ok, born_ok
    cdef bytes blob
    cdef unsigned char *out
    cdef unsigned char *p
    cdef Queues queues
    try:
        # Pass 1: check every message, size the accepted ones.
        it = items
        for batch in batches:
            index = batch[1]
            bodies = batch[2]
            queue_ids = batch[3]
            props = batch[4]
            flags = batch[5]
            prefix = batch[12]
            n = len(bodies)
            if len(queue_ids) != n or (props is not None and len(props) != n) or (
                flags is not None and len(flags) != n
            ):
                for k in range(n):
                    refused.append((index + k, "columns", 0))
                    it.size = 0
                    it += 1
                continue
            born_len = len(batch[9])
            born_ok = born_len == 8 or born_len == 20
            topic_ok = prefix is not None
            prefix_len = PyBytes_GET_SIZE(prefix) if topic_ok else 0
            header_len = HEADER_V4_V4_BYTES + (born_len - 8 if born_ok else 0) + store_len - 8
            v6_bits = (BORNHOST_V6 if born_len == 20 else 0) | (
                STOREHOST_V6 if store_len == 20 else 0
            )
            sys_flag = ((<int32_t>batch[6]) & ~(BORNHOST_V6 | STOREHOST_V6)) | v6_bits
            # The shared fields' types, here: pass 2 must not fail once it takes queue offsets.
            scalars = (<int32_t>batch[7], <int64_t>batch[8], <int32_t>batch[10], <int64_t>batch[11])
            for k in range(n):
                it.body = _bytes_of(bodies[k], keep, &it.body_len)
                if props is None:
                    it.props = NULL
                    it.props_len = 0
                else:
                    it.props = _bytes_of(props[k], keep, &it.props_len)
                if flags is not None:
                    sys_flag = ((<int32_t>flags[k]) & ~(BORNHOST_V6 | STOREHOST_V6)) | v6_bits
                it.sys_flag = sys_flag
                queue_id = PyLong_AsLongLongAndOverflow(queue_ids[k], &overflow)
                if overflow:
                    queue_id = -1
                size = (
                    header_len + it.body_len + prefix_len + 2 + it.props_len + reserved
                )
                # prepare_message's checks in its order: the first that fails names the refusal.
                why = None
                if it.body_len > body_bytes_max:
                    why = "body"
                elif not topic_ok:
                    why = "topic"
                elif queue_id < 0 or queue_id > queue_id_max:
                    why = "queue_id"
                elif it.props_len > properties_bytes_max:
                    why = "properties_size"
                elif it.props_len and it.props[it.props_len - 1] != PROPERTIES_END_BYTE_:
                    why = "properties_shape"
                elif not born_ok:
                    why = "born_host"
                elif size > record_bytes_max:
                    why = "record_size"
                if why is not None:
                    refused.append((index + k, why, size))
                    it.size = 0
                else:
                    it.queue_id = <int32_t>queue_id
                    it.size = size
                    total += size
                it += 1

        # Pass 2, holding the GIL: the queue offsets, and the shared fields of each batch.
        blob = PyBytes_FromStringAndSize(NULL, total)
        it = items
        for b in range(len(batches)):
            batch = batches[b]
            n = len(<list>batch[2])
            prefix = batch[12]
            born_len = len(batch[9])
            if prefix is None or (born_len != 8 and born_len != 20):
                it += n
                continue
            sh = &shared[b]
            sh.prefix = <const unsigned char *>PyBytes_AS_STRING(prefix)
            sh.prefix_len = PyBytes_GET_SIZE(prefix)
            sh.header_len = HEADER_V4_V4_BYTES + born_len - 8 + store_len - 8
            mq_put_be32(sh.header + MAGIC_POS, <uint32_t>(MAGIC_V2_ if batch[13] else MAGIC_V1_))
            mq_put_be32(sh.header + FLAG_POS, <uint32_t><int32_t>batch[7])
            p = sh.header + BORN_TIMESTAMP_POS
            mq_put_be64(p, <uint64_t><int64_t>batch[8])
            memcpy(p + 8, PyBytes_AS_STRING(batch[9]), born_len)
            p += 8 + born_len
            mq_put_be64(p, <uint64_t>store_timestamp_ms)
            memcpy(p + 8, PyBytes_AS_STRING(store_host), store_len)
            p += 8 + store_len
            mq_put_be32(p, <uint32_t><int32_t>batch[10])
            mq_put_be64(p + 4, <uint64_t><int64_t>batch[11])
            queues.queues = NULL
            queues.used = 0
            topic = batch[0]
            for k in range(n):
                if it.size:
                    it.batch = b
                    if _gets_queue_offset(it.sys_flag):
                        it.queue_offset = _take(&queues, queue_table, topic, it.queue_id)
                    else:
                        it.queue_offset = 0
                    offsets.append(base_offset + pos)
                    sizes.append(it.size)
                    queue_offsets.append(it.queue_offset)
                    sys_flags.append(it.sys_flag)
                    pos += it.size
                it += 1
            _give_back(&queues)
        # Pass 3, without the GIL (the service's other threads run): write the records, each
        # one's CRC once its fields are final.
        out = <unsigned char *>PyBytes_AS_STRING(blob)
        with nogil:
            _write_records(items, count, shared, out, base_offset, reserved, record_crc)
    finally:
        free(items)
        free(shared)
    return blob, offsets, sizes, queue_offsets, sys_flags, refused
