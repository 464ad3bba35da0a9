"""Several Herald instances on one PostgreSQL database (SPEC.md Revision 2, "Beyond one host").

Every test starts a private PostgreSQL server (pg_server.py: initdb in a temporary directory, a
Unix socket only), a fresh database, and two daemons on it ("host-a" and "host-b"), each with its
own socket, state directory and instance_id, and a copy of the same store key. The provider test
gateways (Tests/gateways) record every push; what reached them is the judge:

  * a device registered through A receives pushes sent through B;
  * a 5,000-device fan-out (4 APNs, 4 FCM, 2 Web Push per user) sent through both at once, as two
    messages or as one (the same idempotency key to both): every accepted delivery received, none
    sent twice except a resend of a copy whose answer never reached Herald; push.status detail
    names both instances as `sent_by`;
  * kill -9 of one instance mid fan-out (lease 3 s): the other finishes its deliveries once the
    lease has run out, nothing lost; resends only of deliveries the gateways had answered before
    the kill, at most max_inflight of them;
  * a database restart mid-send: calls during the outage get -32603 with data.reason
    store_unavailable and system.health says `store: degraded:…`; delivery resumes by itself;
    nothing accepted is lost;
  * idempotency across instances (one message id for a key sent to A and B at once) and the
    per-user registration rate limit shared by both.

A delivery at the gateways is (gateway, token or subscription id, tag), the tag being the
message's `data.hx`; every copy of it must carry the same collapse id.
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time
import zlib

import pytest

from herald_fixtures import (GATEWAY_NAMES, Daemon, Gateways, RPC, copy_store_key, record_counts, reset_counts,
                             wait_until, write_store_key)
from pg_server import PostgresServer

SUITE = "multi_instance"
PER_USER = (("apns", 4), ("fcm", 4), ("web", 2))
FANOUT_DEVICES = 5000
DELIVERY = {"max_retries": 8, "backoff_base_ms": 100, "backoff_max_ms": 1000}
TRANSIENT_STATUS = (429, 500, 502, 503, 504)
# Small enough that most of a fan-out waits in the shared queue, where both instances claim.
MAX_INFLIGHT = 200
REGISTER_PER_MINUTE = 20      # Sources/HeraldDaemon/Service.swift: registerLimiter
COMPLETE_TIMEOUT_S = 240


@pytest.fixture(scope="module", autouse=True)
def _suite_counts():
    reset_counts(SUITE)
    yield


@pytest.fixture(scope="module")
def pg():
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="module")
def gw():
    g = Gateways(timeout=120)
    yield g
    g.stop()


@pytest.fixture
def fresh_gw(gw):
    """The module's gateways with their records, programs and knobs cleared."""
    gw.reset()
    yield gw
    gw.set_delay(0)


