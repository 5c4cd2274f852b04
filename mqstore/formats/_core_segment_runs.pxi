# Where a read of commit-log ranges copies from (the log's own Read, storage/segment_reads.
# copy_runs, and a reader beside its writer, LiveLog.read): included by _core.pyx.
#
#   segment_runs(offsets, sizes, starts)      the runs of ranges to copy, or None
#       -> (segments, begins, ends) | None
#
# `offsets`, `sizes`: int64 columns, range i being [offsets[i], offsets[i] + sizes[i]) of the
# commit log, in any order. `starts`: the segments' start offsets, ascending, then the newest
# one's end (storage/segment_reads.LiveLog's listing). None when a size is not positive or a
# range does not lie whole in one listed segment. Otherwise one entry per run of ranges that
# follow each other in one segment (a range starting where the one before ended): the run's
# segment (an index into `starts`) and where it begins and ends in that segment. The pull of
# a thousand records of a queue is a handful of runs; this is the loop over the records that
# LiveLog.read made of some twenty numpy calls. tests/storage/test_segment_reads.py pins it to
# a plain-Python walk of the same rule.


cdef inline Py_ssize_t _segment_of(const int64_t[::1] starts, int64_t offset) noexcept nogil:
    """The index of the last start at or before `offset` (-1: none), a binary search."""
    cdef Py_ssize_t lo = 0, hi = starts.shape[0], mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if starts[mid] <= offset:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def segment_runs(
    const int64_t[::1] offsets, const int64_t[::1] sizes, const int64_t[::1] starts
):
    """(segments, begins, ends) of each run, or None (comment above)."""
    cdef Py_ssize_t n = offsets.shape[0], last = starts.shape[0] - 1
    cdef Py_ssize_t i, k = -1, run_k = -1
    cdef int64_t offset, end, run_begin = 0, run_end = 0
    if sizes.shape[0] != n:
        raise ValueError(f"{n} offsets but {sizes.shape[0]} sizes")
    segments, begins, ends = [], [], []
    for i in range(n):
        offset = offsets[i]
        if sizes[i] <= 0:
            return None
        end = offset + sizes[i]
        if k < 0 or offset < starts[k] or offset >= starts[k + 1]:
            k = _segment_of(starts, offset)
            if k < 0 or k >= last:
                return None
        if end > starts[k + 1]:
            return None
        if k == run_k and offset == run_end:
            run_end = end
            continue
        if run_k >= 0:
            segments.append(run_k)
            begins.append(run_begin - starts[run_k])
            ends.append(run_end - starts[run_k])
        run_k, run_begin, run_end = k, offset, end
    if run_k >= 0:
        segments.append(run_k)
        begins.append(run_begin - starts[run_k])
        ends.append(run_end - starts[run_k])
    return segments, begins, ends
