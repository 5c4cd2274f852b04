"""Network namespaces for the replicated chaos run: each commit-log replica on a network of its
own, so that one can be cut off from everything else and joined again.

    host (chaos run, SDK, etcd, cq_svc, index_svc)
      bridge mqc<id>br  10.231.B.1/24  ◀── etcd listens here; the others reach it through it
        ├── veth mqc<id>0h ══ netns mqc-<id>-0: eth0 10.231.B.10   replica 0
        ├── veth mqc<id>1h ══ netns mqc-<id>-1: eth0 10.231.B.11   replica 1
        └── veth mqc<id>2h ══ netns mqc-<id>-2: eth0 10.231.B.12   replica 2

A replica's process runs in its namespace (`ip netns exec`, which execs: the pid is the
service's, so kill -9 and SIGSTOP reach it) and binds its namespace's address. Every path to
it (clients, cq_svc and index_svc, the other replicas, its way to etcd) crosses its veth.

Cut: the host end of its veth is set down. Frames either way are dropped without a word (no
reset, no ICMP): connections hang, new ones time out, as across a real partition. Heal: set
it up again; TCP retransmits, and connections that outlived the cut carry on. (netem's 100 %
loss would do the same from tc, but this kernel has no sch_netem; a link down needs nothing.)

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the `ip` command: `unavailable()` says why
not, and the run then has no partition cycles. Names carry a random id of the run, so that
runs side by side do not meet; `destroy()` removes everything (namespaces, bridge, veths) and
is safe to call twice. A run killed with SIGKILL leaves them behind: `ip netns list` shows
`mqc-*`, `ip netns del` and `ip link del mqc<id>br` remove them.
"""

from __future__ import annotations

import ipaddress
import secrets
import shutil
import subprocess
from collections.abc import Sequence

SUBNET_PREFIX = "10.231"  # a /24 of 10.231.0.0/16 per run: private, unlikely to be routed here
BRIDGE_HOST = 1
FIRST_REPLICA_HOST = 10
IP_TIMEOUT_S = 10.0  # one `ip` command (it answers in milliseconds)
# /24 networks tried before giving up: each is checked against the host's routes.
SUBNET_TRIES = 32


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`, a kernel without them)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def unavailable() -> str | None:
    """Why namespaces, a bridge and veth pairs cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = Network(1)
    try:
        probe.create()
    except (NetnsUnavailable, OSError, subprocess.SubprocessError) as err:
        return str(err)
    finally:
        probe.destroy()
    return None


class Network:
    """`replicas` namespaces on one bridge; replica i is named by its index."""

    def __init__(self, replicas: int) -> None:
        self.id = secrets.token_hex(2)  # 4 hex digits: interface names stay within 15 bytes
        self.replicas = replicas
        self.bridge = f"mqc{self.id}br"
        self.subnet = ""
        self.created = False
        self._cut: set[int] = set()

    def namespace(self, i: int) -> str:
        return f"mqc-{self.id}-{i}"

    def _veth(self, i: int) -> str:
        return f"mqc{self.id}{i}h"

    @property
    def host_address(self) -> str:
        """The bridge's address: where the replicas reach the host (etcd listens here)."""
        return f"{self.subnet}.{BRIDGE_HOST}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{FIRST_REPLICA_HOST + i}"

    def _free_subnet(self) -> str:
        routes = _ip("-4", "route", "show", "table", "all").stdout
        used = []
        for line in routes.splitlines():
            word = line.split()[0] if line.split() else ""
            if word[:1].isdigit():
                try:
                    used.append(ipaddress.ip_network(word, strict=False))
                except ValueError:
                    continue
        for _ in range(SUBNET_TRIES):
            candidate = f"{SUBNET_PREFIX}.{secrets.randbelow(256)}"
            net = ipaddress.ip_network(f"{candidate}.0/24")
            if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
                return candidate
        raise NetnsUnavailable(f"no free /24 in {SUBNET_PREFIX}.0.0/16")

    def create(self) -> None:
        self.subnet = self._free_subnet()
        self.created = True  # from here on destroy() has something to remove
        _ip("link", "add", "name", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.replicas):
            ns, veth = self.namespace(i), self._veth(i)
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth[:-1]}n")
            _ip("link", "set", f"{veth[:-1]}n", "netns", ns)
            _ip("-n", ns, "link", "set", f"{veth[:-1]}n", "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.host_address)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")

    def wrap(self, i: int, command: Sequence[str]) -> list[str]:
        """`command` run inside replica i's namespace (the process is the command's own)."""
        return ["ip", "netns", "exec", self.namespace(i), *command]

    def cut(self, i: int) -> None:
        """Replica i hears nothing and is heard by nobody until `heal(i)`."""
        _ip("link", "set", self._veth(i), "down")
        self._cut.add(i)

    def heal(self, i: int) -> None:
        _ip("link", "set", self._veth(i), "up")
        self._cut.discard(i)

    @property
    def cut_off(self) -> frozenset[int]:
        return frozenset(self._cut)

    def destroy(self) -> None:
        """Remove the namespaces, veths and the bridge (what exists of them)."""
        if not self.created:
            return
        for i in range(self.replicas):
            _ip("link", "del", self._veth(i), check=False)  # its peer goes with it
            _ip("netns", "del", self.namespace(i), check=False)
        _ip("link", "del", self.bridge, check=False)
        self.created = False
