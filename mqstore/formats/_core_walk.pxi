# The recovery walk (record_columns.scan_run_fast): included by _core.pyx, whose header
# definitions it reads records with.

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
    """scan_run's update for the records of the slot's queue, then the slot freed: each record
    raised the queue's next offset to its queue offset + 1 when that was higher, so together
    they leave it at max(next offset, top + 1), in whatever order they came."""
    cdef dict queues
    if slot.topic != NULL:
        queues = queue_table.setdefault(<object>slot.topic, {})
        if queues.get(slot.queue_id, 0) <= slot.top:
            queues[slot.queue_id] = <object>slot.top + 1  # a Python int: no int64 overflow
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
        raise ValueError(f"walk of [{pos}, {end}) over a buffer of {size} bytes")
    cdef const unsigned char *data = <const unsigned char *>held.view.buf
    cdef const unsigned char *p
    cdef Py_ssize_t count = 0
    cdef int fail
    cdef int64_t stored, queue_offset
    cdef int32_t queue_id
    cdef Frame f
    cdef dict topics = {}
    cdef dict table = queue_table
    cdef bytes last_raw = None
    cdef bytes raw
    cdef object topic = None
    cdef QueueSlot slots[QUEUE_SLOTS]
    cdef QueueSlot *slot
    cdef Py_ssize_t i
    memset(slots, 0, sizeof(slots))
    while pos < end:
        p = data + pos
        if record_frame(p, end - pos, &f):
            break  # a blank, or no record
        if not _same(last_raw, p + f.topic_at, f.topic_len):
            raw = PyBytes_FromStringAndSize(<const char *>(p + f.topic_at), f.topic_len)
            name = topics.get(raw, topics)
            if name is topics:
                name = topics[raw] = _topic_of(raw, &fail)
            if name is None:
                break
            last_raw = raw
            topic = name
        if record_tail(p, &f, check_crc, &stored):
            break
        if mq_be_i64(p + PHYSICAL_OFFSET_POS_) != base_offset + pos:
            break
        if table is not None and base_offset + pos >= apply_from and _gets_queue_offset(f.flags):
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
        pos += f.total
        count += 1
    if table is not None:
        for i in range(QUEUE_SLOTS):
            _flush(table, &slots[i])
    return pos, count