class Cluster:
    """Daemons named ``names`` on one new database, each with a copy of one store key."""

    def __init__(self, pg: PostgresServer, gw: Gateways, *, lease="30", names=("host-a", "host-b"),
                 max_inflight=MAX_INFLIGHT):
        self.pg = pg
        self.database = pg.create_database()
        self.daemons: dict[str, Daemon] = {}
        key = None
        for name in names:
            d = Daemon(gateways=gw, start=False, log_level="info", delivery=DELIVERY,
                       server={"instance_id": name, "max_inflight": max_inflight},
                       store=pg.store_config(self.database, lease=lease, pool_size=4))
            if key is None:
                key = write_store_key(d.store_key)
            else:
                copy_store_key(key, d.store_key)
            self.daemons[name] = d
        for d in self.daemons.values():
            d.start(timeout=60, probe_timeout=5)

    def __getitem__(self, name) -> Daemon:
        return self.daemons[name]

    @property
    def a(self) -> Daemon:
        return self.daemons["host-a"]

    @property
    def b(self) -> Daemon:
        return self.daemons["host-b"]

    def close(self):
        for d in self.daemons.values():
            d.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Fleet:
    """Devices over users of 10 (PER_USER), with the identity each has at its gateway."""

    def __init__(self, gw: Gateways, prefix: str, n_devices: int):
        per_user = sum(n for _, n in PER_USER)
        self.users = [f"{prefix}-u{i:04d}" for i in range(max(1, n_devices // per_user))]
        self.params = []          # device.register params, in order
        self.gw_ids = []          # (gateway, token at the gateway), in the same order
        web_ids = [f"{prefix}-{u}-w{k}" for u in self.users for k in range(dict(PER_USER)["web"])]
        # One call: every id shares the key pair and auth secret of the answer.
        sub = gw.subscriptions(web_ids) if web_ids else {"endpoints": []}
        endpoints = iter(sub["endpoints"])
        keys = {"p256dh": sub["p256dh"], "auth": sub["auth"]} if web_ids else None
        web_iter = iter(web_ids)
        crc = zlib.crc32(prefix.encode())
        for ui, user in enumerate(self.users):
            k = 0
            for platform, n in PER_USER:
                for _ in range(n):
                    if platform == "apns":
                        token = f"{crc:08x}{ui:024x}{k:032x}"
                        self.params.append({"user": user, "platform": "apns", "token": token})
                        self.gw_ids.append(("apns", token))
                    elif platform == "fcm":
                        token = f"fcm-{prefix}-{user}-{k}"
                        self.params.append({"user": user, "platform": "fcm", "token": token})
                        self.gw_ids.append(("fcm", token))
                    else:
                        self.params.append({"user": user, "platform": "web", "token": next(endpoints), "keys": keys})
                        self.gw_ids.append(("webpush", next(web_iter)))
                    k += 1
        self.by_user = collections.defaultdict(list)
        for p, g in zip(self.params, self.gw_ids):
            self.by_user[p["user"]].append(g)

    def expected(self, users, tag):
        return {(g, t, tag) for u in users for g, t in self.by_user[u]}


class Ledger:
    """The gateways' records since the last reset, as deliveries (gateway, token, tag)."""

    def __init__(self, gw: Gateways):
        self.gw = gw
        self.seq = {g: 0 for g in GATEWAY_NAMES}
        self.copies = collections.defaultdict(list)
        self.invalid = []

    def fetch(self) -> int:
        n = 0
        for g in GATEWAY_NAMES:
            for r in self.gw.received(g, since=self.seq[g], kind="send" if g == "fcm" else None):
                self.seq[g] = max(self.seq[g], r["seq"])
                if g == "fcm" and r.get("kind", "send") != "send":
                    continue
                if r.get("unprocessed") and r.get("response") is None:
                    continue   # above a GOAWAY's last stream: never processed
                headers = r.get("headers") or {}
                body = r.get("body") if isinstance(r.get("body"), dict) else {}
                if g in ("apns", "apns_dev"):
                    data, collapse = body, headers.get("apns-collapse-id")
                elif g == "fcm":
                    msg = body.get("message") or {}
                    data, collapse = msg.get("data") or {}, (msg.get("android") or {}).get("collapse_key")
                else:
                    pj = r.get("plaintext_json")
                    data, collapse = (pj.get("data") if isinstance(pj, dict) else None) or {}, headers.get("topic")
                if not r.get("valid", False):
                    self.invalid.append((g, r["seq"], r.get("errors")))
                status = (r.get("response") or {}).get("status")
                cls = "ok" if status is not None and 200 <= status < 300 else \
                    "transient" if status is None or status in TRANSIENT_STATUS else "error"
                self.copies[(g, r.get("token"), data.get("hx"))].append(
                    {"seq": r["seq"], "status": status, "cls": cls, "answered": r.get("answered_at") is not None,
                     "answered_at": r.get("answered_at"), "time": r.get("time"), "collapse": collapse})
                n += 1
        return n

    def judge(self, expected: set, resend_allowed=lambda copy: False) -> dict:
        """Failures and figures: every expected delivery accepted (2xx) at its gateway; no record of
        anything else; one collapse id per delivery; a copy after a final answer is a duplicate,
        allowed only after a copy whose answer never went out or when ``resend_allowed(prev)``."""
        self.fetch()
        problems, duplicates, excused = [], 0, 0
        for g, seq, errors in self.invalid[:10]:
            problems.append(f"gateway {g} record {seq} failed validation: {errors}")
        for key, copies in self.copies.items():
            if key not in expected:
                problems.append(f"record of no accepted delivery: {key} ({len(copies)} copies)")
                continue
            if len({c["collapse"] for c in copies}) != 1:
                problems.append(f"{key}: copies with different collapse ids {[c['collapse'] for c in copies]}")
            for prev, cur in zip(copies, copies[1:]):
                if prev["cls"] == "transient":
                    continue
                if not prev["answered"] or resend_allowed(prev):
                    excused += 1
                    continue
                duplicates += 1
                if duplicates <= 20:
                    problems.append(f"{key}: sent again (record {cur['seq']}) after the gateway had answered "
                                    f"{prev['status']} to record {prev['seq']}")
        missing = [k for k in expected if not any(c["cls"] == "ok" for c in self.copies.get(k, ()))]
        if missing:
            problems.append(f"{len(missing)} of {len(expected)} accepted deliveries never accepted at the "
                            f"gateways, e.g. {sorted(missing)[:5]}")
        return {"problems": problems, "duplicates": duplicates, "excused_resends": excused,
                "copies": sum(len(v) for v in self.copies.values()), "missing": len(missing)}


def register_fleet(fleet: Fleet, via: list[Daemon]):
    """Registers the fleet, user by user spread over ``via`` (pipelined, one thread per daemon)."""
    shares = [[] for _ in via]
    for i, user in enumerate(fleet.users):
        shares[i % len(via)].append(user)
    errors = []

    def run(d, users):
        try:
            wanted = set(users)
            d.register_many([p for p in fleet.params if p["user"] in wanted])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(d, s)) for d, s in zip(via, shares)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def send_concurrently(calls: list[tuple[Daemon, dict]], timeout=120) -> list[dict]:
    """push.send on every (daemon, params) at once (a barrier releases them together); the answers."""
    barrier = threading.Barrier(len(calls))
    out: list = [None] * len(calls)

    def run(i, d, params):
        with RPC(d.socket, timeout=timeout) as c:
            barrier.wait()
            out[i] = c.request("push.send", params, timeout=timeout)

    threads = [threading.Thread(target=run, args=(i, d, p)) for i, (d, p) in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (d, _), a in zip(calls, out):
        assert a is not None and "result" in a, f"push.send through {d.dir}: {a}"
    return [a["result"] for a in out]


def wait_all_complete(d: Daemon, message_ids, timeout=COMPLETE_TIMEOUT_S) -> dict:
    """Waits for every message to be complete (asked of ``d``); their detailed status."""
    out = {}

    def done():
        for mid in message_ids:
            if mid not in out:
                s = d.call("push.status", {"message_id": mid}, timeout=60)
                if s["state"] != "complete":
                    return False
                out[mid] = d.call("push.status", {"message_id": mid, "detail": True}, timeout=120)
        return True

    wait_until(done, timeout=timeout, interval=0.5, what=f"messages {list(message_ids)} to complete")
    return out


def detail_summary(status: dict) -> tuple[collections.Counter, collections.Counter]:
    devices = status.get("devices") or []
    return (collections.Counter(x["state"] for x in devices), collections.Counter(x.get("sent_by") for x in devices))


def message(tag, users, **extra):
    return {"to": {"users": list(users)}, "data": {"hx": tag, "pz": f"{random.getrandbits(64):016x}"},
            "collapse_key": f"ck-{tag}", **extra}


def test_registered_through_one_delivered_through_the_other(pg, fresh_gw):
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "cross", 10)
    with Cluster(pg, gw) as c:
        register_fleet(fleet, [c.a])
        listed = c.b.devices(fleet.users[0])
        assert len(listed) == 10, f"host-b lists {len(listed)} of the 10 devices registered through host-a"
        sent = c.b.send_wait(message("cross", fleet.users))
        assert sent["devices"] == 10 and sent["state"] == "complete", sent
        status = c.a.status(sent["message_id"])
        states, sent_by = detail_summary(status)
        assert states == {"delivered": 10}, status
        # The hand-over at commit: B accepted it, and B sent it while alive.
        assert set(sent_by) == {"host-b"}, sent_by
        result = ledger.judge(fleet.expected(fleet.users, "cross"))
        assert not result["problems"], result["problems"]
        assert result["duplicates"] == 0 and result["copies"] == 10, result
        c.a.shutdown()
        c.b.shutdown()


@pytest.mark.parametrize("mode", ["two_messages", "one_key"])
def test_fanout_through_both_at_once(pg, fresh_gw, mode):
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, f"fan-{mode}", FANOUT_DEVICES)
    with Cluster(pg, gw) as c:
        register_fleet(fleet, [c.a, c.b])
        gw.set_delay(20)
        if mode == "two_messages":
            users = list(fleet.users)
            random.shuffle(users)
            halves = [users[0::2], users[1::2]]
            params = [message(f"{mode}-{i}", h, idempotency_key=f"{mode}-{i}") for i, h in enumerate(halves)]
            answers = send_concurrently([(c.a, params[0]), (c.b, params[1])])
            expected = fleet.expected(halves[0], params[0]["data"]["hx"]) | \
                fleet.expected(halves[1], params[1]["data"]["hx"])
            assert len({a["message_id"] for a in answers}) == 2, answers
        else:
            p = message(mode, fleet.users, idempotency_key=f"{mode}-key")
            answers = send_concurrently([(c.a, p), (c.b, p)])
            assert len({a["message_id"] for a in answers}) == 1, f"one idempotency key, two messages: {answers}"
            expected = fleet.expected(fleet.users, mode)
        assert sum(a["devices"] for a in answers) == (FANOUT_DEVICES if mode == "two_messages"
                                                      else 2 * FANOUT_DEVICES), answers
        statuses = wait_all_complete(c.a, {a["message_id"] for a in answers})
        gw.set_delay(0)
        states, sent_by = collections.Counter(), collections.Counter()
        for s in statuses.values():
            st, sb = detail_summary(s)
            states += st
            sent_by += sb
        assert states == {"delivered": FANOUT_DEVICES}, states
        if mode == "two_messages":
            # Each instance sends the message it accepted (the hand-over at commit) while it lives.
            assert set(sent_by) == {"host-a", "host-b"}, f"sent_by across the fan-out: {dict(sent_by)}"
        else:
            # One message: the instance that created it sends it; the other may claim what is queued.
            assert set(sent_by) <= {"host-a", "host-b"} and sent_by, f"sent_by: {dict(sent_by)}"
        result = ledger.judge(expected)
        assert not result["problems"], result["problems"][:20]
        record_counts(SUITE, **{f"fanout_{mode}_deliveries": len(expected),
                                f"fanout_{mode}_excused_resends": result["excused_resends"]})
        c.a.shutdown()
        c.b.shutdown()


def test_kill9_one_instance_mid_fanout(pg, fresh_gw):
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "kill", FANOUT_DEVICES)
    with Cluster(pg, gw, lease="3") as c:
        register_fleet(fleet, [c.a, c.b])
        gw.set_delay(100)
        p = message("kill", fleet.users, idempotency_key="kill-key")
        sent = c.a.call("push.send", p, timeout=120)
        assert sent["devices"] == FANOUT_DEVICES, sent
        # Mid-send: once the gateways have received a share of it (A sends it: the hand-over).
        wait_until(lambda: sum(gw.stats()["received"].get(g, 0) for g in GATEWAY_NAMES) >= FANOUT_DEVICES // 5,
                   timeout=120, what="a fifth of the fan-out at the gateways")
        c.a.kill9()
        kill_time = time.time()
        # What the dead instance held: leased to it until the lease runs out.
        held = {row[0] for row in pg.query(
            "SELECT device_id FROM deliveries WHERE state = 'in_flight' AND sent_by = 'host-a'", c.database)}
        gw.set_delay(0)
        status = wait_all_complete(c.b, [sent["message_id"]])[sent["message_id"]]
        states, sent_by = detail_summary(status)
        assert states == {"delivered": FANOUT_DEVICES}, states
        assert sent_by.get("host-b", 0) > 0, f"host-b sent none of the dead instance's work: {dict(sent_by)}"
        by_device = {x["device_id"]: x for x in status["devices"]}
        taken_over = [did for did in held if by_device[did]["sent_by"] != "host-b"]
        assert not taken_over, (f"{len(taken_over)} of the {len(held)} deliveries in flight at host-a's kill "
                                f"were not finished by host-b: {taken_over[:5]}")
        # Resends only of copies the gateways had received before the kill: sends host-a had in
        # flight, whose answers (even one the gateway wrote after the kill, into a dead
        # connection) it never recorded; at most one per delivery it held at its death.
        result = ledger.judge(fleet.expected(fleet.users, "kill"),
                              resend_allowed=lambda prev: (prev["time"] or 0) <= kill_time)
        assert not result["problems"], result["problems"][:20]
        assert result["excused_resends"] <= len(held), (result, len(held))
        record_counts(SUITE, kill_held_in_flight=len(held), kill_resends=result["excused_resends"])
        c.b.shutdown()


