"""Several hosts you can trust (issue 26; SPEC.md Revision 3, "Across hosts"): two Herald instances
on one PostgreSQL database, real daemons, a real server (pg_server.py), the provider test gateways
as the judge. Each test starts its own database and instances, like test_multi_instance.py, whose
helpers (Fleet, Ledger, register_fleet, wait_all_complete, the pg / gw fixtures) it reuses.

  1. Nothing stranded while its owner lives: a pending delivery marked `in_flight` under live
     host-a's name, as a lost result leaves it (host-a does not hold it), is delivered within
     lease + 5 s; host-a must not keep renewing a lease on work it does not hold.
  2. One clock: host-a's wall clock 60 s ahead, host-b's 60 s behind (clockshift.c, preloaded into
     each daemon; monotonic clocks untouched). A 30 s-TTL message sent through either reaches
     every device, none `expired`; with a 6 s lease and a gateway holding each request 3 s, no
     lease is taken early: every delivery reaches its gateway once, one attempt, never
     `lease expired`.
  3. Instance identity: (a) a second `herald serve` with an `instance_id` a live instance uses
     refuses to start (non-zero exit within ~10 s, stderr naming the identity and the other
     instance's host and pid); the first keeps working, none of its in-flight work sent twice.
     (b) two instances on one host with no `instance_id` get different default identities
     (system.stats `instance`, push.status `sent_by`), and after kill -9 of one mid fan-out the
     survivor delivers everything the dead one held.
  4. A killed instance's work is taken over within 5 s whatever the lease: lease 30 s, kill -9 of
     host-a holding in-flight deliveries; host-b delivers them all well within the lease.
  5. Graceful stop hands back: lease 30 s, host-a holding sends the gateway has not answered;
     SIGTERM; host-b sends them a few seconds after host-a exits, not after the lease.

Outcomes are judged by the gateways' records (Ledger: every accepted delivery accepted once at its
gateway, resends only where a test allows them) and push.status; times only bound "within N s",
with margins for a slow debug build on two cores. Every wait is bounded.
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from herald_fixtures import (GATEWAY_NAMES, REPO, Daemon, HarnessFailure, Gateways, copy_store_key,
                             record_counts, reset_counts, wait_until, write_store_key)
from test_multi_instance import (DELIVERY, Fleet, Ledger, detail_summary, fresh_gw, gw, message, pg,  # noqa: F401
                                 register_fleet, wait_all_complete)

SUITE = "multi_host"
CLOCKSHIFT_SRC = Path(__file__).resolve().parent / "clockshift.c"
CLOCKSHIFT_LIB = REPO / "build" / "clockshift.so"
CLOCK_ENV = "HERALD_TEST_CLOCK_OFFSET_S"


@pytest.fixture(scope="module", autouse=True)
def _suite_counts():
    reset_counts(SUITE)
    yield


# ----------------------------------------------------------------------------- helpers

class Hosts:
    """Daemons on one new database, each with a copy of one store key. ``specs``: name ->
    {"instance_id": str | None (None: left to the default), "server": {...}, "store": {...},
    "env": {...}}. Started in order (``start=False``: the caller starts them)."""

    def __init__(self, pg, gw: Gateways, specs: dict, *, lease="30", start=True, database=None, key=None):
        self.pg = pg
        self.database = database or pg.create_database()
        self.daemons: dict[str, Daemon] = {}
        self.key = key
        for name, spec in specs.items():
            server = {"max_inflight": 200, **spec.get("server", {})}
            if spec.get("instance_id") is not None:
                server["instance_id"] = spec["instance_id"]
            store = pg.store_config(self.database, lease=lease, pool_size=4, **spec.get("store", {}))
            d = Daemon(gateways=gw, start=False, log_level="info", delivery=DELIVERY, server=server, store=store,
                       env=spec.get("env"))
            if self.key is None:
                self.key = write_store_key(d.store_key)
            else:
                copy_store_key(self.key, d.store_key)
            self.daemons[name] = d
        if start:
            for d in self.daemons.values():
                d.start(timeout=60, probe_timeout=5)

    def __getitem__(self, name) -> Daemon:
        return self.daemons[name]

    def close(self):
        for d in self.daemons.values():
            d.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def rows(self, sql: str) -> list[list[str]]:
        return self.pg.query(sql, self.database)

    def db_now_ms(self) -> int:
        return int(self.rows("SELECT (extract(epoch from clock_timestamp())*1000)::bigint")[0][0])

    def deliveries(self, message_id: str) -> list[dict]:
        """The message's delivery rows as stored (state, sent_by, lease, due time, reason)."""
        out = []
        for r in self.rows("SELECT device_id, state, coalesce(sent_by, ''), coalesce(lease_expires_at, 0), "
                           f"next_attempt_at, attempts, coalesce(reason, ''), 'end' FROM deliveries "
                           f"WHERE message_id = '{message_id}' ORDER BY delivery_id"):
            out.append({"device_id": r[0], "state": r[1], "sent_by": r[2], "lease_expires_at": int(r[3]),
                        "next_attempt_at": int(r[4]), "attempts": int(r[5]), "reason": r[6]})
        return out


