"""`mqstore log`: offline tools over mqstore's (and RocketMQ's) commit-log files.

    mqstore log dump DIR [--from OFFSET] [--limit N] [--body base64|text|none] [--blanks]
    mqstore log verify DIR

Nothing here writes to a store or takes its lock: the tools read files directly
(mqstore.storage.logreader) and work beside a running store.

Exit codes: 0 success; 1 the data failed a check (verify found a bad record); 2 usage errors,
including a directory that cannot be read as a commit log (missing, empty, mixed file sizes).
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any, Final

import click

from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.record import Record, body_crc, unpack_host
from mqstore.storage.logreader import (
    BadEntry,
    BlankEntry,
    LogDir,
    LogDirError,
    RecordEntry,
)

EXIT_OK: Final = 0
EXIT_BAD_DATA: Final = 1
EXIT_USAGE: Final = 2

BODY_MODES: Final = ("base64", "text", "none")


class DirectoryUnreadable(click.ClickException):
    """A directory that does not form a commit log: a usage error (exit 2), not bad data."""

    exit_code = EXIT_USAGE


def _open_log(directory: str) -> LogDir:
    try:
        return LogDir(directory)
    except LogDirError as exc:
        raise DirectoryUnreadable(str(exc)) from exc


def format_host(raw: bytes) -> str:
    """IPv4 hosts as ip:port, IPv6 hosts as [ip]:port (the brackets keep the port apart)."""
    ip, port = unpack_host(raw)
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def record_fields(offset: int, record: Record, body_mode: str) -> dict[str, Any]:
    """One record as the JSON object `log dump` prints."""
    body = record.body
    if body_mode == "base64":
        body_out: str | None = base64.b64encode(body).decode("ascii")
    elif body_mode == "text":
        body_out = body.decode("utf-8", "replace")
    else:
        body_out = None
    return {
        "offset": offset,
        "total_size": record.total_size,
        "version": 2 if record.v2 else 1,
        "body_crc": record.body_crc,
        # As the store checks it: an empty body is not checked (RocketMQ's rule).
        "crc_ok": not body or body_crc(body) == record.body_crc,
        "queue_id": record.queue_id,
        "flag": record.flag,
        "queue_offset": record.queue_offset,
        "physical_offset": record.physical_offset,
        "sys_flag": record.sys_flag,
        "born_timestamp_ms": record.born_timestamp_ms,
        "born_host": format_host(record.born_host),
        "store_timestamp_ms": record.store_timestamp_ms,
        "store_host": format_host(record.store_host),
        "reconsume_times": record.reconsume_times,
        "prepared_tx_offset": record.prepared_tx_offset,
        "topic": record.topic,
        "properties": record.properties_dict(),
        "body": body_out,
        "msg_id": offset_msg_id(record.store_host, offset),
    }


def bad_fields(entry: BadEntry, body_mode: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if entry.record is not None:
        out.update(record_fields(entry.offset, entry.record, body_mode))
    out.update(
        {
            "offset": entry.offset,
            "bad": True,
            "reason": entry.reason,
            "next_offset": entry.next_offset,
        }
    )
    return out


# -------------------------------------------------------------------------------------------


@click.group("log")
def log_group() -> None:
    """Read a commit-log directory: the segment files named by their 20-digit start offset.

    DIR is that directory (mqstore: DATA_DIR/commitlog; RocketMQ: ~/store/commitlog). A store's
    root directory works too: its commitlog/ subdirectory is used when DIR holds no segments
    itself. Segment size comes from the files (RocketMQ's are 1 GiB); all must be equal.

    \b
    Examples:
      mqstore log verify ./data/commitlog
      mqstore log dump ./data/commitlog --limit 10 --body text
      mqstore log dump ~/store/commitlog --from 1073741824 | jq .topic
    """


@log_group.command("dump")
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--from",
    "from_offset",
    type=click.IntRange(min=0),
    default=None,
    metavar="OFFSET",
    help="Start at this commit-log offset: a record's `offset` as printed by an earlier dump "
    "(an offset inside a record prints as bad bytes up to the next record). "
    "Default: the first file.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Stop after N lines (records and bad entries). Default: no limit.",
)
@click.option(
    "--body",
    "body_mode",
    type=click.Choice(BODY_MODES),
    default="base64",
    show_default=True,
    help="How to print message bodies: base64 (exact bytes), text (UTF-8, undecodable bytes "
    "become U+FFFD) or none (null). Compressed bodies (sys_flag bit 0x1) are printed as stored.",
)
@click.option(
    "--blanks",
    is_flag=True,
    help='Also print the end-of-file blanks, as {"offset", "blank": true, "total_size"}.',
)
def dump(
    directory: str, from_offset: int | None, limit: int | None, body_mode: str, blanks: bool
) -> None:
    """Print every record of DIR as JSON lines, one object per record.

    \b
    Each record has: offset, total_size, version (1|2), body_crc, crc_ok, queue_id, flag,
    queue_offset, physical_offset, sys_flag, born_timestamp_ms, born_host, store_timestamp_ms,
    store_host, reconsume_times, prepared_tx_offset, topic, properties, body and msg_id (the
    offset message id: store host + offset, as RocketMQ builds it). Hosts print as ip:port,
    or [ip]:port for IPv6.

    \b
    Bytes that are not a valid record print as
      {"offset": ..., "bad": true, "reason": "...", "next_offset": ...}
    where next_offset is where reading went on (null: nothing valid follows). A record that
    parses but fails its body CRC or offset check carries all its fields too, with "bad": true
    (and "crc_ok": false for a CRC mismatch). dump exits 0 even when it printed bad entries;
    use `mqstore log verify` for a pass/fail answer.
    """
    log = _open_log(directory)
    out = sys.stdout
    printed = 0
    if limit == 0:
        return
    entries = log.scan(from_offset, check_crc=True)
    try:
        for entry in entries:
            if isinstance(entry, RecordEntry):
                obj = record_fields(entry.offset, entry.record, body_mode)
            elif isinstance(entry, BlankEntry):
                if not blanks:
                    continue
                obj = {"offset": entry.offset, "blank": True, "total_size": entry.total_size}
            else:
                obj = bad_fields(entry, body_mode)
            out.write(json.dumps(obj, separators=(",", ":")) + "\n")
            printed += 1
            if limit is not None and printed >= limit:
                break
    finally:
        entries.close()  # unmaps the segment at once, not when the generator is collected
    out.flush()


@log_group.command("verify")
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.pass_context
def verify(ctx: click.Context, directory: str) -> None:
    """Check every record of DIR; exit 1 naming the first bad offset.

    A record passes when its magic code, lengths, body CRC and physical-offset field (which
    must equal its position) are right; every file must end in an end-of-file blank, except
    the newest, whose last record is followed by zeros. Prints one summary line.

    \b
    Exit status:
      0  every record is valid
      1  bad bytes were found; stderr names the first bad offset and why
         (a torn last record, as a crash leaves it, counts: recovery would cut it)
      2  DIR is missing or is not a commit-log directory (no segments, mixed sizes)
    """
    log = _open_log(directory)
    records = 0
    record_bytes = 0
    first_bad: BadEntry | None = None
    bad_ranges = 0
    end = log.min_offset
    for entry in log.scan(None, check_crc=True):
        if isinstance(entry, RecordEntry):
            records += 1
            record_bytes += entry.record.total_size
            end = entry.offset + entry.record.total_size
        elif isinstance(entry, BlankEntry):
            end = entry.offset + entry.total_size
        else:
            first_bad = first_bad or entry
            bad_ranges += 1
            end = entry.next_offset if entry.next_offset is not None else entry.offset
    files = len(log.segments)
    summary = (
        f"{records} records, {record_bytes} bytes in {files} files of {log.file_bytes} bytes, "
        f"offsets [{log.min_offset}, {end})"
    )
    if first_bad is None:
        click.echo(f"ok: {summary}")
        return
    click.echo(f"BAD: {summary}, {bad_ranges} bad range(s)")
    click.echo(
        f"mqstore log verify: first bad offset {first_bad.offset} in {log.directory}: "
        f"{first_bad.reason}",
        err=True,
    )
    ctx.exit(EXIT_BAD_DATA)
