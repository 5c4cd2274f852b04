"""Service configuration: defaults < a TOML file < environment variables < command-line flags.

Every service subclasses `ServiceSettings` with its own fields and environment prefix
(MQSTORE_COMMITLOG_, MQSTORE_CQ_, MQSTORE_INDEX_). The file comes from `--config FILE` or the
MQSTORE_CONFIG variable; within it a service reads its own table ([commitlog], [cq], [index])
and the shared top-level keys. Flags are the field names: `--port 7100 --data-dir ./data`.
The defaults run all three services on one machine.

Security (docs/security.md), all off by default so that `mqstore up` needs nothing:

    tls_cert_file, tls_key_file   the API serves TLS with this certificate chain and key (PEM)
    tls_client_ca_file            and requires client certificates issued by this CA (mTLS)
    tokens_file                   and requires a bearer token with the scope (mqstore/rpc/auth.py)

Followers (cq_svc, index_svc) reach commitlog_svc as clients (`FollowerSettings`):

    commitlog_tls_ca_file         TLS to the commit log, trusting this CA ("" with
                                  commitlog_tls: the system's roots)
    commitlog_tls_cert_file/_key_file   a client certificate, for a commit log that wants one
    commitlog_tls_server_name     the name to check in its certificate (default: the target's)
    commitlog_token_file          the follower's own token (scopes: subscribe, consume:*)

Only paths are settings: secrets stay in their files, out of argv, the environment and logs.
"""

from __future__ import annotations

import argparse
import contextvars
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from mqstore.rpc.channel import ChannelSecurity
from mqstore.storage.data_mode import DataMode

CONFIG_ENV = "MQSTORE_CONFIG"
# Workers that no stream or long poll may hold (each service's settings check its caps against
# max_workers): unary calls (pulls, appends, acks, status) always find a thread. Calls of ~1 ms
# on 2 cores need a few threads at once; 8 keep them busy with room for a slow disk read.
UNARY_WORKERS_MIN = 8


def unary_workers_min(max_workers: int) -> int:
    """Workers no stream or long poll may hold: UNARY_WORKERS_MIN, or half of a smaller pool."""
    return min(UNARY_WORKERS_MIN, max_workers // 2)


def check_worker_budget(max_workers: int, held: Mapping[str, int]) -> None:
    """`held` (setting name -> calls that may each hold a worker at once) leaves
    unary_workers_min of max_workers free; ValueError naming the settings otherwise."""
    reserve = unary_workers_min(max_workers)
    if sum(held.values()) + reserve > max_workers:
        names = " + ".join(f"{name} ({n})" for name, n in held.items())
        raise ValueError(
            f"{names} must leave {reserve} of max_workers ({max_workers}) to unary calls: "
            "lower them or raise max_workers"
        )


class ServiceSettings(BaseSettings):
    # Subclasses set their own prefix; this one keeps a bare PORT or HOST from leaking in.
    model_config = SettingsConfigDict(env_prefix="MQSTORE_", extra="forbid", validate_default=True)

    # The TOML table holding this service's own keys.
    section: ClassVar[str] = ""

    host: str = Field("127.0.0.1", description="address the API, health and metrics ports bind")
    port: int = Field(0, ge=0, le=65535, description="main gRPC port (API and reflection)")
    health_port: int = Field(0, ge=0, le=65535, description="plaintext grpc.health.v1 port")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus port (0: a free one)")
    data_dir: str = Field("./data", description="where this service keeps its files")
    # Who may read them (mqstore/storage/data_mode.py): "private" 0700 directories and 0600
    # files, or "group" 0750 / 0640 for a group that must read them too (an fsGroup, a backup).
    data_mode: DataMode = Field("private", description="private (0700/0600) or group (0750/0640)")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    # SIGTERM: health NOT_SERVING, wait drain_delay_s for endpoints to go, finish calls in
    # grace_period_s, then flush and checkpoint.
    drain_delay_s: float = Field(0.0, ge=0)
    grace_period_s: float = Field(10.0, ge=0)
    # A sync server holds a thread per call in flight (streams and long polls included; their
    # caps leave UNARY_WORKERS_MIN of these to unary calls).
    max_workers: int = Field(64, ge=2, le=1024)
    max_message_bytes: int = Field(64 << 20, ge=1 << 20)
    # glibc keeps megabyte buffers in the heap between messages instead of fresh pages for each
    # (mqstore/rpc/allocator.py): no page faults in serializing a megabyte answer.
    keep_large_blocks: bool = True
    # Where to write the bound ports as JSON once listening (launchers and tests read it).
    ports_file: str = ""

    # -- security of the API port (the health port stays plaintext and health-only) --------------
    tls_cert_file: str = Field("", description="PEM certificate chain: the API serves TLS")
    tls_key_file: str = Field("", description="PEM private key of tls_cert_file")
    tls_client_ca_file: str = Field(
        "", description="PEM CA bundle: require client certificates it issued (mutual TLS)"
    )
    tokens_file: str = Field(
        "", description="TOML of token hashes and scopes: require a bearer token (auth.py)"
    )

    @model_validator(mode="after")
    def _check_tls(self) -> Self:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError(
                "tls_client_ca_file (client certificates) needs server TLS: "
                "tls_cert_file and tls_key_file"
            )
        return self

    @classmethod
    def load(cls, argv: list[str] | None = None, **overrides: Any) -> Self:
        """Settings from the file, the environment and the flags in `argv`; `overrides`
        (tests, launchers) win over everything."""
        pre = argparse.ArgumentParser(add_help=False)
        pre.add_argument("--config", default=os.environ.get(CONFIG_ENV, ""))
        known, rest = pre.parse_known_args(argv or [])
        file_values = _read_toml(known.config, cls.section) if known.config else {}
        token = _SOURCES.set((file_values, rest))
        try:
            return cls(**overrides)
        finally:
            _SOURCES.reset(token)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file_values, cli_args = _SOURCES.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings]
        if cli_args is not None:
            sources.append(
                CliSettingsSource(settings_cls, cli_parse_args=cli_args, cli_kebab_case=True)
            )
        sources.append(env_settings)
        sources.append(InitSettingsSource(settings_cls, init_kwargs=file_values))
        return tuple(sources)