def received_total(gw: Gateways) -> int:
    return sum(gw.stats()["received"].get(g, 0) for g in GATEWAY_NAMES)


def complete_within(d: Daemon, message_id: str, seconds: float) -> dict | None:
    """push.status detail once the message is complete, polled for at most ``seconds`` (None if not)."""
    deadline = time.monotonic() + seconds
    while True:
        s = d.call("push.status", {"message_id": message_id}, timeout=30)
        if s["state"] == "complete":
            return d.call("push.status", {"message_id": message_id, "detail": True}, timeout=60)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def device_reasons(status: dict) -> collections.Counter:
    return collections.Counter(x.get("reason") for x in status.get("devices") or [])


def clockshift_lib() -> str:
    """build/clockshift.so, built from clockshift.c when missing or older; checked to move a
    child's CLOCK_REALTIME (and only it) before any daemon relies on it."""
    if not CLOCKSHIFT_LIB.exists() or CLOCKSHIFT_LIB.stat().st_mtime < CLOCKSHIFT_SRC.stat().st_mtime:
        CLOCKSHIFT_LIB.parent.mkdir(parents=True, exist_ok=True)
        tmp = CLOCKSHIFT_LIB.with_suffix(f".{os.getpid()}.so")
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(tmp), str(CLOCKSHIFT_SRC), "-ldl"], check=True,
                       capture_output=True, timeout=120)
        os.replace(tmp, CLOCKSHIFT_LIB)
    # 5: CLOCK_REALTIME_COARSE (Linux; Python names no constant for it)
    probe = ("import time; print(int(time.time()), int(time.clock_gettime(5)), "
             "int(time.monotonic()))")
    for offset in (60, -60):
        out = subprocess.run(["python3", "-c", probe], capture_output=True, text=True, timeout=30, check=True,
                             env=dict(os.environ, LD_PRELOAD=str(CLOCKSHIFT_LIB), **{CLOCK_ENV: str(offset)}))
        wall, coarse, mono = (int(x) for x in out.stdout.split())
        assert abs(wall - time.time() - offset) < 5 and abs(coarse - time.time() - offset) < 5, \
            f"clockshift.so with offset {offset}: the child read {wall} / {coarse}, now is {time.time():.0f}"
        assert abs(mono - time.monotonic()) < 5, "clockshift.so moved the monotonic clock"
    return str(CLOCKSHIFT_LIB)


def shifted_env(offset_s: int) -> dict:
    return {"LD_PRELOAD": clockshift_lib(), CLOCK_ENV: str(offset_s)}


def assert_preloaded(d: Daemon):
    maps = Path(f"/proc/{d.pid}/maps").read_text()
    assert "clockshift.so" in maps, f"herald (pid {d.pid}) runs without clockshift.so loaded"


def allow_clock_skew(gw: Gateways, seconds: int):
    """The APNs gateways refuse a provider token whose iat is more than 60 s ahead of their clock
    (Apple's own tolerance is not documented); a host 60 s fast sits on that edge."""
    for g in ("apns", "apns_dev"):
        gw.knobs(g, iat_future_skew=seconds)


