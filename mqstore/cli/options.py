"""What every client command shares: the connection options, the exit codes, and output.

    mqstore [--commitlog A] [--cq A,B] [--index A,B] [--token-file F] [--tls-ca F]
            [--tls-cert F --tls-key F] [--tls-server-name N] [--timeout S]
            [--connect-timeout S] <command>

Each option also reads its MQSTORE_* variable (click's envvar). The options are only kept on
the click context (`CliState`); ClientSettings and the Connection are built on first use, so
`mqstore up` and `mqstore log ...` work with no service around and ignore a bad MQSTORE_*.

Exit codes (docs/client.md), decided in one place, `exit_code_for`:

    0  success
    1  the store answered an error, or the data failed a check
    2  bad arguments (click's usage error; also settings that cannot work, such as a missing
       token file)
    3  a service could not be reached (UNAVAILABLE, DEADLINE_EXCEEDED): for a store never
       reached, within --connect-timeout, naming the address and the likely cause
    4  nothing found (a query without a match, NOT_FOUND)

`ClientGroup.invoke` catches every mqstore error a command lets out and prints it as one line,
"error: ...", on stderr: a person sees what went wrong, a script sees the code, and nobody
sees a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import click
from rich.console import Console

from mqstore import errors as domain
from mqstore.client import contexts
from mqstore.client.connection import Connection
from mqstore.client.errors import ClientError, StoreUnreachable
from mqstore.client.settings import ClientSettings, TlsSettings, split_addresses

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_NOT_FOUND: Final = 4

_UNREACHABLE_CODES: Final = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})

# Width of tables when stdout is not a terminal (a pipe, a file): wide enough that no column
# of `status` is cut or wrapped, so scripts and grep see whole values.
PIPE_WIDTH_COLUMNS: Final = 200

F = TypeVar("F", bound=Callable[..., Any])


# -- errors and exit codes --------------------------------------------------------------------


class CommandError(click.ClickException):
    """A failure printed as one line, "error: ...", exit code 1."""

    exit_code = EXIT_ERROR

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class Unreachable(CommandError):
    exit_code = EXIT_UNREACHABLE


class NothingFound(CommandError):
    exit_code = EXIT_NOT_FOUND


class SettingsError(CommandError):
    """Settings that cannot work (a token file that is not there): a usage error."""

    exit_code = EXIT_USAGE


def error_code_name(err: domain.MqstoreError) -> str:
    """The gRPC status name of an error from the SDK or from the domain layer it builds on."""
    if isinstance(err, ClientError):
        return err.code.name
    return err.grpc_code


def exit_code_for(err: domain.MqstoreError) -> int:
    return exit_code_for_status(error_code_name(err))


def exit_code_for_status(name: str) -> int:
    """The exit code for a gRPC status name (UNAVAILABLE, NOT_FOUND, ...)."""
    if name in _UNREACHABLE_CODES:
        return EXIT_UNREACHABLE
    if name == "NOT_FOUND":
        return EXIT_NOT_FOUND
    return EXIT_ERROR


def as_command_error(
    err: domain.MqstoreError, settings: ClientSettings | None = None
) -> CommandError:
    """The one-line error for `err`; for an unreachable service, where it was looked for."""
    code = exit_code_for(err)
    cls = {EXIT_UNREACHABLE: Unreachable, EXIT_NOT_FOUND: NothingFound}.get(code, CommandError)
    text = str(err) if isinstance(err, ClientError) else f"{err.grpc_code}: {err}"
    service = _service_of(err.method) if isinstance(err, ClientError) else None
    if isinstance(err, StoreUnreachable):
        # "cannot reach cq_svc at 127.0.0.1:7200 (--cq, MQSTORE_CQ): connection refused: ..."
        named = f"{service[0]} at {err.address} ({service[1]})" if service else err.address
        text = f"cannot reach {named}: {err.details}"
    elif code == EXIT_UNREACHABLE and service is not None and settings is not None:
        package, options = service
        text += f" ({package} at {_addresses(package, settings)}: {options})"
    return cls(" ".join(text.split()))  # one line, whatever the server put in its details


# The service a call went to (the method's prefix): its package and the options naming it.
_SERVICES: Final = {
    "CommitLog": ("commitlog_svc", "--commitlog, MQSTORE_COMMITLOG"),
    "ConsumeQueue": ("cq_svc", "--cq, MQSTORE_CQ"),
    "Index": ("index_svc", "--index, MQSTORE_INDEX"),
}


def _service_of(method: str) -> tuple[str, str] | None:
    return _SERVICES.get(method.partition("/")[0])


def _addresses(package: str, settings: ClientSettings) -> str:
    if package == "commitlog_svc":
        return settings.commitlog
    return ",".join(settings.cq if package == "cq_svc" else settings.index)


class ClientGroup(click.Group):
    """The `mqstore` group: turns every mqstore error of a subcommand into its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except domain.MqstoreError as err:
            state = ctx.obj if isinstance(ctx.obj, CliState) else None
            raise as_command_error(err, state.built_settings() if state else None) from None


