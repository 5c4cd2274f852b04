"""Contexts: where a store is and how to reach it, saved under a name, as nats CLI's are.

    CONFIG_DIR/contexts/NAME.json   {"commitlog": "127.0.0.1:7100", "cq": "127.0.0.1:7200",
                                     "index": "127.0.0.1:7300", "tls_ca": "/abs/ca.pem", ...}
    CONFIG_DIR/context.txt          the selected context's name

CONFIG_DIR is $MQSTORE_CONFIG_DIR, else $XDG_CONFIG_HOME/mqstore, else ~/.config/mqstore.
`mqstore up` saves a context for the store it starts and selects it, so that the `mqstore`
command and ClientSettings.from_env() in any shell reach that store without its ports
(`mqstore context ls|show|select|rm`).

Which settings win, first to last: a command's flags and keyword arguments; MQSTORE_*
variables; the context named by --context or MQSTORE_CONTEXT, else the selected one; the
defaults (what `mqstore up` listens on with its default ports). A context holds the values of
the MQSTORE_* variables below (KEYS), no secrets: paths to the CA, certificate and token files.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from mqstore.errors import InvalidArgument, NotFound

# A context's fields and the variable each stands in for.
KEYS: Final = {
    "commitlog": "MQSTORE_COMMITLOG",
    "cq": "MQSTORE_CQ",
    "index": "MQSTORE_INDEX",
    "token_file": "MQSTORE_TOKEN_FILE",
    "tls_ca": "MQSTORE_TLS_CA",
    "tls_cert": "MQSTORE_TLS_CERT",
    "tls_key": "MQSTORE_TLS_KEY",
    "tls_server_name": "MQSTORE_TLS_SERVER_NAME",
}
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CONTEXT_FILE_BYTES_MAX: Final = 64 * 1024


@dataclass(frozen=True)
class Context:
    name: str
    values: Mapping[str, str]  # KEYS' fields, those set

    def as_env(self) -> dict[str, str]:
        """The context as the MQSTORE_* variables it stands in for."""
        return {KEYS[k]: v for k, v in self.values.items() if k in KEYS and v}


def config_dir(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if env.get("MQSTORE_CONFIG_DIR"):
        return env["MQSTORE_CONFIG_DIR"]
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "mqstore")


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise InvalidArgument(
            f"context name {name!r}: letters, digits, '_', '.' and '-', at most 64, "
            "starting with a letter or digit",
            field="context",
        )
    return name


def _path(name: str, env: Mapping[str, str] | None) -> str:
    return os.path.join(config_dir(env), "contexts", f"{check_name(name)}.json")


def save(context: Context, *, select: bool, env: Mapping[str, str] | None = None) -> str:
    """Write the context (replacing one of that name), select it if asked; its path."""
    unknown = set(context.values) - set(KEYS)
    if unknown:
        raise InvalidArgument(f"a context has no field {sorted(unknown)}", field="context")
    path = _path(context.name, env)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    _write(path, json.dumps(dict(context.values), indent=2, sort_keys=True) + "\n")
    if select:
        _write(os.path.join(config_dir(env), "context.txt"), context.name + "\n")
    return path


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def load(name: str, env: Mapping[str, str] | None = None) -> Context:
    path = _path(name, env)
    try:
        with open(path, "rb") as f:
            data = f.read(CONTEXT_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise NotFound(f"no context {name!r} ({path})") from None
    try:
        values = json.loads(data) if len(data) <= CONTEXT_FILE_BYTES_MAX else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        values = None
    if not isinstance(values, dict) or not all(
        k in KEYS and isinstance(v, str) for k, v in values.items()
    ):
        raise InvalidArgument(
            f"context {name!r} ({path}) is not a JSON object of {', '.join(KEYS)} strings",
            field="context",
        )
    return Context(name, values)


def names(env: Mapping[str, str] | None = None) -> list[str]:
    directory = os.path.join(config_dir(env), "contexts")
    if not os.path.isdir(directory):
        return []
    found = (f[: -len(".json")] for f in os.listdir(directory) if f.endswith(".json"))
    return sorted(n for n in found if NAME_PATTERN.match(n))


def selected(env: Mapping[str, str] | None = None) -> str | None:
    """The selected context's name (context.txt), if one is selected and still saved."""
    try:
        with open(os.path.join(config_dir(env), "context.txt"), encoding="utf-8") as f:
            name = f.read(128).strip()
    except FileNotFoundError:
        return None
    return name if NAME_PATTERN.match(name) and name in names(env) else None


def select(name: str, env: Mapping[str, str] | None = None) -> None:
    load(name, env)  # NotFound for a context never saved
    _write(os.path.join(config_dir(env), "context.txt"), name + "\n")


def remove(name: str, env: Mapping[str, str] | None = None) -> None:
    path = _path(name, env)
    try:
        os.remove(path)
    except FileNotFoundError:
        raise NotFound(f"no context {name!r} ({path})") from None


def active(name: str | None = None, env: Mapping[str, str] | None = None) -> Context | None:
    """The context in force: `name` (a --context flag), else MQSTORE_CONTEXT, else the selected
    one, else None. A named one that does not exist is NotFound: a typo must not fall back to
    another store."""
    env = os.environ if env is None else env
    chosen = name or env.get("MQSTORE_CONTEXT") or None
    if chosen is not None:
        return load(chosen, env)
    current = selected(env)
    return load(current, env) if current is not None else None
