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

import click

from mqstore.cli.cluster import cluster_group
from mqstore.cli.consume import consume
from mqstore.cli.context import context_group
from mqstore.cli.log import log_group
from mqstore.cli.log_repair import repair as log_repair
from mqstore.cli.options import ClientGroup, CliState, connection_options
from mqstore.cli.produce import produce
from mqstore.cli.query import query_group
from mqstore.cli.security import token_group
from mqstore.cli.spark import spark_group
from mqstore.cli.status import (
    groups,
    offsets_group,
    queues,
    status,
    subscribers_group,
    topics,
)
from mqstore.cli.up import up


@click.group(cls=ClientGroup, context_settings={"help_option_names": ["-h", "--help"]})
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


for command in (
    up,
    produce,
    consume,
    query_group,
    status,
    topics,
    queues,
    groups,
    offsets_group,
    subscribers_group,
):
    cli.add_command(command)
log_group.add_command(log_repair)
cli.add_command(log_group)
cli.add_command(token_group)
cli.add_command(spark_group)
cli.add_command(cluster_group)
cli.add_command(context_group)


def main() -> None:
    """Entry point of the `mqstore` script and of `python -m mqstore.cli`."""
    cli(prog_name="mqstore")
