"""`mqstore log`: offline tools over mqstore's (and RocketMQ's) commit-log files.

    mqstore log dump DIR [--from OFFSET] [--limit N] [--body base64|text|none] [--blanks]
    mqstore log verify DIR

Nothing here writes to a store or takes its lock: the tools read files directly
(mqstore.storage.logreader) and work beside a running store.

Exit codes: 0 success; 1 the data failed a check (verify found a bad record); 2 usage errors,
including a directory that cannot be read as a commit log (missing, empty, mixed file sizes).

A record that carries the whole-record CRC (mqstore's since it has it; RocketMQ's with its
enabledAppendPropCRC) is checked by it, so a changed byte in any field is found, and verify
names the field when one changed byte explains the damage (formats/record_damage.py). A record
without it is checked by its body CRC alone; verify counts both kinds.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any, Final

import click

from mqstore.errors import InvalidArgument
from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.record import (
    BODY_CRC_MISMATCH,
    RECORD_CRC_DAMAGED,
    RECORD_CRC_MISMATCH,
    Record,
    unpack_host,
)
from mqstore.formats.record_damage import DamageSite
from mqstore.storage.layout import store_parts
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
# The reasons of read_record's CRC verdicts: a record that fails one shows "crc_ok": false.
_CRC_FAILURES: Final = frozenset({BODY_CRC_MISMATCH, RECORD_CRC_MISMATCH, RECORD_CRC_DAMAGED})
# verify lists at most this many bad ranges on stderr (a damaged region can hold thousands).
VERIFY_LISTED_MAX: Final = 50


class DirectoryUnreadable(click.ClickException):
    """A directory that does not form a commit log: a usage error (exit 2), not bad data."""

    exit_code = EXIT_USAGE


def segments_dir(directory: str) -> str:
    """Where the segment files of DIR are: DIR may be the data dir `mqstore up` made, a
    service's data dir, or the segments' own directory (storage/layout.py). With several
    replicas under DIR, which to read is the user's choice (a usage error naming them)."""
    parts = store_parts(directory)
    if parts.commitlog is None and parts.commitlog_replicas:
        try:
            parts.require_commitlog(directory)
        except InvalidArgument as exc:
            raise DirectoryUnreadable(str(exc)) from None
    return parts.commitlog or directory


def _open_log(directory: str) -> LogDir:
    try:
        return LogDir(segments_dir(directory))
    except LogDirError as exc:
        raise DirectoryUnreadable(str(exc)) from exc


def format_host(raw: bytes) -> str:
    """IPv4 hosts as ip:port, IPv6 hosts as [ip]:port (the brackets keep the port apart)."""
    ip, port = unpack_host(raw)
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def record_fields(
    offset: int, record: Record, body_mode: str, *, crc_ok: bool = True
) -> dict[str, Any]:
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
        # The whole-record CRC (null: the record has none, only its body CRC is checked).
        "record_crc": record.record_crc if record.record_crc >= 0 else None,
        # As the store checks it: the whole-record CRC, else the body CRC (not for an empty
        # body: RocketMQ's rule).
        "crc_ok": crc_ok,
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


def bad_fields(entry: BadEntry, body_mode: str, damage: DamageSite | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if entry.record is not None:
        crc_ok = entry.reason not in _CRC_FAILURES
        out.update(record_fields(entry.offset, entry.record, body_mode, crc_ok=crc_ok))
    out.update(
        {
            "offset": entry.offset,
            "bad": True,
            "reason": entry.reason,
            "next_offset": entry.next_offset,
        }
    )
    if damage is not None:
        out["damage"] = {
            "field": damage.field,
            "position": damage.position,
            "found": damage.found,
            "written": damage.written,
        }
    return out


def explain(entry: BadEntry, damage: DamageSite | None) -> str:
    """Why an entry is bad, as verify says it: the reason, and the field when one changed byte
    explains the damage."""
    text = entry.reason
    if damage is not None:
        text += (
            f"; one changed byte explains it: {damage.field} at +{damage.position} "
            f"(0x{damage.found:02x}, written 0x{damage.written:02x})"
        )
    return text


# -------------------------------------------------------------------------------------------


@click.group("log")
def log_group() -> None:
    """Read a commit-log directory: the segment files named by their 20-digit start offset.

    DIR is that directory (RocketMQ: ~/store/commitlog), commitlog_svc's data dir, or the data
    dir `mqstore up` made (./data: its commit log is found inside; with --replicas 3 name one,
    ./data/commitlog_svc-0). Segment size comes from the files (RocketMQ's are 1 GiB); all must
    be equal.

    \b
    Examples:
      mqstore log verify ./data
      mqstore log dump ./data --limit 10 --body text
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
    parses but fails a CRC or its offset check carries all its fields too, with "bad": true
    (and "crc_ok": false for a CRC mismatch), and "damage": {"field", "position", "found",
    "written"} when one changed byte explains it. record_crc is the whole-record CRC (null for
    a record without one). dump exits 0 even when it printed bad entries; use
    `mqstore log verify` for a pass/fail answer.
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
                obj = bad_fields(entry, body_mode, log.locate_damage(entry.offset))
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

    A record passes when its magic code, lengths, CRC and physical-offset field (which must
    equal its position) are right: the whole-record CRC, which covers every field, when the
    record carries it (mqstore writes it by default), else the body CRC. Every file must end
    in an end-of-file blank, except the newest, whose last record is followed by zeros. Prints
    one summary line, with how many records carry the whole-record CRC and how many were
    checked by their body CRC alone.

    \b
    Exit status:
      0  every record is valid
      1  bad bytes were found; stderr names the first bad offset and why, and each bad range
         (the first 50), with the field when one changed byte explains the damage
         (a torn last record, as a crash leaves it, counts: recovery would cut it)
      2  DIR is missing or is not a commit-log directory (no segments, mixed sizes)
    """
    log = _open_log(directory)
    records = 0
    with_crc = 0
    record_bytes = 0
    bad: list[BadEntry] = []
    end = log.min_offset
    for entry in log.scan(None, check_crc=True):
        if isinstance(entry, RecordEntry):
            records += 1
            with_crc += entry.record.record_crc >= 0
            record_bytes += entry.record.total_size
            end = entry.offset + entry.record.total_size
        elif isinstance(entry, BlankEntry):
            end = entry.offset + entry.total_size
        else:
            bad.append(entry)
            end = entry.next_offset if entry.next_offset is not None else entry.offset
    files = len(log.segments)
    summary = (
        f"{records} records ({with_crc} with the whole-record CRC, {records - with_crc} "
        f"checked by their body CRC alone), {record_bytes} bytes in {files} files of "
        f"{log.file_bytes} bytes, offsets [{log.min_offset}, {end})"
    )
    if not bad:
        click.echo(f"ok: {summary}")
        return
    click.echo(f"BAD: {summary}, {len(bad)} bad range(s)")
    why = [explain(entry, log.locate_damage(entry.offset)) for entry in bad[:VERIFY_LISTED_MAX]]
    click.echo(
        f"mqstore log verify: first bad offset {bad[0].offset} in {log.directory}: {why[0]}",
        err=True,
    )
    for entry, text in zip(bad, why, strict=False):
        click.echo(f"  bad offset {entry.offset}: {text}", err=True)
    if len(bad) > VERIFY_LISTED_MAX:
        click.echo(f"  ... and {len(bad) - VERIFY_LISTED_MAX} more bad range(s)", err=True)
    ctx.exit(EXIT_BAD_DATA)
