"""The `mqstore` command.

    mqstore up                              run the store (all three services) on this machine
    mqstore produce TOPIC [BODY...]         send messages (arguments, a file, stdin, a load)
    mqstore consume TOPIC                   read messages (from an offset, a time, a group)
    mqstore query key|uniq|msg ...          find messages by key, unique id or message id
    mqstore status | topics | queues TOPIC  what the store holds and how its services are
    mqstore groups [GROUP]                  consumer groups and their lag
    mqstore context ls|show|save|select|rm  saved connection settings (`up` saves its own)
    mqstore offsets show|reset GROUP TOPIC  a consumer group's committed offsets
    mqstore subscribers list|forget [ID]    the commit log's subscribers, and forgetting one
    mqstore log dump|verify|repair DIR      offline tools over commit-log files

Nouns are groups and verbs their commands (`mqstore <noun> <verb>`), so later tools slot in;
the everyday verbs (produce, consume, status) sit at the top. The connection options belong to
the group (options.py) and are only turned into a connection by a command that needs one.

Exit codes: 0 success; 1 the store answered an error or the data failed a check; 2 usage
errors; 3 a service could not be reached; 4 nothing found.
"""

from __future__ import annotations

import os

# gRPC's core logs each failed TLS handshake on stderr ("Handshake failed with error
# SSL_ERROR_SSL ..."), several lines before the command's own one-line error; it reads this
# once, when grpc is first imported, so it is set before anything here imports grpc.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import importlib

import click

from mqstore.cli.options import ClientGroup, CliState, connection_options

# Each command's module is imported when that command runs, so a client command does not pay
# for what another needs (etcd's client for `up`, cryptography for `token`, Spark's jobs):
# `python -m mqstore.cli produce` imported in 0.65 s with every module loaded. `mqstore --help`
# imports them all for their summaries.
_COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("mqstore.cli.up", "up"),
    "produce": ("mqstore.cli.produce", "produce"),
    "consume": ("mqstore.cli.consume", "consume"),
    "query": ("mqstore.cli.query", "query_group"),
    "status": ("mqstore.cli.status", "status"),
    "topics": ("mqstore.cli.status", "topics"),
    "queues": ("mqstore.cli.status", "queues"),
    "groups": ("mqstore.cli.status", "groups"),
    "offsets": ("mqstore.cli.status", "offsets_group"),
    "subscribers": ("mqstore.cli.status", "subscribers_group"),
    "log": ("mqstore.cli.log_repair", "log_group"),  # the log group, `repair` added to it
    "token": ("mqstore.cli.security", "token_group"),
    "spark": ("mqstore.cli.spark", "spark_group"),
    "cluster": ("mqstore.cli.cluster", "cluster_group"),
    "context": ("mqstore.cli.context", "context_group"),
}


class _Commands(ClientGroup):
    """The `mqstore` group, its commands loaded from _COMMANDS on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = _COMMANDS.get(cmd_name)
        if where is None:
            return None
        command = getattr(importlib.import_module(where[0]), where[1])
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@connection_options
@click.pass_context
def cli(
    ctx: click.Context,
    commitlog: str | None,
    cq: str | None,
    index: str | None,
    token_file: str | None,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_server_name: str | None,
    timeout_s: str | None,
    context: str | None,
    connect_timeout_s: str | None,
) -> None:
    """mqstore: a persistent message store in the design of RocketMQ's broker store.

    \b
    Start here:
      mqstore up                            run the store on ./data
      mqstore produce demo hello world      send two messages
      mqstore consume demo                  read them back
      mqstore status                        offsets, lag and replicas
      mqstore log verify DIR                check a commit-log directory offline

    \b
    The options above the command say where the services are (defaults: what `mqstore up`
    listens on); each also reads its MQSTORE_* variable.
    Exit codes: 0 ok, 1 the store answered an error, 2 bad arguments,
    3 a service could not be reached, 4 nothing found.
    """
    state = CliState(
        commitlog=commitlog,
        cq=cq,
        index=index,
        token_file=token_file,
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_server_name=tls_server_name,
        timeout_s=timeout_s,
        context=context,
        connect_timeout_s=connect_timeout_s,
    )
    ctx.obj = state
    ctx.call_on_close(state.close)


def main() -> None:
    """Entry point of the `mqstore` script and of `python -m mqstore.cli`."""
    cli(prog_name="mqstore")
