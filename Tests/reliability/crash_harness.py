#!/usr/bin/env python3
"""Crash harness: `kill -9` herald at random moments of 5,000-device fan-outs and of
`device.register` bursts, restart it on the same state directory, and check what it
promised against the provider test gateways' own records.

Set-up: the gateways (Tests/gateways/gateways.py), herald with APNs, FCM and Web Push
configured against them (`max_inflight` 2000), and --devices devices (default 5,000) over users
of 10 devices each (4 APNs, 4 FCM, 2 Web Push, the subscriptions made at the gateway). About
1% of the devices are programmed at the gateways to answer with a permanent error
(APNs 400 BadDeviceToken, FCM INVALID_ARGUMENT, Web Push 400), so `failed` is exercised
too.

Fan-out rounds (--rounds, default 10). Each round:
  - sets a random gateway answer delay (delay_ms 0..800) so that sends are in flight;
  - programs a fresh 2% of the devices to answer one or two transient errors (APNs 429/500/503,
    FCM UNAVAILABLE/INTERNAL/QUOTA_EXCEEDED, Web Push 429/500/503; some with Retry-After)
    before they accept, so that deliveries are `retrying` with a backoff pending at the kills;
  - sends 1 to 3 `push.send` messages that together reach every device (the users
    split at random), and 1 or 2 timed messages (`not_before` 2-6 s after they are written, given
    in Z or with an offset) to a random few hundred devices, all pipelined on one connection in a
    random order, each with an idempotency key and
    `data` = {hx: its tag, pz: a random value, u: non-ASCII text} (the gateways see it in the
    APNs body, the FCM `message.data` and the decrypted Web Push plaintext: the tag ties a
    record to its message; the device comes from the APNs path token, FCM `message.token`
    and the Web Push subscription id);
  - kills herald with SIGKILL mid-enqueue (0.2-1.5 x the last accept time after the
    requests were written, answers possibly lost), mid-send (once the gateways have received
    a random fraction of the round's pushes) or mid-retry (once the gateways have answered
    some of the round's programmed transient errors) or mid-hold (one round of every run, and
    about a tenth of the others: at a random moment before the round's timed messages are due,
    restarted only once all of them are overdue, so that the restart must send them); sometimes
    kills it again in the middle of its recovery, once the gateways have received a random part
    of what it resends;
  - after each kill: waits until the gateways saw every connection close, reads their
    new records, copies herald.db (+ WAL) aside and reads which deliveries the store
    held `in_flight` (reported, and checked against the restart's `deliveries_recovered`),
    restarts herald on the same state, and sends every unanswered push.send again with its
    idempotency key (it must name the message the store committed before the kill, if it did);
  - checks once, before its due time, that push.status shows every device of a timed message
    `held` with `due_at` its not_before (to the millisecond) and `timing` naming not_before;
  - then either waits for every message so far to complete (but timed messages not due yet,
    which the next round's kill may find held) or goes straight on.
At the end: every message must reach `complete`.

Checks, judged by the gateways' records (each failure is listed and the exit status is 1):
  - every gateway record is a send of one of the run's messages to a device the harness
    registered, whole and valid (JWTs, VAPID, encryption): a record without the run's tag
    (say, a resend with its data dropped) or for an unknown token is a failure;
  - every copy of every delivery carries what was sent: the APNs body is the data beside an
    `aps` dictionary, FCM `message.data` is the data plus Herald's `kind`, the decrypted Web
    Push plaintext's `data` is the data; and each copy equals the first copy of that message on
    its platform (APNs body as JSON with apns-push-type/priority/topic/collapse-id; the FCM
    message as JSON but its token and the remaining `android.ttl`; the Web Push plaintext with
    Topic and Urgency);
  - every push.send answer counts the devices of its users; push.status lists exactly
    those devices; each ended `delivered` (the gateway accepted a copy, 2xx, and refused none),
    or `failed` for a device programmed to fail (the gateway refused it with that error and
    accepted none); none pending, none missing;
  - duplicates: a copy that follows one the gateway answered finally (2xx or the programmed
    refusal) is a resend of a finished delivery. Across a kill it counts against the kill that
    ended the earlier copy's life: after kill k only deliveries the gateways had answered in life
    k may come again, at most `max_inflight` of them (no more can be out, their answers not yet
    taken in, when herald dies). Within one life it is allowed only when the gateway never wrote
    the earlier copy's answer, or herald PINGed that connection afterwards (it does so at once
    when a request there passes its deadline: an ambiguous failure). Anything else is a failure.
    The store's `in_flight` rows are not used for this allowance;
  - at least one kill found deliveries in retry (their last copy answered with a transient
    error) at the gateways;
  - timed messages (judged by the time each gateway record was received; gateways and herald
    share the host clock): no copy was received before its not_before (50 ms allowed for clock
    granularity); the first copy is not late: from when it could go, max(not_before, the start of
    the life that sent it, the write of the push.send that made the message), to its receipt,
    herald never sat idle (no gateway receiving anything) for more than 5 s + the gateway delay
    then in effect. (It may wait longer behind deliveries due before it, as claims go by due time
    and a restart has a whole fan-out to send: reported as waited_behind_earlier, with the
    latest first copy.) Each ended as any other delivery (once, with the same duplicate rule across
    kills); its final push.status still has `due_at` = not_before and `timing` with not_before
    (when accepted before its time), and the event stream carried its `held` event (those seen
    held). At least one kill found timed deliveries held in the store (queued, due after the
    kill), at least one restart found some overdue, and the held state was read before a due
    time at least once;
  - an unanswered push.send retried with its idempotency key returns the message the
    store had committed (no second message for one key);
  - the event stream: a subscriber (its own connection, subscribed from the start with
    `events.subscribe`) reads `delivery` and `message_complete` events, and each time herald is
    killed it connects again and subscribes `since` the last cursor it read. Every delivery
    checked above must have reached it as a `delivery` event with its final state (once, or
    more across a reconnect: at least once), every message as a `message_complete`.

Register-burst mode (--bursts, default 3): --burst-size registrations (default 2,000,
10 per fresh user, mixed platforms, each with a name and app_version) pipelined on 4
connections; SIGKILL at a random moment mid-burst; restart. Then every registration
answered with success must be in device.list with every field as registered; every
listed device must be one of the burst's registrations, whole (token_hash, platform,
environment, name, app_version as sent: no half-written row); re-registering every
unanswered one must say `created: false` exactly for those listed. Finally one push to
the burst's users must be delivered to every listed device (the sealed tokens and keys
are readable) and received by the gateways.

--backend postgres runs the same on PostgreSQL (SPEC.md Revision 2, "Beyond one host"): a
private server (pg_server.py: initdb in a temporary directory, a Unix socket only) and a fresh
database; the daemon's [store] names it (backend, dsn, password_file, pool_size, lease) instead
of SQLite's file. The store snapshot after each kill is read from the database (the rows in
flight, the states, the committed messages) rather than from a copy of herald.db. `make test`
runs it with fewer rounds (make test-crash-postgres).

Prints rounds, kills, deliveries checked, payload copies compared, duplicates against their
bound, deliveries in retry at the kills, timed deliveries (held at kills, early, latest),
registrations checked; writes a JSON summary (--out). The daemon's stderr (all starts)
is kept in the work directory and copied next to the summary.

    HERALD_BIN=.build/debug/herald .venv/bin/python Tests/reliability/crash_harness.py
"""
import argparse
import bisect
import datetime
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from herald_fixtures import (  # noqa: E402
    GATEWAY_NAMES, REPO, RPC, Daemon, Gateways, HarnessFailure, ProtocolViolation, herald_binary,
    log, tail, token_hash)
from pg_server import PostgresServer  # noqa: E402

PER_USER = (("apns", 4), ("fcm", 4), ("web", 2))
FAIL_SHARE = 0.01
DELAYS_MS = (0, 50, 200, 400, 800)
GATEWAY_OF = {"apns": "apns", "fcm": "fcm", "web": "webpush"}
FAIL_PROGRAM = {
    "apns": ({"status": 400, "reason": "BadDeviceToken"}, "BadDeviceToken"),
    "fcm": ({"error": "INVALID_ARGUMENT"}, "INVALID_ARGUMENT"),
    "web": ({"status": 400}, None),  # the reason Herald records for a bare 400 is its own
}
DELIVERY = {"max_retries": 8, "backoff_base_ms": 200, "backoff_max_ms": 2000}
# [server] max_inflight: at most this many deliveries can be out (sent, their answer not yet taken in)
# when herald dies, so at most this many can be sent again after one kill.
MAX_INFLIGHT = 2000
# In each round ~2% of the devices (others each round) answer one or two transient errors (with and
# without Retry-After) before a success, so that kills find deliveries `retrying` with backoff
# pending. A device is programmed once in the run: its deliveries can never use up max_retries.
TRANSIENT_SHARE = 0.02
TRANSIENT_PROGRAM = {
    "apns": ([{"status": 503}, {"status": 429, "retry_after": 1}, {"status": 500}], {"status": 200}),
    "fcm": ([{"error": "UNAVAILABLE", "retry_after": 1}, {"error": "INTERNAL"}, {"error": "QUOTA_EXCEEDED"}],
            {"status": 200}),
    "web": ([{"status": 503}, {"status": 429, "retry_after": 1}, {"status": 500}, {"status": 503, "retry_after": 1}],
            {"status": 201}),
}
TRANSIENT_STATUS = (429, 500, 502, 503, 504)
# Timed sends: in every round 1 or 2 messages with `not_before` 2-6 s after they are written (kills
# land before, around and after their time), each to TIMED_USERS users (at most a quarter of them).
TIMED_AHEAD_S = (2.0, 6.0)
TIMED_USERS = 20
TIMED_OFFSETS_MIN = (0, 0, 0, 330, -240, 60)   # not_before in Z, or the same instant with an offset
# A gateway record of a timed message received before its not_before - EARLY_TOLERANCE_S is early;
# its first copy later than LATE_BOUND_S (+ the gateway delay in effect) after it could go is late.
EARLY_TOLERANCE_S = 0.05
LATE_BOUND_S = 5.0
HOLD_SHARE = 0.1    # rounds killed mid-hold besides the one every run has
# Per message, its deliveries the store holds queued with a due time (a held delivery is a queued row
# with held_until: docs/interface.md, "Each device's own rules"); the same on both backends.
QUEUED_TIMED_SQL = ("SELECT message_id, count(*) FROM deliveries WHERE state = 'queued' AND held_until IS NOT NULL "
                    "GROUP BY message_id")


