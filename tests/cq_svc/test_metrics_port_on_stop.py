"""A stopped service lets go of its metrics port (the metrics server is mqstore.rpc's)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.cq_svc.support import ApiHarness


def test_a_stopped_service_no_longer_listens_on_its_metrics_port(tmp_path: Path) -> None:
    api = ApiHarness(tmp_path / "cq")
    port = api.host.metrics_port
    api.stop()
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex(("127.0.0.1", port)) != 0