def strand(h: Hosts, gw: Gateways, via: Daemon, users, tag: str, *, owner: str, lease_s: int) -> str:
    """A message to ``users`` through ``via`` whose every delivery is left `in_flight` under
    ``owner``'s name, lease running ``lease_s`` from the database's now, due now: as a lost
    result (an ambiguous COMMIT, a result dropped) leaves it, held in no instance's memory.
    The gateways are healthy again on return. The message id."""
    # Every first attempt is answered "unavailable, come back in ten minutes": the deliveries
    # wait, pending, in the shared queue (retrying, due in ten minutes), held by nobody.
    gw.program("apns", [{"status": 503, "retry_after": 600}])
    gw.program("fcm", [{"error": "UNAVAILABLE", "retry_after": 600}])
    gw.program("webpush", [{"status": 503, "retry_after": 600}])
    try:
        sent = via.call("push.send", message(tag, users, ttl=3600), timeout=60)
        mid = sent["message_id"]
        n = sent["devices"]
        assert n > 0, sent
        seen = []

        def pending():
            rows = h.deliveries(mid)
            now = h.db_now_ms()
            seen[:] = [dict(r, due_in_s=(r["next_attempt_at"] - now) / 1000) for r in rows]
            return len(rows) == n and all(r["state"] == "retrying" and r["next_attempt_at"] > now + 60_000
                                          for r in rows)
        try:
            wait_until(pending, timeout=30, interval=0.2,
                       what="every delivery to wait in `retrying` for the gateways' Retry-After")
        except AssertionError as e:
            raise AssertionError(f"{e}; the rows: {seen[:3]}") from None
        marked = h.rows(
            "WITH t AS (SELECT (extract(epoch from clock_timestamp())*1000)::bigint AS now) "
            f"UPDATE deliveries d SET state = 'in_flight', sent_by = '{owner}', "
            f"lease_expires_at = t.now + {lease_s * 1000}, next_attempt_at = t.now, updated_at = t.now "
            f"FROM t WHERE d.message_id = '{mid}' AND d.state = 'retrying' RETURNING d.delivery_id")
        assert len(marked) == n, f"marked {len(marked)} of {n} pending deliveries in flight"
    finally:
        for g in ("apns", "fcm", "webpush"):
            gw.program(g, [])          # healthy again
    return mid


def check(problems: list):
    """Fails with every problem, one a line (pytest would cut a long list short)."""
    if problems:
        raise AssertionError("\n".join(str(p) for p in problems))


# ----------------------------------------------------------------------------- 1. nothing stranded

LEASE_STRAND_S = 6


def test_nothing_stranded_while_owner_lives(pg, fresh_gw):
    """A delivery left `in_flight` under a live instance that does not hold it (a lost result, an
    ambiguous COMMIT) goes out within lease + 5 s: its owner renews only what it holds."""
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "strand", 10)
    specs = {"host-a": {"instance_id": "host-a"}, "host-b": {"instance_id": "host-b"}}
    with Hosts(pg, gw, specs, lease=str(LEASE_STRAND_S)) as h:
        a, b = h["host-a"], h["host-b"]
        register_fleet(fleet, [a])
        mid = strand(h, gw, a, fleet.users, "strand", owner="host-a", lease_s=LEASE_STRAND_S)
        marked_at = time.monotonic()
        bound = LEASE_STRAND_S + 5
        status = complete_within(b, mid, bound + 3)     # + 3: polling and a slow debug build
        took = time.monotonic() - marked_at
        if status is None:
            rows = h.deliveries(mid)
            now = h.db_now_ms()
            stuck = [r for r in rows if r["state"] == "in_flight"]
            raise AssertionError(
                f"{len(stuck)} of 10 deliveries still in_flight {took:.1f} s after they were left in flight "
                f"under live host-a with a {LEASE_STRAND_S} s lease (bound {bound} s); e.g. sent_by "
                f"{stuck[0]['sent_by'] if stuck else None}, lease expires in "
                f"{(stuck[0]['lease_expires_at'] - now) / 1000 if stuck else 0:.1f} s (renewed), states "
                f"{collections.Counter(r['state'] for r in rows)}")
        states, _ = detail_summary(status)
        assert states == {"delivered": 10}, status
        assert took <= bound + 3, f"delivered {took:.1f} s after being stranded (bound lease + 5 = {bound} s)"
        result = ledger.judge(fleet.expected(fleet.users, "strand"))
        assert not result["problems"], result["problems"][:20]
        record_counts(SUITE, stranded_rescued=10)
        a.shutdown()
        b.shutdown()


# ----------------------------------------------------------------------------- 2. one clock

CLOCK_SPECS = lambda server: {   # noqa: E731 - host-a 60 s fast, host-b 60 s slow
    "host-a": {"instance_id": "host-a", "env": shifted_env(60), "server": server},
    "host-b": {"instance_id": "host-b", "env": shifted_env(-60), "server": server},
}


