"""Types of the compiled record core (mqstore/formats/_core.pyx)."""

import mmap
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, Final, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from mqstore.formats.record import Buffer

_T = TypeVar("_T")

QUEUE_ID_POS: Final[int]
QUEUE_OFFSET_POS: Final[int]
PHYSICAL_OFFSET_POS: Final[int]
SYSFLAG_POS: Final[int]
BORN_HOST_POS: Final[int]
HEADER_V4_V4_SIZE: Final[int]
RECORD_BYTES_MIN: Final[int]
MAGIC_V1: Final[int]
MAGIC_V2: Final[int]
PROPERTIES_END_BYTE: Final[int]
RECORD_CRC_BYTES: Final[int]
RECORD_CRC_HEAD: Final[bytes]
NO_RECORD_CRC: Final[int]
DAMAGED_RECORD_CRC: Final[int]

def crc32(data: Buffer, value: int = 0) -> int: ...
def crc32c(data: Buffer) -> int: ...

# _core_walk.pxi

def walk(
    buf: Buffer,
    pos: int,
    end: int,
    base_offset: int,
    check_crc: bool,
    queue_table: dict[str, dict[int, int]] | None,
    apply_from: int,
) -> tuple[int, int]: ...

# _core_check.pxi

CHECK_COLUMNS: Final[int]

def check(
    blob: Buffer,
    sizes: object,
    expected_offsets: object,
    bodies: bool,
    check_crc: bool = True,
) -> tuple[bytearray, list[bytes] | None, list[tuple[int, int, int, int]], int]: ...
def chain(buf: Buffer, pos: int, end: int, base_offset: int) -> tuple[memoryview, int]: ...

# the SDK's Messages of a checked run (client/message.py MessageRun.made)

def lazy_messages(
    cls: type[_T],
    bodies: list[bytes],
    blobs: list[bytes],
    starts: list[int],
    ends: list[int],
    start: int,
    stop: int,
) -> list[_T]: ...

# _core_encode.pxi

def encode(
    batches: list[tuple[Any, ...]],
    store_host: bytes,
    store_timestamp_ms: int,
    base_offset: int,
    queue_table: dict[str, dict[int, int]],
    record_crc: bool,
    body_bytes_max: int,
    properties_bytes_max: int,
    queue_id_max: int,
    record_bytes_max: int,
) -> tuple[bytes, list[int], list[int], list[int], list[int], list[tuple[int, str, int]]]: ...

# _core_frames.pxi

def time_entries_ok(units: Buffer, entries: Buffer) -> bytearray: ...

Int64s = npt.NDArray[np.int64] | Buffer | array[int]  # int64 columns, native order

def queue_runs(
    topic_indexes: Int64s, queue_ids: Int64s, sys_flags: Int64s
) -> tuple[list[tuple[int, int]], bytearray, bytearray]: ...

# (start, next queue offset, first and last written commit-log offset, last size, last time)
RunEnd = tuple[int, int, int, int, int, int]

class RunState(Protocol):
    """A queue's state before a frame's run, as pack_runs reads it."""

    @property
    def max_offset(self) -> int: ...  # the next queue offset
    @property
    def last_phy_end(self) -> int: ...  # where the newest unit's record ends in the log
    @property
    def last_time_ms(self) -> int: ...  # the newest unit's indexed time

def pack_runs(
    rows: Int64s,
    bounds: Int64s,
    queue_offsets: Int64s,
    offsets: Int64s,
    sizes: Int64s,
    tags_codes: Int64s,
    store_timestamps_ms: Int64s,
    states: Sequence[RunState],
    prefixes: list[bytes] | None = None,
) -> tuple[list[RunEnd], list[bytes], list[bytes]]: ...
def pack_units(
    rows: Int64s,
    start: int,
    offsets: Int64s,
    sizes: Int64s,
    tags_codes: Int64s,
    store_timestamps_ms: Int64s,
    last_time: int,
) -> tuple[bytes, bytes, int]: ...

class WireError(ValueError): ...

def decode_response(
    data: Buffer,
) -> (
    tuple[int, int, list[str], list[bytearray], tuple[bytes, bytes], tuple[bytes, bytes], bytes]
    | None
): ...

# _core_arrow.pxi

class ColumnBuffer:
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

LOG_FIXED_COLUMNS: Final[tuple[tuple[str, int], ...]]
LOG_STOP_END: Final[int]
LOG_STOP_FULL: Final[int]
LOG_STOP_RECORD: Final[int]

def read_log_columns(
    buf: Buffer,
    pos: int,
    end: int,
    stop: int,
    base_offset: int,
    check_crc: bool,
    include_body: bool,
    topics_kept: frozenset[str] | None,
    rows_max: int,
) -> tuple[int, int, int, int, list[ColumnBuffer], list[str], list[bytes]]: ...

# _core_pull.pxi

def pull_walk(
    units: Buffer,
    stride: int,
    first: int,
    wanted: Int64s,
    count: int,
    total: int,
    max_messages: int,
    max_pull_bytes: int,
    out: npt.NDArray[np.int64],
) -> tuple[int, int, int, int]: ...

