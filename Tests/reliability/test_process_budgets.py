"""Bounds that hold for all clients together (issue 27), memory: what one uid's connections hold
together (decoded calls not yet run, answers owed) is bounded per uid and for the process, and the
memory a burst took goes back to the system within seconds. Judged by the daemon's RSS from /proc
and by another client's latency; both tests fail on the code before these budgets (RSS 3,222 MiB
and 1,101 MiB in the issue).

Run: HERALD_BIN=.build/debug/herald .venv/bin/python -m pytest -q Tests/reliability/test_process_budgets.py
"""
from __future__ import annotations

import json
import multiprocessing
import os
import socket
import threading
import time

import pytest

from herald_fixtures import RPC, Daemon, Gateways, proc_memory_kb

USER = "budget-user"
CONNECTIONS = 64  # max_connections_per_uid


@pytest.fixture(scope="module")
def gw():
    return Gateways.shared()


def rss_mib(pid) -> float:
    return proc_memory_kb(pid).get("VmRSS", 0) / 1024


OTHER_UID = 65534


def _health_loop(socket_path, stop, out):
    """In a child running as another uid: system.health every 20 ms on one connection; the
    latencies (s) go to `out` at the end."""
    os.setgroups([])
    os.setgid(OTHER_UID)
    os.setuid(OTHER_UID)
    times = []
    with RPC(socket_path, 30) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            r = c.request("system.health", timeout=30)
            assert "result" in r, r
            times.append(time.perf_counter() - t0)
            time.sleep(0.02)
    out.put(times)


class Health:
    """Another client (another uid, its own connection) calling system.health every 20 ms; its
    latencies. The daemon's socket must let that uid in (socket_mode 0666)."""

    def __init__(self, d: Daemon):
        ctx = multiprocessing.get_context("fork")
        self.stop, self.out = ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=_health_loop, args=(d.socket, self.stop, self.out), daemon=True)
        self.proc.start()

    def end(self):
        self.stop.set()
        times = self.out.get(timeout=60)
        self.proc.join(10)
        return sorted(times)