# -- connection options -----------------------------------------------------------------------


@dataclass
class CliState:
    """The global options as given; settings and the connection come on first use."""

    commitlog: str | None = None
    cq: str | None = None
    index: str | None = None
    token_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    timeout_s: str | None = None
    context: str | None = None
    connect_timeout_s: str | None = None
    _settings: ClientSettings | None = field(default=None, repr=False)
    _connection: Connection | None = field(default=None, repr=False)

    def settings(self) -> ClientSettings:
        if self._settings is None:
            self._settings = self._build_settings()
        return self._settings

    def built_settings(self) -> ClientSettings | None:
        """The settings if a command built them (error messages name the addresses)."""
        return self._settings

    def _build_settings(self) -> ClientSettings:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError("--tls-cert and --tls-key go together (mutual TLS needs both)")
        try:
            self._fill_from_context()
        except (domain.InvalidArgument, domain.NotFound) as exc:
            raise SettingsError(str(exc)) from None
        kwargs: dict[str, Any] = {}
        if self.commitlog:
            kwargs["commitlog"] = self.commitlog
        if self.cq:
            kwargs["cq"] = split_addresses(self.cq)
        if self.index:
            kwargs["index"] = split_addresses(self.index)
        if self.token_file:
            kwargs["token_file"] = self.token_file
        if self.timeout_s is not None:
            kwargs["timeout_s"] = _seconds(self.timeout_s, "--timeout (MQSTORE_TIMEOUT_S)")
        if self.connect_timeout_s is not None:
            kwargs["connect_timeout_s"] = _seconds(
                self.connect_timeout_s, "--connect-timeout (MQSTORE_CONNECT_TIMEOUT_S)"
            )
        try:
            if self.tls_ca or self.tls_cert or self.tls_key or self.tls_server_name:
                kwargs["tls"] = TlsSettings(
                    ca_file=self.tls_ca,
                    cert_file=self.tls_cert,
                    key_file=self.tls_key,
                    server_name=self.tls_server_name,
                )
            return ClientSettings(**kwargs)
        except domain.InvalidArgument as exc:
            raise SettingsError(str(exc)) from None

    def _fill_from_context(self) -> None:
        """What neither a flag nor an MQSTORE_* variable set comes from the context in force
        (--context, MQSTORE_CONTEXT, or the selected one: `mqstore up` selects its own)."""
        context = contexts.active(self.context)
        if context is None:
            return
        for name, value in context.values.items():
            if getattr(self, name, None) is None:
                setattr(self, name, value)

    def connection(self) -> Connection:
        """The one Connection of this command, closed when the command ends."""
        if self._connection is None:
            settings = self.settings()
            show_sdk_warnings()
            try:
                self._connection = Connection(settings)  # reads the token and TLS files
            except OSError as exc:
                raise SettingsError(f"cannot read {exc.filename}: {exc.strerror}") from None
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _seconds(text: str, option: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):  # also false for nan
        raise SettingsError(f"{option} is {text!r}: a number of seconds above 0 is needed")
    return seconds