def _store_unavailable(d: Daemon, method: str, params: dict):
    resp = d.request(method, params, timeout=60)
    err = resp.get("error")
    assert err and err["code"] == -32603 and (err.get("data") or {}).get("reason") == "store_unavailable", \
        f"{method} during the database outage was answered {resp}"


def test_database_restart_mid_send(pg, fresh_gw):
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "outage", 2000)
    with Cluster(pg, gw) as c:
        register_fleet(fleet, [c.a, c.b])
        gw.set_delay(50)
        p = message("outage", fleet.users, idempotency_key="outage-key")
        sent = c.a.call("push.send", p, timeout=120)
        total = sent["devices"]
        wait_until(lambda: sum(gw.stats()["received"].get(g, 0) for g in GATEWAY_NAMES) >= total // 5,
                   timeout=120, what="a fifth of the send at the gateways")
        pg.stop()
        try:
            for d in (c.a, c.b):
                _store_unavailable(d, "device.register", {"user": "outage-new", "platform": "fcm", "token": "fcm-x"})
                _store_unavailable(d, "push.send", message("outage-refused", fleet.users[:1]))
                health = wait_until(lambda d=d: (h := d.call("system.health", timeout=60))["store"] != "ok" and h,
                                    timeout=60, what="system.health to report the store degraded")
                assert health["store"].startswith("degraded:"), health
        finally:
            pg.start()
        back = time.time()
        gw.set_delay(0)
        for d in (c.a, c.b):
            wait_until(lambda d=d: d.call("system.health", timeout=60)["store"] == "ok", timeout=60,
                       what="the store to be ok again once the database is back")
        status = wait_all_complete(c.b, [sent["message_id"]])[sent["message_id"]]
        states, _ = detail_summary(status)
        assert states == {"delivered": total}, states
        # Nothing refused during the outage was kept; new work is served again.
        assert c.b.devices("outage-new") == []
        c.b.register("outage-new", "fcm", "fcm-outage-new")
        again = c.a.send_wait({"to": {"users": ["outage-new"]}, "data": {"hx": "outage-after"},
                               "collapse_key": "ck-outage-after"})
        assert again["state"] == "complete" and again["devices"] == 1, again
        expected = fleet.expected(fleet.users, "outage") | {("fcm", "fcm-outage-new", "outage-after")}
        # A result held in memory through the outage is written later; a resend is allowed only for
        # a copy answered before the database was back.
        result = ledger.judge(expected, resend_allowed=lambda prev: (prev["answered_at"] or 0) <= back)
        assert not result["problems"], result["problems"][:20]
        assert result["excused_resends"] <= MAX_INFLIGHT * 2, result
        record_counts(SUITE, outage_calls_refused=4, outage_resends=result["excused_resends"])
        c.a.shutdown()
        c.b.shutdown()