class FollowerSettings(ServiceSettings):
    """A service that follows commitlog_svc (cq_svc, index_svc): how it reaches it securely."""

    commitlog_tls: bool = Field(
        False, description="TLS to the commit log (on by itself with any commitlog_tls_* file)"
    )
    commitlog_tls_ca_file: str = Field("", description="PEM CA bundle for the commit log's cert")
    commitlog_tls_cert_file: str = Field("", description="client certificate (mutual TLS)")
    commitlog_tls_key_file: str = Field("", description="key of commitlog_tls_cert_file")
    commitlog_tls_server_name: str = Field("", description="name checked in its certificate")
    commitlog_token_file: str = Field("", description="file holding this follower's token")

    @model_validator(mode="after")
    def _check_commitlog_tls(self) -> Self:
        if bool(self.commitlog_tls_cert_file) != bool(self.commitlog_tls_key_file):
            raise ValueError("commitlog_tls_cert_file and commitlog_tls_key_file go together")
        return self

    def commitlog_security(self) -> ChannelSecurity:
        """TLS and token for every channel to the commit log; reads the token file now."""
        return ChannelSecurity.from_files(
            tls=self.commitlog_tls
            or bool(
                self.commitlog_tls_ca_file
                or self.commitlog_tls_cert_file
                or self.commitlog_tls_server_name
            ),
            ca_file=self.commitlog_tls_ca_file,
            cert_file=self.commitlog_tls_cert_file,
            key_file=self.commitlog_tls_key_file,
            server_name=self.commitlog_tls_server_name,
            token_file=self.commitlog_token_file,
        )


# What `load` found for the settings being built: (file values, remaining argv).
_SOURCES: contextvars.ContextVar[tuple[dict[str, Any], list[str] | None]] = contextvars.ContextVar(
    "mqstore_settings_sources", default=({}, None)
)


def _read_toml(path: str, section: str) -> dict[str, Any]:
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    values = {k: v for k, v in data.items() if not isinstance(v, dict)}
    if section and isinstance(data.get(section), dict):
        values.update(data[section])
    return values
