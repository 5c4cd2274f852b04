"""cq_svc's settings: flags, environment, defaults for one machine, and refused relations."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from pydantic import ValidationError

from cq_svc.config import AckFlush, StoreKind
from cq_svc.settings import (
    OPEN_MAPS_AUTO_MAX,
    OPEN_MAPS_AUTO_MIN,
    CqSettings,
    open_maps_for_fd_limit,
)
from mqstore.ports import DEFAULT_PORTS


def test_defaults_listen_on_the_cq_ports_and_follow_the_local_commit_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    s = CqSettings.load([])
    assert (s.port, s.health_port, s.metrics_port) == DEFAULT_PORTS["cq_svc"]
    assert s.commitlog_target == f"127.0.0.1:{DEFAULT_PORTS['commitlog_svc'][0]}"
    assert s.subscriber_id == "cq-0"
    assert (s.cq_store, s.ack_flush) == (StoreKind.FILE, AckFlush.SYNC)


def test_the_subscriber_id_is_the_pod_name_in_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "cq-2")
    assert CqSettings.load([]).subscriber_id == "cq-2"
    assert CqSettings.load(["--subscriber-id", "mine"]).subscriber_id == "mine"


def test_flags_and_environment_reach_the_engine_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQSTORE_CQ_ACK_FLUSH", "async")
    s = CqSettings.load(["--cq-store", "rocksdb", "--data-dir", "/x", "--commitlog-target", "h:1"])
    config = s.engine_config()
    assert (config.cq_store, config.ack_flush, config.data_dir) == (
        StoreKind.ROCKSDB,
        AckFlush.ASYNC,
        "/x",
    )
    assert config.pull_bytes_cap == s.pull_bytes_max
    assert s.commitlog_target == "h:1"


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--long-polls-max", "64", "--max-workers", "64"], "long_polls_max"),
        (["--follow-streams-max", "17"], "follow_streams_max"),  # 24 + 16 + 17 + 8 > 64
        (["--pull-bytes-max", str(40 << 20)], "pull_bytes_max"),
        (["--pull-messages-default", "100", "--pull-messages-max", "50"], "pull_messages_default"),
        (["--cq-store", "leveldb"], "cq_store"),
        (["--subscriber-id", ""], "subscriber_id"),
    ],
)
def test_settings_that_cannot_work_are_refused(flags: list[str], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        CqSettings.load(flags)


_LIMITS_PROBE = """
import resource
from cq_svc.settings import CqSettings, raise_open_files_limit
print(*raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0],
      CqSettings.load(["--data-dir", "/x"]).engine_config().open_maps_max,
      CqSettings.load(["--open-maps-max", "100"]).engine_config().open_maps_max)
"""


@pytest.mark.parametrize(
    ("soft", "hard", "maps"), [(256, 4096, 1024), (64, 128, OPEN_MAPS_AUTO_MIN), (4096, 4096, 1024)]
)
def test_the_service_raises_its_open_files_limit_and_maps_a_quarter_of_it(
    soft: int, hard: int, maps: int
) -> None:
    """In a process started with a low soft limit, as a shell's `ulimit -n` leaves it: the
    soft limit goes up to the hard one, and unset open_maps_max follows it; set, it is kept."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    done = subprocess.run(
        [sys.executable, "-c", _LIMITS_PROBE],
        preexec_fn=limited,
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.split() == [str(v) for v in (soft, hard, hard, maps, 100)]


def test_open_maps_follow_the_limit_up_to_a_cap() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(OPEN_MAPS_AUTO_MIN, min(OPEN_MAPS_AUTO_MAX, soft // 4))
    assert open_maps_for_fd_limit() == want
    assert OPEN_MAPS_AUTO_MAX * 2 < 65_530  # vm.max_map_count's default, with room to spare
