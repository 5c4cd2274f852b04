"""index_svc settings: one-machine defaults, the [index] table, MQSTORE_INDEX_*, flags, and the
shard index derived from a StatefulSet pod ordinal."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from index_svc.settings import IndexSettings, ordinal_of
from mqstore.ports import DEFAULT_PORTS


@pytest.fixture(autouse=True)
def _no_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)


def test_defaults_run_on_one_machine_next_to_the_default_commit_log() -> None:
    s = IndexSettings.load([])
    assert (s.port, s.health_port, s.metrics_port) == DEFAULT_PORTS["index_svc"]
    assert s.commitlog_target == f"127.0.0.1:{DEFAULT_PORTS['commitlog_svc'][0]}"
    assert (s.subscriber_id, s.shard_count, s.shard_index, s.exact) == ("index-0", 1, 0, False)
    assert (s.default_results, s.max_results, s.uniq_max_results) == (64, 1_024, 32)


def test_the_subscriber_id_defaults_to_the_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "index-5")
    assert IndexSettings.load([]).subscriber_id == "index-5"
    assert IndexSettings.load(["--subscriber-id", "mine"]).subscriber_id == "mine"


def test_the_index_table_environment_and_flags_apply_in_that_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mqstore.toml"
    path.write_text("[index]\nshard_count = 3\nshard_index = 1\nexact = true\n[cq]\nport = 1\n")
    s = IndexSettings.load(["--config", str(path)])
    assert (s.shard_count, s.shard_index, s.exact, s.port) == (3, 1, True, 7300)
    monkeypatch.setenv("MQSTORE_INDEX_SHARD_INDEX", "2")
    assert IndexSettings.load(["--config", str(path)]).shard_index == 2
    assert IndexSettings.load(["--config", str(path), "--shard-index", "0"]).shard_index == 0


@pytest.mark.parametrize(
    ("pod", "shard_count", "expected"),
    [("index-0", 4, 0), ("index-3", 4, 3), ("index-7", 4, 3), ("index-10", 3, 1)],
)
def test_the_shard_index_can_come_from_the_pod_ordinal_modulo_the_shard_count(
    pod: str, shard_count: int, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", pod)
    s = IndexSettings.load(
        ["--shard-count", str(shard_count), "--shard-from-ordinal", "true", "--shard-index", "99"]
    )
    assert s.shard_index == expected
    assert s.index_config().shard_index == expected


def test_a_name_without_an_ordinal_cannot_give_a_shard_index() -> None:
    assert ordinal_of("mqstore-index-12") == 12
    with pytest.raises(ValidationError, match="ordinal"):
        IndexSettings.load(["--subscriber-id", "indexer", "--shard-from-ordinal", "true"])


@pytest.mark.parametrize(
    "flags",
    [
        ["--shard-count", "2", "--shard-index", "2"],
        ["--shard-count", "0"],
        ["--shard-index", "-1"],
        ["--commitlog-target", ""],
        ["--flush-interval-ms", "0"],
        ["--default-results", "100", "--max-results", "50"],
        ["--max-results", "2000"],  # beyond the candidate walk (max_candidates)
    ],
)
def test_impossible_settings_are_refused(flags: list[str]) -> None:
    with pytest.raises(ValidationError):
        IndexSettings.load(flags)


def test_geometry_and_limits_reach_the_engine_config(tmp_path: Path) -> None:
    s = IndexSettings.load(
        [
            "--data-dir",
            str(tmp_path),
            "--slot-num",
            "16",
            "--entry-num",
            "64",
            "--max-results",
            "8",
            "--default-results",
            "4",
        ]
    )
    config = s.index_config()
    assert (config.data_dir, config.slot_num, config.entry_num) == (str(tmp_path), 16, 64)
    assert config.max_results == 8
