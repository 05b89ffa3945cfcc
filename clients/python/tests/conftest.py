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
                 extra: Sequence[str] = ()) -> None:
        self.id = node_id
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
