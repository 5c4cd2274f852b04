"""`mqstore up`: the three services on this machine, one command, Ctrl-C to stop.

Starts commitlog_svc, then cq_svc and index_svc subscribed to it, each a process with its own
data directory under DATA_DIR and its log in DATA_DIR/logs/. Prints where each listens and how
to reach it; on Ctrl-C (or SIGTERM) stops them in reverse order, each gracefully (flush,
checkpoint), and exits with 0 only if every service exited cleanly.

Plaintext on loopback by default (`make run` needs nothing). `--secure` makes (or reuses) a CA,
certificates and tokens in DATA_DIR/secrets/ (security.py) and starts every service with TLS
and a tokens file, the followers with their own token; `--mtls` also requires client
certificates. Either prints the `export MQSTORE_...` lines a client needs.
"""

from __future__ import annotations

import os
import shlex
import signal
import time

import click

from mqstore.cli.security import SecretFiles, prepare_secrets
from mqstore.client import contexts
from mqstore.coordination.etcd_process import EtcdProcess
from mqstore.errors import InvalidArgument
from mqstore.launcher import READY_POLL_S, ServiceProcess, last_error
from mqstore.ports import DEFAULT_PORTS
from mqstore.stop_request import StopRequest
from mqstore.storage.data_mode import DATA_MODES, DataMode
from mqstore.storage.data_mode import apply as apply_data_mode

SERVICES = ("commitlog_svc", "cq_svc", "index_svc")
# --replicas N: the broker group's name, and the in-sync replicas an append needs.
GROUP = "mqstore"
MIN_INSYNC = 2
# Replica i listens on the commit log's three ports + 10 * i (below the consume queues' +100).
REPLICA_PORT_STEP = 10

# A store on one machine is sized for a laptop: a fresh one takes ~69 MB of disk, not the
# ~1.5 GB of the services' defaults (1 GiB commit-log segments, a 401 MB index file), which
# deploy/ keeps for production. Files are preallocated whole, so these are what a store holding
# one message takes: a 64 MiB segment, an 8.4 MB index file (100,000 slots, 400,000 entries),
# and 1 MB consume-queue files (50,000 units of 20 bytes) per queue.
LAPTOP_SEGMENT_BYTES = 64 << 20
LAPTOP_INDEX_SLOTS = 100_000
LAPTOP_INDEX_ENTRIES = 400_000
LAPTOP_CQ_UNITS_PER_FILE = 50_000
# A follower not ready this long after it listens is replaying a large log: `up` says so.
REPLAY_NOTICE_S = 2.0


def _ports_args(package: str, base: int, *, replica: int = 0) -> list[str]:
    shift = base - DEFAULT_PORTS["commitlog_svc"][0] + REPLICA_PORT_STEP * replica
    port, health, metrics = (
        (0, 0, 0) if base < 0 else tuple(p + shift for p in DEFAULT_PORTS[package])
    )
    return ["--port", str(port), "--health-port", str(health), "--metrics-port", str(metrics)]


