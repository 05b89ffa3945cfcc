"""Real `latchkey serve` processes for the tests: 127.0.0.1 on free ports, a data dir each,
every process stopped (SIGCONT first if paused, then SIGTERM, then SIGKILL) at teardown.

The binary: $LATCHKEY_BIN, or <repo>/target/debug/latchkey.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import pytest

import latchkey

REPO = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 30.0
POLL_S = 0.02


def latchkey_bin() -> str:
    path = os.environ.get("LATCHKEY_BIN") or str(REPO / "target" / "debug" / "latchkey")
    if not Path(path).is_file():
        pytest.fail(f"no latchkey binary at {path}: build it (cargo build -p latchkey-cli) "
                    "or set LATCHKEY_BIN")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Polls `cond` until true, failing after `timeout` seconds (bounded in count and time)."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / POLL_S) + 1):
        if cond():
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    raise AssertionError(f"timed out after {timeout}s waiting until {what}")


class Server:
    """One `latchkey serve` member."""

    def __init__(self, tmp: Path, node_id: int = 1, port: Optional[int] = None,
                 peers: Optional[str] = None, metrics: bool = False,
                 extra: Sequence[str] = (), groups: int = 1) -> None:
        self.id = node_id
        # `serve --groups N`: the Raft groups a new cluster splits its locks over (every
        # member of one cluster gets the same).
        self.groups = groups
        self.port = port or free_port()
        self.addr = f"127.0.0.1:{self.port}"
        # --metrics-listen: Prometheus text at http://ADDR/metrics (see `requests`).
        self.metrics_addr = f"127.0.0.1:{free_port()}" if metrics else None
        self.dir = tmp / f"node{node_id}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "server.log"
        self.peers = peers
        self.extra = list(extra)  # more `serve` flags, e.g. ["--acl", FILE]
        self.proc: Optional[subprocess.Popen] = None
        self.paused = False

    def start(self) -> None:
        args = [latchkey_bin(), "serve", "--id", str(self.id), "--listen", self.addr,
                "--data-dir", str(self.dir / "data")]
        if self.peers:
            args += ["--peers", self.peers]
        if self.metrics_addr:
            args += ["--metrics-listen", self.metrics_addr]
        if self.groups != 1:
            args += ["--groups", str(self.groups)]
        args += self.extra
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def requests(self, method: str) -> int:
        """Client calls of `method` (snake case: "keep_alive") this member received so far:
        its `latchkey_requests_total{method=...}` counter (0 before the first)."""
        assert self.metrics_addr is not None, "start the server with metrics=True"
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=5) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith(f'latchkey_requests_total{{method="{method}"}} '):
                return int(float(line.split()[-1]))
        return 0

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            self.proc.send_signal(signal.SIGCONT)
            self.paused = False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.resume()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        self.log.close()

    def kill9(self) -> None:
        if self.proc is not None:
            self.resume()
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None
            self.log.close()


def wait_leader(servers: List[Server], auth_token: Optional[str] = None) -> Server:
    """Waits until one member says it leads and serves a read; that member. Under --acl,
    `auth_token` is an identity's that may read "probe/"."""
    probe = latchkey.Client([s.addr for s in servers], rpc_timeout=1.0, auth_token=auth_token)
    found: List[Server] = []

    def ready() -> bool:
        for s in servers:
            if s.proc is None:
                continue
            if s.proc.poll() is not None:
                raise AssertionError(f"server {s.addr} exited:\n{s.log_tail()}")
            try:
                st = probe.node_status(s.addr)
            except latchkey.LatchkeyError:
                continue
            if st.role == "leader":
                try:
                    probe.describe("probe/ready")
                except latchkey.LatchkeyError:
                    return False
                found[:] = [s]
                return True
        return False

    try:
        wait_until("a member leads", ready, READY_TIMEOUT_S)
    finally:
        probe.close()
    return found[0]


def run(coro):
    """Runs an asyncio test body, bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, 60))


async def wait_until_async(what, cond, timeout=10.0):
    """wait_until for an async condition."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.02) + 1):
        if await cond():
            return
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting until {what}")


def _serving(s):
    """Starts `s`, yields it once it leads, and stops it."""
    s.start()
    try:
        wait_leader([s])
        yield s
    finally:
        s.stop()


@pytest.fixture
def server(tmp_path):
    yield from _serving(Server(tmp_path))


@pytest.fixture
def metered_server(tmp_path):
    """A single member that also serves its Prometheus metrics (Server.requests)."""
    yield from _serving(Server(tmp_path, metrics=True))


