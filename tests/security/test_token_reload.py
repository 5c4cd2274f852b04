"""A running service reads its tokens file again: a token added by `mqstore token new
--tokens-file` works within the reload bound, a removed one is refused, SIGHUP reloads at once,
and a file that does not read keeps the tokens in force and names the file and line in the log.

One commitlog_svc process with TLS and a tokens file of its own (the session's tokens file is
shared by other tests and must not change); each test starts from BASELINE, put in force by
SIGHUP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.cli.security import new_token, toml_entry, write_secret
from mqstore.client import ClientSettings, Producer, TlsSettings
from mqstore.client.errors import Unauthenticated
from mqstore.rpc.auth import TOKENS_RELOAD_CHECK_S, TokensFile, hash_token
from mqstore.rpc.channel import ChannelSecurity, make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.testing.cluster import Cluster

from .conftest import Material

pytestmark = pytest.mark.timeout(120)
# The reload bound, and what a loaded machine adds to it (a check, a read, a call).
WITHIN_S = TOKENS_RELOAD_CHECK_S + 2.0
# SIGHUP: "at once", far under a check period.
SIGHUP_WITHIN_S = 1.0
BASELINE = {"admin": ("admin",), "producer": ("produce:orders*",)}


class Store:
    """The service, its tokens file, the tokens by name, and its log."""

    def __init__(self, cluster: Cluster, material: Material, root: Path) -> None:
        self.cluster = cluster
        self.material = material
        self.root = root
        self.tokens_file = root / "tokens.toml"
        self.tokens = {name: new_token() for name in BASELINE}
        self.log = cluster.logs / "commitlog.log"

    def entries(self, names: Callable[[str], bool] = lambda _: True) -> str:
        return "\n".join(toml_entry(n, self.tokens[n], s) for n, s in BASELINE.items() if names(n))

    def token_file(self, name: str) -> Path:
        path = self.root / f"{name}.token"
        if not path.exists():
            write_secret(path, self.tokens[name] + "\n")
        return path

    def status(self, token: str) -> grpc.StatusCode:
        """The code of a GetStatus call with `token` (OK when it is admitted)."""
        security = ChannelSecurity(tls=True, ca_file=str(self.material.ca), token=token)
        with make_channel(self.cluster.commitlog.target, security) as channel:
            try:
                commitlog_pb2_grpc.CommitLogStub(channel).GetStatus(
                    cl.GetStatusRequest(), timeout=5
                )
            except grpc.RpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    def client(self, token_file: Path) -> ClientSettings:
        return ClientSettings(
            commitlog=self.cluster.commitlog.target,
            tls=TlsSettings(ca_file=str(self.material.ca)),
            token_file=str(token_file),
        )

    def sighup(self) -> None:
        self.cluster.commitlog.signal(signal.SIGHUP)

    def log_lines(self, text: str) -> list[str]:
        return [line for line in self.log.read_text(encoding="utf-8").splitlines() if text in line]


def until(probe: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until `probe()` held; AssertionError past `timeout_s`."""
    start = time.monotonic()
    while not probe():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not true within {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def running(material: Material, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    root = tmp_path_factory.mktemp("token-reload")
    flags = [
        "--tls-cert-file", str(material.server_cert),
        "--tls-key-file", str(material.server_key),
        "--tokens-file", str(root / "tokens.toml"),
    ]  # fmt: skip
    cluster = Cluster(root / "store", extra={"commitlog_svc": flags})
    store = Store(cluster, material, root)
    write_secret(store.tokens_file, store.entries())
    try:
        cluster.start_commitlog()
        yield store
    finally:
        cluster.stop_all()


@pytest.fixture
def store(running: Store) -> Store:
    """The running store with BASELINE in force (and nothing else), whatever a test left."""
    (running.root / "late.token").unlink(missing_ok=True)
    write_secret(running.tokens_file, running.entries())
    before = len(running.log_lines("reloaded"))
    running.sighup()
    until(lambda: len(running.log_lines("reloaded")) > before, WITHIN_S)
    assert running.status(running.tokens["admin"]) == grpc.StatusCode.OK
    return running


def test_a_token_made_by_token_new_works_within_the_reload_bound(store: Store) -> None:
    late = store.root / "late.token"
    done = subprocess.run(
        [
            sys.executable, "-m", "mqstore.cli", "token", "new",
            "--name", "late", "--scope", "produce:orders*",
            "--out", str(late), "--tokens-file", str(store.tokens_file),
        ],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"added to {store.tokens_file}; running services read it within" in done.stderr
    token = late.read_text(encoding="utf-8").strip()

    took = until(lambda: store.status(token) == grpc.StatusCode.OK, WITHIN_S)
    with Producer(store.client(late)) as producer:
        assert producer.send_sync("orders-late", b"first order of a new token").msg_id
    assert store.status(store.tokens["producer"]) == grpc.StatusCode.OK  # the others stay
    added = store.log_lines("(changed) reloaded")[-1]
    assert "3 tokens" in added and "'late'" in added, added
    print(f"new token admitted {took:.2f} s after `token new` returned")


def test_a_removed_token_is_unauthenticated_within_the_reload_bound(store: Store) -> None:
    with Producer(store.client(store.token_file("producer"))) as producer:
        producer.send_sync("orders-a", b"before")
        write_secret(store.tokens_file, store.entries(lambda n: n != "producer"))
        took = until(
            lambda: store.status(store.tokens["producer"]) == grpc.StatusCode.UNAUTHENTICATED,
            WITHIN_S,
        )
        with pytest.raises(Unauthenticated):  # the same client, its next call
            producer.send_sync("orders-a", b"after")
    assert store.status(store.tokens["admin"]) == grpc.StatusCode.OK
    print(f"removed token refused {took:.2f} s after the file changed")


def test_sighup_reloads_at_once_even_what_the_check_cannot_see(store: Store) -> None:
    """The producer's hash replaced in place, with the same size and mtime: the periodic check
    sees nothing; SIGHUP reads it."""
    path = str(store.tokens_file)
    st = os.stat(path)
    text = store.tokens_file.read_text(encoding="utf-8")
    rotated = new_token()
    old_hex, new_hex = hash_token(store.tokens["producer"]).hex(), hash_token(rotated).hex()
    assert old_hex in text
    with open(path, "r+", encoding="utf-8") as f:
        f.write(text.replace(old_hex, new_hex))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )

    store.sighup()
    took = until(lambda: store.status(rotated) == grpc.StatusCode.OK, SIGHUP_WITHIN_S)
    assert store.status(store.tokens["producer"]) == grpc.StatusCode.UNAUTHENTICATED
    assert store.log_lines("(SIGHUP) reloaded")
    print(f"SIGHUP: rotated token admitted after {took:.2f} s")


def test_an_open_stream_of_a_removed_token_ends_unauthenticated(store: Store) -> None:
    """A Subscribe stream admitted before the reload ends at its next frame after it."""
    follower = new_token()
    write_secret(
        store.tokens_file, store.entries() + toml_entry("follower", follower, ["subscribe"])
    )
    store.sighup()
    until(lambda: store.status(follower) == grpc.StatusCode.OK, SIGHUP_WITHIN_S)
    security = ChannelSecurity(tls=True, ca_file=str(store.material.ca), token=follower)
    with make_channel(store.cluster.commitlog.target, security) as channel:
        frames = commitlog_pb2_grpc.CommitLogStub(channel).Subscribe(
            cl.SubscribeRequest(subscriber_id="reload-test"), timeout=30
        )
        assert next(frames).HasField("handshake")
        write_secret(store.tokens_file, store.entries())
        store.sighup()
        until(lambda: store.status(follower) == grpc.StatusCode.UNAUTHENTICATED, SIGHUP_WITHIN_S)
        with Producer(store.client(store.token_file("producer"))) as producer:
            producer.send_sync("orders-stream", b"a frame for the stream to carry")
        with pytest.raises(grpc.RpcError) as refused:
            for _ in frames:
                pass
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
        assert "'follower' was removed from the tokens file" in str(refused.value.details())


BROKEN = {
    # what the file holds -> what the error line must say
    "toml": ('[[token]]\nname = "x"\nsha256 = oops\n', "line 3"),
    "entry": (None, "token 'bad' (line "),
    "empty": ("# every token removed by mistake\n", "no [[token]] entries"),
}


def write_broken(store: Store, kind: str) -> str:
    """The tokens file made unreadable in the way `kind` says; what the error must say."""
    text, says = BROKEN[kind]
    if text is None:  # the producer removed, and an entry with a scope that does not parse
        bad = toml_entry("bad", new_token(), ["admin"]).replace('"admin"', '"admin:x"')
        text = store.entries(lambda n: n != "producer") + bad
    write_secret(store.tokens_file, text)
    return says


def assert_old_tokens_in_force(store: Store) -> None:
    for name in BASELINE:  # nobody locked out, no removal applied
        assert store.status(store.tokens[name]) == grpc.StatusCode.OK, name
    assert store.status(new_token()) == grpc.StatusCode.UNAUTHENTICATED  # nor a door opened


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_file_that_does_not_read_keeps_the_tokens_in_force(store: Store, kind: str) -> None:
    errors = len(store.log_lines("not reloaded"))
    says = write_broken(store, kind)
    store.sighup()
    until(lambda: len(store.log_lines("not reloaded")) > errors, SIGHUP_WITHIN_S)

    line = store.log_lines("not reloaded")[-1]
    assert str(store.tokens_file) in line and says in line, line
    assert "the 2 tokens read before stay in force" in line, line
    assert_old_tokens_in_force(store)


@pytest.mark.slow
def test_a_changed_file_that_does_not_read_is_logged_once_and_the_next_change_read(
    store: Store,
) -> None:
    errors = len(store.log_lines("not reloaded"))
    write_broken(store, "entry")
    until(lambda: len(store.log_lines("not reloaded")) > errors, WITHIN_S)
    assert_old_tokens_in_force(store)
    time.sleep(TOKENS_RELOAD_CHECK_S + 0.5)  # checks of the same broken file log nothing
    assert len(store.log_lines("not reloaded")) == errors + 1
    write_secret(store.tokens_file, store.entries(lambda n: n != "producer"))
    until(
        lambda: store.status(store.tokens["producer"]) == grpc.StatusCode.UNAUTHENTICATED,
        WITHIN_S,
    )


def test_a_missing_file_keeps_the_tokens_in_force(store: Store) -> None:
    errors = len(store.log_lines("not reloaded"))
    store.tokens_file.unlink()
    until(lambda: len(store.log_lines("not reloaded")) > errors, WITHIN_S)
    assert store.status(store.tokens["producer"]) == grpc.StatusCode.OK
    assert "No such file" in store.log_lines("not reloaded")[-1]


# -- in-process: the file's reads, and what the errors name ---------------------------------------


def test_tokens_file_reads_again_only_when_the_file_changed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    a, b = new_token(), new_token()
    write_secret(path, toml_entry("a", a, ["admin"]))
    tokens = TokensFile(str(path))
    seen: list[int] = []
    tokens.on_reload(lambda table: seen.append(len(table.grants)))
    assert not tokens.check()  # unchanged: not read
    write_secret(path, toml_entry("a", a, ["admin"]) + toml_entry("b", b, ["subscribe"]))
    assert tokens.check() and seen == [2]
    assert tokens.table.authenticate(b).name == "b"
    assert not tokens.check()
    write_secret(path, "[[token]]\nname = 'b'\n")  # no sha256: refused, the old table stays
    assert not tokens.check() and seen == [2]
    assert tokens.table.authenticate(a).name == "a"


def test_a_bad_entry_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    first = toml_entry("a", new_token(), ["admin"])
    write_secret(path, first + '\n[[token]]\nname = "b"\nsha256 = "00"\n')
    line = first.count("\n") + 2
    with pytest.raises(Exception, match=rf"token 'b' \(line {line}\): `sha256` must be 64"):
        TokensFile(str(path))


def test_the_service_logs_its_pid_for_sighup(running: Store) -> None:
    """docs/security.md sends SIGHUP to the pid in the `listening` line and the ports file."""
    process = running.cluster.commitlog
    assert process.proc is not None
    ports = Path(process.data_dir) / ".commitlog_svc.ports.json"  # where `mqstore up` puts it
    assert json.loads(ports.read_text(encoding="utf-8"))["pid"] == process.proc.pid
    event = json.loads(running.log_lines("listening")[0])["event"]
    assert json.loads(event.removeprefix("listening "))["pid"] == process.proc.pid