def _send_both(a: Daemon, b: Daemon, fleet: Fleet, tag: str, **extra):
    """One message to user 0 through host-a and one to user 1 through host-b; ids and expected."""
    ma = message(f"{tag}-a", fleet.users[:1], **extra)
    mb = message(f"{tag}-b", fleet.users[1:2], **extra)
    ra = a.call("push.send", ma, timeout=60)
    rb = b.call("push.send", mb, timeout=60)
    assert ra["devices"] == 10 and rb["devices"] == 10, (ra, rb)
    expected = fleet.expected(fleet.users[:1], f"{tag}-a") | fleet.expected(fleet.users[1:2], f"{tag}-b")
    return [ra["message_id"], rb["message_id"]], expected


def test_one_clock_ttl_across_skewed_hosts(pg, fresh_gw):
    """host-a 60 s ahead, host-b 60 s behind: a 30 s-TTL message accepted by either is delivered on
    all ten devices, whichever instance sends each (max_inflight 2 spreads every message over
    both); none ends `expired`."""
    gw = fresh_gw
    allow_clock_skew(gw, 180)
    ledger = Ledger(gw)
    fleet = Fleet(gw, "ttl", 20)
    with Hosts(pg, gw, CLOCK_SPECS({"max_inflight": 2}), lease="30") as h:
        a, b = h["host-a"], h["host-b"]
        assert_preloaded(a)
        assert_preloaded(b)
        register_fleet(fleet, [a, b])
        gw.set_delay(500)
        ids, expected = _send_both(a, b, fleet, "ttl", ttl=30)
        states, sent_by, reasons = collections.Counter(), collections.Counter(), collections.Counter()
        cross = 0      # deliveries sent by the instance that did not accept the message
        for mid, accepted_by in zip(ids, ("host-a", "host-b")):
            # Within the TTL (30 s + the 2 s grace): past it nothing may be sent anyway.
            status = complete_within(a, mid, 40)
            assert status is not None, f"message {mid} not complete 40 s after a 30 s-TTL send: {h.deliveries(mid)}"
            st, sb = detail_summary(status)
            states += st
            sent_by += sb
            reasons += device_reasons(status)
            cross += sum(1 for x in status["devices"] if x.get("sent_by") not in (None, accepted_by))
        gw.set_delay(0)
        assert states == {"delivered": 20}, (f"30 s-TTL messages through hosts 60 s fast and 60 s slow: {dict(states)} "
                                             f"(reasons {dict(reasons)}, sent_by {dict(sent_by)})")
        result = ledger.judge(expected)
        assert not result["problems"], result["problems"][:20]
        record_counts(SUITE, skewed_ttl_delivered=20, skewed_ttl_sent_by_the_other=cross)
        a.shutdown()
        b.shutdown()


def test_one_clock_no_lease_taken_early(pg, fresh_gw):
    """The same skewed hosts, lease 6 s, a gateway holding every request 3 s: neither instance
    takes the other's live in-flight work; every delivery reaches its gateway once, in one
    attempt, never `lease expired`."""
    gw = fresh_gw
    allow_clock_skew(gw, 180)
    ledger = Ledger(gw)
    fleet = Fleet(gw, "lease", 20)
    with Hosts(pg, gw, CLOCK_SPECS({"max_inflight": 4}), lease="6") as h:
        a, b = h["host-a"], h["host-b"]
        assert_preloaded(a)
        assert_preloaded(b)
        register_fleet(fleet, [a, b])
        gw.set_delay(3000)
        ids, expected = _send_both(a, b, fleet, "lease")
        devices = []
        for mid in ids:
            status = complete_within(a, mid, 60)
            assert status is not None, f"message {mid} not complete in 60 s: {h.deliveries(mid)}"
            devices += status["devices"]
        gw.set_delay(0)
        states = collections.Counter(x["state"] for x in devices)
        reasons = collections.Counter(x.get("reason") for x in devices)
        result = ledger.judge(expected)
        problems = list(result["problems"][:20])
        if states != {"delivered": 20}:
            problems.append(f"states {dict(states)}")
        if reasons.get("lease expired"):
            problems.append(f"{reasons['lease expired']} deliveries taken over as `lease expired` while their "
                            f"instance was alive and sending")
        again = [x for x in devices if x.get("attempts", 1) != 1]
        if again:
            problems.append(f"{len(again)} deliveries attempted more than once, e.g. {again[:3]}")
        if result["copies"] != len(expected):
            problems.append(f"{result['copies']} copies at the gateways for {len(expected)} deliveries "
                            f"(a lease taken early sends twice)")
        check(problems)
        record_counts(SUITE, skewed_lease_deliveries=20)
        a.shutdown()
        b.shutdown()


