#!/usr/bin/env python3
"""Fan-out benchmark: how fast does one message reach 500 devices, next to the
senders people use today, all against the same sink in the same run.

The sink is Debian's nginx on loopback (benchmarks/fanout/sink.py: TLS with a
CA made for the run, HTTP/2, answering like APNs, FCM and Web Push on several
Web Push origins). Against it, one after the other:

  herald             a release `herald serve` on a temporary directory, driven
                     over its Unix socket: `push.send {"to": {"users": [100
                     users]}, "wait": true}` timed from the write to the answer,
                     so each figure holds the RPC, the store commit, sealing
                     and HTTP until every delivery is final
  pywebpush_seq      pywebpush.webpush() 500 times in sequence
  pywebpush_threads  the same in a 32-thread pool
  aioapns            500 APNs sends at once on its connection pool
  h2load             the raw HTTP/2 request rate to the sink: the ceiling
  http_ece           seal-only, for the crypto share (next to Herald's seal
                     figures from benchmarks/results/crypto.json)
  herald_pg          Herald with the store on PostgreSQL (a private server,
                     durable unless --pg-durable off): one instance
  herald_pg_x2       two instances on one database, each 500-device message
                     split across both sockets (sustained: a client each)

Every scenario runs on SQLite (`herald`), then herald_pg, then herald_pg_x2,
back to back. The PostgreSQL server's CPU (postmaster, its live children and
the ones it reaped) over each of those phases goes next to Herald's.

Scenarios: web500, apns500, fcm500, mixed500 (200 web, 200 APNs, 100 FCM):
`--messages` messages after `--warmup`; then web_sustained, apns_sustained,
fcm_sustained: 500-device messages back to back for `--sustained-seconds`.
Peers run each in a process of their own (benchmarks/fanout/peers.py); CPU
(utime + stime) and peak RSS (VmHWM) of every sender come from /proc, of
h2load from wait4().

Then, on SQLite only (their devices registered at that point, so that every
scenario above runs on the store as before):

  size_100, size_500, size_2000, size_10000
                     the size curve: one APNs message to that many devices
                     (users with 20 devices each, the app's device_cap),
                     `--size-messages` (10) after 2 warm-up; each row also has
                     devices and us_per_device (p50 / devices)
  stalled_subscriber the largest size again, `--size-messages` times, while an
                     events.subscribe connection reads nothing for a minute
                     (the phase, if longer; --quick: the phase): the row has
                     the p50 next to the size's (vs_unstalled), peak RSS, and
                     what the subscriber got once it read: gap_events (1) and
                     event_deliveries_missing after a replay from the gap (0)
  accept_under_load  push.send (no wait: answered at its commit) to one user's
                     5 APNs devices on a second connection, one call every
                     2 ms: 300 on the idle daemon, then as many as fit while
                     the first connection sends the size curve's largest
                     message (10,000 devices) 3 times; the row holds the
                     loaded p50/p99, the idle p50/p99 and p99_vs_idle
  held_million       a Herald of its own ([delivery] max_queued 2,000,000) holds
                     1,000,000 deliveries (500 push.send to 2,000 APNs devices
                     with not_before a week ahead; --quick: 10): the acceptance
                     rate, its idle CPU over 10 s with them and, before, with
                     none (--quick: 2 s), and a 500-device APNs message with
                     them next to the same without (vs_unheld); checked, not
                     timed: push.status says held with due_at, and the sink got
                     nothing for a held device. SQLite, then PostgreSQL with one
                     instance (a new database) when the run has PostgreSQL
                     (--quick: SQLite only)
  web_sustained_4c, apns_sustained_4c
                     4 client connections to one Herald, one thread each,
                     each sending 500-device messages to its own 100 users back
                     to back for `--sustained-seconds`, all at once; h2load
                     next to them as for the one-connection rows

--quick runs size_100 and size_2000 (2 messages after 1), accept_under_load
(60 idle calls, one 2,000-device message), both 4c scenarios in 2 s phases and
held_million with 20,000 held on SQLite;
--only names any scenario (accept_under_load and stalled_subscriber need a size_ one with it).

Time to first push: every Herald row of a scenario whose messages go one at
a time (the 500-device ones on every store, and the size curve) has
first_push_p50_ms and first_push_p90_ms: from the wall clock taken right
before push.send's sendall to the first request of that message at the sink,
by nginx's clock ($msec - $request_time of the access log: whole ms, cached
at its event-loop wake-up, + 0.5 ms), read from the log once nginx has written
it all (Receipts.first_pushes).

Prints the table, writes OUT_DIR/fanout.json (one object per scenario and
sender), OUT_DIR/fanout-details.json (everything), OUT_DIR/REPORT.md and its
PNG plots (fanout-size-curve.png for the size curve). Figures only: no timing fails anything. With --check the exit
status is 1 when any push of any sender was not delivered, or when the sink's
access log (the receiver's own record, see Receipts) does not show every push
Herald accepted reaching each of its devices exactly once.

    .venv/bin/python benchmarks/fanout/bench_fanout.py [--quick] [--check] [--perf] \
        [--herald .build/release/herald] [--out-dir benchmarks/results] \
        [--postgres 1,2|1|2|none] [--pg-durable on|off] [--only SCENARIO,...]
"""
import argparse
import bisect
import collections
import datetime
import json
import socket
import math
import os
import pathlib
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import fixture  # noqa: E402
import machine  # noqa: E402  (benchmarks/machine.py)
import report  # noqa: E402
from h2load import H2Load, version as h2load_version  # noqa: E402
from herald_proc import (  # noqa: E402  (benchmarks/herald_proc.py)
    HeraldProcess, proc_cpu_seconds, proc_peak_rss_kb, request, reset_peak_rss, tail)
from pg import BenchPostgres, server_cpu_seconds  # noqa: E402
from sink import NGINX, Sink  # noqa: E402

REPO = HERE.parent.parent
DEVICES = 500
USERS = 100
PER_USER_DEVICES = DEVICES // USERS
SCENARIOS = {  # devices per user: (web, apns, fcm)
    "web500": (5, 0, 0),
    "apns500": (0, 5, 0),
    "fcm500": (0, 0, 5),
    "mixed500": (2, 2, 1),
}
PEERS = {"web500": ["pywebpush_seq", "pywebpush_threads"], "apns500": ["aioapns"], "fcm500": [], "mixed500": []}
SUSTAINED = {
    "web_sustained": ("web500", "web", ["pywebpush_seq", "pywebpush_threads"]),
    "apns_sustained": ("apns500", "apns", ["aioapns"]),
    "fcm_sustained": ("fcm500", "fcm", []),
}
# Sustained with CONNECTIONS_4C client connections to one Herald (SQLite), sending at once: each
# connection its own 100 users with 5 devices of the platform each; h2load as for the one-connection rows.
SUSTAINED_4C = {
    "web_sustained_4c": ("web", (5, 0, 0)),
    "apns_sustained_4c": ("apns", (0, 5, 0)),
}
CONNECTIONS_4C = 4
# The size curve: one APNs message to this many devices (sender herald, SQLite), users with
# SIZE_PER_USER devices each (the app's device_cap, fixture.herald_config; a message is capped at
# 10,000 devices), the smaller sizes the first users of the larger ones.
SIZES = {"size_100": 100, "size_500": 500, "size_2000": 2000, "size_10000": 10000}
SIZE_PER_USER = 20
# accept_under_load: the gap between two probing push.send calls, and the idle probes (quick: fewer)
ACCEPT_GAP_S = 0.002
ACCEPT_CALLS, ACCEPT_CALLS_QUICK = 300, 60
ACCEPT_BIG_MESSAGES, ACCEPT_BIG_MESSAGES_QUICK = 3, 1
SIZES_QUICK = ["size_100", "size_2000"]  # what --quick runs unless --only names others
# stalled_subscriber: how long the subscriber reads nothing (at least the phase), full run and --quick
STALL_S, STALL_S_QUICK = 60.0, 0.0
# held_million: a Herald of its own holding deliveries for a week (push.send not_before), [delivery] max_queued
# raised past them. Each message goes to HELD_USERS users with SIZE_PER_USER APNs devices each (2,000 devices):
# HELD_MESSAGES of them hold 1,000,000 deliveries (quick: 20,000 on SQLite only, 2-4 s of the debug build's
# acceptance). Idle windows of HELD_IDLE_S with and without them, each after HELD_SETTLE_S of nothing; the fan-out
# beside them is apns500's shape on users of its own.
HELD_USERS = 100
HELD_MESSAGES, HELD_MESSAGES_QUICK = 500, 10
HELD_DAYS = 7
HELD_TTL_S = 8 * 86400  # the TTL counts from acceptance: it covers the wait
HELD_MAX_QUEUED = 2_000_000
HELD_IDLE_S, HELD_IDLE_S_QUICK = 10.0, 2.0
HELD_SETTLE_S, HELD_SETTLE_S_QUICK = 5.0, 0.5
HELD_SCENARIO_INDEX = 20  # its APNs tokens apart from every other scenario's (fixture.apns_token)
SENDERS = ["herald", "herald_pg", "herald_pg_x2", "pywebpush_seq", "pywebpush_threads", "aioapns", "h2load"]
# Herald on PostgreSQL, by instances on the one database.
PG_SENDERS = {1: "herald_pg", 2: "herald_pg_x2"}
PG_POOL_SIZE = 8   # [store] pool_size (the default): connections per instance
PG_LEASE_S = 30    # [store] lease (the default)
PAYLOAD = '{"kind":"notification","data":{"msg":"TAG"}}'
WEB_ORIGINS = 5


def percentile(values, q):
    s = sorted(values)
    if not s:
        return None
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def row(scenario, sender, samples, delivered, expected, cpu_s, peak_rss_kb, wall_s=None, **extra):
    """One result row. Latency rows: pushes/s = delivered / the sum of the
    message times; sustained rows (wall_s given): delivered / wall time."""
    ms = [x * 1000 for x in samples]
    busy = wall_s if wall_s is not None else sum(samples)
    r = {
        "scenario": scenario, "sender": sender,
        "p50_ms": round(percentile(ms, 0.5), 2) if ms else None,
        "p90_ms": round(percentile(ms, 0.9), 2) if ms else None,
        "p99_ms": round(percentile(ms, 0.99), 2) if ms else None,
        "pushes_per_s": round(delivered / busy, 1) if busy and busy > 0 else None,
        "cpu_s_per_1000": round(cpu_s * 1000 / delivered, 3) if delivered else None,
        "peak_rss_mb": round(peak_rss_kb / 1024, 1) if peak_rss_kb else None,
        "messages": len(samples), "delivered": delivered, "expected": expected,
        "delivered_all": delivered == expected and expected > 0,
        "samples_ms": [round(x, 2) for x in ms],
        # the machine's 1-minute load average as the phase ended (shared machines drift)
        "load_1min": (machine.load_average() or [None])[0],
    }
    r.update(extra)
    return r


# ---------------------------------------------------------------- Herald