def test_idempotency_and_rate_limits_across_instances(pg, fresh_gw):
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "idem", 20)
    with Cluster(pg, gw) as c:
        register_fleet(fleet, [c.a])
        expected = set()
        ids = []
        for i in range(20):
            p = message(f"idem-{i}", fleet.users, idempotency_key=f"idem-key-{i}")
            answers = send_concurrently([(c.a, p), (c.b, p)])
            assert answers[0]["message_id"] == answers[1]["message_id"], f"key {i}: {answers}"
            ids.append(answers[0]["message_id"])
            expected |= fleet.expected(fleet.users, p["data"]["hx"])
        assert len(set(ids)) == 20
        wait_all_complete(c.b, ids)
        result = ledger.judge(expected)
        assert not result["problems"], result["problems"][:20]
        assert result["copies"] == len(expected), result

        # The per-user registration limit is one bucket for both instances.
        t0 = time.monotonic()
        first = [c.a.request("device.register", {"user": "rl-user", "platform": "fcm", "token": f"fcm-rl-{i}"})
                 for i in range(REGISTER_PER_MINUTE)]
        assert all("result" in r for r in first), [r for r in first if "result" not in r][:3]
        more = [c.b.request("device.register", {"user": "rl-user", "platform": "fcm", "token": f"fcm-rl-b{i}"})
                for i in range(5)]
        elapsed = time.monotonic() - t0
        refused = [r for r in more if "error" in r]
        for r in refused:
            assert r["error"]["code"] == 1002 and (r["error"].get("data") or {}).get("reason") == "rate_limited" \
                and r["error"]["data"].get("retry_after_ms", 0) > 0, r
        # The bucket refills at 20 a minute: no more than that many can have come back meanwhile.
        refilled = int(elapsed * REGISTER_PER_MINUTE / 60)
        assert len(refused) >= len(more) - refilled, (f"host-b accepted {len(more) - len(refused)} of 5 after 20 "
                                                      f"through host-a in {elapsed:.1f} s: {more}")
        assert len(c.a.devices("rl-user")) == REGISTER_PER_MINUTE + len(more) - len(refused)
        record_counts(SUITE, idempotent_pairs=20, rate_limited_across=len(refused))
        c.a.shutdown()
        c.b.shutdown()