# ----------------------------------------------------------------------------- 3. identity

def test_second_instance_with_same_identity_refuses_to_start(pg, fresh_gw):
    """A second `herald serve` with the instance_id of a live instance exits non-zero within
    ~10 s, naming the identity and the other instance (its host and pid); the first keeps
    working, and none of its in-flight pushes is sent twice."""
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "twin", 30)
    specs = {"first": {"instance_id": "twin-id"}, "second": {"instance_id": "twin-id"}}
    with Hosts(pg, gw, specs, lease="6", start=False) as h:
        first, second = h["first"], h["second"]
        first.start(timeout=60, probe_timeout=5)
        register_fleet(fleet, [first])
        gw.set_delay(3000)
        sent = first.call("push.send", message("twin", fleet.users[:2]), timeout=60)
        assert sent["devices"] == 20, sent
        wait_until(lambda: received_total(gw) >= 20, timeout=30, interval=0.1,
                   what="the first instance's 20 sends held at the gateways")
        problems = []
        t0 = time.monotonic()
        try:
            second.start(timeout=15, probe_timeout=3)
            started = True
        except HarnessFailure:
            started = False
        took = time.monotonic() - t0
        if started:
            problems.append(f"a second instance with instance_id twin-id (in use by live pid {first.pid}) "
                            f"started and serves")
            second.stop()
        elif second.running:
            problems.append(f"the second instance neither served nor exited within {took:.1f} s")
            second.stop()
        else:
            code = second.proc.returncode
            text = second.log()
            if code == 0:
                problems.append("the refused second instance exited with status 0")
            if took > 12:
                problems.append(f"the second instance took {took:.1f} s to refuse")
            for what, needle in (("the identity", "twin-id"), ("the other instance's host", socket.gethostname()),
                                 ("the other instance's pid", str(first.pid))):
                if needle not in text:
                    problems.append(f"its stderr does not name {what} ({needle!r}): {text[-1500:]}")
        gw.set_delay(0)
        status = complete_within(first, sent["message_id"], 40)
        assert status is not None, f"the first instance's message is not complete: {h.deliveries(sent['message_id'])}"
        states, _ = detail_summary(status)
        if states != {"delivered": 20}:
            problems.append(f"first instance's in-flight message ended {dict(states)}")
        # The first keeps working.
        after = first.send_wait(message("twin-after", fleet.users[2:3]), timeout_ms=30000)
        if after.get("state") != "complete" or after.get("counts", {}).get("delivered") != 10:
            problems.append(f"the first instance after the refusal: {after}")
        result = ledger.judge(fleet.expected(fleet.users[:2], "twin") | fleet.expected(fleet.users[2:3], "twin-after"))
        problems += result["problems"][:10]
        if result["copies"] != 30:
            problems.append(f"{result['copies']} copies at the gateways for 30 deliveries (work sent twice)")
        check(problems)
        record_counts(SUITE, duplicate_identity_refused=1)
        first.shutdown()


DEFAULT_FLEET = 400


