"""Bounds that hold for all clients together (issue 27), the figures: a client reading
``system.stats`` / ``system.metrics`` in a loop must not slow down registrations, fifty scrapers of
``/metrics`` must not keep a ``/livez`` probe waiting or refused, and ``system.*`` calls are
limited per peer uid. Each test runs a real daemon on loopback and judges by another client's
latency; the first two fail on the code before these bounds (the figures ran on the SQLite
writer; the metrics listener answered on one thread and allowed 16 connections per address).

Run: HERALD_BIN=.build/debug/herald .venv/bin/python -m pytest -q Tests/reliability/test_figures.py
"""
from __future__ import annotations

import http.client
import multiprocessing
import socket
import threading
import time

import pytest

from herald_fixtures import RPC, Daemon, RPCError

# Root (the tests' uid) may call `default` only, so its figures are per app: the path
# the issue measured (the counts per app ran on the SQLite writer).
OTHER_APP = "[app.other]\nallow_uids = 65534\ndevice_cap = 20\n"


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def register_latencies(d: Daemon, prefix: str, count: int) -> list[float]:
    """Seconds each of `count` registrations took, one at a time on one connection (each user
    new, so the per-user limit never answers)."""
    out = []
    with d.connect(10) as c:
        for i in range(count):
            t0 = time.perf_counter()
            r = c.request("device.register", {"user": f"{prefix}-{i}", "platform": "fcm",
                                               "token": f"{prefix}-token-{i:06d}"})
            out.append(time.perf_counter() - t0)
            assert "result" in r, r
    return out


def _stats_loop(socket_path: str, stop, active, calls, threads: int):
    """In a process of its own (the measuring process keeps its interpreter to itself):
    `threads` threads, each calling system.stats and system.metrics in turn without pause while
    `active` is set."""
    def loop():
        n = 0
        with RPC(socket_path, 10) as c:
            while not stop.is_set():
                if not active.wait(0.05):
                    continue
                c.request("system.stats" if n % 2 == 0 else "system.metrics")
                n += 1
        with calls.get_lock():
            calls.value += n

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_register_latency_holds_under_a_stats_loop():
    """20,000 devices stored; four threads of a client allowed for some apps read system.stats and
    system.metrics in a loop, with the shipped limits. device.register's p99 stays within 2x its
    p99 without the loop (45 ms against 2.2 ms when the counts ran on the writer, every call
    answered). The figures are read on the store's reader at most once a second; past its
    allowance (ten seconds of the rate at once) the loop's calls are answered rate_limited after
    250 ms, so the loop runs at its rate."""
    d = Daemon(transports=("fcm",), apps=OTHER_APP)
    try:
        d.register_many([{"user": f"bulk-{i}", "platform": "fcm", "token": f"bulk-token-{i:06d}"}
                         for i in range(20_000)])
        stats = d.call("system.stats")
        assert stats["apps"] == ["default"]
        register_latencies(d, "warm", 50)

        ctx = multiprocessing.get_context("fork")
        stop, active, calls = ctx.Event(), ctx.Event(), ctx.Value("i", 0)
        loader = ctx.Process(target=_stats_loop, args=(d.socket, stop, active, calls, 4))
        loader.start()
        # Rounds without and with the loop, in turn: the store's own drift (its log growing)
        # weighs on both alike.
        idle, loaded = [], []
        try:
            for r in range(10):
                active.clear()
                time.sleep(0.3)
                idle += register_latencies(d, f"idle{r}", 150)
                active.set()
                time.sleep(0.3)
                loaded += register_latencies(d, f"loaded{r}", 150)
        finally:
            stop.set()
            active.set()
            loader.join(30)
        # Answered at the pace (200 a second at 6,000 a minute), none refused: about 900.
        assert calls.value > 600, f"the stats loop made only {calls.value} calls"
        idle_p99, loaded_p99 = percentile(idle, 0.99), percentile(loaded, 0.99)
        print(f"register p99 idle {idle_p99 * 1000:.2f} ms, under {calls.value} stats/metrics calls "
              f"{loaded_p99 * 1000:.2f} ms")
        # The code before these bounds: 102 ms against 16. With a whole minute's calls allowed
        # at once and refusals answered within 10 ms the loop ran at thousands of calls a second
        # and this p99 was 2-4x idle on this 2-core machine; what is left of a register's p99 is
        # the fsync of its commit, alike in both.
        assert loaded_p99 <= 2 * idle_p99, (idle_p99, loaded_p99)
        # The figures still come: per app, and catching up with the registrations.
        devices = d.call("system.stats")["devices"]
        assert devices["fcm"] >= 20_000, devices
    finally:
        d.cleanup()


