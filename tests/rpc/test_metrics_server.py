"""The metrics port: it serves /metrics, and binding it asks no DNS server anything."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from mqstore.rpc.metrics import MetricsServer


def test_serves_metrics_without_a_reverse_dns_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    # http.server's own bind looks the address up (socket.getfqdn): where no DNS server answers
    # (a network namespace, a pod with its resolver down) that held a service's start for 10 s.
    def no_dns(name: str = "") -> str:
        raise AssertionError(f"getfqdn({name!r}) called: a start would wait on DNS")

    monkeypatch.setattr(socket, "getfqdn", no_dns)
    server = MetricsServer("127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert r.status == 200
        assert "grpc_server_handled_total" in body or "python_info" in body
    finally:
        server.stop()