def test_default_identities_differ_and_survivor_takes_over(pg, fresh_gw):
    """Two instances on one host with no instance_id: two different names (system.stats,
    push.status sent_by); kill -9 of one mid fan-out (400 devices, gateways slowed): the survivor
    delivers everything the dead one held."""
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "dflt", DEFAULT_FLEET)
    specs = {"one": {"server": {"max_inflight": 100}}, "two": {"server": {"max_inflight": 100}}}
    with Hosts(pg, gw, specs, lease="6") as h:
        one, two = h["one"], h["two"]
        names = [one.call("system.stats")["instance"], two.call("system.stats")["instance"]]
        problems = []
        if names[0] == names[1]:
            problems.append(f"two instances on one host (sockets {one.socket}, {two.socket}) share the default "
                            f"identity {names[0]!r}")
        register_fleet(fleet, [one, two])
        gw.set_delay(800)
        sent = one.call("push.send", message("dflt", fleet.users, idempotency_key="dflt-key"), timeout=120)
        mid = sent["message_id"]
        assert sent["devices"] == DEFAULT_FLEET, sent
        wait_until(lambda: received_total(gw) >= 150, timeout=60, interval=0.1,
                   what="150 of the fan-out at the gateways")
        held_rows = h.rows(f"SELECT device_id FROM deliveries WHERE message_id = '{mid}' AND state = 'in_flight' "
                           f"AND sent_by = '{names[0]}'")
        one.kill9()
        kill_time = time.time()
        held = {r[0] for r in held_rows}
        gw.set_delay(0)
        status = complete_within(two, mid, 30)
        if status is None:
            rows = h.deliveries(mid)
            left = [r for r in rows if r["state"] == "in_flight"]
            problems.append(f"30 s after kill -9 of {names[0]!r} (lease 6 s), {len(left)} deliveries still in flight, "
                            f"sent_by {collections.Counter(r['sent_by'] for r in left)}")
            check(problems)
        states, sent_by = detail_summary(status)
        if states != {"delivered": DEFAULT_FLEET}:
            problems.append(f"states {dict(states)}")
        by_device = {x["device_id"]: x for x in status["devices"]}
        not_taken = [d for d in held if by_device[d]["sent_by"] == names[0]]
        if names[0] != names[1] and not_taken:
            problems.append(f"{len(not_taken)} of the {len(held)} deliveries the dead instance held still name it")
        # A second push.status sent_by name: the survivor's, different from the dead one's.
        if names[1] not in sent_by:
            problems.append(f"sent_by {dict(sent_by)} does not name the survivor {names[1]!r}")
        result = ledger.judge(fleet.expected(fleet.users, "dflt"),
                              resend_allowed=lambda prev: (prev["time"] or 0) <= kill_time)
        problems += result["problems"][:20]
        if result["excused_resends"] > len(held):
            problems.append(f"{result['excused_resends']} resends for {len(held)} held at the kill")
        check(problems)
        record_counts(SUITE, default_identity_held=len(held))
        two.shutdown()


# ----------------------------------------------------------------------------- 4. kill -9, long lease

LONG_LEASE_S = 30
TAKEOVER_FLEET = 200


def test_killed_instance_work_taken_over_within_seconds(pg, fresh_gw):
    """Lease 30 s: kill -9 of host-a holding in-flight deliveries; host-b delivers them all within
    5 s plus the time to send them (bound 15 s, half the lease)."""
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "takeover", TAKEOVER_FLEET)
    specs = {"host-a": {"instance_id": "host-a", "server": {"max_inflight": 400}},
             "host-b": {"instance_id": "host-b", "server": {"max_inflight": 400}}}
    with Hosts(pg, gw, specs, lease=str(LONG_LEASE_S)) as h:
        a, b = h["host-a"], h["host-b"]
        register_fleet(fleet, [a, b])
        gw.set_delay(2000)
        sent = a.call("push.send", message("takeover", fleet.users, idempotency_key="takeover-key"), timeout=60)
        mid = sent["message_id"]
        assert sent["devices"] == TAKEOVER_FLEET, sent
        wait_until(lambda: received_total(gw) >= TAKEOVER_FLEET // 2, timeout=60, interval=0.05,
                   what="half the fan-out held at the gateways")
        a.kill9()
        kill_time, killed_at = time.time(), time.monotonic()
        held = {r[0] for r in h.rows(f"SELECT device_id FROM deliveries WHERE message_id = '{mid}' "
                                     f"AND state = 'in_flight' AND sent_by = 'host-a'")}
        assert held, "host-a held nothing in flight at its kill"
        gw.set_delay(0)
        bound = 15
        status = complete_within(b, mid, bound + 5)
        took = time.monotonic() - killed_at
        if status is None:
            rows = h.deliveries(mid)
            left = [r for r in rows if r["state"] == "in_flight"]
            raise AssertionError(f"{took:.1f} s after kill -9 of host-a (lease {LONG_LEASE_S} s), {len(left)} of its "
                                 f"{len(held)} deliveries still in flight under {collections.Counter(r['sent_by'] for r in left)}")
        assert took <= bound, f"host-b finished the dead instance's work {took:.1f} s after the kill (bound {bound} s)"
        states, _ = detail_summary(status)
        assert states == {"delivered": TAKEOVER_FLEET}, states
        by_device = {x["device_id"]: x for x in status["devices"]}
        assert all(by_device[d]["sent_by"] == "host-b" for d in held), "held deliveries not finished by host-b"
        result = ledger.judge(fleet.expected(fleet.users, "takeover"),
                              resend_allowed=lambda prev: (prev["time"] or 0) <= kill_time)
        assert not result["problems"], result["problems"][:20]
        assert result["excused_resends"] <= len(held), (result, len(held))
        record_counts(SUITE, killed_taken_over=len(held), killed_takeover_ms=int(took * 1000))
        b.shutdown()


