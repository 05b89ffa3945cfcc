"""The conformance agent driven through its JSON-lines protocol against a real server."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading

import pytest


class AgentProc:
    def __init__(self, endpoints: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "latchkey.conformance_agent", "--endpoints", endpoints],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.pending = {}

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, obj) -> None:
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def answer(self, cid, timeout=20.0):
        """The answer with id `cid`; other answers are kept for later."""
        if cid in self.pending:
            return self.pending.pop(cid)
        for _ in range(100):
            line = self.lines.get(timeout=timeout)
            a = json.loads(line)
            if a.get("id") == cid:
                return a
            self.pending[a.get("id")] = a
        raise AssertionError(f"no answer {cid}")

    def call(self, cid, **cmd):
        self.send({"id": cid, **cmd})
        return self.answer(cid)

    def close(self) -> int:
        self.proc.stdin.close()
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def agent(server):
    a = AgentProc(server.addr)
    try:
        yield a
    finally:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait(10)


def test_agent_speaks_the_protocol(agent):
    a = agent
    s1 = a.call("1", op="session", session="s1", ttl_ms=4000)
    assert s1["ok"] and s1["session_id"] > 0
    assert a.call("2", op="session", session="s2", ttl_ms=4000)["ok"]
    held = a.call("3", op="lock", session="s1", name="x", wait_ms=3000)
    assert held["ok"] and held["guard"].startswith("g-")
    # A blocked lock does not stop later commands: s2 queues, describe still answers.
    a.send({"id": "4", "op": "lock", "session": "s2", "name": "x"})
    for _ in range(200):
        d = a.call("5", op="describe", name="x")
        if d["waiters"] == 1:
            break
    assert d == {"id": "5", "ok": True, "held": True, "token": held["token"],
                 "session_id": s1["session_id"], "waiters": 1, "mode": "exclusive",
                 "permits": 0,
                 "holders": [{"session_id": s1["session_id"], "token": held["token"]}]}
    assert a.call("5b", op="session", session="s3", ttl_ms=4000)["ok"]
    busy = a.call("6", op="lock", session="s3", name="x", wait_ms=0)
    assert busy["ok"] is False and busy["error"] == "wait-timeout"
    assert a.call("7", op="fencing_headers", guard=held["guard"])["headers"] == {
        "latchkey-lock": "x", "latchkey-token": str(held["token"])}
    assert a.call("8", op="lost", guard=held["guard"]) == {"id": "8", "ok": True, "lost": False}
    assert a.call("9", op="release", guard=held["guard"]) == {"id": "9", "ok": True}
    second = a.answer("4")
    assert second["ok"] and second["token"] > held["token"]
    retry = a.call("10", op="inject_retry", session="s1", name="y")
    assert retry["ok"] and len(retry["tokens"]) == 2 and retry["tokens"][0] == retry["tokens"][1]
    assert a.call("11", op="describe", name="y")["token"] == retry["tokens"][0]
    assert a.call("12", op="wait_lost", guard=second["guard"], timeout_ms=100)["lost"] is False
    assert a.call("13", op="frobnicate") == {"id": "13", "ok": False, "error": "unknown-op"}
    a.send("{not json")
    assert a.answer(None) == {"id": None, "ok": False, "error": "bad-command"}
    assert a.call("14", op="close", session="s2") == {"id": "14", "ok": True}
    assert a.call("15", op="lost", guard=second["guard"])["lost"] is True
    assert a.call("16", op="describe", name="x")["held"] is False
    assert a.close() == 0