def _collect_events(d: Daemon, since: str, until, timeout=120, kinds=("delivery", "message_complete")):
    """Subscribes on ``d`` from ``since`` and reads events until ``until(events)`` holds."""
    out = []
    with RPC(d.socket, timeout=timeout) as c:
        c.call("events.subscribe", {"since": since, "kinds": list(kinds)})
        deadline = time.monotonic() + timeout
        while not until(out):
            left = deadline - time.monotonic()
            assert left > 0, f"events from {d.dir} incomplete after {timeout} s: {len(out)}"
            try:
                msg = c.read_json(timeout=min(left, 5))
            except TimeoutError:
                continue
            if msg.get("method") == "events":
                out += msg["params"]["events"]
    return out


def test_a_timed_send_accepted_by_one_goes_out_once_at_its_time_from_the_other(pg, fresh_gw):
    """A message held until `not_before` is rows in the shared store: host-a accepts it and is
    killed before its time; host-b sends every delivery once, none before its time."""
    gw = fresh_gw
    ledger = Ledger(gw)
    fleet = Fleet(gw, "timed", 40)
    with Cluster(pg, gw) as c:
        register_fleet(fleet, [c.a, c.b])
        due = time.time() + 4.0
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(due)) + f".{int(due * 1000) % 1000:03d}Z"
        sent = c.a.call("push.send", message("timed", fleet.users, not_before=at), timeout=60)
        assert sent["devices"] == 40, sent
        status = c.b.status(sent["message_id"])
        assert status["counts"]["held"] == 40, status["counts"]
        assert {x["due_at"] for x in status["devices"]} == {at}, status["devices"][:2]
        c.a.kill9()
        status = wait_all_complete(c.b, [sent["message_id"]])[sent["message_id"]]
        states, sent_by = detail_summary(status)
        assert states == {"delivered": 40} and set(sent_by) == {"host-b"}, (states, sent_by)
        result = ledger.judge(fleet.expected(fleet.users, "timed"))
        assert not result["problems"], result["problems"][:10]
        assert result["duplicates"] == 0 and result["copies"] == 40, result
        early = [copy for copies in ledger.copies.values() for copy in copies if copy["time"] < due - 0.05]
        assert not early, f"{len(early)} copies reached the gateways before their time: {early[:3]}"
        c.b.shutdown()


