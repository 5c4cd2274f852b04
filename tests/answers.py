"""The records of a Read, Pull or Receive answer, one bytes each (the answer carries them laid
end to end in records_blob, each one's size in record_sizes; b"" where a Read's range was not
served)."""

from __future__ import annotations

from typing import Any

from mqstore.formats.record_columns import split_records


def records_of(answer: Any) -> list[bytes]:
    """`answer`'s records cut out of its blob; the sizes must add up to the blob."""
    sizes = list(answer.record_sizes)
    assert sum(sizes) == len(answer.records_blob), (sizes, len(answer.records_blob))
    return split_records(answer.records_blob, sizes)
