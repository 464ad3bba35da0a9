"""Bounds that hold for all clients together (issue 27), the smaller edges: a push service
that floods GOAWAY frames, a process out of descriptors, the limit on open descriptors, a
test-only setting left on. Each runs a real daemon against the test gateways (or none) on
loopback; each fails on the code before these bounds.

Run: HERALD_BIN=.build/debug/herald .venv/bin/python -m pytest -q Tests/reliability/test_shared_bounds.py
"""
from __future__ import annotations

import os
import socket
import time

import pytest

from herald_fixtures import Daemon, Gateways, metric

USER = "bounds-user"


@pytest.fixture(scope="module")
def gw():
    return Gateways.shared()


def cpu_seconds(pid):
    """utime + stime of a process, in seconds (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(what, predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_goaway_flood_is_logged_once_with_its_count(gw):
    """A push service that sends 30,000 GOAWAY frames (500 KiB) after its GOAWAY, on a
    connection that still carries an unanswered push (so the daemon keeps reading it until the
    service closes it): the daemon logs the first frame (http2_goaway) and, when the connection
    ends, how many came (http2_goaway_repeated), not a line per frame."""
    flood = 30_000
    gw.reset()
    hanging, plain = gw.subscription(), gw.subscription()
    gw.knobs("webpush", goaway_after=2, goaway_times=1, goaway_flood=flood, goaway_reason="Shutdown",
             hang_tokens=[hanging["id"]])
    d = Daemon(gateways=gw, transports=("web",))
    try:
        for sub in (hanging, plain):
            d.register(USER, "web", sub["endpoint"], keys={"p256dh": sub["p256dh"], "auth": sub["auth"]})
        d.call("push.send", {"to": {"users": [USER]}})
        flooded = wait_for("the gateway's flood", lambda: [c for c in gw.connections("webpush")["connections"]
                                                           if c.get("goaway_flood_sent")])
        assert flooded[0]["goaway_flood_sent"] == flood
        repeated = wait_for("the connection's end", lambda: d.log_lines("http2_goaway_repeated"), timeout=15)
        goaways = d.log_lines("http2_goaway")
        assert len(goaways) == 1, f"{len(goaways)} http2_goaway lines"
        assert len(repeated) == 1, repeated
        counted = int(repeated[0].split("goaways=")[1].split()[0])
        # What came before the service closed the connection: well past one read's 256 KiB.
        assert 20_000 <= counted <= flood + 1, repeated
        # Every frame read is counted, and the log has two lines for them all.
        assert metric(d.metrics(), "herald_provider_goaways_total", transport="web") == counted
    finally:
        d.cleanup()
        gw.reset()


def test_open_files_limit_is_raised_to_the_hard_limit():
    """Started with a soft limit of 256 descriptors and a hard one of 4096 (a shell's default
    soft limit is often 1024), the daemon raises its soft limit to the hard one and says so."""
    d = Daemon(transports=(), nofile=(256, 4096), start=False)
    try:
        d.start()
        with open(f"/proc/{d.pid}/limits") as f:
            line = next(l for l in f if l.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"], line
        started = d.log_lines("herald_started")
        assert started and "open_files_limit=4096" in started[-1], started
        d.shutdown()
    finally:
        d.cleanup()


def test_accept_backs_off_when_out_of_descriptors():
    """With 96 descriptors in all, clients connect until accept fails with EMFILE while more
    wait in the backlog. The listener stays readable, and the daemon used to take it again at
    once, spinning a core; now it leaves the listener alone until its next sweep: little CPU,
    one warning, a counter, and once descriptors are free the waiting clients are served."""
    d = Daemon(transports=(), nofile=(96, 96), server={"max_connections_per_uid": 512}, start=False)
    held = []
    try:
        d.start()
        # Fill the descriptors: each connection costs the daemon one; stop once one is left
        # waiting unaccepted (a call on it gets no answer).
        for _ in range(120):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.socket)
            held.append(s)
        time.sleep(0.5)
        before = cpu_seconds(d.pid)
        time.sleep(3.0)
        spent = cpu_seconds(d.pid) - before
        # Spinning on accept would cost about a core for those 3 s.
        assert spent < 0.6, f"{spent:.2f} s of CPU in 3 s while out of descriptors"
        paused = d.log_lines("accept_paused")
        assert paused and "Too many open files" in paused[0], d.log(30)
        for s in held:
            s.close()
        held.clear()
        # Descriptors free again: a new client is served, and the pause is counted.
        stats = wait_for("a client served after the pause", lambda: d.call("system.stats", timeout=5), timeout=10)
        assert stats["connections"]["accept_pauses"] >= 1, stats["connections"]
        assert metric(d.metrics(), "herald_client_accept_pauses_total") >= 1
        wait_for("accept_resumed", lambda: d.log_lines("accept_resumed"), timeout=5)
        d.shutdown()
    finally:
        for s in held:
            s.close()
        d.cleanup()


def test_webpush_allow_private_warns_at_every_start():
    """[endpoints] webpush_allow_private = true is for test servers: a warning at every start
    while it is on, none without it."""
    on = Daemon(transports=(), allow_private=True, start=False)
    off = Daemon(transports=(), allow_private=False, start=False)
    try:
        on.start()
        on.shutdown()
        on.start()
        warnings = on.log_lines("webpush_allow_private")
        assert len(warnings) == 2 and warnings[0].startswith("<4>"), warnings
        on.shutdown()
        off.start()
        assert off.log_lines("webpush_allow_private") == []
        off.shutdown()
    finally:
        on.cleanup()
        off.cleanup()
