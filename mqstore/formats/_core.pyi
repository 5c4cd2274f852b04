"""Types of the compiled record core (mqstore/formats/_core.pyx)."""

from typing import Final

from mqstore.formats.record import Buffer

QUEUE_ID_POS: Final[int]
QUEUE_OFFSET_POS: Final[int]
PHYSICAL_OFFSET_POS: Final[int]
SYSFLAG_POS: Final[int]
HEADER_V4_V4_SIZE: Final[int]
RECORD_BYTES_MIN: Final[int]
MAGIC_V1: Final[int]
MAGIC_V2: Final[int]
PROPERTIES_END_BYTE: Final[int]
RECORD_CRC_BYTES: Final[int]
RECORD_CRC_HEAD: Final[bytes]
NO_RECORD_CRC: Final[int]
DAMAGED_RECORD_CRC: Final[int]
CRC_FOLDED: Final[bool]

def crc32(data: Buffer, value: int = 0) -> int: ...

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

# _core_encode.pxi

# _core_frames.pxi

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
