"""`mqstore log dump` and `mqstore log verify`, driven as a user runs them: a subprocess of
`python -m mqstore.cli`, on directories our commit log wrote and on RocketMQ-style directories
built record by record."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig
from commitlog_svc.messages import PutStatus
from mqstore.formats import sysflag
from mqstore.formats.properties import encode_properties
from tests.commitlog.message_in import MessageIn, as_batches

from .segments import (
    Msg,
    Placed,
    build_rocketmq_style,
    expected_json,
    host,
    one_byte_in_each_field,
    segment_name,
    tree_digest,
)

STORE_IP = "10.1.2.3"
STORE_PORT = 10911
FILE_BYTES = 4096  # CommitLogConfig.for_tests: rollover every few messages


def run(*args: str | Path | int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def dump(*args: str | Path | int) -> list[dict[str, Any]]:
    done = run("log", "dump", *args)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


# -- a directory written by our commit log --------------------------------------------------------


@dataclass
class Written:
    offset: int
    size: int
    queue_offset: int
    store_timestamp_ms: int
    message: MessageIn
    properties: dict[str, str]
    raw: bytes = b""  # the record as the store wrote it (read back from its segment file)


@dataclass
class OurLog:
    data_dir: Path
    commitlog_dir: Path
    written: list[Written]


def our_messages() -> list[tuple[MessageIn, dict[str, str]]]:
    out = []
    for i in range(30):
        props = {"TAGS": f"tag{i % 3}", "KEYS": f"order-{i} buyer-{i % 4}"}
        if i % 5 == 0:
            props["UNIQ_KEY"] = f"7F000001{i:024X}"
        body = f"message {i} ".encode() * (4 * (i % 7)) + bytes([i, 0xFF, 0x00])
        born = host("2001:db8::42", 40000 + i) if i % 4 == 1 else host("192.168.7.9", 50000 + i)
        sys_flag = sysflag.TRANSACTION_PREPARED_TYPE if i == 11 else 0
        msg = MessageIn(
            topic="%RETRY%" + "g" * 140 if i == 13 else f"Topic{i % 2}",
            queue_id=i % 3,
            body=body,
            properties=encode_properties(props),
            flag=i * 7,
            sys_flag=sys_flag,
            born_timestamp_ms=1_700_000_000_000 + i,
            born_host=born,
            reconsume_times=i % 2,
            prepared_tx_offset=0,
        )
        out.append((msg, props))
    out.append((MessageIn("Empty", 0, b""), {}))  # an empty body: no CRC to check
    return out


@pytest.fixture
def our_log(tmp_path: Path) -> OurLog:
    data_dir = tmp_path / "store"
    config = CommitLogConfig.for_tests(str(data_dir), store_ip=STORE_IP, store_port=STORE_PORT)
    log = CommitLog(config)
    log.open()
    written = []
    try:
        for msg, props in our_messages():
            result = log.append_batch(as_batches([msg]))
            assert result.statuses == [PutStatus.PUT_OK], result.reasons
            written.append(
                Written(
                    result.offsets[0],
                    result.sizes[0],
                    result.queue_offsets[0],
                    result.store_timestamp_ms,
                    msg,
                    props,
                )
            )
    finally:
        log.close()
    for w in written:
        start = w.offset - w.offset % FILE_BYTES
        segment = (data_dir / "commitlog" / segment_name(start)).read_bytes()
        w.raw = segment[w.offset - start : w.offset - start + w.size]
    files = sorted(p.name for p in (data_dir / "commitlog").iterdir())
    assert len(files) >= 3, "the fixture must span several segment files"
    return OurLog(data_dir, data_dir / "commitlog", written)


def expected_for(w: Written) -> dict[str, Any]:
    m = w.message
    flags = m.sys_flag | (sysflag.BORNHOST_V6 if len(m.born_host) == 20 else 0)
    born_ip = ".".join(str(b) for b in m.born_host[:4]) if len(m.born_host) == 8 else None
    return {
        "offset": w.offset,
        "total_size": w.size,
        "version": 2 if len(m.topic) > 127 else 1,
        "body_crc": zlib.crc32(m.body) & 0x7FFFFFFF,
        # The whole-record CRC: over every byte but its own 20-byte property at the end.
        "record_crc": zlib.crc32(w.raw[:-20]) & 0x7FFFFFFF,
        "crc_ok": True,
        "queue_id": m.queue_id,
        "flag": m.flag,
        "queue_offset": w.queue_offset,
        "physical_offset": w.offset,
        "sys_flag": flags,
        "born_timestamp_ms": m.born_timestamp_ms,
        "born_host": (
            f"{born_ip}:{int.from_bytes(m.born_host[4:], 'big')}"
            if born_ip
            else f"[2001:db8::42]:{int.from_bytes(m.born_host[16:], 'big')}"
        ),
        "store_timestamp_ms": w.store_timestamp_ms,
        "store_host": f"{STORE_IP}:{STORE_PORT}",
        "reconsume_times": m.reconsume_times,
        "prepared_tx_offset": m.prepared_tx_offset,
        "topic": m.topic,
        "properties": w.properties,
        "body": base64.b64encode(m.body).decode(),
        "msg_id": "0A010203" + f"{STORE_PORT:08X}" + f"{w.offset:016X}",
    }


def test_dump_prints_every_field_of_every_record_our_commit_log_wrote(our_log: OurLog) -> None:
    lines = dump(our_log.commitlog_dir)
    assert lines == [expected_for(w) for w in our_log.written]
    # A prepared transaction message takes no queue offset; the V2 topic reads back whole.
    assert lines[11]["queue_offset"] == 0 and lines[11]["sys_flag"] & 0xC == 0x4
    assert lines[13]["version"] == 2 and len(lines[13]["topic"]) == 147


def test_verify_of_a_healthy_log_exits_0_with_a_summary(our_log: OurLog) -> None:
    done = run("log", "verify", our_log.commitlog_dir)
    assert done.returncode == 0, done.stderr
    files = len(list(our_log.commitlog_dir.iterdir()))
    total = sum(w.size for w in our_log.written)
    summary = done.stdout.strip()
    assert summary.startswith("ok:")
    records = len(our_log.written)
    assert (
        f"{records} records ({records} with the whole-record CRC, 0 checked by their body "
        "CRC alone)" in summary
    )
    assert f"{total} bytes" in summary
    assert f"{files} files" in summary
    assert done.stderr == ""


def test_a_stores_root_directory_reads_as_its_commitlog_subdirectory(our_log: OurLog) -> None:
    assert dump(our_log.data_dir) == dump(our_log.commitlog_dir)


def flip_byte(commitlog_dir: Path, offset: int, file_bytes: int = FILE_BYTES) -> None:
    start = offset - offset % file_bytes
    path = commitlog_dir / segment_name(start)
    data = bytearray(path.read_bytes())
    data[offset - start] ^= 0x5A
    path.write_bytes(bytes(data))


def body_offset(w: Written) -> int:
    return w.offset + 84 + 4 + (12 if len(w.message.born_host) == 20 else 0)


def test_one_flipped_body_byte_makes_verify_exit_1_naming_that_records_offset(
    our_log: OurLog,
) -> None:
    victim = our_log.written[8]
    assert victim.message.body and len(victim.message.born_host) == 8
    flip_byte(our_log.commitlog_dir, body_offset(victim) + 3)
    done = run("log", "verify", our_log.commitlog_dir)
    assert done.returncode == 1
    assert f"first bad offset {victim.offset} " in done.stderr
    assert "CRC" in done.stderr
    assert done.stdout.startswith("BAD:")
    assert f"{len(our_log.written) - 1} records" in done.stdout


def test_verify_names_the_first_of_several_bad_records_and_counts_them(our_log: OurLog) -> None:
    early, late = our_log.written[4], our_log.written[20]
    flip_byte(our_log.commitlog_dir, body_offset(late))
    flip_byte(our_log.commitlog_dir, body_offset(early))
    done = run("log", "verify", our_log.commitlog_dir)
    assert done.returncode == 1
    assert f"first bad offset {early.offset} " in done.stderr
    assert "2 bad range(s)" in done.stdout


def test_a_byte_changed_in_any_field_makes_verify_exit_1_naming_the_record_and_field(
    our_log: OurLog,
) -> None:
    """The whole-record CRC covers every field: one byte changed in each, one record per
    field, and verify names every damaged record's offset and the field the change hit
    (before, only the body, BODYCRC and the lengths were checked: a changed born time or
    queue id read as sound)."""
    # Every other record (adjacent bad records would read as one bad range), in two copies.
    victims = [w for w in our_log.written if w.message.body and len(w.message.topic) <= 127]
    victims = [w for w in victims[::2] if our_log.written.index(w) + 1 < len(our_log.written)]
    fields = list(one_byte_in_each_field(victims[0].raw))
    half = (len(fields) + 1) // 2
    assert len(victims) >= half
    for part, chosen in enumerate((fields[:half], fields[half:])):
        copy = our_log.data_dir.parent / f"copy-{part}"
        shutil.copytree(our_log.commitlog_dir, copy)
        for field, w in zip(chosen, victims, strict=False):
            flip_byte(copy, w.offset + one_byte_in_each_field(w.raw)[field])
        done = run("log", "verify", copy)
        assert done.returncode == 1, done.stdout
        assert f"{len(chosen)} bad range(s)" in done.stdout
        assert f"first bad offset {victims[0].offset} " in done.stderr
        for field, w in zip(chosen, victims, strict=False):
            line = next(x for x in done.stderr.splitlines() if f"bad offset {w.offset}:" in x)
            assert f"explains it: {field} at +{one_byte_in_each_field(w.raw)[field]} " in line, line


def test_dump_marks_a_record_with_a_flipped_body_byte_bad_and_goes_on(our_log: OurLog) -> None:
    victim_index = 8
    victim = our_log.written[victim_index]
    flip_byte(our_log.commitlog_dir, body_offset(victim))
    lines = dump(our_log.commitlog_dir)
    assert len(lines) == len(our_log.written)
    bad = lines[victim_index]
    assert bad["offset"] == victim.offset
    assert bad["bad"] is True and bad["crc_ok"] is False
    assert "CRC" in bad["reason"]
    assert bad["next_offset"] == our_log.written[victim_index + 1].offset
    # Its other fields are still shown; the body is as damaged on disk.
    assert bad["topic"] == victim.message.topic
    assert base64.b64decode(bad["body"]) != victim.message.body
    # Every other record is intact and printed as before.
    others = [line for i, line in enumerate(lines) if i != victim_index]
    assert others == [expected_for(w) for i, w in enumerate(our_log.written) if i != victim_index]


def test_a_torn_last_record_fails_verify_and_dumps_as_a_bad_tail(our_log: OurLog) -> None:
    last = our_log.written[-1]
    cut_from = last.offset + last.size // 2
    # A crash tore the last record: its second half never reached the disk.
    start = cut_from - cut_from % FILE_BYTES
    path = our_log.commitlog_dir / segment_name(start)
    data = bytearray(path.read_bytes())
    data[cut_from - start :] = bytes(len(data) - (cut_from - start))
    path.write_bytes(bytes(data))

    done = run("log", "verify", our_log.commitlog_dir)
    assert done.returncode == 1
    assert f"first bad offset {last.offset} " in done.stderr

    lines = dump(our_log.commitlog_dir)
    assert lines[:-1] == [expected_for(w) for w in our_log.written[:-1]]
    assert lines[-1]["offset"] == last.offset
    assert lines[-1]["bad"] is True and lines[-1]["next_offset"] is None
    assert "nothing valid follows" in lines[-1]["reason"]


def test_dump_from_a_record_offset_with_a_limit_prints_exactly_those_records(
    our_log: OurLog,
) -> None:
    w = our_log.written
    lines = dump(our_log.commitlog_dir, "--from", w[5].offset, "--limit", "4")
    assert [line["offset"] for line in lines] == [x.offset for x in w[5:9]]
    # Across a file boundary (and its blank), the records follow in order.
    crossing = next(
        i for i in range(1, len(w)) if w[i].offset // FILE_BYTES > w[i - 1].offset // FILE_BYTES
    )
    lines = dump(our_log.commitlog_dir, "--from", w[crossing - 1].offset, "--limit", "2")
    assert [line["offset"] for line in lines] == [w[crossing - 1].offset, w[crossing].offset]
    assert dump(our_log.commitlog_dir, "--limit", "0") == []
    assert len(dump(our_log.commitlog_dir, "--limit", "3")) == 3


def test_dump_from_a_file_start_or_past_the_end(our_log: OurLog) -> None:
    w = our_log.written
    second_file = next(x for x in w if x.offset >= FILE_BYTES)
    assert dump(our_log.commitlog_dir, "--from", FILE_BYTES)[0]["offset"] == second_file.offset
    assert dump(our_log.commitlog_dir, "--from", 10**12) == []


def test_dump_from_inside_a_record_reports_bad_bytes_up_to_the_next(our_log: OurLog) -> None:
    w = our_log.written
    lines = dump(our_log.commitlog_dir, "--from", w[3].offset + 1, "--limit", "2")
    assert lines[0]["bad"] is True and lines[0]["offset"] == w[3].offset + 1
    assert lines[0]["next_offset"] == w[4].offset
    assert lines[1] == expected_for(w[4])


@pytest.mark.parametrize(
    ("mode", "decode"),
    [
        ("base64", base64.b64decode),
        ("text", lambda s: s.encode()),
        ("none", lambda s: s),
    ],
)
def test_dump_body_modes(our_log: OurLog, mode: str, decode: Any) -> None:
    w = our_log.written[2]
    [line] = dump(our_log.commitlog_dir, "--from", w.offset, "--limit", "1", "--body", mode)
    if mode == "none":
        assert line["body"] is None
    elif mode == "text":
        assert line["body"] == w.message.body.decode("utf-8", "replace")
    else:
        assert decode(line["body"]) == w.message.body


def test_dump_blanks_flag_shows_each_files_end_of_file_blank(our_log: OurLog) -> None:
    lines = dump(our_log.commitlog_dir, "--blanks")
    blanks = [line for line in lines if line.get("blank")]
    files = len(list(our_log.commitlog_dir.iterdir()))
    assert len(blanks) == files - 1  # every full file; the last one ends in zeros
    for b in blanks:
        assert (b["offset"] + b["total_size"]) % FILE_BYTES == 0


def test_the_tools_read_beside_a_running_store_without_its_lock(tmp_path: Path) -> None:
    config = CommitLogConfig.for_tests(str(tmp_path / "live"))
    log = CommitLog(config)
    log.open()
    try:
        for i in range(12):
            assert log.append_batch(as_batches([MessageIn("Live", 0, f"m{i}".encode())])).ok
        done = run("log", "verify", tmp_path / "live" / "commitlog")
        assert done.returncode == 0, done.stderr
        assert "12 records" in done.stdout
        assert len(dump(tmp_path / "live")) == 12
        assert log.append_batch(
            as_batches([MessageIn("Live", 0, b"after")])
        ).ok  # the store is unaffected
    finally:
        log.close()


def test_dump_and_verify_never_write_to_the_directory(our_log: OurLog) -> None:
    before = tree_digest(our_log.data_dir)
    run("log", "dump", our_log.commitlog_dir)
    run("log", "verify", our_log.data_dir)
    assert tree_digest(our_log.data_dir) == before


# -- a RocketMQ-style directory ---------------------------------------------------------------


ROCKET_FILE_BYTES = 2048


def rocketmq_messages() -> list[Msg]:
    msgs = []
    for i in range(14):
        props = {
            "UNIQ_KEY": f"7F00000100012A9F{i:016X}",
            "CLUSTER": "DefaultCluster",
            "WAIT": "true",
            "TAGS": "TagA" if i % 2 else "TagB",
            "KEYS": f"order-{i} user-{i % 3}",
            "MIN_OFFSET": "0",
            "MAX_OFFSET": str(i),
        }
        msgs.append(
            Msg(
                topic="%RETRY%" + "please_consume_me_" * 8 if i == 4 else "TopicTest",
                queue_id=i % 4,
                body=f"Hello RocketMQ {i}".encode() * (1 + i % 3),
                properties=props,
                flag=0,
                queue_offset=i // 4,
                sys_flag=sysflag.MULTI_TAGS if i == 6 else 0,
                born_timestamp_ms=1_726_000_000_000 + i,
                born=("2001:db8::1", 57000 + i),
                store_timestamp_ms=1_726_000_000_100 + i,
                store=("fd00::7", 10911),
                reconsume_times=i % 3,
                prepared_tx_offset=0,
                # A broker that turned enabledAppendPropCRC on after its tenth message.
                record_crc=i >= 10,
            )
        )
    return msgs


@pytest.fixture
def rocket_dir(tmp_path: Path) -> tuple[Path, list[Placed]]:
    directory = tmp_path / "rocketmq-store" / "commitlog"
    placed = build_rocketmq_style(directory, ROCKET_FILE_BYTES, rocketmq_messages())
    # The layout this test depends on: a blank ends the first file, a spare file follows.
    first = (directory / segment_name(0)).read_bytes()
    assert placed[-1].offset >= 2 * ROCKET_FILE_BYTES or placed[-1].offset >= ROCKET_FILE_BYTES
    assert any(p.offset >= ROCKET_FILE_BYTES for p in placed)
    last_in_first = max((p for p in placed if p.offset < ROCKET_FILE_BYTES), key=lambda p: p.offset)
    blank_at = last_in_first.offset + last_in_first.size
    assert first[blank_at + 4 : blank_at + 8] == bytes.fromhex("CBD43194")
    return directory, placed


def test_dump_reads_every_field_of_a_rocketmq_style_directory(
    rocket_dir: tuple[Path, list[Placed]],
) -> None:
    directory, placed = rocket_dir
    lines = dump(directory)
    assert len(lines) == len(placed)
    for line, p in zip(lines, placed, strict=True):
        want = expected_json(p.offset, p.msg, version=2 if len(p.msg.topic) > 127 else 1)
        want["total_size"] = p.size
        assert line == want
    assert lines[4]["version"] == 2
    assert lines[0]["born_host"] == "[2001:db8::1]:57000"
    assert lines[0]["store_host"] == "[fd00::7]:10911"
    assert len(lines[0]["msg_id"]) == 56
    assert lines[0]["sys_flag"] == 0x30


def test_verify_of_a_rocketmq_style_directory_exits_0(
    rocket_dir: tuple[Path, list[Placed]],
) -> None:
    directory, placed = rocket_dir
    done = run("log", "verify", directory)
    assert done.returncode == 0, done.stderr
    files = len(list(directory.iterdir()))
    assert (
        f"{len(placed)} records (4 with the whole-record CRC, 10 checked by their body CRC "
        "alone)" in done.stdout
    )
    assert f"{files} files of {ROCKET_FILE_BYTES} bytes" in done.stdout


def test_a_corrupt_rocketmq_record_is_named_and_the_rest_still_dumps(
    rocket_dir: tuple[Path, list[Placed]],
) -> None:
    directory, placed = rocket_dir
    victim = placed[2]
    # Body of a record with IPv6 born and store hosts: 84 + 12 + 12, then the 4-byte length.
    flip_byte(directory, victim.offset + 84 + 24 + 4, ROCKET_FILE_BYTES)
    done = run("log", "verify", directory)
    assert done.returncode == 1
    assert f"first bad offset {victim.offset} " in done.stderr
    lines = dump(directory)
    assert [line["offset"] for line in lines] == [p.offset for p in placed]
    assert lines[2]["bad"] is True and lines[2]["crc_ok"] is False
    assert all("bad" not in line for i, line in enumerate(lines) if i != 2)


# -- usage errors -------------------------------------------------------------------------------


def test_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    for command in ("dump", "verify"):
        done = run("log", command, tmp_path / "nope")
        assert done.returncode == 2
        assert "does not exist" in done.stderr


def test_a_directory_without_segments_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a segment")
    done = run("log", "verify", tmp_path)
    assert done.returncode == 2
    assert "no segment files" in done.stderr


def test_segment_files_of_mixed_sizes_are_a_usage_error(tmp_path: Path) -> None:
    build_rocketmq_style(tmp_path, 1024, [Msg("T", 0, b"x" * 300) for _ in range(6)])
    with (tmp_path / segment_name(0)).open("ab") as f:
        f.write(b"\x00" * 512)
    for command in ("dump", "verify"):
        done = run("log", command, tmp_path)
        assert done.returncode == 2
        assert "differ in size" in done.stderr


def test_a_negative_from_offset_is_a_usage_error(our_log: OurLog) -> None:
    done = run("log", "dump", our_log.commitlog_dir, "--from", "-1")
    assert done.returncode == 2


def test_help_texts_explain_the_commands() -> None:
    top = run("--help")
    assert top.returncode == 0 and "log" in top.stdout
    group = run("log", "--help")
    assert "dump" in group.stdout and "verify" in group.stdout and "20-digit" in group.stdout
    dump_help = run("log", "dump", "--help").stdout
    for word in ("--from", "--limit", "--body", "msg_id", "crc_ok", "next_offset"):
        assert word in dump_help
    verify_help = run("log", "verify", "--help").stdout
    assert "Exit status" in verify_help and "2" in verify_help


def test_the_installed_script_entry_point_runs_the_same_command() -> None:
    script = Path(sys.executable).with_name("mqstore")
    if not script.exists():
        pytest.skip("the package is not installed with its console script in this environment")
    done = subprocess.run(
        [str(script), "log", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and "dump" in done.stdout
    assert os.access(script, os.X_OK)


# -- the data dir `mqstore up` made ------------------------------------------------------------


def test_verify_and_dump_take_the_data_dir_mqstore_up_made(our_log: OurLog, tmp_path: Path) -> None:
    """`mqstore up` keeps the log in DATA/commitlog_svc/commitlog (DATA/commitlog_svc-i with
    --replicas): DATA itself is what a user names."""
    data = tmp_path / "up-data"
    shutil.copytree(our_log.data_dir, data / "commitlog_svc")
    (data / "cq_svc").mkdir()
    done = run("log", "verify", data)
    assert done.returncode == 0, done.stderr
    assert f"{len(our_log.written)} records" in done.stdout, done.stdout
    assert len(dump(data)) == len(our_log.written)

    group = tmp_path / "group-data"
    for i in range(3):
        shutil.copytree(our_log.data_dir, group / f"commitlog_svc-{i}")
    done = run("log", "verify", group)
    assert done.returncode == 2, done.stderr
    assert "3 commit-log replicas" in done.stderr and "commitlog_svc-2" in done.stderr
    assert run("log", "verify", group / "commitlog_svc-1").returncode == 0