# ----------------------------------------------------------------------------- 5. SIGTERM hands back

HANDBACK_FLEET = 100


def test_graceful_stop_hands_back_unsent_work(pg, fresh_gw):
    """Lease 30 s. host-a holds unsent work of two kinds: 90 sends the gateways hold unanswered past
    its 10 s drain, and 10 deliveries leased to it that it never sent (as a lost result leaves
    them). SIGTERM: host-a exits 0 within the unit's budget, and host-b delivers all 100 within
    8 s after host-a exits, not after the lease."""
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "handback", HANDBACK_FLEET)
    specs = {"host-a": {"instance_id": "host-a", "server": {"max_inflight": 400}},
             "host-b": {"instance_id": "host-b", "server": {"max_inflight": 400}}}
    with Hosts(pg, gw, specs, lease=str(LONG_LEASE_S)) as h:
        a, b = h["host-a"], h["host-b"]
        register_fleet(fleet, [a, b])
        leased = strand(h, gw, a, fleet.users[:1], "handback-leased", owner="host-a", lease_s=LONG_LEASE_S)
        seq0 = received_total(gw)
        # host-a's own sends, held 30 s at the gateways (past its drain); what arrives after the
        # knob is lowered again (host-b's sends) is answered at once.
        gw.set_delay(30_000)
        sent = a.call("push.send", message("handback", fleet.users[1:], idempotency_key="handback-key"), timeout=60)
        mid = sent["message_id"]
        assert sent["devices"] == HANDBACK_FLEET - 10, sent
        wait_until(lambda: received_total(gw) - seq0 >= HANDBACK_FLEET - 10, timeout=60, interval=0.05,
                   what="all of host-a's sends held at the gateways")
        gw.set_delay(0)
        term_time = time.time()
        stop_took = a.shutdown()
        exited_at = time.monotonic()
        at_exit = collections.Counter((r["state"], r["sent_by"]) for m in (leased, mid) for r in h.deliveries(m))
        bound = 8
        statuses = {}
        for m in (leased, mid):
            left = max(0.5, bound + 4 - (time.monotonic() - exited_at))
            statuses[m] = complete_within(b, m, left)
        took = time.monotonic() - exited_at
        if any(v is None for v in statuses.values()):
            now = h.db_now_ms()
            rows = [r for m in (leased, mid) for r in h.deliveries(m) if r["state"] != "delivered"]
            raise AssertionError(
                f"{took:.1f} s after host-a exited on SIGTERM ({stop_took:.1f} s after it; lease {LONG_LEASE_S} s), "
                f"{len(rows)} deliveries not delivered: {dict(collections.Counter((r['state'], r['sent_by']) for r in rows))}"
                f"; their leases run {sorted({round((r['lease_expires_at'] - now) / 1000) for r in rows if r['lease_expires_at']})[:5]} s "
                f"more (rows at host-a's exit: {dict(at_exit)})")
        assert took <= bound, f"host-b finished host-a's unsent work {took:.1f} s after host-a exited (bound {bound} s)"
        states, sent_by = collections.Counter(), collections.Counter()
        for st in statuses.values():
            s_, b_ = detail_summary(st)
            states += s_
            sent_by += b_
        assert states == {"delivered": HANDBACK_FLEET}, states
        assert sent_by.get("host-b", 0) >= 10, dict(sent_by)
        # host-a's copies that the gateways held are resent by host-b: allowed, being unanswered
        # when host-a stopped; the leased ten never went out before.
        result = ledger.judge(fleet.expected(fleet.users[:1], "handback-leased") |
                              fleet.expected(fleet.users[1:], "handback"),
                              resend_allowed=lambda prev: (prev["time"] or 0) <= term_time)
        check(result["problems"][:20])
        record_counts(SUITE, handed_back=HANDBACK_FLEET, handback_ms=int(took * 1000))
        b.shutdown()