# _core_pull_answer.pxi
def pull_answer_wire(
    queue_offsets: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> bytes: ...

# _core_segment_runs.pxi
def segment_runs(
    offsets: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64], starts: npt.NDArray[np.int64]
) -> tuple[list[int], list[int], list[int]] | None: ...

# _core_dispatch.pxi

DISPATCH_END: Final[int]
DISPATCH_PAST: Final[int]
DISPATCH_RECORD: Final[int]

def dispatch_columns(
    buf: Buffer,
    pos: int,
    limit: int,
    readable: int,
    base_offset: int,
    topic_index: dict[bytes, int],
    topics: list[str],
    include_keys: bool,
    rows_max: int,
    bytes_max: int,
) -> tuple[int, int, int, int, bytes, bytes]: ...

class HeldProperties(Protocol):
    @property
    def tags_codes(self) -> list[int]: ...
    @property
    def keys(self) -> list[str]: ...
    @property
    def uniq_keys(self) -> list[str]: ...

class HeldRun(Protocol):
    """What dispatch_of_runs reads of commitlog_svc/append_frames.py's AppendedRun."""

    @property
    def offsets(self) -> list[int]: ...
    @property
    def topics(self) -> list[str]: ...
    @property
    def topic_indexes(self) -> list[int] | None: ...
    @property
    def queue_ids(self) -> list[int]: ...
    @property
    def queue_offsets(self) -> list[int]: ...
    @property
    def sizes(self) -> list[int]: ...
    @property
    def store_timestamp_ms(self) -> int: ...
    @property
    def sys_flags(self) -> list[int]: ...
    @property
    def props(self) -> HeldProperties: ...

class HeldSlice(Protocol):
    @property
    def run(self) -> HeldRun: ...
    @property
    def lo(self) -> int: ...
    @property
    def hi(self) -> int: ...

def dispatch_of_runs(
    slices: Iterable[HeldSlice],
    include_keys: bool,
    start_offset: int,
    next_offset: int,
    records: list[bytes],
) -> bytes: ...
def dispatch_tail(
    start_offset: int,
    next_offset: int,
    topics: list[str],
    corrupt_starts: list[int],
    corrupt_ends: list[int],
) -> bytes: ...
def dispatch_frame(pieces: tuple[bytes, ...]) -> bytes: ...
def property_columns(blobs: Iterable[bytes]) -> tuple[list[int], list[str], list[str]]: ...

# _core_ids.pxi
def uniq_ids(head: str, first: int, n: int) -> list[str]: ...
def uniq_properties(prefix: bytes, uniq_keys: list[str]) -> list[bytes]: ...
def malformed_properties(blobs: Iterable[bytes]) -> list[int]: ...

# _core_append.pxi
def append_request_wire(
    producer_id: str,
    sequence: int,
    batches: list[tuple[str, list[int], list[bytes], list[bytes], list[int], int]],
) -> bytes: ...
def append_response_wire(
    statuses: list[int],
    offsets: list[int],
    sizes: list[int],
    queue_offsets: list[int],
    store_timestamp_ms: int,
    store_host: bytes,
    refusals: list[tuple[int, int, str, str]],
    duplicate: bool,
    sequence: int,
) -> bytes: ...
def share_bounds(
    bodies: list[bytes],
    properties: list[bytes],
    overhead: int,
    share_messages: int,
    share_bytes: int,
) -> list[tuple[int, int, int]]: ...
def read_append_response(
    data: bytes,
) -> tuple[
    list[int],
    list[int],
    list[int],
    list[int],
    int,
    bytes,
    list[tuple[int, int, str, str]],
    bool,
    int,
    tuple[int, str, str] | None,
]: ...
def read_append_request(
    data: bytes,
) -> tuple[
    list[tuple[str, list[int], list[bytes], list[bytes], list[int], int, int, int, str, int, int]],
    str,
    int,
]: ...
def widest_bytes(items: list[Any]) -> int: ...

# _core_index.pxi
def java_hashes(keys: list[str]) -> bytes: ...
def java_hashes_utf8(
    data: npt.NDArray[np.uint8] | bytes, offsets: npt.NDArray[np.int64]
) -> bytes: ...
def index_message_keys(
    prefixes: list[str],
    topic_indexes: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    uniq_data: bytes,
    uniq_offsets: npt.NDArray[np.int64],
    keys_data: bytes,
    keys_offsets: npt.NDArray[np.int64],
) -> tuple[bytes, bytes]: ...
def index_put_keys(
    buf: bytearray | memoryview | mmap.mmap,
    slot_num: int,
    count: int,
    begin_ts_ms: int,
    key_hashes: npt.NDArray[np.int64],
    phys: npt.NDArray[np.int64],
    store_ts_ms: npt.NDArray[np.int64],
) -> tuple[int, int]: ...
def index_rows(
    offsets: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    sys_flags: npt.NDArray[np.int64],
    applied: int,
) -> tuple[bytes, int]: ...