class _LowerLevelFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def show_sdk_warnings() -> None:
    """The SDK logs what it rides out (a replica down, offsets lost to retention) as warnings:
    show them on stderr in the command's own "error: ..." style, one line each."""
    logger = logging.getLogger("mqstore.client")
    if any(getattr(h, "_mqstore_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LowerLevelFormatter())
    handler._mqstore_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def connection_options(f: F) -> F:
    """The global options of `mqstore`, each with its MQSTORE_* variable."""
    options = [
        click.option(
            "--commitlog",
            envvar="MQSTORE_COMMITLOG",
            metavar="HOST:PORT",
            help="commitlog_svc's address [env MQSTORE_COMMITLOG; default 127.0.0.1:7100]",
        ),
        click.option(
            "--cq",
            envvar="MQSTORE_CQ",
            metavar="A,B",
            help="cq_svc replicas, comma separated; the first that answers serves "
            "[env MQSTORE_CQ; default 127.0.0.1:7200]",
        ),
        click.option(
            "--index",
            envvar="MQSTORE_INDEX",
            metavar="A,B",
            help="index_svc replicas, comma separated (any shards) "
            "[env MQSTORE_INDEX; default 127.0.0.1:7300]",
        ),
        click.option(
            "--token-file",
            envvar="MQSTORE_TOKEN_FILE",
            metavar="FILE",
            help="a file holding the bearer token [env MQSTORE_TOKEN_FILE]",
        ),
        click.option(
            "--tls-ca",
            envvar="MQSTORE_TLS_CA",
            metavar="FILE",
            help="use TLS, trusting this CA bundle [env MQSTORE_TLS_CA]",
        ),
        click.option(
            "--tls-cert",
            envvar="MQSTORE_TLS_CERT",
            metavar="FILE",
            help="client certificate for mutual TLS, with --tls-key [env MQSTORE_TLS_CERT]",
        ),
        click.option(
            "--tls-key",
            envvar="MQSTORE_TLS_KEY",
            metavar="FILE",
            help="the client certificate's key [env MQSTORE_TLS_KEY]",
        ),
        click.option(
            "--tls-server-name",
            envvar="MQSTORE_TLS_SERVER_NAME",
            metavar="NAME",
            help="the name to check in the servers' certificates [env MQSTORE_TLS_SERVER_NAME]",
        ),
        click.option(
            "--context",
            envvar="MQSTORE_CONTEXT",
            metavar="NAME",
            help="a saved context: where a store is and how to reach it, for what no other "
            "option sets (`mqstore context ls`; `mqstore up` saves and selects one) "
            "[env MQSTORE_CONTEXT; default: the selected context]",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            envvar="MQSTORE_TIMEOUT_S",
            # Checked when a command connects (not here), so that a bad MQSTORE_TIMEOUT_S in
            # the environment does not break `mqstore up` or `mqstore log`.
            metavar="SECONDS",
            help="deadline of each call; long polls add their wait "
            "[env MQSTORE_TIMEOUT_S; default 10]",
        ),
        click.option(
            "--connect-timeout",
            "connect_timeout_s",
            envvar="MQSTORE_CONNECT_TIMEOUT_S",
            metavar="SECONDS",
            help="how long a store not reached yet is tried before the command fails naming "
            "the address and the likely cause [env MQSTORE_CONNECT_TIMEOUT_S; default 3]",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def pass_state(f: F) -> F:
    """Hands the command the CliState the group put on the context."""
    return click.pass_obj(f)  # type: ignore[return-value]


# -- output -----------------------------------------------------------------------------------


def stdout_console() -> Console:
    """Rich output for tables: colours on a terminal, plain and wide in a pipe."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, width=PIPE_WIDTH_COLUMNS, no_color=True)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def echo_json(obj: object) -> None:
    """One JSON document (or one line of a JSON-lines stream): compact, UTF-8 as is."""
    click.echo(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


json_option = click.option(
    "--json", "as_json", is_flag=True, help="print JSON for scripts instead of text"
)
