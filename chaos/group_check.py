"""The checks of a replicated chaos run after every cycle, once the group is whole again.

The commit offset C (the leader's GetStatus) is what every in-sync replica holds durably: the
log below it may never change again, on any replica. Each cycle checks what is new below it,
and a little of the old:

    log        the leader's log from the last cycle's C to this one's, record by record
               (`LogWatch`, from its segment files): each record is a message this run sent,
               with its bytes (else a corrupt record); none is stored twice in the whole log
               so far (else a duplicate); each queue's offsets go on 0, 1, 2, ... in log
               order (else out of order); every acknowledgement that arrived since the last
               check names the record the log holds at its offset (else lost)
    read back  READBACK_NEW of those acknowledgements read through the leader (the SDK's
               connection, which finds it), and READBACK_OLD older ones, drawn at random:
               each the acknowledged message (else lost, or a corrupt read)
    replicas   every replica's segment bytes in [last C, C) are identical (`compare_replicas`);
               every FULL_COMPARE_EVERY cycles, and at the end, the whole of [0, C)
    followers  cq_svc and index_svc against a from-scratch rebuild of [last C, C), once both
               applied past C: the single-node torn cycle's tail check (check.check_tail),
               the units there of QUEUES_PER_CYCLE queues pulled and compared, and
               KEYS_PER_CYCLE keys asked of the index over the region's store times (queues
               and keys drawn at random each cycle)

The final checks (chaos/run.py final_checks) then do everything over the whole log, as the
single-node run does, against the leader's files, and compare all replicas up to the commit
offset once more, with every replica's end equal to the leader's.
"""

from __future__ import annotations

import os
import random
from array import array
from dataclasses import dataclass, field

from chaos.check import LogView, Problems, read_batch, stored_records
from chaos.oracle import EXAMPLES_MAX, Ack, Oracle
from chaos.plan import message, parse_header
from mqstore.client.connection import Connection
from mqstore.storage.logreader import LogDir

# Acknowledgements read back through the leader each cycle, drawn at random: new ones (every
# new one is compared with the leader's files; this reads some through the service too) and
# older ones (every one is read again at the end). A Read costs ~1 ms an acknowledgement here:
# reading all of them each cycle would take seconds.
READBACK_NEW = 128
READBACK_OLD = 128
READ_BATCH = 512
COMPARE_CHUNK_BYTES = 1 << 20  # replica files are compared a MiB at a time
FULL_COMPARE_EVERY = 25  # cycles between two comparisons of the replicas' whole logs
# Each cycle's comparison of the followers with the region pulls every unit of this many queues
# (of 8: the pulls read the records through the leader, ~1 ms each here) and asks the index
# for this many keys (of 32, in both topics); at the end, every queue and every sampled key.
QUEUES_PER_CYCLE = 2
KEYS_PER_CYCLE = 4


@dataclass
class LogWatchFigures:
    records: int = 0  # records audited, over every cycle
    duplicates: int = 0
    corrupt: int = 0
    foreign: int = 0
    out_of_order: int = 0
    acks_checked: int = 0  # acknowledgements compared with the log at their offset
    lost: int = 0


class LogWatch:
    """The leader's log, audited region by region as the commit offset moves on."""

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle
        self.audited_to = 0  # [0, audited_to) has been read
        # Per producer, by n: where the log stores the message (-1: not (yet) seen).
        self._stored_at = [array("q") for _ in range(oracle.producers)]
        self._next_queue_offset: dict[tuple[str, int], int] = {}
        self._acks_from = 0  # the first acknowledgement (in arrival order) not yet taken
        self._pending: list[Ack] = []  # taken, above the audited region when last looked at
        self.figures = LogWatchFigures()

    def _stored(self, producer: int, n: int) -> int:
        column = self._stored_at[producer]
        return column[n] if n < len(column) else -1

    def _store(self, producer: int, n: int, offset: int) -> None:
        column = self._stored_at[producer]
        if n >= len(column):
            column.extend([-1] * (n + 1 - len(column)))
        column[n] = offset

    def advance(self, commitlog_dir: str, end: int, problems: Problems, where: str) -> int:
        """Audit the log in [audited_to, end); returns the records read."""
        if end <= self.audited_to:
            return 0
        f, salt = self.figures, self.oracle.salt
        view = LogView()
        records = 0
        for rec in stored_records(commitlog_dir, view, start=self.audited_to, end=end):
            records += 1
            at = f"{where}: record at {rec.commit_log_offset} ({rec.topic}/{rec.queue_id}@" + (
                f"{rec.queue_offset})"
            )
            ids = parse_header(rec.body)
            if ids is None or not 0 <= ids[0] < self.oracle.producers:
                f.foreign += 1
                problems.add(f"log: {at}: not a message of this run")
                continue
            p, n = ids
            spec = message(salt, p, n)
            if (rec.body, rec.topic, rec.queue_id, rec.uniq_key) != (
                spec.body,
                spec.topic,
                spec.queue_id,
                spec.uniq_key,
            ):
                f.corrupt += 1
                problems.corrupt(f"log: {at}: producer {p} message {n} is not as it was sent")
                continue
            first = self._stored(p, n)
            if first >= 0:
                f.duplicates += 1
                if f.duplicates <= EXAMPLES_MAX:
                    problems.add(
                        f"log: {at}: producer {p} message {n} is stored again (first at {first})"
                    )
                continue
            self._store(p, n, rec.commit_log_offset)
            key = (rec.topic, rec.queue_id)
            expected = self._next_queue_offset.get(key, 0)
            if rec.queue_offset != expected:
                f.out_of_order += 1
                if f.out_of_order <= EXAMPLES_MAX:
                    problems.add(f"log: {at}: queue offset {rec.queue_offset}, {expected} expected")
            self._next_queue_offset[key] = max(expected, rec.queue_offset + 1)
        for text in view.bad_ranges:
            problems.add(f"log: {where}: {text}")
        f.records += records
        self.audited_to = end
        return records

    def new_acks(self, problems: Problems) -> list[Ack]:
        """The acknowledgements that arrived since the last call, each compared with what the
        log stores at its offset once the audit has passed it (those above the audited region
        wait for a later call). Returns the ones compared (for the read back)."""
        arrived = self.oracle.arrived(self._acks_from)
        self._acks_from += len(arrived)
        acks = [a for p, n in arrived if (a := self.oracle.ack(p, n)) is not None]
        todo, self._pending = [*self._pending, *acks], []
        checked: list[Ack] = []
        for ack in todo:
            if ack.commit_log_offset >= self.audited_to:
                self._pending.append(ack)
                continue
            checked.append(ack)
            p, n = ack.producer, ack.n
            stored = self._stored(p, n)
            if stored != ack.commit_log_offset:
                self.figures.lost += 1
                where = "not stored" if stored < 0 else f"stored at {stored}"
                problems.lose(
                    p,
                    n,
                    f"producer {p} message {n} acknowledged at {ack.commit_log_offset}, below "
                    f"the commit offset, is {where}",
                )
        self.figures.acks_checked += len(checked)
        return checked