def rfc3339_ms(ms, offset_min=0):
    """The instant `ms` (ms since the epoch) as RFC 3339 with milliseconds, in Z or at an offset."""
    tz = datetime.timezone(datetime.timedelta(minutes=offset_min))
    dt = datetime.datetime.fromtimestamp(ms // 1000, tz).replace(microsecond=(ms % 1000) * 1000)
    text = dt.isoformat(timespec="milliseconds")
    return text[:-6] + "Z" if offset_min == 0 else text


def epoch_ms(text):
    """An RFC 3339 instant as ms since the epoch (None when it is not one)."""
    try:
        dt = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except (AttributeError, TypeError, ValueError):
        return None
    if dt.tzinfo is None:
        return None
    return (dt - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)) // datetime.timedelta(milliseconds=1)


class Failures:
    def __init__(self):
        self.items = []

    def add(self, what):
        self.items.append(what)
        if len(self.items) <= 50:
            log(f"  FAIL: {what}")

    def __bool__(self):
        return bool(self.items)


# ---------------------------------------------------------------- the harness


class EventWatcher:
    """A subscriber to herald's event stream that resumes by cursor across kills (its own thread):
    every delivery's final outcome it read, as (message_id, device_id) -> [state, ...]."""

    KINDS = ["delivery", "message_complete"]

    def __init__(self, socket_path):
        self.socket_path = socket_path
        self.cursor = None
        self.finals = {}
        self.complete = set()
        self.events = 0
        self.subscriptions = 0
        self.gaps = []
        self.lock = threading.Lock()
        self.stopping = False
        self.thread = threading.Thread(target=self.run, name="event-watcher", daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping = True
        self.thread.join(timeout=10)

    def run(self):
        while not self.stopping:
            try:
                with RPC(self.socket_path, timeout=5) as c:
                    params = {"kinds": self.KINDS, "since": self.cursor or "0"}
                    c.call("events.subscribe", params)
                    with self.lock:
                        self.subscriptions += 1
                    while not self.stopping:
                        try:
                            msg = c.read_json(timeout=1)
                        except TimeoutError:
                            continue
                        if msg.get("method") == "events":
                            self.take(msg["params"])
            except (OSError, EOFError, ValueError, ConnectionError):
                time.sleep(0.2)   # killed: subscribe again since the last cursor once it is back
            except Exception:  # noqa: BLE001 - an RPC error while it starts: try again
                time.sleep(0.2)

    def take(self, params):
        with self.lock:
            for e in params["events"]:
                self.events += 1
                if e["kind"] == "gap":
                    self.gaps.append(e)
                elif e["kind"] == "delivery":
                    self.finals.setdefault((e["message_id"], e["device_id"]), []).append(e["state"])
                elif e["kind"] == "message_complete":
                    self.complete.add(e["message_id"])
            # Resume after the notification's cursor (past the last event, or at it).
            if params["events"] and params["events"][-1]["kind"] != "gap":
                self.cursor = params["cursor"]

    def wait_for(self, message_ids, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if set(message_ids) <= self.complete:
                    return True
            time.sleep(0.1)
        return False


class Harness:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = tempfile.mkdtemp(prefix="herald-crash-")
        self.failures = Failures()
        self.gw = None
        self.daemon = None
        self.pg = None             # --backend postgres: the private server
        self.database = None
        # device bookkeeping
        self.devices = {}          # device_id -> {user, platform, gw, token, gw_token, fail}
        self.by_gw_token = {}      # (gateway, gateway token) -> device_id
        self.user_devices = {}     # user -> [device_id]
        # messages
        self.messages = {}         # tag -> {message_id, devices, users, round, answered_at}
        self.tag_by_id = {}        # message_id -> tag
        self.unanswered = []       # tags sent and not answered before a kill
        # gateway records
        self.seq = {g: 0 for g in GATEWAY_NAMES}
        self.receipts = {}         # (tag, device_id) -> [life, ...] of its copies the gateway answered finally
        self.copies = {}           # (tag, device_id) -> [copy, ...]: every request the gateway recorded, in order
        self.reference = {}        # (tag, platform) -> (seq, the first copy's payload and headers)
        self.by_collapse = {}      # collapse id / Topic -> tag (to name the message of a record without its tag)
        self.invalid_records = []
        self.stray_records = 0
        self.payload_mismatches = 0
        self.transient_devices = []
        self.life = 0              # index of the daemon's current life (kills so far)
        # kills
        self.kills = []            # per kill: {round, mode, in_flight (set of (mid, did)), ...}
        self.rounds = []
        self.timings = {}
        self.accept_s = 0.2        # last time from writing a round's push.send to its last answer
        self.watcher = None        # the event stream's subscriber (EventWatcher)
        # timed messages (not_before)
        self.life_start = []       # per life: the wall time its daemon answered system.health
        self.delays = [(0.0, 0)]   # (wall time, gateway delay_ms set then)
        self.hold_round = None     # the round killed mid-hold in every run
        self.held_seen = set()     # (message_id, device_id) push.status showed held before its time
        self.held_status_checked = 0
        self.held_status_unjudged = 0   # checks answered after the due time: states not judged
        self.record_times = []     # every gateway record's receive time (sorted at verify: herald's idle gaps)

    # ------------------------------------------------------------ plumbing

    def rpc(self, timeout=120):
        return RPC(self.daemon.socket, timeout=timeout)

    def start(self):
        t0 = time.monotonic()
        self.daemon.start(timeout=60, probe_timeout=5)
        return time.monotonic() - t0

    def setup(self):
        t0 = time.monotonic()
        self.gw = Gateways(self.work, timeout=120)
        server = {"max_inflight": MAX_INFLIGHT}
        if self.args.backend == "postgres":
            self.pg = PostgresServer()
            self.database = self.pg.create_database()
            store = self.pg.store_config(self.database, pool_size=8, lease=self.args.lease)
            server["instance_id"] = "crash-a"
            log(f"PostgreSQL {self.pg.dir} (database {self.database}), lease {self.args.lease}")
        else:
            store = {"synchronous": "full"}
        self.daemon = Daemon(binary=self.args.herald, directory=self.work, gateways=self.gw, delivery=DELIVERY,
                             store=store, server=server, log_level="info", start=False)
        self.start()
        self.life_start.append(time.time())
        self.watcher = EventWatcher(self.daemon.socket)
        self.watcher.start()
        log(f"herald {self.args.herald} on {self.work} (pid {self.daemon.pid}), gateways pid {self.gw.pid}, "
            f"seed {self.args.seed}")
        per_user = sum(n for _, n in PER_USER)
        users = [f"u{i:04d}" for i in range(self.args.devices // per_user)]
        params = self.device_params(users, "fan", with_fields=False)
        self.register_all(params)
        self.fan_users = users
        # ~1% of the devices answer with a permanent error, on every platform
        ids = [d for u in users for d in self.user_devices[u]]
        failing = self.rng.sample(ids, max(3, int(len(ids) * FAIL_SHARE)))
        for did in failing:
            d = self.devices[did]
            prog, _ = FAIL_PROGRAM[d["platform"]]
            self.gw.post("/control/program", {"gateway": d["gw"], "token": d["gw_token"], "responses": [prog]})
            d["fail"] = True
        # the devices that answer transient errors first, a fresh set in every round
        self.transient_pool = [did for did in ids if not self.devices[did]["fail"]]
        self.rng.shuffle(self.transient_pool)
        self.transient_n = max(3, int(len(ids) * TRANSIENT_SHARE))
        self.timings["setup_s"] = round(time.monotonic() - t0, 1)
        log(f"registered {len(self.devices)} devices over {len(users)} users in {self.timings['setup_s']} s "
            f"({len(failing)} programmed to fail permanently, {self.transient_n} more in every round to answer "
            f"transient errors first)")

    def set_delay(self, ms):
        self.gw.set_delay(ms)
        self.delays.append((time.time(), ms))

    def delay_between(self, t0, t1):
        """The largest gateway delay (ms) in effect at some moment of [t0, t1]."""
        inside = [ms for t, ms in self.delays if t0 <= t <= t1]
        before = [ms for t, ms in self.delays if t < t0]
        return max(inside + before[-1:] or [0])

    def program_transients(self):
        """A fresh set of devices answers 1 or 2 transient errors (429/500/503, with or without
        Retry-After) before it accepts; the success stays programmed once the errors are used up."""
        self.transient_devices = self.transient_pool[:self.transient_n]
        del self.transient_pool[:self.transient_n]
        for did in self.transient_devices:
            d = self.devices[did]
            errors, ok = TRANSIENT_PROGRAM[d["platform"]]
            seq = [dict(self.rng.choice(errors)) for _ in range(self.rng.choice((1, 1, 2)))] + [ok]
            self.gw.post("/control/program", {"gateway": d["gw"], "token": d["gw_token"], "responses": seq})

    def transient_answers(self):
        """Transient errors the gateways have answered as programmed so far (their own counters)."""
        c = self.gw.stats()["counters"]
        return sum(v for k, v in c.items() if "_programmed_" in k and k.rsplit("_", 1)[1].isdigit()
                   and int(k.rsplit("_", 1)[1]) in TRANSIENT_STATUS)

    def device_params(self, users, prefix, with_fields):
        """Registration params for `users` (10 devices each); remembers what each is."""
        params = []
        for user in users:
            ui = len(self.user_devices)
            self.user_devices.setdefault(user, [])
            k = 0
            for platform, n in PER_USER:
                for _ in range(n):
                    p = {"user": user, "platform": platform}
                    if platform == "apns":
                        tok = f"{zlib.crc32(prefix.encode()):08x}{ui:024x}{k:032x}"
                        p["token"] = tok
                        meta = {"gw": "apns", "gw_token": tok, "token": tok}
                    elif platform == "fcm":
                        tok = f"fcm-{prefix}-{user}-{k}"
                        p["token"] = tok
                        meta = {"gw": "fcm", "gw_token": tok, "token": tok}
                    else:
                        s = self.gw.subscription()
                        p["token"] = s["endpoint"]
                        p["keys"] = {"p256dh": s["p256dh"], "auth": s["auth"]}
                        meta = {"gw": "webpush", "gw_token": s["id"], "token": s["endpoint"]}
                    if with_fields:
                        p["name"] = f"dev {user}/{k}"
                        p["app_version"] = f"2.{k}.{ui % 97}"
                        if platform == "apns":
                            p["environment"] = "production" if k % 2 else "development"
                            if p["environment"] == "development":
                                meta["gw"] = "apns_dev"   # APNs development is a host of its own
                    meta.update(user=user, platform=platform, fail=False, params=p)
                    params.append((p, meta))
                    k += 1
        return params

    def adopt(self, did, meta):
        old = self.devices.get(did)
        if old is not None and old["token"] != meta["token"]:
            raise HarnessFailure(f"device_id {did} answered for two different tokens")
        self.devices[did] = meta
        self.by_gw_token[(meta["gw"], meta["gw_token"])] = did
        if did not in self.user_devices[meta["user"]]:
            self.user_devices[meta["user"]].append(did)

    def register_all(self, params):
        t0 = time.monotonic()
        with self.rpc() as c:
            answers = c.pipelined("device.register", [p for p, _ in params])
        self.reg_s = (time.monotonic() - t0) / max(1, len(params))
        for (p, meta), a in zip(params, answers):
            if "result" not in a:
                raise HarnessFailure(f"registration failed: {a}")
            if a["result"]["token_hash"] != token_hash(p["token"].lower() if p["platform"] == "apns" else p["token"]):
                raise HarnessFailure(f"token_hash of {p['platform']} device is not sha256('push:'+token): {a}")
            self.adopt(a["result"]["device_id"], meta)

    # ------------------------------------------------------------ gateway records

    def fetch_records(self):
        """Reads the gateways' new records as copies of the current life. Each must be a whole
        send of a known message to a known device carrying exactly the payload that was sent:
        the data of the push.send, and the same body / plaintext and headers as every other copy
        of that message on that platform (the first one seen is the reference). A record that is
        not (a tag of the run's message, a device the harness registered) is a failure."""
        n = 0
        for g in GATEWAY_NAMES:
            recs = self.gw.received(g, since=self.seq[g], kind="send" if g == "fcm" else None)
            for r in recs:
                self.seq[g] = max(self.seq[g], r["seq"])
                if r.get("time") is not None:
                    self.record_times.append(r["time"])
                if g == "fcm" and r.get("kind", "send") != "send":
                    continue
                n += 1
                self.take_record(g, r)
            # keep the seq even when the list came back empty
        return n

    def take_record(self, g, r):
        if r.get("unprocessed") and r.get("response") is None:
            return  # above a GOAWAY's last stream: the provider never processed it
        headers = r.get("headers") or {}
        body = r.get("body") if isinstance(r.get("body"), dict) else None
        if g in ("apns", "apns_dev"):
            data = {k: v for k, v in body.items() if k != "aps"} if body is not None else None
            collapse = headers.get("apns-collapse-id")
            aps_ok = body is not None and isinstance(body.get("aps"), dict)
            canon = (json.dumps(body, sort_keys=True), headers.get("apns-push-type"), headers.get("apns-priority"),
                     headers.get("apns-topic"), collapse)
        elif g == "fcm":
            msg = (body or {}).get("message")
            msg = msg if isinstance(msg, dict) else None
            data = (msg or {}).get("data")
            collapse = ((msg or {}).get("android") or {}).get("collapse_key")
            aps_ok = msg is not None
            # android.ttl is what is left of the TTL at the send: it alone may differ between copies
            android = dict((msg or {}).get("android") or {})
            ttl = android.pop("ttl", None)
            canon = (json.dumps({**{k: v for k, v in (msg or {}).items() if k not in ("token", "android")},
                                 "android": android}, sort_keys=True),)
            if not (isinstance(ttl, str) and ttl.endswith("s") and ttl[:-1].isdigit() and int(ttl[:-1]) <= 86400):
                aps_ok = False
        else:
            pj = r.get("plaintext_json")
            data = pj.get("data") if isinstance(pj, dict) else None
            collapse = headers.get("topic")
            aps_ok = isinstance(pj, dict) and pj.get("kind") == "notification"
            canon = (r.get("plaintext"), collapse, headers.get("urgency"))
        tag = data.get("hx") if isinstance(data, dict) else None
        did = self.by_gw_token.get((g, r.get("token")))
        if not r.get("valid", False):
            self.invalid_records.append({"gateway": g, "seq": r["seq"], "errors": r.get("errors"),
                                         "token": r.get("token"), "life": self.life})
        if tag not in self.messages or did is None:
            # a send of something the run never sent, or to a token it never registered: e.g. a
            # recovery that resends a delivery with its data dropped or garbled
            self.stray_records += 1
            guess = self.by_collapse.get(collapse)
            self.failures.add(f"gateway {g} record {r['seq']} (life {self.life}) is no send of this run: tag {tag!r}"
                              f"{'' if tag in self.messages else ' (unknown)'}, device "
                              f"{did or 'unknown token'}, collapse id {collapse!r}"
                              f"{f' (that of {guess})' if guess else ''}, data {json.dumps(data)[:200]}")
            return
        pair = (tag, did)
        m = self.messages[tag]
        status = (r.get("response") or {}).get("status")
        cls = "ok" if status is not None and 200 <= status < 300 else \
            "transient" if status is None or status in TRANSIENT_STATUS else "error"
        copy = {"life": self.life, "seq": r["seq"], "status": status, "cls": cls,
                "answered": r.get("answered_at") is not None, "collapse": collapse,
                "conn": r.get("conn"), "time": r.get("time")}
        self.copies.setdefault(pair, []).append(copy)
        if cls != "transient":
            self.receipts.setdefault(pair, []).append(self.life)
        if collapse:
            self.by_collapse.setdefault(collapse, tag)
        problems = []
        # FCM's data carries Herald's `kind` beside the message's data (docs/delivery.md)
        sent = m["params"]["data"] if g != "fcm" else {"kind": "notification", **m["params"]["data"]}
        if data != sent:
            problems.append(f"data {json.dumps(data)[:300]} != sent {json.dumps(sent)}")
        if not aps_ok:
            problems.append("no aps dictionary" if g in ("apns", "apns_dev") else "no message, or android.ttl is not <= 86400s"
                            if g == "fcm"
                            else "plaintext is not {kind: notification, ...}")
        if g == "fcm" and (body or {}).get("message", {}).get("token") != self.devices[did]["gw_token"]:
            problems.append("message.token is not the device's")
        ref = self.reference.setdefault((tag, self.devices[did]["platform"]), (r["seq"], did, canon))
        if ref[2] != canon:
            diff = [f"{a!r:.300} (reference {b!r:.300})" for a, b in zip(canon, ref[2]) if a != b]
            problems.append(f"differs from the first copy of {tag} on {g} (record {ref[0]}, device {ref[1]}): "
                            + "; ".join(diff))
        if problems:
            self.payload_mismatches += 1
            self.failures.add(f"gateway {g} record {r['seq']} (life {self.life}) of {tag} to {did}: "
                              + " / ".join(problems))

    def received_total(self):
        st = self.gw.stats()["received"]
        return sum(st.get(g, 0) for g in GATEWAY_NAMES)

    def wait_gateways_idle(self, timeout=10):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.gw.open_connections() == 0:
                return time.monotonic() - t0
            time.sleep(0.02)
        log("  (gateways still report open connections 10 s after the kill)")
        return None

    # ------------------------------------------------------------ store snapshot

    def store_files(self):
        """SQLite: sizes of herald.db and its WAL; PostgreSQL: the database's size (no WAL file)."""
        if self.pg is None:
            return self.daemon.store_files()
        size = int(self.pg.psql(f"SELECT pg_database_size('{self.database}')"))
        return {"herald.db": size, "herald.db-wal": 0}

    def snapshot_in_flight(self, index):
        """Copies herald.db (+WAL) of the dead daemon and reads what the store holds (on
        PostgreSQL: reads it from the database, which outlives the daemon): the deliveries in flight,
        the count per state, the committed messages by tag, and per message the queued rows with a
        due time (held, or due and not yet claimed)."""
        if self.pg is not None:
            return self.snapshot_postgres()
        snap = os.path.join(self.work, f"snap-{index}")
        os.makedirs(snap)
        for suffix in ("", "-wal"):
            src = os.path.join(self.work, "herald.db" + suffix)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(snap, "herald.db" + suffix))
        db = sqlite3.connect(os.path.join(snap, "herald.db"))
        try:
            in_flight = set(db.execute("SELECT message_id, device_id FROM deliveries WHERE state = 'in_flight'"))
            states = dict(db.execute("SELECT state, count(*) FROM deliveries GROUP BY state"))
            queued_timed = dict(db.execute(QUEUED_TIMED_SQL))
            committed = {}
            for mid, payload in db.execute("SELECT message_id, payload FROM messages"):
                try:
                    tag = (json.loads(payload).get("data") or {}).get("hx")
                except (ValueError, AttributeError):
                    tag = None
                if tag:
                    committed.setdefault(tag, []).append(mid)
        finally:
            db.close()
        shutil.rmtree(snap, ignore_errors=True)
        return in_flight, states, committed, queued_timed

    def snapshot_postgres(self):
        q = self.pg.query
        in_flight = {(m, d) for m, d in q("SELECT message_id, device_id FROM deliveries WHERE state = 'in_flight'",
                                          self.database)}
        states = {st: int(n) for st, n in q("SELECT state, count(*) FROM deliveries GROUP BY state", self.database)}
        committed = {}
        # payload as one line: json text never holds a raw newline, but be sure
        for mid, tag in q("SELECT message_id, coalesce(payload::jsonb -> 'data' ->> 'hx', '') FROM messages",
                          self.database):
            if tag:
                committed.setdefault(tag, []).append(mid)
        queued_timed = {m: int(n) for m, n in q(QUEUED_TIMED_SQL, self.database)}
        return in_flight, states, committed, queued_timed

    # ------------------------------------------------------------ kill and restart

    def kill_and_restart(self, round_no, mode, conn=None, stats_before=None, extra=None, restart_at=None):
        """SIGKILL now; collect what the gateways saw and what the store held; restart (not before
        the wall time `restart_at`, when given); retry the unanswered sends."""
        t_kill = time.time()
        self.daemon.kill9()
        answered_late = []
        if conn is not None:
            # answers already written before the kill are still in our socket buffer
            try:
                while conn.pending:
                    answered_late.append(conn.read())
            except (ConnectionError, OSError, ProtocolViolation) as e:
                if isinstance(e, ProtocolViolation):
                    self.failures.add(f"round {round_no}: malformed answer read after the kill: {e}")
            conn.close()
        idle_s = self.wait_gateways_idle()
        got = self.fetch_records()
        index = len(self.kills)
        # the gateways' view of the retry state killed mid-way: deliveries whose last copy so far
        # was answered with a transient error in this life (herald held them `retrying`, or was
        # about to)
        retrying = sum(1 for cps in self.copies.values()
                       if cps[-1]["life"] == self.life and cps[-1]["cls"] == "transient" and cps[-1]["answered"])
        files = self.store_files()
        in_flight, states, committed, queued_timed = self.snapshot_in_flight(index)
        # timed messages' deliveries the store held queued with a due time: held (due after the kill),
        # or due and not claimed yet
        timed_queued = {}
        for tag, mids in committed.items():
            m = self.messages.get(tag)
            if m is not None and m.get("not_before") is not None:
                n = sum(queued_timed.get(mid, 0) for mid in mids)
                if n:
                    timed_queued[tag] = n
        held = sum(n for tag, n in timed_queued.items() if self.messages[tag]["not_before"] > t_kill)
        if restart_at is not None and restart_at > time.time():
            time.sleep(restart_at - time.time())
        t_restart = time.time()
        self.life += 1
        restart_s = self.start()
        self.life_start.append(time.time())
        recovered = self.daemon.log_lines("deliveries_recovered", current_start_only=True)
        rec_count = 0
        if recovered:
            try:
                rec_count = int(recovered[-1].split("count=")[1].split()[0].strip('"'))
            except (IndexError, ValueError):
                pass
        k = {"index": index, "round": round_no, "mode": mode, "time": t_kill,
             "in_flight": in_flight, "in_flight_n": len(in_flight),
             "stats_in_flight": stats_before, "store_states": states,
             "recovered_logged": rec_count, "restart_s": round(restart_s, 2),
             "gateways_idle_s": None if idle_s is None else round(idle_s, 2),
             "records_fetched": got, "committed_tags": committed, "store_files_bytes": files,
             "retrying_at_kill": retrying, "held_at_kill": held,
             "held_due_unclaimed_at_kill": sum(timed_queued.values()) - held,
             "held_overdue_at_restart": sum(n for tag, n in timed_queued.items()
                                            if self.messages[tag]["not_before"] <= t_restart),
             "down_s": round(t_restart - t_kill, 2)}
        if extra:
            k.update(extra)
        if rec_count is not None and rec_count != len(in_flight):
            self.failures.add(f"kill {index}: the store held {len(in_flight)} deliveries in_flight, "
                              f"but the restart logged deliveries_recovered count={rec_count}")
        self.kills.append(k)
        return k, answered_late

    def retry_unanswered(self, kill):
        """Sends every unanswered push.send again with its idempotency key."""
        if not self.unanswered:
            return 0
        tags = list(self.unanswered)
        self.unanswered = []
        t_written = time.time()
        with self.rpc() as c:
            answers = c.pipelined("push.send", [self.messages[t]["params"] for t in tags])
        for tag, a in zip(tags, answers):
            self.messages[tag]["retry_written_at"] = t_written
            if "result" not in a:
                raise HarnessFailure(f"retry of {tag} failed: {a}")
            self.accept(tag, a["result"], retried=True)
            was = kill["committed_tags"].get(tag, [])
            m = self.messages[tag]
            m["committed_before_kill"] = bool(was)
            if not was:
                # the store never held it: copies sent before the kill were early sends (SQLite
                # sends a message while its commit is under way), which no in_flight row covers
                m["uncommitted_at_kill"] = kill["index"]
            if len(was) > 1:
                self.failures.add(f"{tag}: the store held {len(was)} messages for one idempotency key: {was}")
            if was and a["result"]["message_id"] not in was:
                self.failures.add(f"{tag}: committed as {was} before kill {kill['index']}, but the retry with "
                                  f"its idempotency key answered a new message {a['result']['message_id']}")
        return len(tags)

    def accept(self, tag, result, retried=False):
        m = self.messages[tag]
        mid = result["message_id"]
        if m.get("message_id") and m["message_id"] != mid:
            self.failures.add(f"{tag}: answered as {m['message_id']} and later as {mid}")
        m["message_id"] = mid
        m["devices"] = result["devices"]
        m["skipped"] = result["skipped"]
        m["retried"] = retried
        self.tag_by_id[mid] = tag
        if result["devices"] != len(m["expected"]) or result["skipped"] != 0:
            self.failures.add(f"{tag} ({mid}): accepted {result['devices']} devices, skipped {result['skipped']}, "
                              f"expected {len(m['expected'])} and 0")

    # ------------------------------------------------------------ fan-out rounds

    def new_message(self, tag, users, round_no, not_before_ms=None):
        expected = {d for u in users for d in self.user_devices[u]}
        # the tag ties a record to its message; the rest must come back unchanged in every copy
        data = {"hx": tag, "pz": f"{self.rng.getrandbits(64):016x}", "u": f"\u00fc\u2713 {tag} \"q\""}
        params = {"to": {"users": users}, "data": data, "idempotency_key": f"crash-{self.args.seed}-{tag}",
                  "collapse_key": f"ck-{tag}"}
        self.messages[tag] = {"tag": tag, "users": users, "expected": expected, "round": round_no,
                              "params": params, "message_id": None}
        if not_before_ms is not None:
            # a timed message: held until not_before (given in Z or with an offset: the same instant)
            params["not_before"] = rfc3339_ms(not_before_ms, self.rng.choice(TIMED_OFFSETS_MIN))
            self.messages[tag].update(not_before=not_before_ms / 1000, not_before_ms=not_before_ms)
        return params

    def fanout_round(self, r):
        rng = self.rng
        delay = rng.choice(DELAYS_MS)
        self.set_delay(delay)
        self.program_transients()
        k = rng.choice((1, 1, 2, 3))
        users = list(self.fan_users)
        rng.shuffle(users)
        groups = [users[i::k] for i in range(k)]
        tags = [f"r{r:02d}m{j}" for j in range(k)]
        params = [self.new_message(t, g, r) for t, g in zip(tags, groups)]
        total = sum(len(self.messages[t]["expected"]) for t in tags)
        hold = r == self.hold_round or rng.random() < HOLD_SHARE
        x = rng.random()
        mode = "hold" if hold else "enqueue" if x < 0.3 else "retry" if x < 0.55 else "send"
        # timed messages: 1 or 2, each to a random 200 devices, due 2-6 s after they are written
        # (at least 3 s when killed mid-hold: time for the answers before the kill)
        per = min(TIMED_USERS, max(1, len(self.fan_users) // 4))
        timed = [f"r{r:02d}t{j}" for j in range(rng.choice((1, 2)))]
        ahead = (max(3.0, TIMED_AHEAD_S[0]), TIMED_AHEAD_S[1]) if hold else TIMED_AHEAD_S
        now_ms = int(time.time() * 1000)
        params += [self.new_message(t, rng.sample(self.fan_users, per), r,
                                    not_before_ms=now_ms + int(rng.uniform(*ahead) * 1000)) for t in timed]
        sends = list(zip(tags + timed, params))
        rng.shuffle(sends)
        base = self.received_total()
        base_transient = self.transient_answers()
        mon = self.rpc(timeout=30)
        c = self.rpc(timeout=60)
        t0 = time.monotonic()
        t_written = time.time()
        ids = c.send_many("push.send", [p for _, p in sends])
        id_tag = dict(zip(ids, [t for t, _ in sends]))
        for t in tags + timed:
            self.messages[t]["written_at"] = t_written
        stats = None
        restart_at = None
        info = {"delay_ms": delay, "messages": k,
                "timed": [{"tag": t, "devices": len(self.messages[t]["expected"]),
                           "due_in_s": round(self.messages[t]["not_before"] - t_written, 3),
                           "not_before": self.messages[t]["params"]["not_before"]} for t in timed]}
        if mode == "enqueue":
            # somewhere between writing the requests and the last answer (as last measured)
            time.sleep(rng.uniform(0.2, 1.5) * self.accept_s)
            answered = []
        else:
            answered = [c.read() for _ in ids]
            self.accept_s = time.monotonic() - t0
            info["accept_s"] = round(self.accept_s, 3)
            # the timed messages wait for their time: push.status says so (checked before it)
            self.check_held_status([(id_tag[a["id"]], a["result"]["message_id"]) for a in answered
                                    if id_tag[a["id"]] in timed and "result" in a], mon)
            frac = rng.uniform(0.02, 0.95)
            deadline = time.monotonic() + 60
            if mode == "hold":
                # mid-hold: at a random moment before the first timed message is due; the restart comes
                # only once every one of them is overdue, so it must send them (and only then)
                first = min(self.messages[t]["not_before"] for t in timed)
                now = time.time()
                time.sleep(max(0.0, rng.uniform(now, max(now, first - 0.3)) - time.time()))
                info["kill_before_due_s"] = round(first - time.time(), 3)
                restart_at = max(self.messages[t]["not_before"] for t in timed) + rng.uniform(0.2, 1.0)
            elif mode == "retry":
                # once the gateways have answered some of this round's programmed transient errors:
                # those deliveries wait in `retrying` (backoff or Retry-After pending) at the kill
                want = rng.randint(1, max(1, len(self.transient_devices) // 10))
                info["target_transient_answers"] = want
                while self.transient_answers() - base_transient < want and time.monotonic() < deadline:
                    time.sleep(0.01)
                info["transient_answers_at_kill"] = self.transient_answers() - base_transient
            else:
                info["target_fraction"] = round(frac, 3)
                while self.received_total() - base < frac * total and time.monotonic() < deadline:
                    time.sleep(0.01)
            info["received_at_kill"] = self.received_total() - base
            try:
                s = mon.ok("system.stats")
                stats = {"queue_in_flight": s["queue"]["in_flight"], "queue_depth": s["queue"]["depth"]}
            except (OSError, ConnectionError, HarnessFailure) as e:
                stats = {"error": repr(e)}
        mon.close()
        info["kill_after_s"] = round(time.monotonic() - t0, 3)
        kill, late = self.kill_and_restart(r, mode, conn=c, stats_before=stats, extra=info, restart_at=restart_at)
        answered += late
        got = set()
        for a in answered:
            tag = id_tag[a["id"]]
            if "result" not in a:
                raise HarnessFailure(f"push.send {tag} failed: {a}")
            self.accept(tag, a["result"])
            got.add(tag)
        unans = [t for t in tags + timed if t not in got]
        self.unanswered += unans
        kill["unanswered"] = len(unans)
        kill["answered"] = len(got)
        retried = self.retry_unanswered(kill)
        self.check_held_status([(t, self.messages[t]["message_id"]) for t in timed if self.messages[t]["message_id"]])
        committed_unanswered = sum(1 for t in unans if self.messages[t].get("committed_before_kill"))
        double = rng.random() < 0.3
        kills = [kill]
        if double:
            # kill again while the restarted daemon resends what was in flight: once the gateways
            # have received a random part of what it had to resend (or after 10 s without it)
            want = 1 + int(rng.uniform(0.0, 0.6) * kill["in_flight_n"])
            base2 = self.received_total()
            deadline = time.monotonic() + 10
            while self.received_total() - base2 < want and time.monotonic() < deadline:
                time.sleep(0.005)
            try:
                with self.rpc(timeout=10) as mon2:
                    s = mon2.ok("system.stats")
                st = {"queue_in_flight": s["queue"]["in_flight"], "queue_depth": s["queue"]["depth"]}
            except (OSError, ConnectionError, HarnessFailure) as e:
                st = {"error": repr(e)}
            k2, _ = self.kill_and_restart(r, "recovery", stats_before=st, extra={"delay_ms": delay})
            kills.append(k2)
        wait = rng.random() < 0.5 or r == self.args.rounds
        if wait:
            self.wait_complete(timeout=self.args.timeout, due_only=r != self.args.rounds)
        row = {"round": r, "delay_ms": delay, "messages": k, "devices": total, "mode": mode,
               "kills": [x["index"] for x in kills], "unanswered_at_kill": len(unans), "retried": retried,
               "unanswered_but_committed": committed_unanswered,
               "in_flight_at_kills": [x["in_flight_n"] for x in kills],
               "stats_in_flight_before_kill": [x.get("stats_in_flight") for x in kills],
               "received_at_kill": info.get("received_at_kill"), "kill_after_s": info["kill_after_s"],
               "waited_for_complete": wait, "timed": info["timed"],
               "held_at_kills": [x["held_at_kill"] for x in kills],
               "held_overdue_at_restarts": [x["held_overdue_at_restart"] for x in kills]}
        self.rounds.append(row)
        log(f"round {r:2d}: {k} msg / {total} devices, delay {delay:3d} ms, kill {mode:7s} after "
            f"{info['kill_after_s']:.2f} s (gateways had {info.get('received_at_kill', '-')}), "
            f"in flight at kill {'/'.join(str(x['in_flight_n']) for x in kills)}"
            f"{' (double kill)' if double else ''}, unanswered {len(unans)} ({committed_unanswered} committed), "
            f"restart {'/'.join(str(x['restart_s']) for x in kills)} s; timed "
            f"{'/'.join(str(x['devices']) for x in info['timed'])} devices due after "
            f"{'/'.join(str(x['due_in_s']) for x in info['timed'])} s, held at kill "
            f"{'/'.join(str(x['held_at_kill']) for x in kills)}, overdue at restart "
            f"{'/'.join(str(x['held_overdue_at_restart']) for x in kills)}")

    def check_held_status(self, pairs, conn=None):
        """Before its time, push.status shows every device of a timed message `held`, with `due_at` its
        not_before (to the millisecond) and `timing` naming not_before; counts agree. Once per message,
        skipped when its time is (nearly) there; an answer that comes after it is not judged."""
        todo = [(t, mid) for t, mid in pairs if not self.messages[t].get("held_checked")
                and time.time() < self.messages[t]["not_before"] - 0.2]
        if not todo:
            return
        c = conn or self.rpc(timeout=30)
        try:
            for tag, mid in todo:
                m = self.messages[tag]
                s = c.ok("push.status", {"message_id": mid, "detail": True})
                m["held_checked"] = True
                if time.time() >= m["not_before"]:
                    self.held_status_unjudged += 1
                    continue
                devs = s.get("devices") or []
                held = [d for d in devs if d["state"] == "held"]
                self.held_status_checked += len(held)
                self.held_seen.update((mid, d["device_id"]) for d in held)
                if len(held) != len(devs) or len(devs) != len(m["expected"]) or s["counts"].get("held") != len(devs):
                    self.failures.add(f"{tag} ({mid}), due {m['params']['not_before']}: push.status before its time "
                                      f"shows {len(held)} of {len(devs)} devices held (expected "
                                      f"{len(m['expected'])}), counts {s['counts']}, states "
                                      f"{sorted({d['state'] for d in devs})}")
                bad = [d for d in devs if epoch_ms(d.get("due_at")) != m["not_before_ms"]
                       or "not_before" not in (d.get("timing") or [])]
                if bad:
                    d = bad[0]
                    self.failures.add(f"{tag} ({mid}): before its time, {len(bad)} device(s) show due_at/timing other "
                                      f"than not_before {m['params']['not_before']} / [not_before], e.g. "
                                      f"{d['device_id']}: due_at {d.get('due_at')!r}, timing {d.get('timing')!r}")
        finally:
            if conn is None:
                c.close()

    def pending_messages(self, due_only=False):
        """Messages not complete (due_only: but timed messages whose time has not come)."""
        out = []
        with self.rpc() as c:
            for tag, m in self.messages.items():
                if due_only and m.get("not_before", 0) > time.time():
                    continue
                if m["message_id"] is None:
                    out.append((tag, None))
                    continue
                s = c.ok("push.status", {"message_id": m["message_id"]})
                if s["state"] != "complete":
                    out.append((tag, s["counts"]))
        return out

    def wait_complete(self, timeout, due_only=False):
        t0 = time.monotonic()
        while True:
            pend = self.pending_messages(due_only)
            if not pend:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                for tag, counts in pend[:10]:
                    self.failures.add(f"{tag} ({self.messages[tag]['message_id']}) not complete after "
                                      f"{timeout:.0f} s: {counts}")
                raise HarnessFailure(f"{len(pend)} message(s) still pending after {timeout:.0f} s")
            time.sleep(0.25)

    # ------------------------------------------------------------ register bursts

    def burst(self, b):
        rng = self.rng
        per_user = sum(n for _, n in PER_USER)
        users = [f"b{b}-u{i:04d}" for i in range(self.args.burst_size // per_user)]
        params = self.device_params(users, f"burst{b}", with_fields=True)
        conns = [self.rpc(timeout=60) for _ in range(4)]
        parts = [params[i::4] for i in range(4)]
        answers = [dict() for _ in conns]   # per connection: id -> answer
        sent_ids = [None] * 4
        errors = []

        def run(i):
            c = conns[i]
            ids = []
            chunks = []
            for p, _ in parts[i]:
                rid, data = c.request_bytes("device.register", p)
                ids.append(rid)
                chunks.append(data)
            sent_ids[i] = ids

            def write():
                try:
                    c.sock.sendall(b"".join(chunks))
                except OSError:
                    pass
            writer = threading.Thread(target=write)
            writer.start()
            try:
                while c.pending:
                    a = c.read()
                    answers[i][a["id"]] = a
            except (ConnectionError, OSError):
                pass
            except ProtocolViolation as e:
                errors.append(str(e))
            writer.join()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        # mid-burst: at a random moment of the time the set-up's registrations took per call
        time.sleep(rng.uniform(0.02, 0.9) * self.reg_s * len(params))
        at = time.monotonic() - t0
        kill, _ = self.kill_and_restart(f"burst{b}", "register", extra={"burst": b})
        for t in threads:
            t.join(timeout=30)
        for c in conns:
            c.close()
        for e in errors:
            self.failures.add(f"burst {b}: {e}")
        answered_ok, answered_err, unanswered = [], [], []
        for i in range(4):
            for rid, (p, meta) in zip(sent_ids[i], parts[i]):
                a = answers[i].get(rid)
                if a is None:
                    unanswered.append((p, meta))
                elif "result" in a:
                    answered_ok.append((p, meta, a["result"]))
                else:
                    answered_err.append((p, meta, a["error"]))
        for p, meta, e in answered_err:
            self.failures.add(f"burst {b}: registration of {p['user']} answered an error: {e}")
        # what device.list must show
        expected_present = {}
        for p, meta, res in answered_ok:
            if res["token_hash"] != token_hash(p["token"]):
                self.failures.add(f"burst {b}: token_hash answered for {p['user']} is wrong")
            expected_present[res["device_id"]] = (p, meta)
        by_hash = {}
        for p, meta in params:
            by_hash[(p["user"], token_hash(p["token"]))] = (p, meta)
        listed = {}
        with self.rpc() as c:
            lists = c.pipelined("device.list", [{"user": u} for u in users])
        for u, a in zip(users, lists):
            if "result" not in a:
                raise HarnessFailure(f"device.list {u} failed: {a}")
            for d in a["result"]["devices"]:
                listed[d["device_id"]] = (u, d)
        lost = [did for did in expected_present if did not in listed]
        for did in lost[:20]:
            p, _ = expected_present[did]
            self.failures.add(f"burst {b}: registration of {p['user']} {p['platform']} answered {did} "
                              f"before the kill, missing from device.list after the restart")
        half = 0
        for did, (u, d) in listed.items():
            pm = by_hash.get((u, d.get("token_hash")))
            if pm is None:
                half += 1
                self.failures.add(f"burst {b}: device.list {u} shows {did} with a token_hash no registration sent")
                continue
            p, meta = pm
            want_env = p.get("environment", "production") if p["platform"] == "apns" else None
            problems = [f for f, want in (("platform", p["platform"]), ("name", p["name"]),
                                          ("app_version", p["app_version"]), ("environment", want_env))
                        if d.get(f) != want]
            if did in expected_present and expected_present[did][0] is not p:
                problems.append("device_id")
            for f in ("created_at", "registered_at"):
                if not isinstance(d.get(f), str):
                    problems.append(f)
            if problems:
                half += 1
                self.failures.add(f"burst {b}: {did} of {u} is half there: {problems} differ: {d}")
        # re-register every unanswered one: exists <=> created false
        listed_hashes = {(u, d["token_hash"]): did for did, (u, d) in listed.items()}
        reregs = [(p, meta) for p, meta in unanswered]
        existed = 0
        if reregs:
            with self.rpc() as c:
                ans = c.pipelined("device.register", [p for p, _ in reregs])
            for (p, meta), a in zip(reregs, ans):
                if "result" not in a:
                    self.failures.add(f"burst {b}: re-registration of {p['user']} failed: {a['error']}")
                    continue
                res = a["result"]
                was = listed_hashes.get((p["user"], token_hash(p["token"])))
                if was is not None:
                    existed += 1
                    if res["created"] or res["device_id"] != was:
                        self.failures.add(f"burst {b}: {p['user']} {was} was listed, but re-registering it "
                                          f"answered {res}")
                elif not res["created"]:
                    self.failures.add(f"burst {b}: {p['user']} was not listed, but re-registering answered "
                                      f"created: false ({res['device_id']})")
                self.adopt(res["device_id"], meta)
        for did, (p, meta) in expected_present.items():
            self.adopt(did, meta)
        # every device of the burst works: one push to all its users
        tag = f"burst{b}"
        params_send = self.new_message(tag, users, f"burst{b}")
        with self.rpc() as c:
            res = c.ok("push.send", params_send)
        self.accept(tag, res)
        row = {"burst": b, "registrations": len(params), "answered_ok": len(answered_ok),
               "answered_error": len(answered_err), "unanswered": len(unanswered),
               "unanswered_existing": existed, "listed": len(listed), "lost": len(lost), "half": half,
               "kill_after_s": round(at, 3), "kill": kill["index"], "restart_s": kill["restart_s"]}
        self.bursts.append(row)
        log(f"burst {b}: {len(params)} registrations, kill after {at:.3f} s: {len(answered_ok)} answered, "
            f"{len(unanswered)} unanswered ({existed} of those were stored), listed {len(listed)}, lost {len(lost)}, "
            f"half-there {half}")

    # ------------------------------------------------------------ final checks

    def verify(self):
        self.fetch_records()
        checked = delivered = failed = 0
        dup_total = ambiguous = 0
        # resent[k]: deliveries the gateway had answered finally (2xx, or the programmed permanent
        # error) in life k and got again in a later life: resends that only kill k can explain
        resent = [set() for _ in self.kills]
        # The store's in_flight rows at each kill grant nothing; they only narrow the check further:
        # a delivery the store did not hold in flight at a kill is not resent because of it, unless
        # the store held nothing of its message (early sends of a push.send the kill left
        # uncommitted and unanswered, which the harness sent again with its idempotency key).
        in_flight_at = {}
        for k in self.kills:
            for mid, did in k["in_flight"]:
                in_flight_at.setdefault((self.tag_by_id.get(mid), did), set()).add(k["index"])
        listed_pairs = set()
        # the PINGs herald sent on each gateway connection: it PINGs a connection at once when a
        # request on it had no answer within its deadline (an ambiguous failure, resent)
        pings = {}
        for g in GATEWAY_NAMES:
            for conn in self.gw.connections(g)["connections"]:
                pings[conn["id"]] = conn.get("pings") or []
        self.index_idle()
        timed = {"held_messages": 0, "held_deliveries": 0, "held_early": 0, "held_late": 0, "held_late_max_ms": None,
                 "held_waited_behind_earlier": 0, "held_idle_max_ms": None, "held_duplicates": 0,
                 "held_final_status_wrong": 0, "held_sent_after_restart": 0, "held_rows": {}}
        with self.rpc() as c:
            for tag, m in self.messages.items():
                s = c.ok("push.status", {"message_id": m["message_id"], "detail": True})
                timed["held_messages"] += m.get("not_before") is not None
                if s["state"] != "complete":
                    self.failures.add(f"{tag} ({m['message_id']}) is {s['state']}: {s['counts']}")
                devs = s.get("devices") or []
                seen = {d["device_id"] for d in devs}
                if len(devs) != len(seen):
                    self.failures.add(f"{tag}: push.status lists a device twice")
                if seen != m["expected"]:
                    self.failures.add(f"{tag}: push.status lists {len(seen)} devices, expected {len(m['expected'])} "
                                      f"(missing {len(m['expected'] - seen)}, extra {len(seen - m['expected'])})")
                for d in devs:
                    pair = (tag, d["device_id"])
                    listed_pairs.add(pair)
                    checked += 1
                    dev = self.devices.get(d["device_id"])
                    copies = self.copies.get(pair, [])
                    finals = [x for x in copies if x["cls"] != "transient"]
                    n = len(finals)
                    want = "failed" if dev and dev["fail"] else "delivered"
                    if d["state"] != want:
                        self.failures.add(f"{tag} ({m['message_id']}) device {d['device_id']} ({dev and dev['platform']}) "
                                          f"ended {d['state']} ({d.get('reason')}, http {d.get('http_status')}), "
                                          f"expected {want}; gateway copies {[x['status'] for x in copies]}")
                    elif want == "failed":
                        failed += 1
                        reason = FAIL_PROGRAM[dev["platform"]][1]
                        if reason and reason not in (d.get("reason") or ""):
                            self.failures.add(f"{tag} device {d['device_id']} failed with {d.get('reason')!r}, "
                                              f"the gateway answered {reason}")
                    else:
                        delivered += 1
                    # judged by the gateway: a delivered push was accepted there (2xx) and never
                    # refused; a failed one was refused there with its programmed error, never accepted
                    oks = sum(1 for x in finals if x["cls"] == "ok")
                    if d["state"] == "delivered" and (oks == 0 or oks != n):
                        self.failures.add(f"{tag} ({m['message_id']}) device {d['device_id']} is delivered but the "
                                          f"gateway answered its copies {[x['status'] for x in copies]}")
                    if d["state"] == "failed" and (n == 0 or oks):
                        self.failures.add(f"{tag} ({m['message_id']}) device {d['device_id']} is failed but the "
                                          f"gateway answered its copies {[x['status'] for x in copies]}")
                    if n > 1:
                        dup_total += n - 1
                    if m.get("not_before") is not None:
                        self.judge_timed(tag, m, d, copies, timed)
                    # every copy after one the gateway answered finally is a resend of a finished delivery
                    for prev, cur in zip(copies, copies[1:]):
                        if prev["cls"] == "transient":
                            continue  # a retry after a transient error (or a hang, a reset)
                        ambiguous_prev = not prev["answered"] or any(t > prev["time"]
                                                                     for t in pings.get(prev["conn"], []))
                        if cur["life"] > prev["life"]:
                            resent[prev["life"]].add(pair)
                            early = self.messages[tag].get("uncommitted_at_kill") == prev["life"]
                            if prev["life"] not in in_flight_at.get(pair, ()) and not ambiguous_prev and not early:
                                self.failures.add(
                                    f"{tag} ({m['message_id']}) device {d['device_id']}: sent again in life "
                                    f"{cur['life']} (record {cur['seq']}) after the gateway had answered "
                                    f"{prev['status']} to record {prev['seq']} in life {prev['life']}, but the store "
                                    f"did not even hold it in flight at kill {prev['life']}")
                        elif ambiguous_prev:
                            # the gateway never wrote its answer, or herald PINGed that connection
                            # after the copy (its answer came too late): a resend after an
                            # ambiguous failure, with the same payload (checked above)
                            ambiguous += 1
                        else:
                            self.failures.add(
                                f"{tag} ({m['message_id']}) device {d['device_id']}: sent again in life "
                                f"{cur['life']} (record {cur['seq']}) after the gateway had answered "
                                f"{prev['status']} to record {prev['seq']} in the same life: a duplicate no crash "
                                f"explains (copies {[(x['life'], x['status']) for x in copies]})")
        events = self.verify_events()
        for pair in self.copies:
            if pair not in listed_pairs:
                self.failures.add(f"{pair[0]}: gateway received it for device {pair[1]}, which push.status "
                                  f"does not list")
        for rec in self.invalid_records[:10]:
            self.failures.add(f"gateway record failed validation: {rec}")
        if len(self.invalid_records) > 10:
            self.failures.add(f"... {len(self.invalid_records)} gateway records failed validation in all")
        # the duplicate allowance, from the gateways' records and max_inflight alone: after kill k,
        # only deliveries the gateway had finished in life k may come again, at most MAX_INFLIGHT
        # of them (no more can be out, unanswered as far as herald knows, when it dies)
        bound_total = 0
        for k, rs in zip(self.kills, resent):
            finished = sum(1 for cps in self.copies.values()
                           if any(x["life"] == k["index"] and x["cls"] != "transient" for x in cps))
            k["duplicates"] = len(rs)
            k["duplicate_bound"] = min(MAX_INFLIGHT, finished)
            bound_total += k["duplicate_bound"]
            if len(rs) > MAX_INFLIGHT:
                self.failures.add(f"kill {k['index']}: {len(rs)} deliveries the gateways had already answered came "
                                  f"again after it, more than max_inflight {MAX_INFLIGHT} could have been out")
        if any(k["mode"] == "retry" for k in self.kills) and not any(k["retrying_at_kill"] for k in self.kills):
            self.failures.add("no kill found a delivery in retry at the gateways (the retry state was never killed)")
        for what in ("held_early", "held_late", "held_final_status_wrong"):
            if timed[what] > 10:
                self.failures.add(f"... {timed[what]} timed deliveries "
                                  f"{what.split('_', 1)[1].replace('_', ' ')} in all")
        rows = []
        for row in timed["held_rows"].values():
            late = sorted(row.pop("late"))
            if late:
                row["late_max_ms"], row["late_p50_ms"] = round(1000 * late[-1]), round(1000 * late[len(late) // 2])
            rows.append(row)
        timed["held_rows"] = rows
        timed["held_kills"] = sum(1 for k in self.kills if k.get("held_at_kill"))
        timed["held_at_kills"] = sum(k.get("held_at_kill", 0) for k in self.kills)
        timed["held_overdue_restarts"] = sum(1 for k in self.kills if k.get("held_overdue_at_restart"))
        timed["held_status_checked"] = self.held_status_checked
        timed["held_status_unjudged"] = self.held_status_unjudged
        if timed["held_messages"]:
            if not timed["held_kills"]:
                self.failures.add("no kill happened while the store held a timed delivery (queued, due after it)")
            if not timed["held_overdue_restarts"]:
                self.failures.add("no restart found a held delivery overdue (the mid-hold kill never took effect)")
            if not self.held_status_checked:
                self.failures.add("push.status was never read before a timed message's due time (held not checked)")
        for row in self.rounds:
            row["duplicates"] = sum(self.kills[i]["duplicates"] for i in row["kills"])
            row["duplicate_bound"] = sum(self.kills[i]["duplicate_bound"] for i in row["kills"])
        copies = sum(len(v) for v in self.copies.values())
        return {"deliveries_checked": checked, "delivered": delivered, "failed_as_programmed": failed,
                "duplicates": dup_total, "duplicate_bound": bound_total,
                "resent_after_unanswered_copy": ambiguous,
                "copies_compared": copies, "payload_mismatches": self.payload_mismatches,
                "transient_answers": sum(1 for v in self.copies.values() for x in v if x["cls"] == "transient"),
                "retrying_at_kills": sum(k["retrying_at_kill"] for k in self.kills),
                "receipts": sum(len(v) for v in self.receipts.values()),
                "invalid_records": len(self.invalid_records), "stray_records": self.stray_records,
                **timed, **events}

    def judge_timed(self, tag, m, d, copies, fig):
        """A timed message's delivery, by the gateways' records (their receive times): none before its
        not_before; the first one not late: it could go at max(not_before, the start of the life that
        sent it, the write of the push.send that made the message), and herald may not sit idle (the
        gateways receiving nothing) for more than LATE_BOUND_S + the gateway delay while it waits (it
        may wait longer behind deliveries due before it: claims go by due time). Its end state and
        duplicates are judged with every other delivery's."""
        fig["held_deliveries"] += 1
        nb = m["not_before"]
        did = d["device_id"]
        row = fig["held_rows"].setdefault(tag, {"tag": tag, "message_id": m["message_id"], "round": m["round"],
                                                 "not_before": m["params"]["not_before"], "devices": 0,
                                                 "late_max_ms": None, "late_p50_ms": None, "late": [],
                                                 "first_sent_after_restart": 0, "early": 0, "resent": 0})
        row["devices"] += 1
        finals = [x for x in copies if x["cls"] != "transient"]
        if len(finals) > 1:
            fig["held_duplicates"] += len(finals) - 1
            row["resent"] += len(finals) - 1
        early = [x for x in copies if x["time"] < nb - EARLY_TOLERANCE_S]
        if early:
            fig["held_early"] += 1
            row["early"] += 1
            x = early[0]
            if fig["held_early"] <= 10:
                self.failures.add(f"{tag} ({m['message_id']}) device {did}: the gateway received a copy (record "
                                  f"{x['seq']}, life {x['life']}, answered {x['status']}) "
                                  f"{1000 * (nb - x['time']):.0f} ms before its not_before "
                                  f"{m['params']['not_before']} ({len(early)} early of {len(copies)} copies)")
        # the message as herald holds it was made by the first write, or by the retry after a kill that
        # left the store without it
        made = m.get("retry_written_at") if m.get("uncommitted_at_kill") is not None else m.get("written_at")
        if copies:
            first = copies[0]
            ref = max(nb, self.life_start[first["life"]], made or 0)
            late = first["time"] - ref
            if first["life"] > 0 and self.life_start[first["life"]] > nb:
                fig["held_sent_after_restart"] += 1
                row["first_sent_after_restart"] += 1
            row["late"].append(late)
            fig["held_late_max_ms"] = max(fig["held_late_max_ms"] or 0, round(1000 * late))
            bound = LATE_BOUND_S + self.delay_between(ref, first["time"]) / 1000
            # herald's longest idle stretch (no gateway received anything) while this one was due
            idle = self.longest_idle(ref, first["time"])
            fig["held_idle_max_ms"] = max(fig["held_idle_max_ms"] or 0, round(1000 * idle))
            if late > bound:
                if idle <= bound:
                    fig["held_waited_behind_earlier"] += 1
                else:
                    fig["held_late"] += 1
                    if fig["held_late"] <= 10:
                        self.failures.add(f"{tag} ({m['message_id']}) device {did}: first copy (record "
                                          f"{first['seq']}, life {first['life']}) received {late:.2f} s after it "
                                          f"could go (not_before {m['params']['not_before']}, life started "
                                          f"{self.life_start[first['life']] - nb:+.2f} s from it), herald idle "
                                          f"{idle:.2f} s of it, more than {bound:.2f} s")
        # accepted before its time: the final status still says when it was due and why
        if made is not None and made < nb - EARLY_TOLERANCE_S and (
                epoch_ms(d.get("due_at")) != m["not_before_ms"] or "not_before" not in (d.get("timing") or [])):
            fig["held_final_status_wrong"] += 1
            if fig["held_final_status_wrong"] <= 10:
                self.failures.add(f"{tag} ({m['message_id']}) device {did} ended {d['state']} with due_at "
                                  f"{d.get('due_at')!r}, timing {d.get('timing')!r}; not_before was "
                                  f"{m['params']['not_before']}")

    def index_idle(self):
        """Sorts the gateways' receive times and builds a sparse table of the gaps between them, so that
        longest_idle answers in O(1)."""
        times = self.record_times
        times.sort()
        gaps = [b - a for a, b in zip(times, times[1:])]
        self.gap_levels = [gaps]
        w = 1
        while 2 * w <= len(gaps):
            prev = self.gap_levels[-1]
            self.gap_levels.append([max(prev[k], prev[k + w]) for k in range(len(prev) - w)])
            w *= 2

    def longest_idle(self, t0, t1):
        """The longest stretch of [t0, t1] in which no gateway received anything (0 when t1 <= t0)."""
        if t1 <= t0:
            return 0.0
        times = self.record_times
        i = bisect.bisect_right(times, t0)
        j = bisect.bisect_left(times, t1)
        if i >= j:
            return t1 - t0
        idle = max(times[i] - t0, t1 - times[j - 1])
        if j - 1 > i:   # the gaps between times[i] .. times[j - 1]: gap indices i .. j - 2
            n = j - 1 - i
            p = n.bit_length() - 1
            lvl = self.gap_levels[p]
            idle = max(idle, lvl[i], lvl[j - 1 - (1 << p)])
        return idle

    def verify_events(self):
        """Every delivery push.status lists reached the subscriber as an event with its final state."""
        ids = [m["message_id"] for m in self.messages.values()]
        if not self.watcher.wait_for(ids, timeout=60):
            missing = sorted(set(ids) - self.watcher.complete)
            self.failures.add(f"event stream: no message_complete for {len(missing)} message(s), e.g. {missing[:3]}")
        checked = missing = again = held_missing = 0
        with self.rpc() as c, self.watcher.lock:
            for tag, m in self.messages.items():
                s = c.ok("push.status", {"message_id": m["message_id"], "detail": True})
                for d in s.get("devices") or []:
                    states = self.watcher.finals.get((m["message_id"], d["device_id"]), [])
                    checked += 1
                    # a held delivery's acceptance is an event of its own (state held), before its outcome
                    if (m["message_id"], d["device_id"]) in self.held_seen and "held" not in states:
                        held_missing += 1
                        if held_missing <= 10:
                            self.failures.add(f"event stream: {tag} device {d['device_id']} was held (push.status), "
                                              f"but the subscriber read no held event: {states or 'no event'}")
                    states = [x for x in states if x != "held"]
                    if d["state"] not in states:
                        missing += 1
                        if missing <= 10:
                            self.failures.add(f"event stream: {tag} device {d['device_id']} ended {d['state']} "
                                              f"but the subscriber read {states or 'no event'}")
                    elif len(states) > 1:
                        again += 1
            if missing > 10:
                self.failures.add(f"... {missing} deliveries without their event in all")
            if held_missing > 10:
                self.failures.add(f"... {held_missing} held deliveries without their held event in all")
            for g in self.watcher.gaps:
                self.failures.add(f"event stream: a gap the subscriber did not expect: {g}")
            return {"events_read": self.watcher.events, "event_deliveries_checked": checked,
                    "event_deliveries_missing": missing, "event_deliveries_seen_again": again,
                    "event_held_missing": held_missing,
                    "event_subscriptions": self.watcher.subscriptions}

    # ------------------------------------------------------------ run

    def run(self):
        t_start = time.monotonic()
        self.bursts = []
        summary = {"seed": self.args.seed, "herald": self.args.herald, "ok": False, "backend": self.args.backend}
        try:
            self.setup()
            if self.args.mode in ("all", "fanout"):
                t0 = time.monotonic()
                self.hold_round = self.rng.randint(1, max(1, self.args.rounds))   # killed mid-hold
                for r in range(1, self.args.rounds + 1):
                    self.fanout_round(r)
                self.set_delay(0)
                waited = self.wait_complete(timeout=self.args.timeout)
                self.timings["fanout_s"] = round(time.monotonic() - t0, 1)
                log(f"fan-out rounds done in {self.timings['fanout_s']} s (final wait {waited:.1f} s)")
            if self.args.mode in ("all", "burst"):
                t0 = time.monotonic()
                self.set_delay(0)
                for b in range(1, self.args.bursts + 1):
                    self.burst(b)
                self.wait_complete(timeout=self.args.timeout)
                self.timings["burst_s"] = round(time.monotonic() - t0, 1)
            t0 = time.monotonic()
            figures = self.verify()
            self.timings["verify_s"] = round(time.monotonic() - t0, 1)
            summary.update(figures)
        except HarnessFailure as e:
            self.failures.add(f"aborted: {e}")
        except Exception as e:  # noqa: BLE001 - reported as a harness error
            self.failures.add(f"harness error: {e!r}\n{traceback.format_exc()}")
        finally:
            status = None
            if self.watcher is not None:
                self.watcher.stop()
            if self.daemon is not None:
                status = self.daemon.stop(timeout=30) if self.daemon.running else None
            summary["herald_exit_status_at_end"] = status
        self.timings["total_s"] = round(time.monotonic() - t_start, 1)
        events = self.daemon.log_events() if self.daemon else {}
        summary.update({
            "rounds": len(self.rounds), "kills": len(self.kills),
            "fanout_kills": sum(1 for k in self.kills if k["mode"] != "register"),
            "hold_kills": sum(1 for k in self.kills if k["mode"] == "hold"),
            "register_kills": sum(1 for k in self.kills if k["mode"] == "register"),
            "devices": len(self.devices), "messages": len(self.messages),
            "registrations_checked": sum(b["registrations"] for b in self.bursts),
            "registrations_answered_before_kill": sum(b["answered_ok"] for b in self.bursts),
            "round_rows": self.rounds, "burst_rows": self.bursts,
            "kill_rows": [{k2: v for k2, v in k.items() if k2 not in ("in_flight", "committed_tags")}
                          for k in self.kills],
            "unanswered_sends_retried": sum(r["retried"] for r in self.rounds),
            "unanswered_sends_committed": sum(r["unanswered_but_committed"] for r in self.rounds),
            "timings": self.timings,
            "log_events": {f"<{p}>": ev for p, ev in sorted(events.items())},
            "failures": self.failures.items,
        })
        summary["ok"] = not self.failures
        self.report(summary)
        return summary

    def report(self, s):
        log("")
        log("crash harness summary")
        log(f"  seed {s['seed']}, {s['rounds']} fan-out rounds of {self.args.devices} devices, "
            f"{s['kills']} kills ({s['fanout_kills']} during fan-outs, {s['register_kills']} during register bursts)")
        if s.get("deliveries_checked") is not None:
            log(f"  deliveries checked: {s['deliveries_checked']} ({s['delivered']} delivered, "
                f"{s['failed_as_programmed']} failed as programmed), gateway receipts {s['receipts']}")
            log(f"  payloads: {s['copies_compared']} copies compared with what was sent (APNs/FCM bodies as JSON, "
                f"Web Push plaintext, collapse id / Topic), {s['payload_mismatches']} differed, "
                f"{s['stray_records']} records of no send of this run")
            log(f"  duplicates: {s['duplicates']} seen, bound {s['duplicate_bound']} (per kill: the deliveries the "
                f"gateways had answered finally before it, at most max_inflight {MAX_INFLIGHT}); "
                f"{s['resent_after_unanswered_copy']} resent in the same life after a copy the gateway never "
                f"answered or whose connection herald then PINGed as silent")
            log(f"  transient errors answered: {s['transient_answers']}; deliveries in retry at the kills "
                f"(gateway view): {s['retrying_at_kills']}")
            log(f"  timed (not_before): {s['held_messages']} messages, {s['held_deliveries']} deliveries; "
                f"{s['held_status_checked']} seen held before their time ({s['held_status_unjudged']} status reads too "
                f"late to judge); {s['held_kills']} kills with deliveries held in the store ({s['held_at_kills']} in "
                f"all), {s['held_overdue_restarts']} restarts finding some overdue; "
                f"{s['held_sent_after_restart']} first sent by a restart after their time; early {s['held_early']}, "
                f"late {s['held_late']} (latest {s['held_late_max_ms']} ms after it could go; bound "
                f"{LATE_BOUND_S:.0f} s + gateway delay of herald idle: {s['held_waited_behind_earlier']} waited longer "
                f"behind earlier work, longest idle {s['held_idle_max_ms']} ms), "
                f"resent {s['held_duplicates']}, final status wrong {s['held_final_status_wrong']}, held events "
                f"missing {s['event_held_missing']}")
            for row in s["held_rows"]:
                log(f"    {row['tag']}: {row['devices']} devices, not_before {row['not_before']}: first copy "
                    f"{row['late_p50_ms']}/{row['late_max_ms']} ms (median/max) after it could go, "
                    f"{row['first_sent_after_restart']} first sent by a restart after it, {row['resent']} resent, "
                    f"{row['early']} early")
            log(f"  event stream: {s['event_deliveries_checked']} deliveries checked against {s['events_read']} "
                f"events read over {s['event_subscriptions']} subscriptions (resumed by cursor after each kill), "
                f"{s['event_deliveries_missing']} missing, {s['event_deliveries_seen_again']} seen again")
        log(f"  unanswered push.send retried with their idempotency key: {s['unanswered_sends_retried']} "
            f"({s['unanswered_sends_committed']} had been committed before the kill: the retry named that message)")
        log(f"  registrations checked: {s['registrations_checked']} ({s['registrations_answered_before_kill']} "
            f"answered before their kill)")
        log("  per round: devices, kill mode, in flight at kill (store) / herald stats just before, in retry at "
            "the kills (gateway), held at the kills (store), duplicates/bound")
        for r in self.rounds:
            sb = ", ".join(str((x or {}).get("queue_in_flight", "-")) for x in r["stats_in_flight_before_kill"])
            log(f"    round {r['round']:2d}: {r['devices']} devices, {r['mode']:7s}, in flight "
                f"{'/'.join(map(str, r['in_flight_at_kills']))} (stats {sb}), in retry "
                f"{'/'.join(str(self.kills[i]['retrying_at_kill']) for i in r['kills'])}, held "
                f"{'/'.join(str(self.kills[i]['held_at_kill']) for i in r['kills'])}, duplicates "
                f"{r.get('duplicates', '-')}/{r.get('duplicate_bound', '-')}")
        warn = s["log_events"].get("<3>", {}) | s["log_events"].get("<4>", {})
        if warn:
            log(f"  daemon errors/warnings in the log: {warn}")
        if self.kills:
            first, last = self.kills[0], self.kills[-1]
            if self.pg is None:
                size = (f"WAL {first['store_files_bytes']['herald.db-wal'] / (1 << 20):.0f} MiB -> "
                        f"{last['store_files_bytes']['herald.db-wal'] / (1 << 20):.0f} MiB, herald.db "
                        f"{first['store_files_bytes']['herald.db']} -> {last['store_files_bytes']['herald.db']} bytes")
            else:
                size = (f"database {first['store_files_bytes']['herald.db']} -> "
                        f"{last['store_files_bytes']['herald.db']} bytes")
            log(f"  store at the kills: {size}; restart (to system.health) {first['restart_s']} s -> "
                f"{last['restart_s']} s")
        log(f"  backend: {s['backend']}")
        log(f"  timings: {s['timings']}")
        if self.failures:
            log(f"FAILED: {len(self.failures.items)} problem(s); daemon log: {self.daemon.log_path if self.daemon else '-'}")
        else:
            log("PASSED")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--herald", default=None, help="herald binary (default $HERALD_BIN, else .build/debug/herald)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--devices", type=int, default=5000)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--burst-size", type=int, default=2000)
    ap.add_argument("--mode", choices=("all", "fanout", "burst"), default="all")
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for messages to complete")
    ap.add_argument("--out", default=os.path.join(REPO, "build/reliability/crash.json"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite",
                    help="the store: SQLite (herald.db in the work directory) or a private PostgreSQL server")
    ap.add_argument("--lease", default="30", help="[store] lease on PostgreSQL (seconds)")
    args = ap.parse_args()
    args.herald = herald_binary(args.herald)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    h = Harness(args)
    summary = h.run()
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    log_copy = os.path.join(out_dir, "crash-herald.log")
    if h.daemon is not None and os.path.exists(h.daemon.log_path):
        shutil.copyfile(h.daemon.log_path, log_copy)
    if h.gw is not None:
        h.gw.stop(timeout=15)
    if h.pg is not None:
        if not summary["ok"]:
            shutil.copyfile(h.pg.log, os.path.join(out_dir, "crash-postgres.log"))
        h.pg.destroy()
        shutil.copyfile(h.gw.log_path, os.path.join(out_dir, "crash-gateways.log"))
    log(f"summary: {os.path.relpath(args.out)}; daemon log: {os.path.relpath(log_copy)}")
    if not summary["ok"] and h.daemon is not None:
        log("herald stderr (tail):\n" + tail(h.daemon.log_path, 30))
    if args.keep or not summary["ok"]:
        log(f"work directory kept: {h.work}")
    else:
        shutil.rmtree(h.work, ignore_errors=True)
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