def write_key(path, key):
    """The store key (32 bytes) at `path`, mode 0600: every instance on one database holds a copy."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)


class Connection:
    """One client connection to a `herald serve`: push.send with wait, and what it accepted."""

    def __init__(self, socket_path, name):
        self.name = name
        self.client = fixture.Client(socket_path, timeout=180)
        self.accepted = 0  # push.send calls answered with a result
        self.accepted_users = collections.Counter()  # user -> pushes accepted for each of their devices
        self.written = None  # time.time() right before the last push.send's sendall

    def request(self, users, tag, timeout_ms=60_000):
        """Writes one push.send with wait; `answer()` reads it."""
        c = self.client
        self.rid = c.next_id
        c.next_id += 1
        data = request(self.rid, "push.send", {"to": {"users": users}, "data": {"msg": tag},
                                               "wait": True, "timeout_ms": timeout_ms})
        self.written = time.time()
        c.sock.sendall(data)

    def answer(self, users, per_user=PER_USER_DEVICES):
        """(delivered, problem) of the push.send `request()` wrote; each user has `per_user` devices."""
        answer = json.loads(self.client.reader.line())
        if answer.get("id") != self.rid:
            raise RuntimeError(f"{self.name}: answer to id {answer.get('id')}, expected {self.rid}")
        result = answer.get("result")
        if result is None:
            return 0, {"instance": self.name, "error": answer.get("error")}
        # One push to each of the users' devices, which the sink must have received.
        self.accepted += 1
        self.accepted_users.update(users)
        counts = result.get("counts") or {}
        delivered = counts.get("delivered", 0)
        want = len(users) * per_user
        problem = None
        if result.get("state") != "complete" or delivered != want or result.get("devices") != want:
            problem = {"instance": self.name, "state": result.get("state"), "devices": result.get("devices"),
                       "skipped": result.get("skipped"), "counts": {k: v for k, v in counts.items() if v}}
        return delivered, problem

    def accept(self, users, tag):
        """One push.send without wait: the seconds from its write to its answer (the
        acceptance: checks, the durable commit) and a problem or None."""
        c = self.client
        rid = c.next_id
        c.next_id += 1
        data = request(rid, "push.send", {"to": {"users": users}, "data": {"msg": tag}})
        t0 = time.perf_counter()
        c.sock.sendall(data)
        answer = json.loads(c.reader.line())
        seconds = time.perf_counter() - t0
        if answer.get("id") != rid or answer.get("result") is None:
            return seconds, {"instance": self.name, "id": answer.get("id"), "error": answer.get("error")}
        self.accepted += 1
        self.accepted_users.update(users)
        return seconds, None

    def send(self, users, tag, per_user=PER_USER_DEVICES):
        t0 = time.perf_counter()
        self.request(users, tag)
        delivered, problem = self.answer(users, per_user)
        return time.perf_counter() - t0, delivered, problem

    def close(self):
        try:
            self.client.close()
        except OSError:
            pass


class Instance:
    """One `herald serve` on `directory` (SQLite by default; `store`: other [store] keys), with one
    client connection (`conn`); `connect()` opens more."""

    def __init__(self, binary, directory, sink, keys, store=None, instance_id=None, key=None, delivery=None):
        os.makedirs(directory, exist_ok=True)
        if key is not None:
            write_key(os.path.join(directory, "store.key"), key)
        self.proc = HeraldProcess(binary, directory, fixture.herald_config(
            directory, sink, keys, store=store, instance_id=instance_id, delivery=delivery), start_timeout=60)
        self.pid = self.proc.proc.pid
        self.name = instance_id or "herald"
        self.conn = Connection(self.proc.socket_path, self.name)
        self.conns = [self.conn]
        self.client = self.conn.client

    def connect(self):
        """One more client connection to this instance (kept until stop)."""
        c = Connection(self.proc.socket_path, f"{self.name}-c{len(self.conns)}")
        self.conns.append(c)
        return c

    @property
    def accepted(self):
        return sum(c.accepted for c in self.conns)

    @property
    def accepted_users(self):
        return sum((c.accepted_users for c in self.conns), collections.Counter())

    def request(self, users, tag, timeout_ms=60_000):
        self.conn.request(users, tag, timeout_ms)

    def answer(self, users, per_user=PER_USER_DEVICES):
        return self.conn.answer(users, per_user)

    def send(self, users, tag, per_user=PER_USER_DEVICES):
        return self.conn.send(users, tag, per_user)

    def stop(self):
        for c in self.conns:
            c.close()
        return self.proc.stop()


class Herald:
    """Herald as one sender: one instance, or several on one database. With several, a
    500-device message is split across them (each gets its share of the users, all written at
    once; the message's time runs from the first write to the last answer), and a sustained
    phase runs one client per instance, each sending 500-device messages back to back.

    Every message sent one at a time leaves a mark in `marks` (write wall time, answer wall
    time, pushes, warm-up or not): Receipts.first_pushes() finds each message's first request in
    the sink's access log with them."""

    def __init__(self, instances):
        self.instances = list(instances)
        self.pid = self.instances[0].pid
        self.client = self.instances[0].client
        self.marks = []

    @property
    def pids(self):
        return [i.pid for i in self.instances]

    @property
    def accepted(self):
        return sum(i.accepted for i in self.instances)

    @property
    def accepted_users(self):
        return sum((i.accepted_users for i in self.instances), collections.Counter())

    def send(self, users, tag, per_user=PER_USER_DEVICES, warmup=False):
        n = len(self.instances)
        shares = [users[k * len(users) // n:(k + 1) * len(users) // n] for k in range(n)]
        t0 = time.perf_counter()
        for inst, share in zip(self.instances, shares):
            inst.request(share, tag)
        written = min(inst.conn.written for inst in self.instances)
        delivered, problems = 0, []
        for inst, share in zip(self.instances, shares):
            d, p = inst.answer(share, per_user)
            delivered += d
            if p:
                problems.append(p)
        seconds = time.perf_counter() - t0
        self.marks.append({"written": written, "answered": time.time(), "pushes": len(users) * per_user,
                           "warmup": warmup})
        if n == 1:
            return seconds, delivered, (problems[0] if problems else None)
        return seconds, delivered, ({"instances": problems} if problems else None)

    def cpu_seconds(self):
        return sum(proc_cpu_seconds(p) for p in self.pids)

    def peak_rss_kb(self):
        """The instances' peaks added up (the memory Herald takes on the machine)."""
        peaks = [proc_peak_rss_kb(p) for p in self.pids]
        return sum(peaks) if all(x is not None for x in peaks) else None

    def messages(self, scenario, users, warmup, messages=None, seconds=None, db_cpu=None,
                 per_user=PER_USER_DEVICES, jobs=None, db_statements=None):
        """Warm-up, then `messages` messages (or back to back for `seconds`): (samples,
        delivered, Herald's CPU s, peak RSS KiB, wall s, problems); `db_cpu`, a function giving
        the database server's CPU seconds, adds its difference over the same span as
        `self.db_cpu_s`. `jobs` ([(Connection, users)], sustained only): those connections send
        at once, each to its own users, each warmed up with `warmup` messages; without it several
        instances send at once (one client each, every user), one instance one message at a time."""
        problems = []
        self.marks = []
        own_warmup = jobs is not None
        if jobs is None and seconds is not None and len(self.instances) > 1:
            jobs = [(inst.conn, users) for inst in self.instances]
        for i in range(warmup):
            if own_warmup:
                for conn, us in jobs:
                    _, _, p = conn.send(us, f"{scenario}-{conn.name}-w{i}", per_user)
                    if p:
                        problems.append({"message": f"warm-up {i}", **p})
                continue
            _, _, p = self.send(users, f"{scenario}-w{i}", per_user, warmup=True)
            if p:
                problems.append({"message": f"warm-up {i}", **p})
        for p in self.pids:
            reset_peak_rss(p)
        d0 = db_cpu() if db_cpu else None
        if db_statements:
            # Counted from zero per measured span: the top statements at the end are the last span's.
            db_statements.reset()
        s0 = db_statements() if db_statements else None
        c0, t0 = self.cpu_seconds(), time.perf_counter()
        if jobs is not None:
            samples, delivered, probs = self._concurrent(scenario, jobs, t0, seconds, per_user)
            problems += probs
        else:
            samples, delivered, i = [], 0, 0
            while (i < messages) if seconds is None else (time.perf_counter() - t0 < seconds):
                s, d, p = self.send(users, f"{scenario}-m{i}", per_user)
                samples.append(s)
                delivered += d
                if p:
                    problems.append({"message": i, **p})
                i += 1
        wall = time.perf_counter() - t0
        cpu = self.cpu_seconds() - c0
        self.db_cpu_s = (db_cpu() - d0) if db_cpu else None
        self.db_statements = (db_statements() - s0) if db_statements else None
        return samples, delivered, cpu, self.peak_rss_kb(), wall, problems

    def _concurrent(self, scenario, jobs, t0, seconds, per_user):
        """One thread per (connection, users), each sending to its users back to back."""
        out = [([], 0, []) for _ in jobs]

        def run(k, conn, users):
            samples, delivered, problems, i = [], 0, [], 0
            try:
                while time.perf_counter() - t0 < seconds:
                    s, d, p = conn.send(users, f"{scenario}-{conn.name}-m{i}", per_user)
                    samples.append(s)
                    delivered += d
                    if p:
                        problems.append({"message": i, **p})
                    i += 1
            except Exception as e:  # noqa: BLE001 (reported, and the run fails with --check)
                problems.append({"instance": conn.name, "error": repr(e)})
            out[k] = (samples, delivered, problems)

        threads = [threading.Thread(target=run, args=(k, conn, users)) for k, (conn, users) in enumerate(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return ([s for o in out for s in o[0]], sum(o[1] for o in out), [p for o in out for p in o[2]])

    def alive(self):
        return all(i.proc.alive() for i in self.instances)

    def stderr_tail(self):
        return "\n".join(f"[{i.name}]\n{i.proc.stderr_tail()}" for i in self.instances)

    def stop(self):
        return [i.stop() for i in self.instances]


def user_devices(users, devices):
    """user -> that user's devices: fixture.register lists each user's in turn."""
    out = {}
    for name, names in users.items():
        k = len(devices[name]) // len(names)
        for i, u in enumerate(names):
            out[u] = devices[name][i * k:(i + 1) * k]
    return out


def start_pg_herald(binary, tmp, sink, keys, pg, n, tag="bench", delivery=None):
    """`n` instances (bench-a, bench-b) on a new database of `pg` (`tag`_`n`x), each with its own
    directory and socket and a copy of one store key; `delivery`: their [delivery] keys."""
    database = pg.create_database(f"{tag}_{n}x")
    key = os.urandom(32)
    store = pg.store_config(database, pool_size=PG_POOL_SIZE, lease=PG_LEASE_S)
    instances = []
    try:
        for k in range(n):
            name = f"{tag}-{'ab'[k]}"
            instances.append(Instance(binary, os.path.join(tmp, f"pg{n}-{name}"), sink, keys, store=store,
                                      instance_id=name, key=key, delivery=delivery))
    except BaseException:
        for inst in instances:
            inst.stop()
        raise
    herald = Herald(instances)
    herald.database = database
    return herald


def db_fields(db_cpu_s, delivered, statements=None, messages=0):
    if db_cpu_s is None:
        return {}
    out = {"db_cpu_s": round(db_cpu_s, 3),
           "db_cpu_s_per_1000": round(db_cpu_s * 1000 / delivered, 3) if delivered else None}
    if statements is not None:
        out["statements_per_message"] = round(statements / messages, 1) if messages else None
    return out


class StatementCounter:
    """Statements run on one database (pg_stat_statements), reset before each measured span."""

    def __init__(self, pg, database):
        self.pg, self.database = pg, database

    def __call__(self):
        return self.pg.statements(self.database)

    def reset(self):
        self.pg.psql("SELECT pg_stat_statements_reset()")


class Store:
    """What a Herald sender runs on: backend, instances, and (PostgreSQL) the
    server's CPU seconds, read around each measured span."""

    def __init__(self, label, herald, backend, pg=None):
        self.label, self.herald, self.backend = label, herald, backend
        postmaster = pg.postmaster_pid() if pg is not None else None
        self.db_cpu = (lambda: server_cpu_seconds(postmaster)) if postmaster else None
        database = getattr(herald, "database", None)
        self.db_statements = StatementCounter(pg, database) if pg is not None and database else None


def herald_latency(store, name, users, receipts, sink, warmup, messages, log, per_user=PER_USER_DEVICES,
                   **extra):
    """One scenario of messages sent one at a time (500 devices, or a size of the size curve)
    for one Herald sender: its row and problems. The row's first_push_* figures are filled in
    at the end of the run from the sink's access log (Receipts.first_pushes)."""
    herald, label = store.herald, store.label
    devices = len(users[name]) * per_user
    done = receipts.herald_phase(name, herald, label=label)
    with SinkMeter(sink) as sm:
        samples, delivered, cpu, rss, wall, probs = herald.messages(name, users[name], warmup, messages,
                                                                    db_cpu=store.db_cpu, per_user=per_user,
                                                                    db_statements=store.db_statements)
    entry = done(marks=herald.marks)
    r = row(name, label, samples, delivered, devices * messages, cpu, rss, backend=store.backend,
            instances=len(herald.instances), **db_fields(herald.db_cpu_s, delivered, herald.db_statements, len(samples)), **extra, **sm.info())
    r.update(first_push_p50_ms=None, first_push_p90_ms=None)
    entry["row"] = r
    log(f"{name} {label}: p50 {r['p50_ms']} ms, delivered {delivered}/{devices * messages}"
        + (f", database CPU {r['db_cpu_s_per_1000']} s/1k, {r.get('statements_per_message')} statements/message"
           if store.db_cpu else ""))
    if not herald.alive():
        raise RuntimeError(f"{label} exited during {name}")
    return r, [{"scenario": name, "sender": label, **p} for p in probs]


def herald_size(store, name, users, receipts, sink, warmup, messages, log):
    """One point of the size curve: one APNs message to SIZES[name] devices, `messages` times."""
    devices = SIZES[name]
    r, probs = herald_latency(store, name, users, receipts, sink, warmup, messages, log, per_user=SIZE_PER_USER,
                              devices=devices)
    r["us_per_device"] = round(r["p50_ms"] * 1000 / devices, 2) if r.get("p50_ms") is not None else None
    return r, probs


def herald_stalled_subscriber(store, big, users, receipts, sink, warmup, messages, log, base, stall_s):
    """The size curve's largest message sent `messages` times while an events.subscribe connection
    reads nothing for `stall_s` (a minute; the phase's length if longer): its row has the delivery
    p50 next to the same message without the subscriber (vs_unstalled), the daemon's peak RSS, and
    what the subscriber got once it read again: one gap event, then a replay from the gap's cursor
    that must hold every delivery of the phase (event_deliveries_missing 0)."""
    herald = store.herald
    sub = fixture.Client(herald.instances[0].proc.socket_path, timeout=120)
    # A small receive buffer: what waits is the daemon's to bound, not the kernel's to hide.
    sub.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    started = sub.call("events.subscribe", {"kinds": ["delivery"]})["result"]
    t0 = time.monotonic()
    name = "stalled_subscriber"
    r, probs = herald_latency(store, name, users, receipts, sink, warmup, messages, log, per_user=SIZE_PER_USER,
                              devices=SIZES[big])
    time.sleep(max(0.0, stall_s - (time.monotonic() - t0)))
    expected = SIZES[big] * (warmup + messages)
    seen, gaps = set(), []
    deadline = time.monotonic() + 60
    while not gaps and time.monotonic() < deadline:
        msg = json.loads(sub.reader.line())
        for e in (msg.get("params") or {}).get("events", []):
            if e["kind"] == "gap":
                gaps.append(e)
            else:
                seen.add((e["message_id"], e["device_id"]))
    sub.close()
    t1 = time.monotonic()
    if gaps:
        replay = fixture.Client(herald.instances[0].proc.socket_path, timeout=120)
        replay.call("events.subscribe", {"kinds": ["delivery"], "since": gaps[0]["cursor"]})
        while len(seen) < expected and time.monotonic() < deadline + 120:
            msg = json.loads(replay.reader.line())
            seen.update((e["message_id"], e["device_id"]) for e in msg["params"]["events"] if e["kind"] == "delivery")
        replay.close()
    r.update(base_p50_ms=base.get("p50_ms") if base else None,
             vs_unstalled=round(r["p50_ms"] / base["p50_ms"], 3) if base and base.get("p50_ms") and r["p50_ms"]
             else None,
             base_peak_rss_mb=base.get("peak_rss_mb") if base else None, stall_s=round(stall_s, 1),
             start_cursor=started["cursor"], gap_events=len(gaps), event_deliveries=len(seen),
             event_deliveries_missing=expected - len(seen), replay_s=round(time.monotonic() - t1, 2))
    log(f"{name}: p50 {r['p50_ms']} ms (without the subscriber {r['base_p50_ms']} ms, x{r['vs_unstalled']}), "
        f"peak RSS {r['peak_rss_mb']} MB, {len(gaps)} gap event(s), {len(seen)}/{expected} deliveries in the events "
        f"after the replay")
    if expected != len(seen) or len(gaps) != 1:
        probs.append({"scenario": name, "sender": store.label, "gap_events": len(gaps),
                      "event_deliveries_missing": expected - len(seen)})
    return r, probs


def ms_percentile(samples_s, q):
    """The q-quantile of samples in seconds, in ms."""
    return round(percentile([x * 1000 for x in samples_s], q), 3) if samples_s else None


def herald_accept_under_load(store, big, users, receipts, log, calls, big_messages):
    """push.send's acceptance time (no wait: the answer comes at the commit) on a second
    connection, one call every ACCEPT_GAP_S: `calls` of them on an idle daemon, then as many as
    fit while the first connection sends `big_messages` messages to the devices of `big` (the size
    curve's largest, 10,000 devices in a full run) one after another. Each probe goes to one
    apns500 user (5 devices). The row: p50/p99 loaded, p50/p99 idle and the p99 ratio."""
    herald, label = store.herald, store.label
    inst = herald.instances[0]
    probe = inst.connect()
    one = users["apns500"][:1]
    done = receipts.herald_phase("accept_under_load", herald, label=label)
    problems = []

    def probes(tag, until):
        out, i = [], 0
        while until(i):
            s, p = probe.accept(one, f"{tag}-{i}")
            out.append(s)
            if p:
                problems.append({"scenario": "accept_under_load", "probe": tag, **p})
            i += 1
            time.sleep(ACCEPT_GAP_S)
        return out

    idle = probes("idle", lambda i: i < calls)
    time.sleep(1.0)  # the idle probes' pushes are out
    sending = threading.Event()
    sending.set()
    big_out = {}

    def fan_out():
        try:
            samples, delivered = [], 0
            for m in range(big_messages):
                s, d, p = inst.conn.send(users[big], f"accept-{big}-m{m}", SIZE_PER_USER)
                samples.append(s)
                delivered += d
                if p:
                    problems.append({"scenario": "accept_under_load", "message": m, **p})
            big_out.update(samples=samples, delivered=delivered)
        finally:
            sending.clear()

    c0 = herald.cpu_seconds()
    t = threading.Thread(target=fan_out)
    t.start()
    time.sleep(0.01)  # the first message is being accepted
    loaded = probes("loaded", lambda i: sending.is_set())
    t.join()
    # The probes' pushes queue behind the big message's deliveries (older
    # ones are sent first): one more push to the same devices, with wait,
    # is answered once those before it are out, so that every push of the
    # phase reaches the sink before the phase ends.
    _, _, p = probe.send(one, "accept-drain", PER_USER_DEVICES)
    if p:
        problems.append({"scenario": "accept_under_load", "probe": "drain", **p})
    time.sleep(0.2)  # answers of the probes' last sends, if any came after the drain's
    cpu = herald.cpu_seconds() - c0
    done()
    idle_p99, loaded_p99 = ms_percentile(idle, 0.99), ms_percentile(loaded, 0.99)
    r = {"scenario": "accept_under_load", "sender": label, "backend": store.backend,
         "p50_ms": ms_percentile(loaded, 0.5), "p90_ms": ms_percentile(loaded, 0.9), "p99_ms": loaded_p99,
         "idle_p50_ms": ms_percentile(idle, 0.5), "idle_p99_ms": idle_p99,
         "p99_vs_idle": round(loaded_p99 / idle_p99, 2) if idle_p99 and loaded_p99 else None,
         "probes_idle": len(idle), "probes_loaded": len(loaded), "big_scenario": big,
         "big_devices": SIZES[big], "big_messages": big_messages,
         "big_p50_ms": ms_percentile(big_out.get("samples") or [], 0.5),
         "delivered": big_out.get("delivered", 0) + 0, "expected": SIZES[big] * big_messages,
         "cpu_s": round(cpu, 3), "pushes_per_s": None, "cpu_s_per_1000": None, "peak_rss_mb": None,
         "messages": big_messages, "samples_ms": [round(x * 1000, 3) for x in loaded]}
    r["delivered_all"] = r["delivered"] == r["expected"] and not problems
    log(f"accept_under_load {label}: push.send p99 {loaded_p99} ms during {big_messages} x {SIZES[big]}-device "
        f"messages ({len(loaded)} calls) vs {idle_p99} ms idle ({len(idle)} calls): {r['p99_vs_idle']}x")
    if not herald.alive():
        raise RuntimeError(f"{label} exited during accept_under_load")
    return r, problems


def proc_rss_kb(pid):
    """VmRSS (resident set size now, KiB) of a process, from /proc/PID/status; None if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def rfc3339(t):
    """A UTC datetime as RFC 3339 with milliseconds and Z, as Herald writes its timestamps."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class SpanStatements(StatementCounter):
    """Statements on one database, counted by difference only: a reset would clear every database's
    counts, the other variants' top statements with them."""

    def reset(self):
        pass


class HeldStore:
    """held_million's Herald: one instance of its own (SQLite, or one on a new PostgreSQL database) with
    [delivery] max_queued raised past the held deliveries, as a Store, plus what the idle windows read
    of its database: the server's CPU, its own connections' CPU (Herald's pool: autovacuum and the other
    variants' connections left out) and the statements run on it."""

    def __init__(self, binary, tmp, sink, keys, pg=None):
        delivery = {"max_queued": HELD_MAX_QUEUED}
        if pg is None:
            self.dir = os.path.join(tmp, "held-sqlite")
            self.store = Store("herald", Herald([Instance(binary, self.dir, sink, keys, delivery=delivery)]),
                               "sqlite")
            self.database = None
        else:
            h = start_pg_herald(binary, tmp, sink, keys, pg, 1, tag="held", delivery=delivery)
            self.store = Store("herald_pg", h, "postgres", pg)
            self.store.db_statements = SpanStatements(pg, h.database)
            self.dir, self.database = h.instances[0].proc.dir, h.database
        self.pg = pg

    def backends(self):
        """The pids of the client connections to this Herald's database (its pool)."""
        rows = self.pg.query(f"SELECT pid FROM pg_stat_activity WHERE datname = '{self.database}' "
                             "AND backend_type = 'client backend' AND pid <> pg_backend_pid()", "postgres")
        return [int(r[0]) for r in rows if r and r[0]]

    def statements(self):
        return self.pg.statements(self.database) if self.pg else None

    def statement_times(self):
        """{statement's first 100 characters: (calls, ms)} run on this Herald's database so far."""
        rows = self.pg.query("SELECT left(regexp_replace(s.query, '\\s+', ' ', 'g'), 100), sum(s.calls), "
                             "sum(s.total_exec_time) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                             f"WHERE d.datname = '{self.database}' GROUP BY 1", "postgres")
        return {q: (int(c), float(t)) for q, c, t in rows}

    def store_mb(self):
        """The store's size: the SQLite files (database, WAL), or the queue's tables and indexes."""
        if self.pg:
            return round(sum(self.pg.table_sizes(self.database).values()) / 1e6, 1)
        total = sum(e.stat().st_size for e in os.scandir(self.dir)
                    if e.is_file() and (".db" in e.name or ".sqlite" in e.name))
        return round(total / 1e6, 1)

    def idle(self, seconds):
        """Herald's CPU (ms per s) over `seconds` in which nothing is asked of it, and each second's
        (per_second_ms: what recurs shows), its RSS at the end, and on PostgreSQL the server's CPU, its
        pool connections' CPU and the statements run on its database (per s)."""
        herald = self.store.herald
        pids = self.backends() if self.pg else []
        t_0 = self.statement_times() if self.pg else {}
        s0 = self.statements()
        d0 = self.store.db_cpu() if self.store.db_cpu else None
        b0 = sum(proc_cpu_seconds(p) for p in pids)
        c0, t0 = herald.cpu_seconds(), time.perf_counter()
        per_second, last = [], c0
        while time.perf_counter() - t0 < seconds - 1e-3:
            time.sleep(min(1.0, seconds - (time.perf_counter() - t0)))
            now = herald.cpu_seconds()
            per_second.append(round((now - last) * 1000))
            last = now
        cpu, wall = herald.cpu_seconds() - c0, time.perf_counter() - t0
        out = {"cpu_ms_per_s": round(cpu * 1000 / wall, 2), "seconds": round(wall, 2), "per_second_ms": per_second,
               "rss_mb": round((proc_rss_kb(herald.pid) or 0) / 1024, 1)}
        if self.pg:
            b1 = sum(proc_cpu_seconds(p) for p in pids)
            d1 = self.store.db_cpu()
            s1 = self.statements()
            spent = {q: (c - t_0.get(q, (0, 0.0))[0], t - t_0.get(q, (0, 0.0))[1])
                     for q, (c, t) in self.statement_times().items()}
            # the statements that took the most time in the window: what an idle Herald asks of its database
            top = sorted(((t, c, q) for q, (c, t) in spent.items() if c > 0), reverse=True)[:3]
            out.update(top_statements=[{"statement": q, "calls": c, "ms": round(t, 1)} for t, c, q in top])
            out.update(db_cpu_ms_per_s=round((d1 - d0) * 1000 / wall, 2),
                       db_pool_cpu_ms_per_s=round((b1 - b0) * 1000 / wall, 2), db_pool_connections=len(pids),
                       statements_per_s=round((s1 - s0) / wall, 2))
        return out

    def fan_out(self, users, receipts, sink, warmup, messages, log):
        """held_fanout's 500-device APNs message, `messages` times after `warmup`: herald_latency's row."""
        return herald_latency(self.store, "held_fanout", users, receipts, sink, warmup, messages, log)


def herald_held_million(held, users, devices, receipts, sink, warmup, messages, held_messages, idle_s, settle_s,
                        log):
    """held_million on one store: what a million deliveries held for a week cost while they wait.

    On `held` (a HeldStore: a Herald of its own): registers held's users (2,000 APNs devices) and
    held_fanout's (500); an idle window of `idle_s` with nothing queued; held_fanout's message
    `messages` times (after `warmup`); then `held_messages` push.send calls to held's users with
    not_before a week ahead (one at a time, each answered at its commit: the acceptance rate); the same
    idle window with them waiting; the same fan-out beside them. The row: Herald's idle CPU with and
    without them (ms per s, and the difference), the fan-out's p50 and CPU per push with them over
    without (vs_unheld, cpu_vs_unheld), and, checked: push.status of the first and last held message
    says held with due_at at not_before, and the sink logged nothing for a held device (held_at_sink 0).
    No timing is checked."""
    store = held.store
    herald, label = store.herald, store.label
    name = "held_million"
    problems = []
    offset = sink.log_size()
    receipts.phase("register", name)
    t0 = time.perf_counter()
    for scen, index, n_users, per_user in (("held", HELD_SCENARIO_INDEX, HELD_USERS, (0, SIZE_PER_USER, 0)),
                                           ("held_fanout", HELD_SCENARIO_INDEX + 1, USERS, (0, PER_USER_DEVICES, 0))):
        us, devs = fixture.register(herald.client, sink, scen, index, n_users, per_user)
        if users.get(scen, us) != us or devices.get(scen, devs) != devs:
            raise RuntimeError(f"{label}: {scen} registered other users or devices than on the first store")
        users[scen], devices[scen] = us, devs
    receipts.set_devices(devices, user_devices(users, devices))
    log(f"{name} {label}: registered {len(devices['held']) + len(devices['held_fanout'])} APNs devices in "
        f"{time.perf_counter() - t0:.1f} s (pid {herald.pid}, [delivery] max_queued {HELD_MAX_QUEUED:,})")

    # ---- nothing held: the idle window, then the fan-out
    receipts.phase("held", name)
    time.sleep(settle_s)
    idle_none = held.idle(idle_s)
    base, probs = held.fan_out(users, receipts, sink, warmup, messages, log)
    problems += probs

    # ---- hold the deliveries: not_before a week ahead, the TTL covering it
    receipts.phase("held", name)
    due = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=HELD_DAYS)).replace(microsecond=0)
    not_before = rfc3339(due)
    per_message = len(devices["held"])
    client = fixture.Client(herald.instances[0].proc.socket_path, timeout=300)
    ids, calls, accepted = [], [], 0
    c0, t0 = herald.cpu_seconds(), time.perf_counter()
    for i in range(held_messages):
        t = time.perf_counter()
        answer = client.call("push.send", {"to": {"users": users["held"]}, "data": {"msg": f"held-{i}"},
                                           "not_before": not_before, "ttl": HELD_TTL_S})
        calls.append(time.perf_counter() - t)
        result = answer.get("result")
        if result is None or result.get("devices") != per_message:
            problems.append({"scenario": name, "sender": label, "message": i, "devices": (result or {}).get("devices"),
                             "error": answer.get("error")})
            if result is None:
                break
        ids.append(result["message_id"])
        accepted += result.get("devices") or 0
    accept_wall, accept_cpu = time.perf_counter() - t0, herald.cpu_seconds() - c0
    queue = ((client.call("system.stats").get("result") or {}).get("queue")) or {}
    log(f"{name} {label}: {accepted:,} deliveries held ({len(ids)} push.send to {per_message:,} devices) in "
        f"{accept_wall:.1f} s: {accepted / accept_wall:,.0f} deliveries/s, push.send p50 "
        f"{ms_percentile(calls, 0.5)} ms (first tenth {ms_percentile(calls[:max(1, len(calls) // 10)], 0.5)}, last "
        f"{ms_percentile(calls[-max(1, len(calls) // 10):], 0.5)}); system.stats queue {queue}")

    # ---- held: the same idle window, then the same fan-out beside them
    time.sleep(settle_s)
    idle_held = held.idle(idle_s)
    r, probs = held.fan_out(users, receipts, sink, warmup, messages, log)
    problems += probs

    # ---- checked: still held, due at not_before, nothing of them at the sink
    receipts.phase("held", name)
    status_problems = []
    first = (client.call("push.status", {"message_id": ids[0], "detail": True}).get("result") or {}) if ids else {}
    last = (client.call("push.status", {"message_id": ids[-1]}).get("result") or {}) if ids else {}
    entries = first.get("devices") or []
    for what, st in (("first", first), ("last", last)):
        counts = st.get("counts") or {}
        if counts.get("held") != per_message or any(v for k, v in counts.items() if k != "held"):
            status_problems.append(f"{what} held message's counts {({k: v for k, v in counts.items() if v})}")
    wrong = [e for e in entries if e.get("state") != "held" or not e.get("due_at") or
             datetime.datetime.fromisoformat(e["due_at"].replace("Z", "+00:00")) != due]
    if len(entries) != per_message or wrong:
        status_problems.append(f"first held message: {len(entries)} devices in its detail, {len(wrong)} not held "
                               f"due at {not_before}, e.g. {wrong[:1]}")
    client.close()
    time.sleep(1.5)  # nginx writes its access log out every second
    held_keys = {receipts.device_key(d) for d in devices["held"]}
    at_sink = sum(1 for rec in sink.records(offset) if receipts.record_key(rec) in held_keys)
    if at_sink:
        status_problems.append(f"the sink logged {at_sink} request(s) to held devices, held until {not_before}")
    problems += [{"scenario": name, "sender": label, "held": p} for p in status_problems]
    store_mb = held.store_mb()

    def ratio(a, b, digits=3):
        return round(a / b, digits) if a is not None and b else None
    out = {
        "scenario": name, "sender": label, "backend": store.backend, "instances": 1,
        "held": accepted, "held_messages": len(ids), "held_devices_per_message": per_message,
        "not_before": not_before, "held_days": HELD_DAYS, "max_queued": HELD_MAX_QUEUED,
        "accept_s": round(accept_wall, 2), "accept_per_s": round(accepted / accept_wall, 0) if accept_wall else None,
        "accept_p50_ms": ms_percentile(calls, 0.5), "accept_p99_ms": ms_percentile(calls, 0.99),
        # does acceptance slow down as the held rows grow? the first tenth of the calls next to the last
        "accept_p50_ms_first_tenth": ms_percentile(calls[:max(1, len(calls) // 10)], 0.5),
        "accept_p50_ms_last_tenth": ms_percentile(calls[-max(1, len(calls) // 10):], 0.5),
        "accept_cpu_s_per_1000": round(accept_cpu * 1000 / accepted, 4) if accepted else None,
        "queue_after_accept": queue, "store_mb": store_mb,
        "idle_s": idle_held["seconds"], "idle_none": idle_none, "idle_held": idle_held,
        "idle_cpu_ms_per_s_none": idle_none["cpu_ms_per_s"], "idle_cpu_ms_per_s_held": idle_held["cpu_ms_per_s"],
        "idle_cpu_ms_per_s_diff": round(idle_held["cpu_ms_per_s"] - idle_none["cpu_ms_per_s"], 2),
        "rss_mb_none": idle_none["rss_mb"], "rss_mb_held": idle_held["rss_mb"],
        "fanout_devices": len(devices["held_fanout"]), "messages": r["messages"],
        "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"], "base_p50_ms": base["p50_ms"],
        "vs_unheld": ratio(r["p50_ms"], base["p50_ms"]),
        "cpu_s_per_1000": r["cpu_s_per_1000"], "base_cpu_s_per_1000": base["cpu_s_per_1000"],
        "cpu_vs_unheld": ratio(r["cpu_s_per_1000"], base["cpu_s_per_1000"]),
        "pushes_per_s": r["pushes_per_s"], "peak_rss_mb": r["peak_rss_mb"],
        "samples_ms": r["samples_ms"], "base_samples_ms": base["samples_ms"],
        "delivered": base["delivered"] + r["delivered"], "expected": base["expected"] + r["expected"],
        "held_at_sink": at_sink,
        "status_held_first": (first.get("counts") or {}).get("held"),
        "status_held_last": (last.get("counts") or {}).get("held"),
        "status_due_at": entries[0].get("due_at") if entries else None,
        "status_timing": entries[0].get("timing") if entries else None,
        "held_ok": not status_problems,
        "load_1min": (machine.load_average() or [None])[0],
    }
    out["delivered_all"] = (base["delivered_all"] and r["delivered_all"] and out["held"] == per_message * held_messages
                            and not status_problems)
    if held.pg:
        out.update(idle_db_cpu_ms_per_s_none=idle_none["db_cpu_ms_per_s"],
                   idle_db_cpu_ms_per_s_held=idle_held["db_cpu_ms_per_s"],
                   idle_db_pool_cpu_ms_per_s_none=idle_none["db_pool_cpu_ms_per_s"],
                   idle_db_pool_cpu_ms_per_s_held=idle_held["db_pool_cpu_ms_per_s"],
                   idle_statements_per_s_none=idle_none["statements_per_s"],
                   idle_statements_per_s_held=idle_held["statements_per_s"],
                   db_cpu_s_per_1000=r.get("db_cpu_s_per_1000"), base_db_cpu_s_per_1000=base.get("db_cpu_s_per_1000"),
                   statements_per_message=r.get("statements_per_message"),
                   base_statements_per_message=base.get("statements_per_message"))
    log(f"{name} {label}: idle CPU {out['idle_cpu_ms_per_s_held']} ms/s with {accepted:,} held vs "
        f"{out['idle_cpu_ms_per_s_none']} ms/s with none ({out['idle_cpu_ms_per_s_diff']:+} ms/s, over "
        f"{idle_s:g} s each)"
        + (f"; database {out['idle_db_cpu_ms_per_s_held']} vs {out['idle_db_cpu_ms_per_s_none']} ms/s "
           f"(its pool {out['idle_db_pool_cpu_ms_per_s_held']} vs {out['idle_db_pool_cpu_ms_per_s_none']} ms/s, "
           f"{out['idle_statements_per_s_held']} vs {out['idle_statements_per_s_none']} statements/s; the costliest "
           f"with them held: {idle_held['top_statements'][:1]})" if held.pg else "")
        + f"; RSS {out['rss_mb_held']} vs {out['rss_mb_none']} MB; {out['fanout_devices']}-device fan-out p50 "
        f"{out['p50_ms']} vs {out['base_p50_ms']} ms (x{out['vs_unheld']}), CPU/push x{out['cpu_vs_unheld']}; "
        f"held message status: {out['status_held_first']} held, due_at {out['status_due_at']}; "
        f"{at_sink} request(s) at the sink for held devices; store {store_mb} MB")
    if not herald.alive():
        raise RuntimeError(f"{label} exited during {name}")
    return out, problems


def herald_sustained_4c(store, name, groups, receipts, sink, sustained_s, log):
    """One sustained scenario with CONNECTIONS_4C client connections to one Herald, each
    sending to its own users' devices (500 a message) back to back, all at once."""
    herald, label = store.herald, store.label
    inst = herald.instances[0]
    while len(inst.conns) < len(groups):
        inst.connect()
    jobs = list(zip(inst.conns, groups))
    done = receipts.herald_phase(name, herald, label=label)
    with SinkMeter(sink) as sm:
        samples, delivered, cpu, rss, wall, probs = herald.messages(name, None, 1, seconds=sustained_s,
                                                                    db_cpu=store.db_cpu, jobs=jobs,
                                                                    db_statements=store.db_statements)
    done()
    r = row(name, label, samples, delivered, DEVICES * len(samples), cpu, rss, wall_s=wall,
            seconds=round(wall, 2), backend=store.backend, instances=len(herald.instances),
            connections=len(jobs), **db_fields(herald.db_cpu_s, delivered, herald.db_statements, len(samples)), **sm.info())
    log(f"{name} {label}: {r['pushes_per_s']} pushes/s over {wall:.1f} s from {len(jobs)} connections")
    if not herald.alive():
        raise RuntimeError(f"{label} exited during {name}")
    return r, [{"scenario": name, "sender": label, **p} for p in probs]


def herald_sustained(store, name, base, users, receipts, sink, sustained_s, log):
    """One sustained scenario for one Herald sender: its row and problems."""
    herald, label = store.herald, store.label
    done = receipts.herald_phase(name, herald, base, label=label)
    with SinkMeter(sink) as sm:
        samples, delivered, cpu, rss, wall, probs = herald.messages(name, users[base], 1, seconds=sustained_s,
                                                                    db_cpu=store.db_cpu,
                                                                    db_statements=store.db_statements)
    done()
    r = row(name, label, samples, delivered, DEVICES * len(samples), cpu, rss, wall_s=wall,
            seconds=round(wall, 2), backend=store.backend, instances=len(herald.instances),
            **db_fields(herald.db_cpu_s, delivered, herald.db_statements, len(samples)), **sm.info())
    log(f"{name} {label}: {r['pushes_per_s']} pushes/s over {wall:.1f} s"
        + (f", database CPU {r['db_cpu_s_per_1000']} s/1k" if store.db_cpu else ""))
    if not herald.alive():
        raise RuntimeError(f"{label} exited during {name}")
    return r, [{"scenario": name, "sender": label, **p} for p in probs]


# ---------------------------------------------------------------- the receiver's record


class Receipts:
    """Herald's pushes judged by what the sink recorded, not by Herald's counts.

    The run is cut into phases, one sender at a time (registration, herald on a
    scenario, a peer, h2load, ...), each starting at a wall-clock time; every
    access-log record (nginx's $msec at the end of the request) belongs to the
    phase it falls in. In a herald phase (SQLite, or PostgreSQL with one or two
    instances) every device must have been sent exactly one 2xx-answered
    request per push accepted for it in the phase (push.send calls answered with
    a result, whichever instance took them; Herald is never restarted here: no
    duplicate is allowed), none to a path that is not one of the scenario's
    devices, none answered otherwise. In any phase a request to a path that is
    no registered device is a problem; in the start, registration and idle
    phases any request is. h2load's requests and the OAuth token requests are
    not logged (sink.py); Herald's credential checks (PROBE_KEYS) are counted apart. A held
    phase (held_million: deliveries accepted to wait a week, and idle windows beside them) is
    quiet too."""

    QUIET = ("start", "register", "idle", "held")

    def __init__(self, sink):
        self.sink = sink
        self.devices, self.user_devices, self.known = {}, {}, set()
        # dicts: t (start), sender, scenario, devset (herald: whose devices),
        # accepted (herald: push.send calls accepted), expect (herald: device -> pushes)
        self.phases = []

    def set_devices(self, devices, user_devices):
        """devices: scenario -> the devices fixture.register made for it;
        user_devices: user -> that user's devices."""
        self.devices = {name: {self.device_key(d) for d in devs} for name, devs in devices.items()}
        self.user_devices = {u: [self.device_key(d) for d in devs] for u, devs in user_devices.items()}
        self.known = set().union(*self.devices.values())

    def device_key(self, d):
        if d["platform"] == "apns":
            return ("apns", d["token"])
        if d["platform"] == "fcm":
            return ("fcm", d["token"])
        u = urllib.parse.urlsplit(d["token"])
        return ("web", u.hostname, u.port, u.path)

    # Herald's credential checks (docs/operations.md, "Credential checks"): an APNs push to a token
    # no device has, an FCM validate_only send to a topic (no token). Counted apart, in no phase.
    PROBE_KEYS = {("apns", "0" * 64), ("fcm", "")}

    def record_key(self, r):
        port, path = r["p"], r["u"]
        if port == self.sink.apns_port and path.startswith("/3/device/"):
            return ("apns", urllib.parse.unquote(path[len("/3/device/"):]))
        if port == self.sink.fcm_port and re.fullmatch(r"/v1/projects/[^/]+/messages:send", path):
            return ("fcm", r["fcm"])
        if port == self.sink.web_port and path.startswith("/push/"):
            return ("web", r["a"], port, path)
        return ("unknown", f"{r['a']}:{port}{path}")

    def phase(self, sender, scenario=None):
        # nginx logs whole milliseconds (its time cached at the event loop's
        # wake-up, never later than the request's end): 2 ms on either side of
        # the boundary keep each request on its own side.
        time.sleep(0.002)
        self.phases.append({"t": time.time(), "sender": sender, "scenario": scenario, "devset": None,
                            "accepted": None, "expect": None})
        time.sleep(0.002)

    def herald_phase(self, scenario, herald, devices_of=None, label="herald"):
        """A phase of `herald` (an Herald: one or more instances) sending to the
        devices of `devices_of` (default: the scenario's); `done()` afterwards
        records what it accepted, per device."""
        self.phase(label, scenario)
        entry = self.phases[-1]
        entry["devset"] = devices_of or scenario
        entry["expect"] = collections.Counter()
        start, start_users = herald.accepted, herald.accepted_users

        def done(marks=None):
            entry["accepted"] = herald.accepted - start
            expect = collections.Counter()
            for user, n in (herald.accepted_users - start_users).items():
                for key in self.user_devices[user]:
                    expect[key] += n
            entry["expect"] = expect
            if marks is not None:
                entry["marks"] = list(marks)
            return entry
        return done

    def expected(self):
        return sum(sum(p["expect"].values()) for p in self.phases if p["expect"] is not None)

    def herald_records(self, recs):
        starts = [p["t"] for p in self.phases]
        n = 0
        for r in recs:
            i = bisect.bisect_right(starts, r["t"]) - 1
            if i >= 0 and self.phases[i]["expect"] is not None:
                n += 1
        return n

    def wait_flushed(self, timeout=30.0):
        """Waits, with a deadline, until the log holds at least the herald records
        expected (nginx flushes its buffer every second); True when it did."""
        want = self.expected()
        _, ok = self.sink.wait_records(lambda recs: self.herald_records(recs) >= want, timeout=timeout)
        return ok

    def first_pushes(self, recs):
        """Time to first push of every message sent one at a time: fills first_push_p50_ms,
        first_push_p90_ms and first_push_samples_ms of the rows of the phases that have marks
        (Herald.marks: the wall time right before push.send's sendall, the answer's, the pushes).

        Each record's start is the sink's wall clock ($msec - $request_time: nginx's time,
        cached at the event-loop wake-up that read the request's HEADERS, in whole ms). The
        messages of such a phase go one at a time, each after the last one's answer, so sorted
        by start the phase's records are the messages' records in turn: message k's first
        record is the one after the pushes of the messages before it (ties at a millisecond
        shared by two messages do not change that value). It holds only when the phase logged
        exactly the pushes its messages carried (the exactly-once check), and each message's
        records must lie between its write and its answer; else the row gets None and a
        first_push_problem. A sample is start + 0.5 ms (the middle of nginx's millisecond) minus
        the write: +-0.5 ms each. last_push_p50_ms (fanout-details.json and REPORT.md only) is
        the same to the end ($msec) of the message's last request: what comes after it, up to the
        answer, is Herald recording the outcomes and answering."""
        starts_of = {i: [] for i, p in enumerate(self.phases) if p.get("marks")}
        if not starts_of:
            return
        starts = [p["t"] for p in self.phases]
        for r in recs:
            i = bisect.bisect_right(starts, r["t"]) - 1
            if i in starts_of:
                starts_of[i].append((r["t"] - (r.get("rt") or 0.0), r["t"]))
        for i, got in starts_of.items():
            ph = self.phases[i]
            marks, row = ph["marks"], ph.get("row")
            if row is None:
                continue
            got.sort()
            want = sum(m["pushes"] for m in marks)
            firsts, lasts, problem, k = [], [], None, 0
            if len(got) != want:
                problem = f"the phase logged {len(got)} requests, its messages carried {want} pushes"
            else:
                for j, m in enumerate(marks):
                    mine = got[k:k + m["pushes"]]
                    k += m["pushes"]
                    first, last = mine[0][0], mine[-1][0]
                    # whole milliseconds, never later than the event: a start is >= the write's ms
                    if first < math.floor(m["written"] * 1000) / 1000 - 1e-6 or last > m["answered"] + 1e-6:
                        problem = (f"message {j}: its records started {first - m['written']:+.4f} s to "
                                   f"{last - m['written']:+.4f} s from its write, answered after "
                                   f"{m['answered'] - m['written']:.4f} s")
                        break
                    if not m["warmup"]:
                        firsts.append((first + 0.0005 - m["written"]) * 1000)
                        lasts.append((max(end for _, end in mine) + 0.0005 - m["written"]) * 1000)
            if problem:
                row.update(first_push_p50_ms=None, first_push_p90_ms=None, first_push_problem=problem)
                continue
            # last_push: to the end of the message's last request at the sink (its $msec), the same way
            row.update(first_push_p50_ms=round(percentile(firsts, 0.5), 2) if firsts else None,
                       first_push_p90_ms=round(percentile(firsts, 0.9), 2) if firsts else None,
                       first_push_samples_ms=[round(x, 2) for x in firsts],
                       last_push_p50_ms=round(percentile(lasts, 0.5), 2) if lasts else None,
                       last_push_samples_ms=[round(x, 2) for x in lasts])

    def check(self, recs):
        """(problems, summary) over every record of the log."""
        starts = [p["t"] for p in self.phases]
        per_phase = [collections.Counter() for _ in self.phases]
        bad_status = [collections.Counter() for _ in self.phases]
        problems, early = [], 0
        self.probes = 0
        for r in recs:
            i = bisect.bisect_right(starts, r["t"]) - 1
            if i < 0:
                early += 1
                continue
            key = self.record_key(r)
            if key in self.PROBE_KEYS:
                self.probes += 1
                continue
            if 200 <= r["s"] < 300:
                per_phase[i][key] += 1
            else:
                bad_status[i][(key, r["s"])] += 1
        if early:
            problems.append({"sender": "?", "receiver": f"{early} request(s) logged before the run started"})
        summary = []
        for ph, got, bad in zip(self.phases, per_phase, bad_status):
            sender, scenario = ph["sender"], ph["scenario"]
            unknown = sorted(k for k in got if k not in self.known)
            info = {"sender": sender, "scenario": scenario, "requests_2xx": sum(got.values()),
                    "other_status": sum(bad.values()), "unknown_paths": len(unknown)}
            where = {"scenario": scenario, "sender": sender}
            if unknown:
                problems.append({**where, "receiver": f"{len(unknown)} path(s) that are no registered device "
                                 f"got {sum(got[k] for k in unknown)} request(s), e.g. {unknown[:3]}"})
            if ph["expect"] is not None:
                devs, expect = self.devices[ph["devset"]], ph["expect"]
                info["accepted_pushes"] = ph["accepted"]
                info["expected"] = sum(expect.values())
                missing = sorted(k for k in devs if got.get(k, 0) < expect.get(k, 0))
                extra = sorted(k for k in devs if got.get(k, 0) > expect.get(k, 0))
                stray = sorted(k for k in got if k not in devs and k in self.known)
                info.update(missing_devices=len(missing), duplicated_devices=len(extra), other_devices=len(stray))
                if missing:
                    problems.append({**where, "receiver": (
                        f"{len(missing)} of {len(devs)} devices got fewer requests than the pushes accepted for "
                        f"them (nginx logged {sum(expect.get(k, 0) - got.get(k, 0) for k in missing)} fewer), "
                        f"e.g. {[(k, got.get(k, 0), expect.get(k, 0)) for k in missing[:3]]}")})
                if extra:
                    problems.append({**where, "receiver": (
                        f"{len(extra)} of {len(devs)} devices got more requests than the pushes accepted for them "
                        f"(duplicates; none allowed: Herald is not restarted), "
                        f"e.g. {[(k, got[k], expect.get(k, 0)) for k in extra[:3]]}")})
                if stray:
                    problems.append({**where, "receiver": (
                        f"{len(stray)} device(s) of other scenarios got requests, e.g. {stray[:3]}")})
                if bad:
                    problems.append({**where, "receiver": (
                        f"{sum(bad.values())} request(s) answered other than 2xx, e.g. "
                        f"{sorted(bad.items())[:3]}")})
            elif sender in self.QUIET and (got or bad):
                problems.append({**where, "receiver": f"{sum(got.values()) + sum(bad.values())} request(s) "
                                 f"in the {sender} phase, where no push was sent"})
            summary.append(info)
        return problems, summary


# ---------------------------------------------------------------- peers


def peer_env():
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a Session's
    # `verify` (trust_env): a machine that sets them would hide the sink's CA.
    return {k: v for k, v in os.environ.items() if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")}


def run_peer(tmp, peer, devices, sink, keys, messages=None, warmup=0, seconds=None):
    job = {"peer": peer, "devices": devices, "messages": messages, "warmup": warmup, "seconds": seconds,
           "payload": PAYLOAD, "ca": sink.ca, "vapid_key": keys["vapid"],
           "vapid_subject": fixture.VAPID_SUBJECT, "threads": 32,
           "apns": {"host": "127.0.0.1", "port": sink.apns_port, "key_path": keys["apns"],
                    "key_id": fixture.KEY_ID, "team_id": fixture.TEAM_ID, "topic": fixture.TOPIC}}
    job_path = os.path.join(tmp, f"peer-{peer}.job.json")
    out_path = os.path.join(tmp, f"peer-{peer}.out.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    if os.path.exists(out_path):
        os.unlink(out_path)
    limit = (seconds or 0) + 600
    proc = subprocess.run([sys.executable, str(HERE / "peers.py"), job_path, out_path], env=peer_env(),
                          capture_output=True, text=True, timeout=limit)
    if proc.returncode != 0 or not os.path.exists(out_path):
        raise RuntimeError(f"peer {peer} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(out_path) as f:
        out = json.load(f)
    out["stderr_tail"] = proc.stderr[-1500:]
    return out


# ---------------------------------------------------------------- measuring helpers


class SinkMeter:
    def __init__(self, sink):
        self.sink = sink

    def __enter__(self):
        self.c0, self.t0 = self.sink.cpu_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.cpu = self.sink.cpu_seconds() - self.c0

    def info(self):
        return {"sink_cpu_s": round(self.cpu, 3),
                "sink_core_share": round(self.cpu / self.wall, 3) if self.wall > 0 else None}


def h2load_targets(sink, per_user):
    """(platform, origin, requests) per h2load process for one 500-device message."""
    n_web, n_apns, n_fcm = (x * USERS for x in per_user)
    out = []
    if n_web:
        per = n_web // WEB_ORIGINS
        out += [("web", sink.web_origin(i), per) for i in range(WEB_ORIGINS)]
    if n_apns:
        out.append(("apns", sink.apns_url, n_apns))
    if n_fcm:
        out.append(("fcm", sink.fcm_url, n_fcm))
    return out


def h2load_sustained(h2, receipts, sink, name, plat, sustained_s):
    """The h2load row of a sustained scenario: h2load -c 2 -m 100 -t 1 -D seconds against one
    origin of the platform, the ceiling."""
    receipts.phase("h2load", name)
    origin = sink.web_origin(0) if plat == "web" else sink.apns_url if plat == "apns" else sink.fcm_url
    with SinkMeter(sink) as sm:
        res = h2.sustained(plat, origin, max(1, int(round(sustained_s))))
    return {"scenario": name, "sender": "h2load", "p50_ms": None, "p90_ms": None, "p99_ms": None,
            "pushes_per_s": round(res["req_per_s"], 1),
            "cpu_s_per_1000": round(res["cpu_s"] * 1000 / res["succeeded"], 3) if res["succeeded"] else None,
            "peak_rss_mb": round(res["peak_rss_kb"] / 1024, 1), "messages": None,
            "delivered": res["succeeded"], "expected": res["requests"],
            "delivered_all": res["succeeded"] == res["requests"] and res["exit"] == 0,
            "seconds": round(res["seconds"], 2), "samples_ms": [],
            "h2load": "-c 2 -m 100 -t 1 -D %d" % max(1, int(round(sustained_s))), **sm.info()}


class Perf:
    """perf record -g -p PID while a block runs; the flat top afterwards."""

    def __init__(self, pid, path):
        self.pid, self.path = pid, path
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(["perf", "record", "-g", "-q", "-p", str(self.pid), "-o", self.path],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self.record_stderr = (err or b"").decode("utf-8", "replace")[-1000:]

    def _report(self, *extra):
        r = subprocess.run(["perf", "report", "-i", self.path, "--no-children", "--stdio", "-g", "none",
                            "--percent-limit", "0", *extra], capture_output=True, text=True, timeout=300)
        # perf pads every row to the widest symbol and adds empty columns: trim them.
        lines = [re.sub(r"(\s+-)*\s*$", "", ln) for ln in r.stdout.splitlines()
                 if ln.strip() and not ln.startswith("#")]
        header = [ln for ln in r.stdout.splitlines() if ln.startswith("# Samples") or ln.startswith("# Event count")]
        return header, lines

    def top(self, n=30):
        """The n hottest symbols, every thread of herald together (--sort dso,symbol)."""
        header, lines = self._report("--sort", "dso,symbol")
        return header + lines[:n]

    def by_dso(self, n=12):
        return self._report("--sort", "dso")[1][:n]

    def by_thread(self, n=8):
        return self._report("--sort", "comm")[1][:n]


# ---------------------------------------------------------------- machine


def cmd_out(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (r.stdout + r.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


def machine_info(herald_version, peers):
    versions = {"herald": herald_version, "nginx": cmd_out([NGINX, "-v"]), "h2load": h2load_version(),
                "openssl": cmd_out(["openssl", "version"]), "python": platform.python_version(),
                "swift": cmd_out(["swift", "--version"]), "kernel": platform.release()}
    for out in peers:
        versions.update({k: v for k, v in (out.get("versions") or {}).items() if v})
    try:
        import matplotlib
        versions["matplotlib"] = matplotlib.__version__
    except ImportError:
        pass
    return {"processor": machine.cpu_model(), "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "versions": versions}


# ---------------------------------------------------------------- main


def summary_rows(rows):
    """fanout.json: one object per scenario and sender (db_cpu_s_per_1000: PostgreSQL rows only),
    plus, where the row has them, first_push_p50_ms and first_push_p90_ms (Herald's rows of the
    scenarios whose messages go one at a time), devices and us_per_device (the size curve),
    stalled_subscriber's figures, and held_million's."""
    out = []
    for r in rows:
        o = {k: r.get(k) for k in ("scenario", "sender", "p50_ms", "p90_ms", "p99_ms", "pushes_per_s",
                                   "cpu_s_per_1000", "db_cpu_s_per_1000", "peak_rss_mb", "delivered_all")}
        o.update({k: r[k] for k in ("first_push_p50_ms", "first_push_p90_ms", "devices", "us_per_device",
                                    "vs_unstalled", "base_p50_ms", "base_peak_rss_mb", "stall_s", "gap_events",
                                    "event_deliveries", "event_deliveries_missing", "held", "accept_per_s",
                                    "idle_cpu_ms_per_s_none", "idle_cpu_ms_per_s_held", "idle_cpu_ms_per_s_diff",
                                    "idle_db_cpu_ms_per_s_none", "idle_db_cpu_ms_per_s_held", "base_p50_ms",
                                    "vs_unheld", "cpu_vs_unheld", "held_at_sink", "held_ok")
                  if k in r})
        out.append(o)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--herald", default=str(REPO / ".build/release/herald"))
    ap.add_argument("--quick", action="store_true",
                    help="few iterations (2 messages, 2 s sustained phases, 1 peer message): a smoke run")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every push of every sender was delivered")
    ap.add_argument("--perf", action="store_true",
                    help="after the measured web500 and apns500 messages, profile herald (perf record -g) "
                         "over as many more")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--peer-messages", type=int)
    ap.add_argument("--sustained-seconds", type=float)
    ap.add_argument("--size-messages", type=int,
                    help="messages per size of the size curve, after 2 warm-up (default 10; --quick: 2 after 1)")
    ap.add_argument("--crypto-json", default=str(REPO / "benchmarks/results/crypto.json"))
    ap.add_argument("--out-dir", default=str(REPO / "benchmarks/results"))
    ap.add_argument("--only", default="",
                    help="comma-separated scenarios (e.g. web500,apns_sustained,apns_sustained_4c,size_2000)")
    ap.add_argument("--postgres", default="1,2",
                    help="Herald on PostgreSQL too, after the SQLite run: with 1 instance, 2 instances on one "
                         "database, or both ('1,2', the default); 'none' for SQLite only")
    ap.add_argument("--pg-durable", choices=("on", "off"),
                    help="the PostgreSQL server's fsync, synchronous_commit and full_page_writes (default: on, "
                         "to compare with SQLite's synchronous = full; off with --quick, as the tests run it)")
    args = ap.parse_args()
    messages = args.messages or (2 if args.quick else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    peer_messages = args.peer_messages or (1 if args.quick else messages)
    sustained_s = args.sustained_seconds or (2.0 if args.quick else 30.0)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    pg_variants = [] if args.postgres.strip() == "none" else sorted(
        {x.strip() for x in args.postgres.split(",") if x.strip()})
    if any(v not in ("1", "2") for v in pg_variants):
        raise SystemExit(f"--postgres: '1', '2', '1,2' or 'none', not {args.postgres!r}")
    pg_variants = [int(v) for v in pg_variants]
    pg_durable = (args.pg_durable or ("off" if args.quick else "on")) == "on"
    unknown = (only - set(SCENARIOS) - set(SUSTAINED) - set(SUSTAINED_4C) - set(SIZES)
               - {"accept_under_load", "stalled_subscriber", "held_million"})
    if unknown:
        raise SystemExit(f"--only: unknown {sorted(unknown)} (known: "
                         f"{', '.join(list(SCENARIOS) + list(SUSTAINED) + list(SUSTAINED_4C) + list(SIZES))}, "
                         "accept_under_load, stalled_subscriber, held_million)")
    size_messages = args.size_messages or (2 if args.quick else 10)
    size_warmup = 1 if args.quick else 2
    sizes = [n for n in SIZES if (n in only if only else (n in SIZES_QUICK if args.quick else True))]
    runs_4c = [n for n in SUSTAINED_4C if not only or n in only]
    if not os.access(args.herald, os.X_OK):
        raise SystemExit(f"{args.herald} is not an executable (swift build -c release --product herald)")
    out_dir = os.path.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)

    crypto = None
    try:
        with open(args.crypto_json) as f:
            crypto = json.load(f)
    except (OSError, ValueError):
        print(f"no crypto figures at {args.crypto_json} (make bench-crypto writes them)", file=sys.stderr)

    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = machine.load_average()
    tmp = tempfile.mkdtemp(prefix="herald-bench-fanout-")
    sink = herald = receipts = None
    stores = []
    receiver_problems, receiver_summary, completed = [], [], False
    rows, problems, peer_outs, profiles = [], [], [], {}
    herald_status, herald_log, stats = None, "", {}
    crypto_rows, pg, pg_info = [], None, {}
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    try:
        sink = Sink(os.path.join(tmp, "sink"), web_origins=WEB_ORIGINS, access_log=True)
        receipts = Receipts(sink)
        receipts.phase("start")  # herald's start and the registrations: no push request
        keys = fixture.provider_keys(tmp, sink)
        herald = Herald([Instance(os.path.abspath(args.herald), tmp, sink, keys)])
        h2 = H2Load(os.path.join(tmp, "h2load"))
        log(f"sink: nginx pid {sink.proc.pid} (APNs {sink.apns_url}, FCM {sink.fcm_url}, Web Push "
            f"{', '.join(sink.web_origin(i) for i in range(WEB_ORIGINS))}); herald pid {herald.pid} on {tmp}")

        t0 = time.perf_counter()
        users, devices, groups = {}, {}, {}
        for si, (name, per_user) in enumerate(SCENARIOS.items()):
            users[name], devices[name] = fixture.register(herald.client, sink, name, si, USERS, per_user)
        receipts.set_devices(devices, user_devices(users, devices))
        log(f"registered {DEVICES * len(SCENARIOS)} devices in {time.perf_counter() - t0:.1f} s")
        stores = [Store("herald", herald, "sqlite")]

        # ---- the same Herald on PostgreSQL: one instance, and two on one database. Each scenario
        # runs on every store in turn, so that the machine's load at the time is alike for all.
        if pg_variants:
            pg = BenchPostgres(None, durable=pg_durable)
            pg.enable_statement_stats()
            pg_info = {"durable": pg_durable, "settings": pg.settings(), "pool_size": PG_POOL_SIZE,
                       "lease_s": PG_LEASE_S, "variants": {}}
            log(f"postgres: {pg_info['settings'].get('server_version')} on {pg.socket_dir}, "
                f"fsync {pg_info['settings'].get('fsync')}, synchronous_commit "
                f"{pg_info['settings'].get('synchronous_commit')}")
        for n in pg_variants:
            label = PG_SENDERS[n]
            receipts.phase("register")
            h = start_pg_herald(os.path.abspath(args.herald), tmp, sink, keys, pg, n)
            stores.append(Store(label, h, "postgres", pg))
            t0 = time.perf_counter()
            for si, (name, per_user) in enumerate(SCENARIOS.items()):
                pg_users, _ = fixture.register(h.client, sink, name, si, USERS, per_user)
                if pg_users != users[name]:
                    raise RuntimeError(f"{label}: {name} registered other users than on SQLite")
            log(f"{label}: {n} instance(s) {', '.join(str(p) for p in h.pids)}; registered "
                f"{DEVICES * len(SCENARIOS)} devices through {h.instances[0].name} in "
                f"{time.perf_counter() - t0:.1f} s")

        # ---- one message to 500 devices
        for name, per_user in SCENARIOS.items():
            if only and name not in only:
                continue
            for store in stores:
                r, probs = herald_latency(store, name, users, receipts, sink, warmup, messages, log)
                rows.append(r)
                problems += probs
            if args.perf and name in ("web500", "apns500"):
                data = os.path.join(tmp, f"perf-{name}.data")
                done = receipts.herald_phase(name, herald)
                with Perf(herald.pid, data) as perf:
                    psamples, pdel, _, _, _, _ = herald.messages(name, users[name], 0, messages)
                done()
                profiles[name] = {"top": perf.top(30), "by_dso": perf.by_dso(), "by_thread": perf.by_thread(),
                                  "messages": len(psamples),
                                  "p50_ms_under_perf": round(percentile(psamples, 0.5) * 1000, 2),
                                  "delivered": pdel, "record_stderr": perf.record_stderr}
                log(f"{name} profiled ({len(psamples)} messages under perf)")
            for peer in PEERS[name]:
                receipts.phase(peer, name)
                with SinkMeter(sink) as sm:
                    out = run_peer(tmp, peer, devices[name], sink, keys, messages=peer_messages, warmup=1)
                peer_outs.append(out)
                rows.append(row(name, peer, out["samples"], out["delivered"], DEVICES * peer_messages,
                                out["cpu_s"], out["peak_rss_kb"], **sm.info()))
                if out["failed"] or out["errors"]:
                    problems.append({"scenario": name, "sender": peer, "failed": out["failed"],
                                     "errors": out["errors"][:5]})
                log(f"{name} {peer}: p50 {rows[-1]['p50_ms']} ms, delivered {out['delivered']}")
            # h2load: the same requests, one process per origin
            receipts.phase("h2load", name)
            targets = h2load_targets(sink, per_user)
            for _ in range(max(1, warmup)):
                h2.message(targets)
            spans, ok, cpu, rss = [], 0, 0.0, 0
            with SinkMeter(sink) as sm:
                for _ in range(messages):
                    s, good, c, r, probs = h2.message(targets)
                    spans.append(s)
                    ok += good
                    cpu += c
                    rss = max(rss, r)
                    problems += [{"scenario": name, "sender": "h2load", "problem": p} for p in probs]
            rows.append(row(name, "h2load", spans, ok, DEVICES * messages, cpu, rss,
                            h2load_processes=len(targets), **sm.info()))
            log(f"{name} h2load: p50 {rows[-1]['p50_ms']} ms")
            if not all(st.herald.alive() for st in stores):
                raise RuntimeError(f"a herald exited during {name}")

        # ---- crypto share: http_ece seal-only next to Herald's seal figures
        if not only or "web500" in only:
            receipts.phase("http_ece")
            out = run_peer(tmp, "http_ece", devices["web500"], sink, keys, messages=peer_messages, warmup=1)
            peer_outs.append(out)
            seals = out["delivered"]
            crypto_rows.append({"sender": "http_ece", "source": "this run (seal-only, 500 subscriptions per pass)",
                                "us_per_seal": round(out["wall_s"] / seals * 1e6, 1) if seals else None,
                                "seals_per_s": round(seals / out["wall_s"], 0) if out["wall_s"] else None,
                                "cpu_s_per_1000": round(out["cpu_s"] * 1000 / seals, 3) if seals else None,
                                "peak_rss_mb": round(out["peak_rss_kb"] / 1024, 1), "cores": 1})
        if crypto:
            crypto_rows.insert(0, {"sender": "herald", "source": f"crypto.json ({crypto.get('measured_at')})",
                                   "us_per_seal": crypto.get("seal_us"),
                                   "seals_per_s": round(1e6 / crypto["seal_us"]) if crypto.get("seal_us") else None,
                                   "cores": 1})
            if crypto.get("seal_all_cores_us"):
                crypto_rows.insert(1, {"sender": "herald", "source": "crypto.json, all cores (wall)",
                                       "us_per_seal": crypto["seal_all_cores_us"],
                                       "seals_per_s": round(1e6 / crypto["seal_all_cores_us"]),
                                       "cores": crypto.get("cores")})

        # ---- sustained
        for name, (base, plat, peers) in SUSTAINED.items():
            if only and name not in only:
                continue
            for store in stores:
                r, probs = herald_sustained(store, name, base, users, receipts, sink, sustained_s, log)
                rows.append(r)
                problems += probs
            for peer in peers:
                receipts.phase(peer, name)
                with SinkMeter(sink) as sm:
                    out = run_peer(tmp, peer, devices[base], sink, keys, warmup=1, seconds=sustained_s)
                peer_outs.append(out)
                rows.append(row(name, peer, out["samples"], out["delivered"], DEVICES * len(out["samples"]),
                                out["cpu_s"], out["peak_rss_kb"], wall_s=out["wall_s"],
                                seconds=round(out["wall_s"], 2), **sm.info()))
                if out["failed"] or out["errors"]:
                    problems.append({"scenario": name, "sender": peer, "failed": out["failed"],
                                     "errors": out["errors"][:5]})
                log(f"{name} {peer}: {rows[-1]['pushes_per_s']} pushes/s")
            rows.append(h2load_sustained(h2, receipts, sink, name, plat, sustained_s))
            log(f"{name} h2load: {rows[-1]['pushes_per_s']} req/s")
            if not all(st.herald.alive() for st in stores):
                raise RuntimeError(f"a herald exited during {name}")

        # ---- the size curve: one APNs message to 100 ... 10,000 devices (SQLite). Its devices are
        # registered only now, so that every scenario above ran on the store as before.
        if sizes:
            receipts.phase("register")
            t0 = time.perf_counter()
            n_users = max(SIZES[n] for n in sizes) // SIZE_PER_USER
            size_users, size_devices = fixture.register(herald.client, sink, "size", len(SCENARIOS), n_users,
                                                        (0, SIZE_PER_USER, 0))
            for n in sizes:
                users[n] = size_users[:SIZES[n] // SIZE_PER_USER]
                devices[n] = size_devices[:SIZES[n]]
            receipts.set_devices(devices, user_devices(users, devices))
            log(f"size curve: registered {len(size_devices)} APNs devices ({n_users} users with {SIZE_PER_USER} "
                f"each) in {time.perf_counter() - t0:.1f} s")
        for name in sizes:
            r, probs = herald_size(stores[0], name, users, receipts, sink, size_warmup, size_messages, log)
            rows.append(r)
            problems += probs

        # ---- the largest message again, while an event subscriber reads nothing for a minute
        if sizes and (not only or "stalled_subscriber" in only):
            big = max(sizes, key=lambda n: SIZES[n])
            users["stalled_subscriber"] = users[big]
            devices["stalled_subscriber"] = devices[big]
            receipts.set_devices(devices, user_devices(users, devices))
            base = next((x for x in rows if x["scenario"] == big and x["sender"] == stores[0].label), None)
            r, probs = herald_stalled_subscriber(stores[0], big, users, receipts, sink, size_warmup, size_messages,
                                                 log, base, STALL_S_QUICK if args.quick else STALL_S)
            rows.append(r)
            problems += probs

        # ---- accepting while a big message is sent: push.send's p99 against an idle daemon's
        if sizes and (not only or "accept_under_load" in only) and users.get("apns500"):
            big = max(sizes, key=lambda n: SIZES[n])
            devices["accept_under_load"] = devices[big] + devices["apns500"]
            receipts.set_devices(devices, user_devices(users, devices))
            r, probs = herald_accept_under_load(
                stores[0], big, users, receipts, log,
                ACCEPT_CALLS_QUICK if args.quick else ACCEPT_CALLS,
                ACCEPT_BIG_MESSAGES_QUICK if args.quick else ACCEPT_BIG_MESSAGES)
            rows.append(r)
            problems += probs

        # ---- sustained with CONNECTIONS_4C client connections to one Herald (SQLite), each its own
        # users (registered only now, as the size curve's)
        if runs_4c:
            receipts.phase("register")
            t0 = time.perf_counter()
            for si, name in enumerate(runs_4c):
                plat, per_user = SUSTAINED_4C[name]
                groups[name], devices[name] = [], []
                for k in range(CONNECTIONS_4C):
                    us, devs = fixture.register(herald.client, sink, f"{plat}4c{k}",
                                                len(SCENARIOS) + 1 + si * CONNECTIONS_4C + k, USERS, per_user)
                    groups[name].append(us)
                    devices[name] += devs
                users[name] = [u for us in groups[name] for u in us]
            receipts.set_devices(devices, user_devices(users, devices))
            log(f"4-connection scenarios: registered {sum(len(devices[n]) for n in runs_4c)} devices in "
                f"{time.perf_counter() - t0:.1f} s")
        for name in runs_4c:
            plat, _ = SUSTAINED_4C[name]
            r, probs = herald_sustained_4c(stores[0], name, groups[name], receipts, sink, sustained_s, log)
            rows.append(r)
            problems += probs
            rows.append(h2load_sustained(h2, receipts, sink, name, plat, sustained_s))
            log(f"{name} h2load: {rows[-1]['pushes_per_s']} req/s")
            if not all(st.herald.alive() for st in stores):
                raise RuntimeError(f"a herald exited during {name}")

        # ---- deliveries held for a week, on a Herald of their own per store (SQLite; PostgreSQL with one
        # instance when the run has PostgreSQL): what they cost while they wait
        if not only or "held_million" in only:
            # (--quick: SQLite only, a smoke check of the row within the tests' time.)
            for held_pg in [None] + ([pg] if pg_variants and not args.quick else []):
                held = HeldStore(os.path.abspath(args.herald), tmp, sink, keys, held_pg)
                try:
                    r, probs = herald_held_million(
                        held, users, devices, receipts, sink, warmup, messages,
                        HELD_MESSAGES_QUICK if args.quick else HELD_MESSAGES,
                        HELD_IDLE_S_QUICK if args.quick else HELD_IDLE_S,
                        HELD_SETTLE_S_QUICK if args.quick else HELD_SETTLE_S, log)
                except BaseException:
                    print(f"held_million {held.store.label} stderr (tail):\n" + held.store.herald.stderr_tail(),
                          file=sys.stderr)
                    raise
                finally:
                    status = held.store.herald.stop()
                rows.append(r)
                problems += probs
                if any(x != 0 for x in status):
                    problems.append({"scenario": "held_million", "sender": held.store.label, "exit_status": status})

        stats = (herald.client.call("system.stats").get("result")) or {}
        herald_status = herald.stop()[0]
        herald_log = tail(herald.instances[0].proc.log_path, 40)
        herald = None
        for store in stores[1:]:
            h = store.herald
            inst_stats = []
            for inst in h.instances:
                st = (inst.client.call("system.stats").get("result")) or {}
                inst_stats.append({"instance": st.get("instance"), "store": st.get("store"),
                                   "queue": st.get("queue")})
            # The hot tables after the run: the queue and its indexes should be the size of the live
            # work, not of the history.
            table_sizes = pg.table_sizes(h.database)
            top_statements = pg.top_statements(h.database)
            status = h.stop()
            pg_info["variants"][store.label] = {
                "instances": len(h.instances), "stats": inst_stats, "exit_status": status, "table_sizes": table_sizes,
                "top_statements": top_statements,
                "stderr_tail": {i.name: tail(i.proc.log_path, 15) for i in h.instances}}
            if any(x != 0 for x in status):
                problems.append({"sender": store.label, "exit_status": status})
        stores = stores[:1]
        # Herald's pushes as nginx recorded them: wait (with a deadline) until its
        # buffered log holds at least what was accepted, then, after nginx exits
        # (which writes out the rest), compare every device's count.
        receipts.phase("idle")
        t0 = time.perf_counter()
        flushed = receipts.wait_flushed(timeout=90)
        log(f"access log: {receipts.expected()} herald requests expected, "
            f"{'all' if flushed else 'NOT all'} logged after {time.perf_counter() - t0:.1f} s")
        completed = True
    except BaseException:
        for label, h in ([(st.label, st.herald) for st in stores] or ([("herald", herald)] if herald else [])):
            print(f"{label} stderr (tail):\n" + h.stderr_tail(), file=sys.stderr)
        if sink is not None:
            print("nginx (tail):\n" + sink.error_tail(), file=sys.stderr)
        raise
    finally:
        if herald is not None:
            herald.stop()
        for store in stores[1:]:
            store.herald.stop()
        if pg is not None:
            pg.destroy()
        if sink is not None:
            sink.stop()
            if completed:
                recs = sink.records()
                receiver_problems, receiver_summary = receipts.check(recs)
                receipts.first_pushes(recs)
                del recs
        shutil.rmtree(tmp, ignore_errors=True)
    problems += receiver_problems

    for r in rows:
        if not r["delivered_all"] and not any(p.get("scenario") == r["scenario"] and p.get("sender") == r["sender"]
                                              for p in problems):
            problems.append({"scenario": r["scenario"], "sender": r["sender"],
                             "delivered": r["delivered"], "expected": r["expected"]})

    results = {
        "quick": args.quick,
        "date": started.isoformat(timespec="seconds"),
        "machine": machine_info(stats.get("version"), peer_outs),
        "config": {"devices_per_message": DEVICES, "users_per_scenario": USERS, "messages": messages,
                   "warmup": warmup, "peer_messages": peer_messages, "sustained_seconds": sustained_s,
                   "web_origins": WEB_ORIGINS, "herald": "max_inflight 2000, synchronous full, [delivery] defaults",
                   "herald_pg": (f"max_inflight 2000, [store] backend postgres, pool_size {PG_POOL_SIZE}, "
                                 f"lease {PG_LEASE_S}, [delivery] defaults") if pg_variants else None,
                   "postgres_variants": [PG_SENDERS[n] for n in pg_variants],
                   "mixed500": "200 web, 200 apns, 100 fcm per message",
                   "sustained_4c": {"connections": CONNECTIONS_4C, "users_per_connection": USERS,
                                    "devices_per_message": DEVICES, "scenarios": runs_4c},
                   "sizes": {"scenarios": {n: SIZES[n] for n in sizes}, "devices_per_user": SIZE_PER_USER,
                             "messages": size_messages, "warmup": size_warmup, "platform": "apns"},
                   "held_million": {"held_messages": HELD_MESSAGES_QUICK if args.quick else HELD_MESSAGES,
                                    "devices_per_message": HELD_USERS * SIZE_PER_USER, "days_ahead": HELD_DAYS,
                                    "ttl_s": HELD_TTL_S, "max_queued": HELD_MAX_QUEUED,
                                    "idle_s": HELD_IDLE_S_QUICK if args.quick else HELD_IDLE_S,
                                    "settle_s": HELD_SETTLE_S_QUICK if args.quick else HELD_SETTLE_S,
                                    "fanout_devices": DEVICES, "platform": "apns"}
                   if not only or "held_million" in only else None,
                   "first_push": "sink: nginx $msec - $request_time (whole ms, cached at its event-loop "
                                 "wake-up) + 0.5 ms, minus the driver's time.time() right before sendall",
                   "nginx_workers": 2},
        "rows": rows,
        "crypto": crypto_rows,
        "crypto_json": crypto,
        "profiles": profiles,
        "problems": problems,
        "receiver": receiver_summary,
        "herald_stats": {k: stats.get(k) for k in ("transports", "apns", "queue")},
        "herald_exit_status": herald_status,
        "postgres": pg_info,
        "herald_stderr_tail": herald_log,
        "load_average": {"before": load_before, "after": machine.load_average()},
    }
    if pg_info.get("settings"):
        results["machine"]["versions"]["postgresql"] = pg_info["settings"].get("server_version")
    summary = report.summarise(results)
    results["targets"] = summary["targets"]
    with open(os.path.join(out_dir, "fanout.json"), "w") as f:
        json.dump(summary_rows(rows), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "fanout-details.json"), "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")
    table = report.table(results)
    print(table)
    paths = report.write(results, out_dir, table)
    print(f"\nwritten: {', '.join(os.path.relpath(p, os.getcwd()) for p in paths)}")
    herald_phases = [x for x in receiver_summary if "accepted_pushes" in x]
    print(f"\nreceiver (nginx access log): {len(herald_phases)} herald phases"
          + (" (SQLite and PostgreSQL), " if pg_variants else ", ")
          + 
          f"{sum(x['accepted_pushes'] or 0 for x in herald_phases)} accepted push.send calls, "
          f"{sum(x['expected'] for x in herald_phases)} requests expected, "
          f"{sum(x['requests_2xx'] for x in herald_phases)} logged with 2xx; "
          + ("every device got each push exactly once" if completed and not receiver_problems else
             f"{len(receiver_problems)} mismatch(es)" if completed else "not checked (the run did not complete)")
          + f"; {getattr(receipts, 'probes', 0)} credential check request(s) apart")
    for p in receiver_problems:
        print(f"  RECEIVER MISMATCH {p.get('scenario')} {p.get('sender')}: {p['receiver']}", file=sys.stderr)
    if args.check and problems:
        print(f"\nNOT every push was delivered exactly once (by the senders' answers or the sink's access log): "
              f"{len(problems)} problem(s), first: {json.dumps(problems[0])}",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
