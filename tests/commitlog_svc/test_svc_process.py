"""`python -m commitlog_svc` as a real process: SIGTERM under load, kill -9 under sync-flush
load, and what a restart finds afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.storage.mapped_file import offset_to_file_name
from tests.answers import records_of
from tests.commitlog_svc.support import (
    FILE_BYTES,
    PROCESS_ARGS,
    batch,
    parse,
    start_process,
    wait_until,
)

PRODUCERS = 3
PER_CALL = 10


@dataclass
class Load:
    """Producers appending until the server goes away; what was acknowledged, what was not."""

    stub: pb_grpc.CommitLogStub
    idempotent: bool = False
    acked: dict[tuple[int, int], pb.AppendResponse] = field(default_factory=dict)
    unknown: set[tuple[int, int]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def request(self, k: int, seq: int) -> pb.AppendRequest:
        first = (k * 100_000 + seq) * PER_CALL
        if self.idempotent:
            return pb.AppendRequest(
                batches=[batch(first, PER_CALL)], producer_id=f"producer-{k}", sequence=seq
            )
        return pb.AppendRequest(batches=[batch(first, PER_CALL)])

    def _produce(self, k: int) -> None:
        seq = 0
        while True:
            try:
                response = self.stub.Append(self.request(k, seq), timeout=10)
            except grpc.RpcError:
                with self.lock:
                    self.unknown.add((k, seq))  # the outcome of this one is not known
                return
            if all(s == pb.PUT_OK for s in response.statuses):
                with self.lock:
                    self.acked[(k, seq)] = response
            seq += 1

    def start(self) -> None:
        for k in range(PRODUCERS):
            t = threading.Thread(target=self._produce, args=(k,), daemon=True)
            t.start()
            self.threads.append(t)

    def join(self) -> None:
        for t in self.threads:
            t.join(30)
            assert not t.is_alive()

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)


def assert_all_readable(stub: pb_grpc.CommitLogStub, load: Load) -> None:
    for (k, seq), response in load.acked.items():
        read = stub.Read(
            pb.ReadRequest(offsets=response.commit_log_offsets, sizes=response.sizes), timeout=30
        )
        assert set(read.statuses) == {pb.READ_OK}, (k, seq)
        bodies = [parse(raw).body for raw in records_of(read)]
        assert bodies == list(load.request(k, seq).batches[0].bodies), (k, seq)


def test_sigterm_under_load_exits_0_without_an_abort_file_and_keeps_every_acked_append(
    tmp_path: Path,
) -> None:
    data = tmp_path / "log"
    process = start_process(data)
    try:
        with make_channel(process.target) as channel:
            load = Load(pb_grpc.CommitLogStub(channel))
            load.start()
            wait_until(lambda: load.acked_count() >= 300, "300 acknowledged appends")
            process.signal(signal.SIGTERM)
            assert process.proc is not None
            assert process.proc.wait(60) == 0
            load.join()
        assert not (data / "abort").exists()
    finally:
        process.stop()

    again = start_process(data, log_name="again.log")
    try:
        with make_channel(again.target) as channel:
            assert_all_readable(pb_grpc.CommitLogStub(channel), load)
    finally:
        assert again.stop() == 0


def test_kill_9_under_sync_flush_loses_no_acked_append_and_retries_are_recognised(
    tmp_path: Path,
) -> None:
    data = tmp_path / "log"
    # No checkpoint after start-up: the producer table must come back from the records' tags.
    process = start_process(data, "--flush", "sync", "--checkpoint-interval-ms", "600000")
    try:
        with make_channel(process.target) as channel:
            stub = pb_grpc.CommitLogStub(channel)
            store_id = stub.GetStatus(pb.GetStatusRequest(), timeout=10).store_id
            load = Load(stub, idempotent=True)
            load.start()
            wait_until(lambda: load.acked_count() >= 30, "some acknowledged appends")
            confirmed = next(iter(load.acked.values())).commit_log_offsets[0]
            stub.Confirm(
                pb.ConfirmRequest(
                    subscriber_id="cq-0", store_id=store_id, confirmed_offset=confirmed
                ),
                timeout=10,
            )
            wait_until(lambda: load.acked_count() >= 200, "200 acknowledged appends")
            process.kill()
            load.join()
        assert (data / "abort").exists()
    finally:
        process.stop()

    again = start_process(data, "--flush", "sync", log_name="again.log")
    try:
        with make_channel(again.target) as channel:
            stub = pb_grpc.CommitLogStub(channel)
            assert_all_readable(stub, load)
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert [(s.subscriber_id, s.confirmed_offset) for s in status.subscribers] == [
                ("cq-0", confirmed)
            ]
            end = status.max_offset
            # The last acknowledged request of each producer is remembered: its retry is the
            # first result, and stores nothing.
            for k in range(PRODUCERS):
                last = max(seq for kk, seq in load.acked if kk == k)
                retry = stub.Append(load.request(k, last), timeout=10)
                assert retry.duplicate, (k, last)
                assert list(retry.commit_log_offsets) == list(
                    load.acked[(k, last)].commit_log_offsets
                )
            assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).max_offset == end
            # A request in flight at the kill is stored at most once, whatever its retry finds.
            for k, seq in sorted(load.unknown):
                retry = stub.Append(load.request(k, seq), timeout=10)
                assert all(s == pb.PUT_OK for s in retry.statuses)
            assert_each_message_once(stub, load)
    finally:
        assert again.stop() == 0
    assert not (data / "abort").exists()


def assert_each_message_once(stub: pb_grpc.CommitLogStub, load: Load) -> None:
    end = stub.GetStatus(pb.GetStatusRequest(), timeout=10).max_offset
    frames = stub.Subscribe(pb.SubscribeRequest(subscriber_id="audit"), timeout=60)
    offsets: list[int] = []
    sizes: list[int] = []
    for frame in frames:
        if frame.WhichOneof("frame") == "batch":
            offsets.extend(frame.batch.commit_log_offsets)
            sizes.extend(frame.batch.sizes)
            if frame.batch.next_offset >= end:
                break
    frames.cancel()
    read = stub.Read(pb.ReadRequest(offsets=offsets, sizes=sizes), timeout=60)
    bodies = [parse(raw).body for raw in records_of(read)]
    assert len(bodies) == len(set(bodies)), "a message is stored twice"
    expected = {
        body
        for k, seq in [*load.acked, *load.unknown]
        for body in load.request(k, seq).batches[0].bodies
    }
    assert set(bodies) == expected


def test_the_process_refuses_a_second_instance_on_the_same_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "log"
    process = start_process(data)
    try:
        other = ServiceProcess(
            "commitlog_svc",
            str(data),
            args=["--port", "0", "--health-port", "0", "--metrics-port", "0"],
            ports_file=str(tmp_path / "other.ports.json"),
            log_path=str(tmp_path / "other.log"),
        )
        other.start()
        assert other.proc is not None
        assert other.proc.wait(60) != 0
        assert "lock" in (tmp_path / "other.log").read_text().lower()
    finally:
        assert process.stop() == 0
    assert os.path.exists(data / "checkpoint")


def _append_segments(stub: pb_grpc.CommitLogStub, segments: int) -> list[tuple[int, int, bytes]]:
    """(offset, size, body) of every message appended until the log spans `segments` files."""
    stored: list[tuple[int, int, bytes]] = []
    first = 0
    while not stored or stored[-1][0] < (segments - 1) * FILE_BYTES + FILE_BYTES // 2:
        request = batch(first, 50)
        response = stub.Append(pb.AppendRequest(batches=[request]), timeout=30)
        assert set(response.statuses) == {pb.PUT_OK}
        stored += zip(response.commit_log_offsets, response.sizes, request.bodies, strict=True)
        first += 50
    return stored


def _segment_path(data: Path, index: int) -> Path:
    return data / "commitlog" / offset_to_file_name(index * FILE_BYTES)


def _assert_log_holds(stub: pb_grpc.CommitLogStub, kept: list[tuple[int, int, bytes]]) -> None:
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=30)
    assert status.max_offset == kept[-1][0] + kept[-1][1]
    read = stub.Read(
        pb.ReadRequest(offsets=[o for o, _, _ in kept], sizes=[s for _, s, _ in kept]), timeout=30
    )
    assert set(read.statuses) == {pb.READ_OK}
    assert [parse(raw).body for raw in records_of(read)] == [b for _, _, b in kept]
    after = stub.Append(pb.AppendRequest(batches=[batch(10**6, 3)]), timeout=30)
    assert set(after.statuses) == {pb.PUT_OK}
    assert after.commit_log_offsets[0] in (
        status.max_offset,
        status.max_offset // FILE_BYTES * FILE_BYTES + FILE_BYTES,
    )


def test_a_short_newest_segment_is_mended_at_start_and_a_short_older_one_needs_the_repair(
    tmp_path: Path,
) -> None:
    """A real `python -m commitlog_svc` start over segment files that lost their tails.
    Newest: extended with zeros, recovered as a torn tail, said in the log; the records whole
    in what was left are served, appends resume. Older: the start is refused naming the file
    and `mqstore log repair`; the repair (dry run: exit 1, nothing changed; --yes: segments
    moved aside) lets it start, the log ending in that segment. (Before: both refused.)"""
    data = tmp_path / "log"
    process = start_process(data)
    try:
        with make_channel(process.target) as channel:
            stored = _append_segments(pb_grpc.CommitLogStub(channel), 3)
    finally:
        assert process.stop() == 0
    newest = max(o for o, _, _ in stored) // FILE_BYTES

    # The newest segment lost its tail in the middle of its third record.
    in_newest = [m for m in stored if m[0] >= newest * FILE_BYTES]
    cut = in_newest[2][0] - newest * FILE_BYTES + 50
    os.truncate(_segment_path(data, newest), cut)
    again = start_process(data, log_name="short-newest.log")
    try:
        with make_channel(again.target) as channel:
            kept = [m for m in stored if m[0] + m[1] <= newest * FILE_BYTES + cut]
            assert len(stored) - len(kept) == len(in_newest) - 2
            _assert_log_holds(pb_grpc.CommitLogStub(channel), kept)
    finally:
        assert again.stop() == 0
    said = (tmp_path / "short-newest.log").read_text()
    assert str(_segment_path(data, newest)) in said and "extended with zeros" in said
    assert os.path.getsize(_segment_path(data, newest)) == FILE_BYTES

    # An older segment lost its tail: refused, named, with the repair to run.
    older = newest - 1
    cut = 1_000
    os.truncate(_segment_path(data, older), cut)
    refused = ServiceProcess(
        "commitlog_svc",
        str(data),
        args=list(PROCESS_ARGS),
        ports_file=str(tmp_path / "refused.ports.json"),
        log_path=str(tmp_path / "refused.log"),
    )
    refused.start()
    assert refused.proc is not None
    assert refused.proc.wait(60) != 0
    said = (tmp_path / "refused.log").read_text()
    assert str(_segment_path(data, older)) in said and "not the newest" in said
    assert f"mqstore log repair {data}" in said

    repair = [sys.executable, "-m", "mqstore.cli", "log", "repair", str(data)]
    dry = subprocess.run(repair, check=False, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert "Lost to the store" in dry.stdout and "--yes" in dry.stdout
    assert os.path.exists(_segment_path(data, newest))
    done = subprocess.run(
        [*repair, "--yes"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not os.path.exists(_segment_path(data, newest))

    repaired = start_process(data, log_name="repaired.log")
    try:
        with make_channel(repaired.target) as channel:
            kept = [m for m in stored if m[0] + m[1] <= older * FILE_BYTES + cut]
            _assert_log_holds(pb_grpc.CommitLogStub(channel), kept)
    finally:
        assert repaired.stop() == 0
