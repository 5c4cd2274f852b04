"""index_svc's settings: defaults < TOML file ([index] table) < MQSTORE_INDEX_* < flags.

    python -m index_svc --data-dir ./data/index-0 --commitlog-target 127.0.0.1:7100 \
        --shard-count 4 --shard-index 1 --exact true

Shards. A replica indexes the keys of shard `shard_index` of `shard_count` (mqstore.sharding).
In Kubernetes the replicas are one StatefulSet whose pods are named index-0, index-1, ...: with
`shard_from_ordinal` the shard index is the pod ordinal (the number after the last "-" of the
subscriber id, which defaults to the pod name) modulo `shard_count`, so replicas=2*shard_count
gives every shard two replicas and changing the shard count changes no manifest but one number.

Geometry defaults are RocketMQ's (a 420 MB file of 19,999,999 keys); tests pass tiny ones.
"""

from __future__ import annotations

import os
import re
from typing import ClassVar, Self

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from index_svc.config import IndexConfig
from mqstore.dispatch import DISPATCH_LINGER_MS_MAX
from mqstore.errors import InvalidArgument
from mqstore.formats import index_file as fmt
from mqstore.ports import DEFAULT_PORTS
from mqstore.rpc.settings import FollowerSettings

_API_PORT, _HEALTH_PORT, _METRICS_PORT = DEFAULT_PORTS["index_svc"]
_COMMITLOG_PORT = DEFAULT_PORTS["commitlog_svc"][0]
POD_NAME_ENV = "POD_NAME"
DEFAULT_SUBSCRIBER_ID = "index-0"
# The index's dispatch linger (dispatch_linger_ms); measured in docs/index.md.
DISPATCH_LINGER_MS_DEFAULT = 20
# A StatefulSet pod name ends in "-<ordinal>".
_ORDINAL = re.compile(r"-(\d+)$")


def default_subscriber_id() -> str:
    return os.environ.get(POD_NAME_ENV) or DEFAULT_SUBSCRIBER_ID


def ordinal_of(name: str) -> int:
    """The ordinal of a StatefulSet-style name: "index-3" -> 3."""
    found = _ORDINAL.search(name)
    if found is None:
        raise ValueError(f"{name!r} does not end in -<ordinal> (as StatefulSet pods are named)")
    return int(found.group(1))


class IndexSettings(FollowerSettings):
    model_config = SettingsConfigDict(
        env_prefix="MQSTORE_INDEX_", extra="forbid", validate_default=True
    )
    section: ClassVar[str] = "index"

    port: int = Field(_API_PORT, ge=0, le=65535, description="main gRPC port (API, reflection)")
    health_port: int = Field(_HEALTH_PORT, ge=0, le=65535, description="grpc.health.v1 port")
    metrics_port: int = Field(_METRICS_PORT, ge=0, le=65535, description="Prometheus port")

    commitlog_target: str = Field(
        f"127.0.0.1:{_COMMITLOG_PORT}", min_length=1, description="commitlog_svc host:port"
    )
    # Stable per replica: the commit log keeps each subscriber's confirmed offset under it.
    subscriber_id: str = Field(default_factory=default_subscriber_id, min_length=1)

    shard_count: int = Field(1, ge=1, le=1 << 16)
    shard_index: int = Field(0, ge=0)
    shard_from_ordinal: bool = Field(
        False, description="shard_index = ordinal of subscriber_id (index-3 -> 3) % shard_count"
    )
    exact: bool = Field(False, description="keep 64-bit key hashes beside entries (+38% disk)")

    slot_num: int = Field(fmt.DEFAULT_SLOT_NUM, ge=1)
    entry_num: int = Field(fmt.DEFAULT_ENTRY_NUM, ge=2)
    flush_interval_ms: int = Field(1_000, gt=0)
    # Messages a key query answers when it asks for 0 (RocketMQ's maxMsgsNumBatch), and the most
    # it answers whatever it asks for. RocketMQ caps at 64; with no paging in the API, a key
    # with more messages would stay out of reach but by time ranges, so the cap is the walk's
    # bound instead. Unique-id queries answer at most uniq_max_results (defaultQueryMaxNum).
    default_results: int = Field(64, gt=0)
    max_results: int = Field(1_024, gt=0)
    uniq_max_results: int = Field(32, gt=0)
    max_candidates: int = Field(1_024, gt=0)
    verify_sealed_on_open: bool = False
    # Bounds the commit-log Read of a query; a caller's deadline, when sooner, bounds it instead.
    read_timeout_s: float = Field(10.0, gt=0)
    # How often to ask the commit log for its minimum offset and drop index files below it.
    retention_check_interval_s: float = Field(10.0, gt=0)
    # Dispatch entries per batch asked of the commit log (0: its default).
    max_batch_entries: int = Field(0, ge=0)
    # At most one dispatch frame per this many ms while appends keep coming (0: each frame as
    # soon as it is visible): a key becomes findable up to this much later, and the index and
    # the commit log spend far less on frames at moderate rates (docs/index.md).
    dispatch_linger_ms: int = Field(DISPATCH_LINGER_MS_DEFAULT, ge=0, le=DISPATCH_LINGER_MS_MAX)

    @model_validator(mode="after")
    def _derive_shard(self) -> Self:
        if self.shard_from_ordinal:
            self.shard_index = ordinal_of(self.subscriber_id) % self.shard_count
        if self.default_results > self.max_results:
            raise ValueError(
                f"default_results {self.default_results} must not exceed max_results "
                f"{self.max_results}"
            )
        if self.shard_index >= self.shard_count:
            raise ValueError(
                f"shard_index {self.shard_index} must be below shard_count {self.shard_count}"
            )
        try:
            self.index_config()  # the engine's own checks (geometry, limits), at load time
        except InvalidArgument as err:
            raise ValueError(str(err)) from err
        return self

    def index_config(self) -> IndexConfig:
        return IndexConfig(
            data_dir=self.data_dir,
            slot_num=self.slot_num,
            entry_num=self.entry_num,
            exact=self.exact,
            shard_count=self.shard_count,
            shard_index=self.shard_index,
            flush_interval_ms=self.flush_interval_ms,
            max_results=self.max_results,
            uniq_max_results=self.uniq_max_results,
            max_candidates=self.max_candidates,
            verify_sealed_on_open=self.verify_sealed_on_open,
        )
