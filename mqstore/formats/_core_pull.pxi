# The pull walk over consume-queue units: included by _core.pyx.
#
#   pull_walk(units, stride, first, wanted, count, total,    where a pull's batch stops in a
#             max_messages, max_pull_bytes, out)             run of units, and what it takes
#       -> (stop, taken, filtered, total)
#
# `units` holds consecutive units from queue offset `first`, `stride` bytes apart, each starting
# with the 20-byte unit of cq_unit.py (phy int64, size int32, tags code int64, big-endian): the
# file store's unit bytes (stride 20) or the rocks store's values (stride 28, a store time
# after the unit). `wanted`: the tag filter's codes, a sorted int64 buffer (empty: no filter).
# `count`, `total`: the units and bytes the batch took before this run. `out`: a writable int64
# buffer of 4 x n rows (n units in the run), where the taken units go as four columns (queue
# offset, phy, size, tags code), the k-th taken at row k of each.
#
# RocketMQ's getMessage walk (rocketmq-store.md §6.2), unit by unit: a blank unit is stepped
# over; before any other unit the batch is full when it holds max_messages, or the unit would
# take it past the byte cap, or it is at the cap already; a unit the filter refuses is counted
# and skipped; the rest are taken. tests/cq/test_pull_decision.py pins it to that walk.

from cpython.buffer cimport PyBUF_WRITABLE


cdef enum:
    PULL_UNIT_BYTES = 20
    PULL_COLUMNS = 4
    UNIT_SIZE_POS = 8
    UNIT_TAGS_POS = 12

cdef int32_t PULL_BLANK_SIZE = 0x7FFFFFFF  # cq_unit.BLANK_SIZE: fillPreBlank's unit


cdef inline bint _wanted(const int64_t *codes, Py_ssize_t n, int64_t code) noexcept nogil:
    """Whether `code` is among the sorted `codes` (a binary search)."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if codes[mid] < code:
            lo = mid + 1
        else:
            hi = mid
    return lo < n and codes[lo] == code


def pull_walk(
    object units,
    Py_ssize_t stride,
    int64_t first,
    object wanted,
    int64_t count,
    int64_t total,
    int64_t max_messages,
    int64_t max_pull_bytes,
    object out,
):
    """(stop, taken, filtered, total): the batch is full at the run's unit `stop` (n: not in
    this run); `taken` units went to `out`, `filtered` were refused by the filter; `total` is
    the batch's bytes after the run."""
    if stride < PULL_UNIT_BYTES:
        raise ValueError(f"a stride of {stride} bytes is shorter than a unit")
    cdef _Buffer held_units = _Buffer(units)
    cdef _Buffer held_wanted = _Buffer(wanted)
    cdef _Buffer held_out = _Buffer(out, PyBUF_WRITABLE)
    cdef Py_ssize_t n = held_units.view.len // stride
    cdef Py_ssize_t n_wanted = held_wanted.view.len // 8
    cdef const unsigned char *p = <const unsigned char *>held_units.view.buf
    cdef const int64_t *codes = <const int64_t *>held_wanted.view.buf
    cdef int64_t *column = <int64_t *>held_out.view.buf
    cdef Py_ssize_t i, stop, taken = 0, filtered = 0
    cdef int64_t phy, tags
    cdef int32_t size
    if held_units.view.len % stride or held_wanted.view.len % 8:
        raise ValueError("units or wanted codes of a length that is not whole entries")
    if held_out.view.len < PULL_COLUMNS * n * 8:
        raise ValueError(f"an out buffer of {held_out.view.len} bytes for {n} units")
    stop = n
    with nogil:
        for i in range(n):
            phy = mq_be_i64(p)
            size = mq_be_i32(p + UNIT_SIZE_POS)
            p += stride
            if size == PULL_BLANK_SIZE and phy == 0:
                continue
            if total >= max_pull_bytes or (
                count > 0 and (count >= max_messages or total + size > max_pull_bytes)
            ):
                stop = i
                break
            tags = mq_be_i64(p - stride + UNIT_TAGS_POS)
            if n_wanted and not _wanted(codes, n_wanted, tags):
                filtered += 1
                continue
            column[taken] = first + i
            column[n + taken] = phy
            column[2 * n + taken] = size
            column[3 * n + taken] = tags
            taken += 1
            count += 1
            total += size
    return stop, taken, filtered, total