def raw_connection(path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect(path)
    return s


def watch_rss(pid, seconds, peak):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak[0] = max(peak[0], rss_mib(pid))
        time.sleep(0.05)


def settle(pid, baseline, seconds=30) -> float:
    """RSS once it is back under 2x `baseline`, waiting at most `seconds`; the last reading."""
    deadline = time.monotonic() + seconds
    rss = rss_mib(pid)
    while rss >= 2 * baseline and time.monotonic() < deadline:
        time.sleep(0.5)
        rss = rss_mib(pid)
    return rss


def big_call(rid: int) -> dict:
    """A valid call of about 130,000 small objects (3.6 MB): decoded whole before it can run."""
    return {"jsonrpc": "2.0", "id": rid, "method": "device.list",
            "params": {"user": USER, "padding": [{"k": "v" * 18}] * 130_000}}


def test_decoded_calls_behind_hanging_sends_are_bounded(gw):
    """64 connections of one uid, each sending one batch: 16 push.send wait:true to a device whose
    push service never answers, then a call of ~130,000 small objects that waits behind them.
    Peak RSS stays under 512 MiB, another client's system.health stays quick, and once the
    connections close RSS is back under 2x its baseline within 30 s."""
    gw.reset()
    hanging = gw.subscription()
    gw.knobs("webpush", hang_tokens=[hanging["id"]])
    d = Daemon(gateways=gw, transports=("web",), server={"max_connections_per_uid": CONNECTIONS + 2, "system_calls_per_minute": 1_000_000},
               socket_mode="0666", dir_mode=0o711)
    sockets = []
    try:
        d.register(USER, "web", hanging["endpoint"], keys={"p256dh": hanging["p256dh"], "auth": hanging["auth"]})
        time.sleep(1)
        baseline = rss_mib(d.pid)
        health = Health(d)
        peak = [baseline]
        watcher = threading.Thread(target=watch_rss, args=(d.pid, 1e9, peak), daemon=True)
        calls = [{"jsonrpc": "2.0", "id": i, "method": "push.send",
                  "params": {"to": {"users": [USER]}, "wait": True, "timeout_ms": 60_000}} for i in range(16)]
        body = (json.dumps(calls + [big_call(99)], separators=(",", ":")) + "\n").encode()
        assert len(body) < 4 * 1024 * 1024
        watcher.start()
        refused = []

        def send(s):
            # A message that cannot be taken in time (the daemon holds 64 MiB of unfinished
            # messages at most) is closed by request_timeout_ms: counted, not an error.
            try:
                s.sendall(body)
            except OSError as e:
                refused.append(e)

        for _ in range(CONNECTIONS):
            sockets.append(raw_connection(d.socket))
        senders = [threading.Thread(target=send, args=(s,), daemon=True) for s in sockets]
        for t in senders:
            t.start()
        watch_rss(d.pid, 12, peak)
        held = rss_mib(d.pid)
        for s in sockets:
            s.close()
        sockets.clear()
        watch_rss(d.pid, 1, peak)
        times = health.end()
        after = settle(d.pid, baseline)
        print(f"{len(refused)} of {CONNECTIONS} sends cut short; "
              f"RSS baseline {baseline:.0f} MiB, peak {peak[0]:.0f}, held {held:.0f}, after close {after:.0f}; "
              f"health p50 {times[len(times) // 2] * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms ({len(times)})")
        assert peak[0] <= 512, f"peak RSS {peak[0]:.0f} MiB"
        assert after < 2 * baseline, f"RSS {after:.0f} MiB 30 s after the connections closed (baseline {baseline:.0f})"
        assert times[len(times) // 2] < 0.05 and times[-1] < 1.0, times[-5:]
        assert d.log_lines("client_budget_paused"), "the pause is logged"
        assert d.running
    finally:
        for s in sockets:
            s.close()
        d.cleanup()
        gw.reset()


def test_answers_owed_to_slow_readers_are_bounded():
    """64 connections of one uid each send a batch of 400 rpc.discover and read nothing for 8 s,
    then read slowly. Peak RSS stays under 512 MiB (the issue saw 1,101 MiB), another client's
    system.health keeps its latency, every batch is answered (rpc.discover documents or 1007
    overloaded), and RSS comes back under 2x its baseline within 30 s of the end."""
    d = Daemon(transports=(), server={"max_connections_per_uid": CONNECTIONS + 2, "system_calls_per_minute": 1_000_000},
               socket_mode="0666", dir_mode=0o711)
    sockets = []
    try:
        time.sleep(1)
        baseline = rss_mib(d.pid)
        health = Health(d)
        peak = [baseline]
        batch = [{"jsonrpc": "2.0", "id": i, "method": "rpc.discover"} for i in range(400)]
        body = (json.dumps(batch) + "\n").encode()
        for _ in range(CONNECTIONS):
            s = raw_connection(d.socket)
            s.sendall(body)
            sockets.append(s)
        watch_rss(d.pid, 8, peak)
        answered = {"documents": 0, "overloaded": 0}

        def drain(s):
            buf = b""
            s.settimeout(60)
            while not buf.endswith(b"\n"):
                chunk = s.recv(256 * 1024)
                if not chunk:
                    break
                buf += chunk
                time.sleep(0.005)
            answers = json.loads(buf)
            assert len(answers) == 400
            for a in answers:
                if "result" in a:
                    answered["documents"] += 1
                else:
                    assert a["error"]["code"] == 1007, a
                    answered["overloaded"] += 1

        readers = [threading.Thread(target=drain, args=(s,)) for s in sockets]
        for r in readers:
            r.start()
        while any(r.is_alive() for r in readers):
            watch_rss(d.pid, 0.2, peak)
        times = health.end()
        for s in sockets:
            s.close()
        sockets.clear()
        after = settle(d.pid, baseline)
        print(f"RSS baseline {baseline:.0f} MiB, peak {peak[0]:.0f}, after {after:.0f}; {answered}; "
              f"health p50 {times[len(times) // 2] * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms ({len(times)})")
        assert answered["documents"] + answered["overloaded"] == CONNECTIONS * 400
        assert answered["documents"] >= 400, "at least a connection's worth of documents is answered"
        assert peak[0] <= 512, f"peak RSS {peak[0]:.0f} MiB"
        assert after < 2 * baseline, f"RSS {after:.0f} MiB 30 s after (baseline {baseline:.0f})"
        assert times[len(times) // 2] < 0.05, times[len(times) // 2]
    finally:
        for s in sockets:
            s.close()
        d.cleanup()


def test_the_connection_holding_the_most_is_shed(gw):
    """With max_client_bytes = 16 MiB, a connection whose 3.5 MB call waits behind 16 hanging
    push.send holds more than every connection may for over a second: it is closed, with a
    client_shed warning and the counter, and the daemon and its other clients go on."""
    gw.reset()
    hanging = gw.subscription()
    gw.knobs("webpush", hang_tokens=[hanging["id"]])
    d = Daemon(gateways=gw, transports=("web",),
               server={"max_client_bytes": 16 * 1024 * 1024, "system_calls_per_minute": 1_000_000})
    try:
        d.register(USER, "web", hanging["endpoint"], keys={"p256dh": hanging["p256dh"], "auth": hanging["auth"]})
        calls = [{"jsonrpc": "2.0", "id": i, "method": "push.send",
                  "params": {"to": {"users": [USER]}, "wait": True, "timeout_ms": 60_000}} for i in range(16)]
        body = (json.dumps(calls + [big_call(99)], separators=(",", ":")) + "\n").encode()
        s = raw_connection(d.socket)
        s.sendall(body)
        s.settimeout(10)
        t0 = time.monotonic()
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        shed_after = time.monotonic() - t0
        s.close()
        lines = d.log_lines("client_shed")
        assert len(lines) == 1, lines
        assert "limit_bytes=16777216" in lines[0], lines[0]
        assert shed_after < 5, shed_after
        stats = d.call("system.stats")
        assert stats["connections"]["shed"] == 1, stats["connections"]
        assert stats["connections"]["held_bytes"] < 1024 * 1024, stats["connections"]
        assert d.running
    finally:
        d.cleanup()
        gw.reset()


def _big_call_as_other_uid(socket_path, out):
    """In a child running as another uid: one complete 3.5 MB call; (seconds to its answer, answer
    code) go to `out`."""
    os.setgroups([])
    os.setgid(OTHER_UID)
    os.setuid(OTHER_UID)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(socket_path)
    body = (json.dumps(big_call(7), separators=(",", ":")) + "\n").encode()
    t0 = time.monotonic()
    s.sendall(body)
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    answer = json.loads(buf)
    out.put((time.monotonic() - t0, answer.get("error", {}).get("code")))


def test_one_uids_unfinished_messages_leave_room_for_another():
    """20 connections of one uid each send 4 MiB of a message that never ends (80 MiB, past the
    64 MiB the daemon takes of unfinished messages); another uid's complete 3.5 MB call is still
    read and answered well before those messages' 10 s request timeout (under 5 s; about 1 s on an
    idle machine, 2.6 s once on a busy 2-core CI run), because one uid takes at most half of that
    room (before, it waited for the first uid's messages to time out, about 10 s)."""
    d = Daemon(transports=(), server={"system_calls_per_minute": 1_000_000}, socket_mode="0666", dir_mode=0o711)
    socks = []
    try:
        head = b'{"jsonrpc":"2.0","id":1,"method":"system.health","params":{"pad":"'
        body = head + b"x" * (4 * 1024 * 1024 - len(head) - 16)

        def send(s):
            try:
                s.sendall(body)
            except OSError:
                pass

        for _ in range(20):
            s = raw_connection(d.socket)
            s.settimeout(30)
            socks.append(s)
            threading.Thread(target=send, args=(s,), daemon=True).start()
        time.sleep(2)
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_big_call_as_other_uid, args=(d.socket, out), daemon=True)
        child.start()
        seconds, code = out.get(timeout=40)
        child.join(10)
        print(f"another uid's 3.5 MB call answered in {seconds:.2f} s (code {code})")
        assert code == -32602, code   # device.list does not take "padding": read, decoded, refused
        assert seconds < 5, f"answered after {seconds:.1f} s"
    finally:
        for s in socks:
            s.close()
        d.cleanup()