@click.command("up")
@click.option("--data-dir", default="./data", show_default=True, help="where everything is kept")
@click.option(
    "--flush",
    type=click.Choice(["sync", "async"]),
    default="sync",
    show_default=True,
    help="sync: an append returns once durable; async: flushed on an interval",
)
@click.option(
    "--cq-store", type=click.Choice(["file", "rocksdb"]), default="file", show_default=True
)
@click.option(
    "--base-port",
    type=int,
    default=DEFAULT_PORTS["commitlog_svc"][0],
    show_default=True,
    help="ports from here: commit log +0..2, consume queues +100..102, index +200..202; "
    "-1 lets the kernel pick free ones",
)
@click.option(
    "--secure",
    is_flag=True,
    help="TLS and bearer tokens, with a CA, certificates and tokens made in DATA_DIR/secrets",
)
@click.option("--mtls", is_flag=True, help="--secure, and require client certificates too")
@click.option(
    "--replicas",
    type=click.Choice(["1", "3", "5"]),
    default="1",
    show_default=True,
    help="commit-log replicas: 3 or 5 run a broker group on an etcd started here "
    "(sync replication, min in-sync 2); replica i's ports are the commit log's + 10*i",
)
@click.option(
    "--data-mode",
    type=click.Choice(DATA_MODES),
    default="private",
    show_default=True,
    help="who may read DATA_DIR: private (directories 0700, files 0600) or group (0750, 0640)",
)
@click.option(
    "--save-context",
    "context_name",
    metavar="NAME",
    help="the context saved and selected for this store, so that mqstore commands and "
    "ClientSettings.from_env() in any shell reach it (default: local, or local-PORT with "
    "another --base-port; '' saves none)",
)
def up(
    data_dir: str,
    flush: str,
    cq_store: str,
    base_port: int,
    secure: bool,
    mtls: bool,
    replicas: str,
    data_mode: DataMode,
    context_name: str | None,
) -> None:
    """Run the store here: commit log, consume queues and index, until Ctrl-C.

    \b
    Each service listens on three ports: its API (gRPC, with reflection), a plaintext
    grpc.health.v1 port for probes, and Prometheus metrics. Logs: DATA_DIR/logs/*.log.
    With --secure the API ports speak TLS and want a token; the lines to paste into a shell
    are printed (MQSTORE_TLS_CA, MQSTORE_TOKEN_FILE, ...). Everything under DATA_DIR is
    readable by this user only (--data-mode), with or without --secure.
    """
    count = int(replicas)
    data_dir = os.path.abspath(data_dir)
    # Before anything is made: the logs, secrets and the services' directories are born
    # private too (the services apply the same mode to their own directories).
    apply_data_mode(data_dir, data_mode)
    mode_args = ["--data-mode", data_mode]
    logs = os.path.join(data_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    secrets = prepare_secrets(os.path.join(data_dir, "secrets")) if secure or mtls else None
    server_args = _server_args(secrets, mtls)
    follower_args = _follower_args(secrets, mtls, replica=False)
    replica_args = _follower_args(secrets, mtls, replica=True)
    started: list[ServiceProcess] = []
    # Ctrl-C, a kill, the terminal closed: every way of asking ends in the same clean stop.
    # A death with no chance to stop them (kill -9, a crash) stops them too: each child gets
    # SIGTERM when this process dies (launcher.ends_with_launcher).
    stop = StopRequest()
    stop.install((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    etcd: EtcdProcess | None = None
    try:
        group_args: list[list[str]] = [[]]
        if count > 1:
            etcd = EtcdProcess(
                data_dir=os.path.join(data_dir, "etcd"),
                log_path=os.path.join(logs, "etcd.log"),
                ends_with_launcher=True,
            )
            etcd.start()
            group_args = [
                ["--group", GROUP, "--replica-name", f"commitlog-{i}", "--etcd", etcd.endpoint,
                 "--min-insync", str(MIN_INSYNC)]
                for i in range(count)
            ]  # fmt: skip
        replicas_started: list[ServiceProcess] = []
        for i, extra in enumerate(group_args):
            name = "commitlog_svc" if count == 1 else f"commitlog_svc-{i}"
            replica = ServiceProcess(
                "commitlog_svc",
                os.path.join(data_dir, name),
                args=[
                    *_ports_args("commitlog_svc", base_port, replica=i),
                    *("--flush", flush),
                    *("--file-bytes", str(LAPTOP_SEGMENT_BYTES)),
                    *mode_args,
                    *server_args,
                    *extra,
                    *(replica_args if count > 1 else []),
                ],
                log_path=os.path.join(logs, f"{name}.log"),
                ends_with_launcher=True,
            )
            replica.start()
            started.append(replica)
            replicas_started.append(replica)
        for replica in replicas_started:
            replica.wait_listening()
        commitlog = replicas_started[0]
        target = ",".join(r.target for r in replicas_started)
        # One host and one replica: pulls read the log's segment files, not a Read per pull.
        local = ["--commitlog-dir", commitlog.data_dir] if count == 1 else []
        followers = [
            ServiceProcess(
                "cq_svc",
                os.path.join(data_dir, "cq_svc"),
                args=[*_ports_args("cq_svc", base_port), "--cq-store", cq_store, *mode_args,
                      "--units-per-file", str(LAPTOP_CQ_UNITS_PER_FILE),
                      "--commitlog-target", target, *server_args, *follower_args, *local],
                log_path=os.path.join(logs, "cq_svc.log"),
                ends_with_launcher=True,
            ),
            ServiceProcess(
                "index_svc",
                os.path.join(data_dir, "index_svc"),
                args=[*_ports_args("index_svc", base_port), *mode_args,
                      "--slot-num", str(LAPTOP_INDEX_SLOTS),
                      "--entry-num", str(LAPTOP_INDEX_ENTRIES),
                      "--commitlog-target", target, *server_args, *follower_args],
                log_path=os.path.join(logs, "index_svc.log"),
                ends_with_launcher=True,
            ),
        ]  # fmt: skip
        for service in followers:
            service.start()
            started.append(service)
        for service in followers:
            service.wait_listening()
        # "mqstore is up" means a pull answers: the followers have replayed the log.
        _wait_ready(followers, stop)
    except (RuntimeError, TimeoutError) as exc:
        _stop_all(started)
        if etcd is not None:
            etcd.stop()
        raise click.ClickException(str(exc)) from exc
    try:
        if not stop.is_set():  # (it is when asked to stop while the followers replayed)
            if context_name is None:
                context_name = _default_context_name(base_port)
            # Saved before "mqstore is up" is printed: whoever waits for that line finds it.
            saved = (
                _save_context(context_name, client_environment(started, secrets, mtls))
                if context_name
                else None
            )
            _print_summary(data_dir, started, secrets, mtls, etcd)
            if saved:
                _say(saved)
            _watch(started, etcd, logs, stop)
    finally:
        # Whatever ended the watch (a signal, a service lost, stdout gone with its pipe's
        # reader): the services stop with `up`, never left running on the data directory.
        _say("stopping ...")
        codes = _stop_all(started)
        if etcd is not None:
            code = etcd.stop()
            # etcd shuts down cleanly on SIGTERM and then ends by it (status -SIGTERM)
            codes["etcd"] = 0 if code == -signal.SIGTERM else code
    bad = {name: code for name, code in codes.items() if code != 0}
    if bad:
        raise click.ClickException(f"services exited with errors: {bad}")
    _say("stopped cleanly")


def _say(text: str, *, err: bool = False) -> None:
    """A line for the console, if it is still there: with `mqstore up | tee log`, Ctrl-C ends
    tee first, and a write to the closed pipe must not stop `up` from stopping the services."""
    try:
        click.echo(text, err=err)
    except OSError:  # EPIPE (BrokenPipeError), EIO from a terminal that hung up
        pass


def _watch(
    started: list[ServiceProcess], etcd: EtcdProcess | None, logs: str, stop: StopRequest
) -> None:
    """Until asked to stop, or a service the store cannot go on without exits."""
    told: set[str] = set()
    while not stop.wait(0.5):
        dead = [s for s in started if not s.running]
        # A broker group outlives a replica: the store goes on while min-insync replicas live.
        lost = [s for s in dead if etcd is not None and s.package == "commitlog_svc"]
        alive = sum(1 for s in started if s.package == "commitlog_svc" and s.running)
        if dead and (len(lost) < len(dead) or alive < MIN_INSYNC):
            names = ", ".join(os.path.basename(s.data_dir) for s in dead)
            _say(f"stopped unexpectedly: {names} (see {logs}); stopping the rest", err=True)
            return
        for s in lost:
            name = os.path.basename(s.data_dir)
            if name not in told:
                told.add(name)
                _say(
                    f"{name} stopped unexpectedly (see {logs}); the broker group goes on with "
                    f"{alive} replicas",
                    err=True,
                )


def _wait_ready(followers: list[ServiceProcess], stop: StopRequest) -> None:
    """Until each follower is ready (caught up with the commit log), or `up` is asked to
    stop. A replay of a large log can take minutes; it is said on the console once."""
    since = time.monotonic()
    told = False
    for service in followers:
        while not service.ready:
            if not service.running:
                why = last_error(service.log_path)
                raise RuntimeError(
                    f"{service.package} exited before it was ready"
                    + (f": {why}" if why else "")
                    + f"; see {service.log_path}"
                )
            if stop.is_set():
                return
            if not told and time.monotonic() - since > REPLAY_NOTICE_S:
                told = True
                _say(f"{service.package} is replaying the commit log; waiting for it ...")
            stop.wait(READY_POLL_S)


def _stop_all(started: list[ServiceProcess]) -> dict[str, int]:
    return {os.path.basename(s.data_dir): s.stop() for s in reversed(started)}


def _server_args(secrets: SecretFiles | None, mtls: bool) -> list[str]:
    """Flags of every service's API: TLS, tokens, client certificates under --mtls."""
    if secrets is None:
        return []
    server = [
        "--tls-cert-file", str(secrets.server_cert),
        "--tls-key-file", str(secrets.server_key),
        "--tokens-file", str(secrets.tokens),
    ]  # fmt: skip
    if mtls:
        server += ["--tls-client-ca-file", str(secrets.ca)]
    return server


def _follower_args(secrets: SecretFiles | None, mtls: bool, *, replica: bool) -> list[str]:
    """Flags of a channel to the commit log: cq_svc's and index_svc's (the subscriber token),
    or a replica's to the other replicas (the replica token, scope replicate)."""
    if secrets is None:
        return []
    token = secrets.replica_token if replica else secrets.subscriber_token
    follower = [
        "--commitlog-tls-ca-file", str(secrets.ca),
        "--commitlog-token-file", str(token),
    ]  # fmt: skip
    if mtls:
        follower += [
            "--commitlog-tls-cert-file", str(secrets.client_cert),
            "--commitlog-tls-key-file", str(secrets.client_key),
        ]  # fmt: skip
    return follower


def _default_context_name(base_port: int) -> str:
    default = DEFAULT_PORTS["commitlog_svc"][0]
    return "local" if base_port == default else f"local-{base_port if base_port >= 0 else 'any'}"


def _save_context(name: str, env: dict[str, str]) -> str:
    """Save and select the store's context; what to tell the user."""
    by_var = {var: key for key, var in contexts.KEYS.items()}
    values = {by_var[var]: value for var, value in env.items() if var in by_var and value}
    try:
        path = contexts.save(contexts.Context(contexts.check_name(name), values), select=True)
    except (InvalidArgument, OSError) as exc:
        return f"No context saved ({exc}): use the lines above"
    return (
        f"Context {name!r} saved and selected ({path}): mqstore commands and "
        "ClientSettings.from_env() in any shell reach this store without the lines above"
    )


def client_environment(
    started: list[ServiceProcess], secrets: SecretFiles | None, mtls: bool
) -> dict[str, str]:
    """What a client of this store needs (ClientSettings.from_env, the mqstore command): the
    addresses (every replica of a broker group: the client finds and follows the leader), and
    with --secure the CA and token (and client certificate with --mtls)."""
    by_package = {s.package: s.target for s in started}
    commitlog = ",".join(s.target for s in started if s.package == "commitlog_svc")
    env = {
        "MQSTORE_COMMITLOG": commitlog,
        "MQSTORE_CQ": by_package.get("cq_svc", ""),
        "MQSTORE_INDEX": by_package.get("index_svc", ""),
    }
    if secrets is None:
        return env
    env["MQSTORE_TLS_CA"] = str(secrets.ca)
    env["MQSTORE_TOKEN_FILE"] = str(secrets.admin_token)
    if mtls:
        env["MQSTORE_TLS_CERT"] = str(secrets.client_cert)
        env["MQSTORE_TLS_KEY"] = str(secrets.client_key)
    return env


def _print_summary(
    data_dir: str,
    started: list[ServiceProcess],
    secrets: SecretFiles | None,
    mtls: bool,
    etcd: EtcdProcess | None = None,
) -> None:
    click.echo(f"mqstore is up; data in {data_dir}")
    for s in started:
        click.echo(
            f"  {os.path.basename(s.data_dir):<16} api {s.target:<16} health "
            f"{s.health_target:<16} metrics http://127.0.0.1:{s.ports['metrics_port']}/metrics"
        )
    replicas = [s for s in started if s.package == "commitlog_svc"]
    commitlog = replicas[0].target
    cq = next((s.target for s in started if s.package == "cq_svc"), "?")
    if etcd is not None:
        click.echo(
            f"  {'etcd':<16} {etcd.endpoint}: broker group {GROUP!r} of {len(replicas)} "
            f"replicas, sync replication, min in-sync {MIN_INSYNC} (docs/replication.md)"
        )
    if secrets is not None:
        mode = "mutual TLS" if mtls else "TLS"
        click.echo(
            f"Secure: {mode} and bearer tokens; secrets in {secrets.directory} (keep it private)"
        )
    follows = "; it finds and follows the leader" if etcd is not None else ""
    click.echo(f"A client needs (paste into a shell, then e.g. `mqstore status`{follows}):")
    for name, value in client_environment(started, secrets, mtls).items():
        click.echo(f"  export {name}={shlex.quote(value)}")
    if secrets is None:
        grpcurl = "grpcurl -plaintext"
    else:
        grpcurl = f"grpcurl -cacert {shlex.quote(str(secrets.ca))}"
        if mtls:
            grpcurl += (
                f" -cert {shlex.quote(str(secrets.client_cert))}"
                f" -key {shlex.quote(str(secrets.client_key))}"
            )
        token = shlex.quote(str(secrets.admin_token))
        grpcurl += f' -H "authorization: Bearer $(cat {token})"'
    click.echo("Try it (grpcurl uses the servers' reflection):")
    click.echo(
        f'  {grpcurl} -d \'{{"batches":[{{"topic":"demo","queue_ids":[0],'
        f'"bodies":["aGVsbG8="]}}]}}\' {commitlog} mqstore.commitlog.v1.CommitLog/Append'
    )
    click.echo(
        f'  {grpcurl} -d \'{{"topic":"demo","queue_id":0,"offset":0}}\' '
        f"{cq} mqstore.consumequeue.v1.ConsumeQueue/Pull"
    )
    click.echo("Ctrl-C stops everything gracefully.")
