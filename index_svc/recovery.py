"""Index recovery at open: which files to keep, what to cut, from where to replay.

The checkpoint (formats/checkpoint.py) is the only witness. It names every file it vouches for,
with the header values, entry count and CRC32C of entries that were durable when it was
written, and whether the engine closed cleanly. Whatever it does not vouch for is rebuilt from
the commit log, by replay from `replay_from_offset`; the engine reports that offset as its
confirmed offset in the start-up handshake.

What open finds, and what it does (a test walks every row):

    found                                       decision
    no checkpoint (missing or corrupt)          delete every index file; replay from 0
    checkpoint of an incompatible shard         delete every index file; replay from 0 (keeps
      (another index, or fewer shards than        the store id). Growing the shard count keeps
      before)                                     the files: see mqstore.sharding
    a file on disk the checkpoint does not      created after it: delete (replay re-creates it)
      name (and stray companions, .tmp files)
    a named file missing, of the wrong size,    damaged: drop it and every newer file, cut the
      a sealed or cleanly closed file whose       kept ones at its first offset, replay from
      header disagrees with its record, or        there
      (verify_sealed_on_open) whose CRCs fail
    the active file after a clean close,        keep as is
      header agreeing with its record
    the active file after an unclean exit,      cut it back to the record's entry count (zero
      entries CRC matching the record             the rest, rebuild slots, restore the header
                                                  from the record); replay from the
                                                  checkpoint's confirmed offset
    the active file after an unclean exit,      damaged (row above)
      entries CRC not matching
    a sealed file's companion unusable          keep the file; its queries go unfiltered (the
                                                  confirm step still drops false candidates)
    the active file's companion unusable, or    damaged (the active file must keep writing
      present while exact mode is off             hashes, or carry none): in exact mode; with
                                                  exact mode off the companion is removed

"Cut at offset X" drops every entry whose commit-log offset is >= X: newer files whole, the
newest kept file from its first such entry (entries are in commit-log order within and across
files). A file's record keeps the offset of its first entry, so replay from there re-indexes
every key of the message that opened the file, including keys an older file received before the
rollover, which the cut removed: nothing is indexed twice, nothing is lost.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from index_svc.config import IndexConfig
from index_svc.index_file import IndexFile
from mqstore.errors import CorruptFile
from mqstore.formats import index_file as fmt
from mqstore.formats import index_hash64 as h64fmt
from mqstore.formats.index_checkpoint import FILE_HAS_COMPANION, FileRecord, IndexCheckpoint
from mqstore.storage.disk import Disk

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RecoveryReport:
    checkpoint_found: bool = False
    clean_exit: bool = False
    replay_from_offset: int = 0
    files_kept: int = 0
    files_deleted: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)  # "name: reason"
    entries_cut: int = 0
    reset_reason: str = ""
    duration_ms: float = 0.0


@dataclass(slots=True)
class Recovered:
    files: list[IndexFile]
    report: RecoveryReport


def shards_compatible(old_count: int, old_index: int, new_count: int, new_index: int) -> bool:
    """Files built for shard (old_count, old_index) hold every key of (new_count, new_index)
    when the index is the same and the count did not shrink: under jump hashing a key only ever
    moves to a newly added shard."""
    return new_index == old_index < old_count <= new_count


def list_index_dir(disk: Disk, index_dir: str) -> list[str]:
    """Every name in the index directory that recovery owns (files and companions)."""
    out = []
    for name in disk.listdir(index_dir):
        base = name.removesuffix(h64fmt.SUFFIX).removesuffix(".tmp")
        if fmt.NAME_PATTERN.match(base):
            out.append(name)
    return out


def cut_at_offset(files: list[IndexFile], offset: int) -> tuple[list[IndexFile], int]:
    """Drop every entry at or beyond `offset` (see the module doc). Returns the files left and
    the number of entries dropped; the caller fsyncs the directory and checkpoints."""
    dropped = 0
    while files:
        f = files[-1]
        if f.header.index_count > 1 and f.header.begin_phy < offset:
            break
        dropped += f.header.entries
        files.pop()
        f.destroy()
    if files:
        f = files[-1]
        keep = f.first_entry_at_or_after(offset)
        if keep < f.header.index_count:
            dropped += f.header.index_count - keep
            f.cut(keep)
    return files, dropped


def _problem(f: IndexFile, rec: FileRecord, *, active: bool, clean: bool, verify: bool) -> str:
    """Why the file cannot be trusted as the checkpoint describes it, or ""."""
    h = f.header
    if not active and not rec.sealed:
        return "an older file that was never sealed"
    if rec.index_count < 1 or rec.index_count > rec.entry_num:
        return f"record count {rec.index_count} outside the file"
    if not active or clean:
        stored = (h.begin_ts_ms, h.end_ts_ms, h.begin_phy, h.end_phy, h.index_count)
        expected = (rec.begin_ts_ms, rec.end_ts_ms, rec.begin_phy, rec.end_phy, rec.index_count)
        if stored != expected:
            return f"header {stored} disagrees with the checkpoint {expected}"
        if not 0 <= h.slots_used <= rec.slot_num:
            return f"header says {h.slots_used} slots used of {rec.slot_num}"
        if verify and not f.entries_crc_matches(rec.index_count, rec.entries_crc):
            return "entries CRC32C mismatch"
        if verify and rec.has_head_crc and not f.head_crc_matches(rec.head_crc):
            return "header and slots CRC32C mismatch"
        return ""
    # The active file after an unclean exit: only the entries the checkpoint counted matter,
    # and they must be intact (a torn sector of a later write can reach back into them).
    if not f.entries_crc_matches(rec.index_count, rec.entries_crc):
        return "entries CRC32C mismatch after an unclean exit"
    return ""


def recover(
    disk: Disk, config: IndexConfig, ckpt: IndexCheckpoint | None, *, ckpt_note: str = ""
) -> Recovered:
    started = time.monotonic()
    index_dir = config.index_dir
    report = RecoveryReport(checkpoint_found=ckpt is not None)
    kept: list[IndexFile] = []
    if ckpt is None:
        if list_index_dir(disk, index_dir):
            report.reset_reason = ckpt_note or "index files without a checkpoint"
    elif not shards_compatible(
        ckpt.shard_count, ckpt.shard_index, config.shard_count, config.shard_index
    ):
        report.reset_reason = (
            f"files index shard {ckpt.shard_index}/{ckpt.shard_count}, "
            f"configured {config.shard_index}/{config.shard_count}"
        )
    else:
        report.clean_exit = ckpt.clean_close
        report.replay_from_offset = ckpt.confirmed_offset
        kept, damaged_at = _open_files(disk, config, ckpt, report)
        if damaged_at is not None:
            kept, dropped = cut_at_offset(kept, damaged_at)
            report.entries_cut += dropped
            report.replay_from_offset = min(report.replay_from_offset, damaged_at)
    if report.reset_reason:
        log.error("index rebuilt from the commit log: %s", report.reset_reason)
    keep_names = {f.name for f in kept}
    keep_names |= {f.name + h64fmt.SUFFIX for f in kept if f.has_companion}
    for name in list_index_dir(disk, index_dir):
        if name not in keep_names:
            disk.remove(os.path.join(index_dir, name))
            report.files_deleted.append(name)
    disk.fsync_dir(index_dir)
    report.files_kept = len(kept)
    report.duration_ms = (time.monotonic() - started) * 1000.0
    return Recovered(kept, report)


def _open_files(
    disk: Disk, config: IndexConfig, ckpt: IndexCheckpoint, report: RecoveryReport
) -> tuple[list[IndexFile], int | None]:
    """Open the files the checkpoint names, oldest first, until one is damaged. Returns the
    good ones and, if one was damaged, the commit-log offset to cut and replay from."""
    kept: list[IndexFile] = []
    for i, rec in enumerate(ckpt.files):
        active = i == len(ckpt.files) - 1
        name = fmt.name_of(rec.name_ms)
        try:
            f = IndexFile.open(disk, config.index_dir, rec)
        except CorruptFile as exc:
            report.damaged.append(f"{name}: {exc.reason}")
            return kept, rec.start_offset
        problem = _problem(
            f,
            rec,
            active=active,
            clean=ckpt.clean_close,
            verify=config.verify_sealed_on_open or (active and not ckpt.clean_close),
        )
        if not problem and rec.has_companion:
            problem = _companion_problem(
                f,
                rec,
                active=active,
                exact=config.exact,
                verify=config.verify_sealed_on_open or (active and not ckpt.clean_close),
            )
        if problem:
            report.damaged.append(f"{name}: {problem}")
            f.close()
            return kept, rec.start_offset
        if active and not ckpt.clean_close:
            before = f.header.index_count
            f.cut(rec.index_count, restore=rec)
            if rec.index_count <= before <= rec.entry_num:
                report.entries_cut += before - rec.index_count
        kept.append(f)
    return kept, None


def _companion_problem(
    f: IndexFile, rec: FileRecord, *, active: bool, exact: bool, verify: bool
) -> str:
    if active and not exact:
        # Exact mode was turned off: new entries would get no hash, so the companion must go
        # before it can ever be trusted again.
        f.drop_companion()
        f.disk.remove(f.companion_path)
        rec.flags &= ~FILE_HAS_COMPANION
        return ""
    usable = f.has_companion and (
        not verify or f.hash64_crc_matches(rec.index_count, rec.hash64_crc)
    )
    if usable:
        return ""
    if active:
        return "exact-mode companion missing or failing its CRC32C"
    log.warning("companion of %s failed its check; its queries go unfiltered", f.name)
    f.drop_companion()
    return ""
