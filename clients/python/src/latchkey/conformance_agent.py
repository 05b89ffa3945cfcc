"""The conformance agent (issue #15 item 5): JSON lines on stdin -> one JSON answer line per
command on stdout, over the blocking client's public API.

    python -m latchkey.conformance_agent --endpoints HOST:PORT[,HOST:PORT...]

Commands run one at a time in order, except `lock` and `campaign`, which run on a thread of its own so that
a blocked wait does not stop later commands (answers carry the command's id). On stdin EOF
every session is closed and the agent exits 0. Diagnostics go to stderr.

`inject_retry` uses the documented test hook `latchkey.testing.resend_acquire`, which sends one
Acquire request (one sequence number) twice, as a retry after a lost answer does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import threading
from typing import Any, Dict, List, Optional

import latchkey
from latchkey.testing import resend_acquire

# Lock commands in flight at once: a conformance run queues a handful.
_LOCKS_IN_FLIGHT_MAX = 256
# Queue positions kept per lock command (the latest): a wait hears one a long-poll (at most
# 10 s), so a conformance wait of a minute hears a handful.
_POSITIONS_KEPT_MAX = 64


def _error_code(e: BaseException) -> str:
    if isinstance(e, latchkey.WaitTimeout):
        return "wait-timeout"
    if isinstance(e, latchkey.PermissionDenied):
        return "permission-denied"
    if isinstance(e, latchkey.LockLost):
        return "lost"
    if isinstance(e, latchkey.InvalidArgument):
        return "invalid-argument"
    if isinstance(e, latchkey.KindConflict):
        return "kind-conflict"
    if isinstance(e, latchkey.PermitsConflict):
        return "permits-conflict"
    if isinstance(e, latchkey.NotElectionLeader):
        return "not-election-leader"
    return "other"


class Agent:
    def __init__(self, endpoints: str) -> None:
        self.client = latchkey.Client(endpoints)
        self.sessions: Dict[str, latchkey.Session] = {}
        self.guards: Dict[str, latchkey.LockGuard] = {}
        # The queue positions reported to a lock that asked ("positions": true), in order, by
        # the lock command's id.
        self.positions: Dict[str, List[int]] = {}
        self.ids = itertools.count(1)
        self.out_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.lock_slots = threading.BoundedSemaphore(_LOCKS_IN_FLIGHT_MAX)
        self.workers: "set[threading.Thread]" = set()

    def answer(self, obj: Dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":"))
        with self.out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def session(self, name: Any) -> latchkey.Session:
        with self.state_lock:
            s = self.sessions.get(str(name))
        if s is None:
            raise KeyError(f"no session {name!r}")
        return s

    def guard(self, name: Any) -> latchkey.LockGuard:
        with self.state_lock:
            g = self.guards.get(str(name))
        if g is None:
            raise KeyError(f"no guard {name!r}")
        return g

    def keep_guard(self, g: latchkey.LockGuard) -> str:
        gid = f"g-{next(self.ids)}"
        with self.state_lock:
            self.guards[gid] = g
        return gid

    def run_line(self, line: str) -> None:
        try:
            cmd = json.loads(line)
            if not isinstance(cmd, dict) or not isinstance(cmd.get("id"), str) \
                    or not isinstance(cmd.get("op"), str):
                raise ValueError("a command is an object with a string id and op")
        except ValueError as e:
            print(f"agent: bad command {line!r}: {e}", file=sys.stderr)
            self.answer({"id": None, "ok": False, "error": "bad-command"})
            return
        if cmd["op"] in ("lock", "campaign"):
            self.lock_slots.acquire()
            t = threading.Thread(target=self.run_lock, args=(cmd,), daemon=True)
            with self.state_lock:
                self.workers = {w for w in self.workers if w.is_alive()}
                self.workers.add(t)
            t.start()
            return
        self.answer(self.run(cmd))

    def run_lock(self, cmd: Dict[str, Any]) -> None:
        try:
            self.answer(self.run(cmd))
        finally:
            self.lock_slots.release()

    def run(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        cid, op = cmd["id"], cmd["op"]
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            return {"id": cid, "ok": False, "error": "unknown-op"}
        try:
            out = handler(cmd)
        except latchkey.LatchkeyError as e:
            # First: InvalidArgument is a ValueError too.
            return {"id": cid, "ok": False, "error": _error_code(e), "message": str(e)}
        except (KeyError, TypeError, ValueError) as e:
            return {"id": cid, "ok": False, "error": "other", "message": f"bad command: {e}"}
        except Exception as e:  # noqa: BLE001 - reported to the driver, never fatal
            print(f"agent: {op} failed: {e!r}", file=sys.stderr)
            return {"id": cid, "ok": False, "error": "other", "message": repr(e)}
        return {"id": cid, "ok": True, **out}

    def op_session(self, cmd):
        s = self.client.session(ttl=int(cmd["ttl_ms"]) / 1000)
        with self.state_lock:
            old = self.sessions.get(str(cmd["session"]))
            self.sessions[str(cmd["session"])] = s
        if old is not None:
            old.close()
        return {"session_id": s.id}

    def op_lock(self, cmd):
        wait_ms: Optional[int] = cmd.get("wait_ms")
        wait = None if wait_ms is None else int(wait_ms) / 1000
        # `"mode": "shared"` a reader, `"permits": N` one of a semaphore's N permits.
        mode, permits = cmd.get("mode"), cmd.get("permits")
        if mode not in (None, "exclusive", "shared", "permits"):
            raise ValueError(f"no mode {mode!r}")
        # `"lock_delay_ms": N` asks for a lock-delay (docs/primitives.md).
        delay_ms = cmd.get("lock_delay_ms")
        lock_delay = None if delay_ms is None else int(delay_ms) / 1000
        # `"positions": true` records the queue positions reported while it waits (`positions`).
        heard = None
        if cmd.get("positions") is True:
            heard = []
            with self.state_lock:
                self.positions[cmd["id"]] = heard

            def heard_one(position: int) -> None:
                with self.state_lock:
                    if len(heard) == _POSITIONS_KEPT_MAX:
                        del heard[0]
                    heard.append(int(position))

        g = self.session(cmd["session"]).lock(str(cmd["name"]), wait=wait,
                                              shared=mode == "shared", permits=permits,
                                              lock_delay=lock_delay,
                                              positions=None if heard is None else heard_one)
        return {"token": g.token, "guard": self.keep_guard(g)}

    def op_positions(self, cmd):
        with self.state_lock:
            heard = self.positions.get(str(cmd["lock"]))
            if heard is None:
                raise KeyError(f"no lock {cmd['lock']!r} that asked for positions")
            return {"positions": list(heard)}

    def op_campaign(self, cmd):
        wait_ms: Optional[int] = cmd.get("wait_ms")
        wait = None if wait_ms is None else int(wait_ms) / 1000
        leadership = self.session(cmd["session"]).campaign(str(cmd["name"]), str(cmd["value"]),
                                                           wait=wait)
        return {"token": leadership.token, "guard": self.keep_guard(leadership)}

    def leadership(self, name: Any) -> latchkey.Leadership:
        g = self.guard(name)
        if not isinstance(g, latchkey.Leadership):
            raise KeyError(f"guard {name!r} is not a campaign's")
        return g

    def op_proclaim(self, cmd):
        self.leadership(cmd["guard"]).proclaim(str(cmd["value"]))
        return {}

    def op_resign(self, cmd):
        self.leadership(cmd["guard"]).resign()
        return {}

    def op_leader(self, cmd):
        leader = self.client.leader(str(cmd["name"]))
        if leader is None:
            return {"leader": None}
        return {"leader": {"session_id": leader.session_id, "token": leader.token,
                           "value": leader.value.decode("utf-8", "replace")}}

    def op_release(self, cmd):
        self.guard(cmd["guard"]).release()
        return {}

    def op_lost(self, cmd):
        return {"lost": self.guard(cmd["guard"]).lost.is_set()}

    def op_wait_lost(self, cmd):
        g = self.guard(cmd["guard"])
        return {"lost": g.lost.wait(timeout=int(cmd["timeout_ms"]) / 1000)}

    def op_contended(self, cmd):
        return {"contended": self.guard(cmd["guard"]).is_contended()}

    def op_wait_contended(self, cmd):
        g = self.guard(cmd["guard"])
        return {"contended": g.contended(timeout=int(cmd["timeout_ms"]) / 1000)}

    def op_describe(self, cmd):
        info = self.client.describe(str(cmd["name"]))
        h = info.holder
        return {"held": h is not None, "token": h.token if h else None,
                "session_id": h.session_id if h else None, "waiters": info.waiters,
                "mode": info.mode, "permits": info.permits,
                "holders": [{"session_id": x.session_id, "token": x.token} for x in info.holders]}

    def op_close(self, cmd):
        with self.state_lock:
            s = self.sessions.pop(str(cmd["session"]), None)
        if s is None:
            raise KeyError(f"no session {cmd['session']!r}")
        s.close()
        return {}

    def op_fencing_headers(self, cmd):
        return {"headers": self.guard(cmd["guard"]).fencing_headers()}

    def op_inject_retry(self, cmd):
        g, tokens = resend_acquire(self.session(cmd["session"]), str(cmd["name"]), times=2)
        return {"tokens": tokens, "guard": self.keep_guard(g)}

    def shutdown(self) -> None:
        with self.state_lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
        for s in sessions:
            try:
                s.close()
            except latchkey.LatchkeyError as e:
                print(f"agent: closing session {s.id}: {e}", file=sys.stderr)
        # Closing the sessions ended every wait (SessionLost): the lock threads answer and end.
        with self.state_lock:
            workers = list(self.workers)
        for t in workers:
            t.join(30)
        self.client.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latchkey.conformance_agent")
    parser.add_argument("--endpoints", required=True, help="HOST:PORT[,HOST:PORT...]")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    agent = Agent(args.endpoints)
    try:
        for line in sys.stdin:
            if line.strip():
                agent.run_line(line)
    finally:
        agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
