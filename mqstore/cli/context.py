"""`mqstore context`: saved connection settings (mqstore/client/contexts.py).

mqstore context ls                    every context, the selected one marked
mqstore context show [NAME]           one (default: the one in force), as JSON
mqstore context save NAME [--select]  what the connection options say now, under NAME
mqstore context select NAME           use NAME when no option or variable says otherwise
mqstore context rm NAME
"""

from __future__ import annotations

import os

import click

from mqstore.cli.options import CliState, SettingsError, echo_json, json_option, pass_state
from mqstore.client import contexts
from mqstore.errors import InvalidArgument, NotFound


def _name(name: str) -> str:
    try:
        return contexts.check_name(name)
    except InvalidArgument as exc:
        raise SettingsError(str(exc)) from None


@click.group("context")
def context_group() -> None:
    """Saved connection settings, as nats CLI contexts: where a store is and how to reach it.

    `mqstore up` saves one for the store it starts ("local", or "local-PORT" with another
    --base-port) and selects it, so that commands in any shell reach that store. Flags and
    MQSTORE_* variables still win; --context NAME (or MQSTORE_CONTEXT) picks another.
    Contexts live in ~/.config/mqstore (MQSTORE_CONFIG_DIR, XDG_CONFIG_HOME).

    \b
    Examples:
      mqstore context ls
      mqstore --commitlog db1:7100 --cq db1:7200 --index db1:7300 context save db1 --select
      mqstore context select local
    """


@context_group.command("ls")
@json_option
def context_ls(as_json: bool) -> None:
    """List the saved contexts; the selected one is marked with *.

    \b
    Examples:
      mqstore context ls
      mqstore context ls --json
    """
    names = contexts.names()
    current = contexts.selected()
    if as_json:
        echo_json({"contexts": names, "selected": current})
        return
    for name in names:
        values = contexts.load(name).values
        mark = "*" if name == current else " "
        click.echo(f"{mark} {name:<20} {values.get('commitlog', '')}")


@context_group.command("show")
@click.argument("name", required=False)
def context_show(name: str | None) -> None:
    """Show a context's settings as JSON (default: the one in force).

    Exit 4 when there is no such context (or none is in force).

    \b
    Examples:
      mqstore context show
      mqstore context show local
    """
    context = contexts.active(_name(name) if name else None)
    if context is None:
        raise NotFound("no context is selected (mqstore context select NAME)")
    echo_json({"name": context.name, **context.values})


@context_group.command("save")
@click.argument("name")
@click.option("--select", "select_it", is_flag=True, help="and select it")
@pass_state
def context_save(state: CliState, name: str, select_it: bool) -> None:
    """Save the connection options and MQSTORE_* variables given now as context NAME.

    \b
    Examples:
      mqstore --commitlog db1:7100 --cq db1:7200 --index db1:7300 context save db1
      mqstore --tls-ca ca.pem --token-file admin.token context save secure --select
    """
    values = {
        key: value
        for key in contexts.KEYS
        if isinstance(value := getattr(state, key), str) and value
    }
    for key in ("token_file", "tls_ca", "tls_cert", "tls_key"):
        if key in values:
            values[key] = os.path.abspath(values[key])  # the context is read from anywhere
    path = contexts.save(contexts.Context(_name(name), values), select=select_it)
    click.echo(f"saved {path}" + (" and selected it" if select_it else ""))


@context_group.command("select")
@click.argument("name")
def context_select(name: str) -> None:
    """Use context NAME for what no option or MQSTORE_* variable sets. Exit 4 if unknown.

    \b
    Examples:
      mqstore context select local
      mqstore context select db1
    """
    contexts.select(_name(name))
    click.echo(f"selected {name}")


@context_group.command("rm")
@click.argument("name")
def context_rm(name: str) -> None:
    """Delete context NAME. Exit 4 if unknown.

    \b
    Examples:
      mqstore context rm db1
      mqstore context rm local-8100
    """
    contexts.remove(_name(name))
    click.echo(f"removed {name}")