def _scrape_loop(port: int, stop, answers, clients: int):
    """In a process of its own: `clients` threads, each fetching /metrics again and again on a
    new connection."""
    def loop():
        n = 0
        while not stop.is_set():
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/metrics")
                r = conn.getresponse()
                r.read()
                conn.close()
                if r.status == 200:
                    n += 1
            except OSError:
                time.sleep(0.01)
        with answers.get_lock():
            answers.value += n

    workers = [threading.Thread(target=loop) for _ in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def probe(port: int, path: str) -> tuple[int | None, float]:
    """(status or None when refused or reset, seconds) of one GET on a new connection."""
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        conn.close()
        return r.status, time.perf_counter() - t0
    except OSError:
        return None, time.perf_counter() - t0


def test_probes_answer_during_a_metrics_flood():
    """Fifty clients fetch /metrics from 127.0.0.1 without pause while /livez and /readyz are
    probed from the same address every 50 ms: every probe is answered 200 within 100 ms (the
    issue saw 14 of 83 /livez probes reset by the per-address limit), and the scrapers are
    answered too."""
    d = Daemon(transports=("fcm",), apps=OTHER_APP, metrics_listen="127.0.0.1:0")
    try:
        d.register_many([{"user": f"m-{i}", "platform": "fcm", "token": f"m-token-{i:06d}"}
                         for i in range(2_000)])
        port = int(d.log_lines("metrics_listening")[0].split("127.0.0.1:")[1].split()[0])
        ctx = multiprocessing.get_context("fork")
        stop, answers = ctx.Event(), ctx.Value("i", 0)
        flood = ctx.Process(target=_scrape_loop, args=(port, stop, answers, 50))
        flood.start()
        probes = []
        try:
            time.sleep(1.0)
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                probes.append(("/livez",) + probe(port, "/livez"))
                probes.append(("/readyz",) + probe(port, "/readyz"))
                time.sleep(0.05)
        finally:
            stop.set()
            flood.join(30)
        slow = [(p, s, round(t * 1000, 1)) for p, s, t in probes if s != 200 or t > 0.100]
        worst = max(t for _, _, t in probes)
        print(f"{len(probes)} probes during {answers.value} /metrics answers; slowest {worst * 1000:.1f} ms")
        assert len(probes) >= 80
        assert not slow, f"{len(slow)} of {len(probes)} probes refused, failed or over 100 ms: {slow[:10]}"
        assert answers.value >= 50, f"only {answers.value} /metrics answers"
    finally:
        d.cleanup()


def test_system_calls_are_limited_per_uid():
    """With system_calls_per_minute = 5 (paced at ten a second), a uid's system.stats and
    system.metrics calls past five within the minute are 1002 rate_limited with retry_after_ms;
    system.health, with an allowance of its own fifty times larger, is still answered; other
    methods are not counted or refused; another connection of the uid shares the allowance."""
    d = Daemon(transports=("fcm",), server={"system_calls_per_minute": 5})
    try:
        with d.connect() as c:
            answered = 0
            while True:
                r = c.request("system.stats" if answered % 2 == 0 else "system.metrics")
                if "error" in r:
                    break
                answered += 1
                assert answered <= 5, "more than five system.stats/metrics calls answered"
            # Five a minute (system.health has an allowance of its own).
            assert answered == 5, answered
            assert r["error"]["code"] == 1002, r
            assert r["error"]["data"]["reason"] == "rate_limited"
            assert 1 <= r["error"]["data"]["retry_after_ms"] <= 12_000
            for _ in range(10):
                assert "result" in c.request("system.health")
            # Other methods go on, on the same connection.
            assert "result" in c.request("device.list", {"user": "nobody"})
            assert "result" in c.request("device.register", {"user": "u", "platform": "fcm", "token": "t-1"})
        with pytest.raises(RPCError) as refused:
            d.call("system.stats")
        assert refused.value.code == 1002
    finally:
        d.cleanup()
