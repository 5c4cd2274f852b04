"""Service settings: defaults < TOML file < environment < flags < explicit overrides."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from mqstore.rpc.settings import ServiceSettings


class DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="MQSTORE_DEMO_", extra="forbid")
    section: ClassVar[str] = "demo"
    flush: str = "async"


@pytest.fixture
def config_file(tmp_path: Path) -> str:
    path = tmp_path / "mqstore.toml"
    path.write_text('data_dir = "/shared"\nport = 1\n[demo]\nport = 5\nflush = "sync"\n')
    return str(path)


def test_defaults_run_on_one_machine() -> None:
    s = DemoSettings.load([])
    assert (s.host, s.data_dir, s.flush) == ("127.0.0.1", "./data", "async")


def test_the_file_gives_shared_keys_and_the_services_own_table(config_file: str) -> None:
    s = DemoSettings.load(["--config", config_file])
    assert (s.data_dir, s.port, s.flush) == ("/shared", 5, "sync")


def test_environment_beats_the_file_and_flags_beat_the_environment(
    config_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQSTORE_DEMO_PORT", "6")
    assert DemoSettings.load(["--config", config_file]).port == 6
    assert DemoSettings.load(["--config", config_file, "--port", "7"]).port == 7
    assert DemoSettings.load(["--port", "7"], port=8).port == 8


def test_the_config_file_can_come_from_the_environment(
    config_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQSTORE_CONFIG", config_file)
    assert DemoSettings.load([]).flush == "sync"


def test_a_bare_variable_named_like_a_field_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "9999")
    assert DemoSettings.load([]).port == 0


def test_bad_values_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValidationError, match="port"):
        DemoSettings.load(["--port", "70000"])
    with pytest.raises(ValidationError, match="log_level"):
        DemoSettings.load(["--log-level", "loud"])