def read_back(
    conn: Connection, acks: list[Ack], oracle: Oracle, problems: Problems, rng: random.Random
) -> int:
    """Read through the leader READBACK_NEW of `acks` (the cycle's new acknowledgements, every
    one of them compared with the log's files already) and READBACK_OLD older acknowledgements,
    drawn by `rng`; returns how many were read."""
    conn.find_commitlog_leader()
    todo = rng.sample(acks, min(READBACK_NEW, len(acks)))
    total = oracle.acked_count
    for k in (rng.randrange(total) for _ in range(READBACK_OLD if total else 0)):
        for p, n in oracle.arrived(k, k + 1):
            ack = oracle.ack(p, n)
            if ack is not None:
                todo.append(ack)
    stub = conn.commitlog()
    for i in range(0, len(todo), READ_BATCH):
        read_batch(conn, stub, todo[i : i + READ_BATCH], oracle.salt, problems)
    return len(todo)


@dataclass
class ReplicaCompare:
    bytes: int = 0  # compared per replica
    mismatches: list[str] = field(default_factory=list)


def compare_replicas(dirs: dict[str, str], start: int, end: int) -> ReplicaCompare:
    """Every replica's segment bytes in [start, end), side by side: the first difference (or a
    replica that does not hold the range) per segment is a mismatch."""
    out = ReplicaCompare()
    if end <= start:
        return out
    logs = {name: LogDir(d) for name, d in dirs.items()}
    first = next(iter(logs.values()))
    file_bytes = first.file_bytes
    names = sorted(logs)
    for name, log in logs.items():
        if log.file_bytes != file_bytes:
            out.mismatches.append(f"{name}'s segments are {log.file_bytes} bytes, not {file_bytes}")
            return out
    seg_start = start - start % file_bytes
    while seg_start < end:
        lo, hi = max(start, seg_start), min(end, seg_start + file_bytes)
        fds: dict[str, int] = {}
        try:
            for name in names:
                path = os.path.join(logs[name].directory, f"{seg_start:020d}")
                try:
                    fds[name] = os.open(path, os.O_RDONLY)
                except OSError as err:
                    out.mismatches.append(f"{name} has no segment {seg_start:020d} ({err})")
            if len(fds) == len(names):
                _compare_range(fds, seg_start, lo, hi, out)
        finally:
            for fd in fds.values():
                os.close(fd)
        seg_start += file_bytes
    out.bytes = end - start
    return out


def _compare_range(
    fds: dict[str, int], seg_start: int, lo: int, hi: int, out: ReplicaCompare
) -> None:
    at = lo
    while at < hi:
        size = min(COMPARE_CHUNK_BYTES, hi - at)
        chunks = {name: os.pread(fd, size, at - seg_start) for name, fd in fds.items()}
        reference_name = min(chunks)
        reference = chunks[reference_name]
        for name, chunk in chunks.items():
            if chunk != reference:
                same = min(len(chunk), len(reference))
                where = at + next((i for i in range(same) if chunk[i] != reference[i]), same)
                out.mismatches.append(
                    f"{name} and {reference_name} differ at offset {where} (segment "
                    f"{seg_start:020d})"
                )
                return
        at += size
