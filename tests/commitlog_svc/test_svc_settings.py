"""commitlog_svc's settings: flags, environment, the [commitlog] table, and what they become."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from commitlog_svc.config import FlushMode
from commitlog_svc.settings import CommitLogSettings
from mqstore.ports import DEFAULT_PORTS


def test_defaults_run_on_one_machine_on_the_commit_logs_ports() -> None:
    s = CommitLogSettings.load([])
    assert (s.port, s.health_port, s.metrics_port) == DEFAULT_PORTS["commitlog_svc"]
    assert s.flush == "async" and s.host == "127.0.0.1"
    engine = s.engine_config()
    assert engine.flush is FlushMode.ASYNC and engine.file_bytes == 1 << 30


def test_flags_environment_and_file_reach_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "mqstore.toml"
    config.write_text("[commitlog]\nfile_bytes = 1048576\nflush_interval_ms = 77\n")
    monkeypatch.setenv("MQSTORE_COMMITLOG_CHECKPOINT_INTERVAL_MS", "333")
    s = CommitLogSettings.load(
        ["--config", str(config), "--flush", "sync", "--data-dir", "/d",
         "--delete-when-hours", "[1, 13]", "--producers-max", "9"]
    )  # fmt: skip
    engine = s.engine_config(store_ip="10.0.0.5", store_port=7100)
    assert engine.flush is FlushMode.SYNC
    assert (engine.file_bytes, engine.flush_interval_ms, engine.checkpoint_interval_ms) == (
        1 << 20,
        77,
        333,
    )
    assert engine.delete_when_hours == (1, 13) and engine.producers_max == 9
    assert engine.data_dir == "/d" and engine.store_host == bytes([10, 0, 0, 5, 0, 0, 0x1B, 0xBC])


@pytest.mark.parametrize(
    "flag", [["--flush", "sometimes"], ["--file-bytes", "100"], ["--nope", "1"]]
)
def test_bad_settings_are_refused(flag: list[str]) -> None:
    with pytest.raises((ValidationError, SystemExit)):
        CommitLogSettings.load(flag)


def test_the_store_host_is_the_services_own_address_and_bound_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert CommitLogSettings.load([]).store_address(41234) == ("127.0.0.1", 41234)
    assert CommitLogSettings.load([], store_port=9).store_address(41234) == ("127.0.0.1", 9)
    assert CommitLogSettings.load([], store_ip="10.1.1.1").store_address(5) == ("10.1.1.1", 5)
    assert CommitLogSettings.load([], host="localhost").store_address(5) == ("127.0.0.1", 5)
    monkeypatch.delenv("POD_IP", raising=False)
    assert CommitLogSettings.load([], host="0.0.0.0").store_address(5) == ("127.0.0.1", 5)
    monkeypatch.setenv("POD_IP", "10.9.8.7")
    assert CommitLogSettings.load([], host="0.0.0.0").store_address(5) == ("10.9.8.7", 5)