def test_a_subscriber_on_either_instance_sees_every_instances_events(pg, fresh_gw):
    """Two messages, one accepted (and sent) by each instance; a subscriber on each sees every
    delivery of both, once, in one cursor order; and the same order on both."""
    gw = fresh_gw
    fleet = Fleet(gw, "events", 100)
    with Cluster(pg, gw) as c:
        register_fleet(fleet, [c.a, c.b])
        half = len(fleet.users) // 2
        first, second = send_concurrently([
            (c.a, message("ev-a", fleet.users[:half])), (c.b, message("ev-b", fleet.users[half:]))])
        statuses = wait_all_complete(c.a, [first["message_id"], second["message_id"]])
        senders = set()
        want = set()
        for mid, status in statuses.items():
            for x in status["devices"]:
                want.add((mid, x["device_id"], x["state"]))
                senders.add(x["sent_by"])
        assert senders == {"host-a", "host-b"}, senders

        def complete(events):
            done = {e["message_id"] for e in events if e["kind"] == "message_complete"}
            return {first["message_id"], second["message_id"]} <= done

        seen = {}
        for name in ("host-a", "host-b"):
            events = _collect_events(c[name], "0", complete)
            got = [(e["message_id"], e["device_id"], e["state"]) for e in events if e["kind"] == "delivery"]
            assert len(got) == len(set(got)), f"{name}: an outcome twice"
            assert set(got) == want, (name, len(set(got) ^ want))
            keys = [tuple(int(x) for x in e["cursor"].split("-")) for e in events]
            assert keys == sorted(keys), f"{name}: not in cursor order"
            seen[name] = [e["cursor"] for e in events]
        assert seen["host-a"] == seen["host-b"], "both instances read one order"
        record_counts(SUITE, events_checked=sum(len(v) for v in seen.values()))
        c.a.shutdown()
        c.b.shutdown()