@pytest.fixture
def cluster(tmp_path):
    ports = [free_port() for _ in range(3)]
    peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    servers = [Server(tmp_path, i + 1, p, peers) for i, p in enumerate(ports)]
    try:
        for s in servers:
            s.start()
        wait_leader(servers)
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def client(server):
    c = latchkey.Client([server.addr])
    try:
        yield c
    finally:
        c.close()


# --- Clusters of several Raft groups (`serve --groups`). --------------------------------------
def names_by_group(groups: int, prefix: str) -> List[str]:
    """One lock name per Raft group, `names[g]` in group g: the first `prefix<i>` of each."""
    from latchkey import _core

    names: dict = {}
    for i in range(100 * groups):  # jump hash spreads evenly: a few tries per group
        names.setdefault(_core.group_of(f"{prefix}{i}", groups), f"{prefix}{i}")
        if len(names) == groups:
            return [names[g] for g in range(groups)]
    raise AssertionError(f"no name of some group among {100 * groups} tries")


def wait_groups_led(servers: List[Server], groups: int) -> None:
    """Waits until every Raft group has a leader that serves a read of one of its locks."""
    probe = latchkey.Client([s.addr for s in servers], rpc_timeout=1.0,
                            retry=latchkey.RetryPolicy(attempts_max=8, elapsed_max=2.0))
    names = names_by_group(groups, "probe/ready-")

    def ready() -> bool:
        for s in servers:
            if s.proc is not None and s.proc.poll() is not None:
                raise AssertionError(f"server {s.addr} exited:\n{s.log_tail()}")
        try:
            for n in names:
                probe.describe(n)
        except latchkey.LatchkeyError:
            return False
        return True

    try:
        wait_until(f"each of {groups} Raft groups leads", ready, READY_TIMEOUT_S)
    finally:
        probe.close()


def group_leaders(servers: List[Server], groups: int) -> dict:
    """{group: address of the member that says it leads it}, from every member's NodeStatus."""
    probe = latchkey.Client([servers[0].addr], rpc_timeout=1.0)
    try:
        leaders = {}
        for s in servers:
            if s.proc is None:
                continue
            st = probe.node_status(s.addr)
            assert st.groups == groups, st
            for g in st.group_status:
                if g.role == "leader":
                    leaders[g.group] = s.addr
        return leaders
    finally:
        probe.close()


def _grouped(tmp: Path, members: int, groups: int, extra: Sequence[str] = ()) -> List[Server]:
    ports = [free_port() for _ in range(members)]
    peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports)) if members > 1 \
        else None
    return [Server(tmp, i + 1, p, peers, metrics=True, extra=extra, groups=groups)
            for i, p in enumerate(ports)]


def _serving_grouped(servers: List[Server], groups: int):
    try:
        for s in servers:
            s.start()
        wait_groups_led(servers, groups)
        yield servers
    finally:
        for s in servers:
            s.stop()


GROUPS = 3


@pytest.fixture(scope="module")
def grouped_server(tmp_path_factory):
    """One member of a cluster of GROUPS Raft groups (it leads them all), with metrics."""
    yield from _serving_grouped(_grouped(tmp_path_factory.mktemp("grouped1"), 1, GROUPS),
                                GROUPS)


@pytest.fixture(scope="module")
def grouped_cluster(tmp_path_factory):
    """Three members of a cluster of GROUPS Raft groups (the leaders spread over them), with
    metrics. Shared by a module's tests: each uses lock names of its own."""
    yield from _serving_grouped(_grouped(tmp_path_factory.mktemp("grouped3"), 3, GROUPS),
                                GROUPS)


REPLICA_GROUPS = 4
# `serve --replicas 3` on four members: group g on the (g mod 4)-th member by id and the next
# two, wrapping (docs/groups.md, "Groups across machines: replica subsets"); ids in order, as
# NodeStatus lists a group's voters.
PLACEMENT = {0: [1, 2, 3], 1: [2, 3, 4], 2: [1, 3, 4], 3: [1, 2, 4]}


@pytest.fixture
def replica_cluster(tmp_path):
    """Four members of a cluster of REPLICA_GROUPS Raft groups, each group on three of them
    (PLACEMENT), with metrics."""
    yield from _serving_grouped(
        _grouped(tmp_path, 4, REPLICA_GROUPS, extra=["--replicas", "3"]), REPLICA_GROUPS)
