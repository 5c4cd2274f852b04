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
import threading
from types import FrameType

import click

from mqstore.cli.security import SecretFiles, prepare_secrets
from mqstore.launcher import DEFAULT_PORTS, ServiceProcess
from mqstore.storage.data_mode import DATA_MODES, DataMode
from mqstore.storage.data_mode import apply as apply_data_mode

SERVICES = ("commitlog_svc", "cq_svc", "index_svc")


def _ports_args(package: str, base: int) -> list[str]:
    port, health, metrics = (
        (0, 0, 0) if base < 0 else tuple(p - DEFAULT_PORTS["commitlog_svc"][0] + base
                                          for p in DEFAULT_PORTS[package])
    )  # fmt: skip
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
    "--data-mode",
    type=click.Choice(DATA_MODES),
    default="private",
    show_default=True,
    help="who may read DATA_DIR: private (directories 0700, files 0600) or group (0750, 0640)",
)
def up(
    data_dir: str,
    flush: str,
    cq_store: str,
    base_port: int,
    secure: bool,
    mtls: bool,
    data_mode: DataMode,
) -> None:
    """Run the store here: commit log, consume queues and index, until Ctrl-C.

    \b
    Each service listens on three ports: its API (gRPC, with reflection), a plaintext
    grpc.health.v1 port for probes, and Prometheus metrics. Logs: DATA_DIR/logs/*.log.
    With --secure the API ports speak TLS and want a token; the lines to paste into a shell
    are printed (MQSTORE_TLS_CA, MQSTORE_TOKEN_FILE, ...). Everything under DATA_DIR is
    readable by this user only (--data-mode), with or without --secure.
    """
    data_dir = os.path.abspath(data_dir)
    # Before anything is made: the logs, secrets and the services' directories are born
    # private too (the services apply the same mode to their own directories).
    apply_data_mode(data_dir, data_mode)
    mode_args = ["--data-mode", data_mode]
    logs = os.path.join(data_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    secrets = prepare_secrets(os.path.join(data_dir, "secrets")) if secure or mtls else None
    server_args, follower_args = _security_args(secrets, mtls)
    started: list[ServiceProcess] = []
    stop = threading.Event()

    def on_signal(signum: int, _: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        commitlog = ServiceProcess(
            "commitlog_svc",
            os.path.join(data_dir, "commitlog_svc"),
            args=[
                *_ports_args("commitlog_svc", base_port),
                *("--flush", flush),
                *mode_args,
                *server_args,
            ],
            log_path=os.path.join(logs, "commitlog_svc.log"),
        )
        commitlog.start()
        started.append(commitlog)
        commitlog.wait_listening()
        followers = [
            ServiceProcess(
                "cq_svc",
                os.path.join(data_dir, "cq_svc"),
                args=[*_ports_args("cq_svc", base_port), "--cq-store", cq_store, *mode_args,
                      "--commitlog-target", commitlog.target, *server_args, *follower_args,
                      # One host: pulls read the log's segment files, not a Read per pull.
                      "--commitlog-dir", commitlog.data_dir],
                log_path=os.path.join(logs, "cq_svc.log"),
            ),
            ServiceProcess(
                "index_svc",
                os.path.join(data_dir, "index_svc"),
                args=[*_ports_args("index_svc", base_port), *mode_args,
                      "--commitlog-target", commitlog.target, *server_args, *follower_args],
                log_path=os.path.join(logs, "index_svc.log"),
            ),
        ]  # fmt: skip
        for service in followers:
            service.start()
            started.append(service)
        for service in followers:
            service.wait_listening()
    except (RuntimeError, TimeoutError) as exc:
        _stop_all(started)
        raise click.ClickException(str(exc)) from exc
    _print_summary(data_dir, started, secrets, mtls)
    while not stop.wait(0.5):
        dead = [s for s in started if not s.running]
        if dead:
            names = ", ".join(s.package for s in dead)
            click.echo(f"stopped unexpectedly: {names} (see {logs}); stopping the rest", err=True)
            break
    click.echo("stopping ...")
    codes = _stop_all(started)
    bad = {name: code for name, code in codes.items() if code != 0}
    if bad:
        raise click.ClickException(f"services exited with errors: {bad}")
    click.echo("stopped cleanly")


def _stop_all(started: list[ServiceProcess]) -> dict[str, int]:
    return {s.package: s.stop() for s in reversed(started)}


def _security_args(secrets: SecretFiles | None, mtls: bool) -> tuple[list[str], list[str]]:
    """(flags of every service's API, flags of a follower's channel to the commit log)."""
    if secrets is None:
        return [], []
    server = [
        "--tls-cert-file", str(secrets.server_cert),
        "--tls-key-file", str(secrets.server_key),
        "--tokens-file", str(secrets.tokens),
    ]  # fmt: skip
    follower = [
        "--commitlog-tls-ca-file", str(secrets.ca),
        "--commitlog-token-file", str(secrets.subscriber_token),
    ]  # fmt: skip
    if mtls:
        server += ["--tls-client-ca-file", str(secrets.ca)]
        follower += [
            "--commitlog-tls-cert-file", str(secrets.client_cert),
            "--commitlog-tls-key-file", str(secrets.client_key),
        ]  # fmt: skip
    return server, follower


def client_environment(
    started: list[ServiceProcess], secrets: SecretFiles, mtls: bool
) -> dict[str, str]:
    """What a client of this store needs (ClientSettings.from_env, the mqstore command)."""
    by_package = {s.package: s.target for s in started}
    env = {
        "MQSTORE_COMMITLOG": by_package.get("commitlog_svc", ""),
        "MQSTORE_CQ": by_package.get("cq_svc", ""),
        "MQSTORE_INDEX": by_package.get("index_svc", ""),
        "MQSTORE_TLS_CA": str(secrets.ca),
        "MQSTORE_TOKEN_FILE": str(secrets.admin_token),
    }
    if mtls:
        env["MQSTORE_TLS_CERT"] = str(secrets.client_cert)
        env["MQSTORE_TLS_KEY"] = str(secrets.client_key)
    return env


def _print_summary(
    data_dir: str, started: list[ServiceProcess], secrets: SecretFiles | None, mtls: bool
) -> None:
    click.echo(f"mqstore is up; data in {data_dir}")
    for s in started:
        click.echo(
            f"  {s.package:<14} api {s.target:<16} health {s.health_target:<16} "
            f"metrics http://127.0.0.1:{s.ports['metrics_port']}/metrics"
        )
    commitlog = started[0].target
    cq = started[1].target if len(started) > 1 else "?"
    if secrets is None:
        grpcurl = "grpcurl -plaintext"
    else:
        mode = "mutual TLS" if mtls else "TLS"
        click.echo(
            f"Secure: {mode} and bearer tokens; secrets in {secrets.directory} (keep it private)"
        )
        click.echo("A client needs (paste into a shell, then e.g. `mqstore status`):")
        for name, value in client_environment(started, secrets, mtls).items():
            click.echo(f"  export {name}={shlex.quote(value)}")
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
