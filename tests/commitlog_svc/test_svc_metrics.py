"""The mqstore_* series on the metrics port, scraped over HTTP as Prometheus would."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from tests.commitlog_svc.support import Running, batch, subscribe, wait_until


def scrape(svc: Running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{svc.service.host.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_append_flush_and_dispatch_series_are_exported(start: Callable[..., Running]) -> None:
    svc = start(flush="sync")
    before = scrape(svc)
    stored = svc.append_ok(batch(0, 10))
    svc.append(batch(10, 2, topic="bad topic!"))
    reader = subscribe(svc, "watcher")
    reader.wait_reaching(svc.status().max_offset)
    wait_until(
        lambda: scrape(svc)[("mqstore_dispatch_behind_bytes", (("subscriber", "watcher"),))] == 0,
        "dispatch-behind to reach 0",
    )
    after = scrape(svc)

    def delta(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert delta("mqstore_commitlog_appended_messages_total") == 10
    assert delta("mqstore_commitlog_appended_bytes_total") == sum(stored.sizes)
    assert delta("mqstore_commitlog_append_refused_total", (("status", "MESSAGE_ILLEGAL"),)) == 2
    assert delta("mqstore_commitlog_flush_duration_seconds_count") >= 1  # sync: flushed first
    assert after[("mqstore_commitlog_flush_behind_bytes", ())] == 0
    end = stored.commit_log_offsets[-1] + stored.sizes[-1]
    assert after[("mqstore_commitlog_max_offset", ())] == end
    assert after[("mqstore_subscriber_lag_bytes", (("subscriber", "watcher"),))] == end
    reader.cancel()


def test_disk_series_are_what_df_shows_for_the_log(start: Callable[..., Running]) -> None:
    svc = start(flush="sync")
    after = scrape(svc)
    st = os.statvfs(svc.engine.queue.store_path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    total = used + st.f_bavail * st.f_frsize
    assert 0 < after[("mqstore_commitlog_disk_used_bytes", ())] <= total
    # Other processes write to the same file system between the two looks: a few MiB apart.
    assert abs(after[("mqstore_commitlog_disk_used_bytes", ())] - used) < 64 << 20
    assert abs(after[("mqstore_commitlog_disk_total_bytes", ())] - total) < 64 << 20
    # Every refusal status and every mismatch source is there before the first one happens.
    assert ("mqstore_commitlog_append_refused_total", (("status", "MESSAGE_ILLEGAL"),)) in after
    assert (
        "mqstore_commitlog_append_refused_total",
        (("status", "SERVICE_NOT_AVAILABLE"),),
    ) in after
    assert ("mqstore_crc_mismatch_total", (("source", "dispatch"),)) in after
