#!/usr/bin/env python3
"""Load test: many concurrent clients against one herald and the provider test gateways.

Phase 1, mixed load (--clients, default 64, for --seconds, default 60): each client is
one connection running a closed loop of device.register (APNs, FCM, Web Push; its own
users, spread so that the 20 registrations/min per user limit is seldom reached; a
pool of Web Push subscriptions shared by everyone, so some registrations reclaim
another user's endpoint), push.send (small fan-outs: one user or 1-4 devices;
deliveries are paced by a token bucket, --deliveries-per-s, so that the Python
gateways keep up), push.status (of the client's own recent messages, sometimes with
detail) and device.list. A monitor samples system.stats (queue depth and in flight)
and the daemon's VmRSS every 0.5 s. Afterwards every message must complete with every
delivery `delivered`.

Phase 2, past the limits (--overload-seconds, default 20): a fresh herald with
`[delivery] max_queued` = --max-queued (default 400) and every gateway answering after
--slow-ms (default 2000 ms). The clients send fan-outs of 10-30 devices as fast as they
are let: the daemon must answer 1007 `overloaded` with data.retry_after_ms (the clients
wait that long, as a good client does) and the queue (waiting + in flight, from
system.stats every 0.1 s) must never pass max_queued. Then the connection limit: 520
connections at once; the ones beyond the daemon's 512 must get a 1007 with
retry_after_ms and be closed, and the daemon must answer on the others. Then the
gateways are made fast again and every accepted message must complete, delivered.

Checks (exit status 1 on any): every response is JSON-RPC 2.0 with the id of a request
in flight on its connection and a well-formed result or error; no -32700/-32600/
-32601/-32602/-32603 nor any application error other than 1002 rate_limited (register)
and, in phase 2, 1007 overloaded (send); results have the documented shape; peak RSS
(VmHWM) of each daemon at most --rss-ceiling-mib (default 512); phase 2 saw overloaded
answers and its queue stayed within max_queued; no message stuck.

Receipts (both phases): Herald's counts are not the verdict. Every push.send carries a
tag of its own in data; after each phase the gateways' records are matched to messages
(by tag) and devices (by token): each delivery Herald calls delivered reached its device
exactly once (no restarts here: no duplicate allowed), a superseded one never, and only
because a later message with its collapse key reached that device; nothing reached a
device outside its message, no refused (1007) or unknown tag was sent, no request was
answered other than 2xx (check_receipts).

Prints requests/s by method, errors by code, peak RSS, max queue depth against the
cap, overloaded answers; writes a JSON summary (--out).

    HERALD_BIN=.build/debug/herald .venv/bin/python Tests/reliability/load_test.py [--seconds 60 --clients 64]
"""
import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from herald_fixtures import (  # noqa: E402
    REPO, RPC, Daemon, Gateways, HarnessFailure, ProtocolViolation, check_response, cpu_seconds, herald_binary,
    log, proc_memory_kb, tail)

USERS_PER_CLIENT = 60
WEB_POOL = 300
STATES = ("queued", "held", "in_flight", "delivered", "retrying", "failed", "expired", "superseded",
          "skipped", "removed_stale")
DELIVERY = {"max_retries": 5, "backoff_base_ms": 200, "backoff_max_ms": 2000}


class Failures(list):
    def add(self, what):
        self.append(what)
        if len(self) <= 40:
            log(f"  FAIL: {what}")


def is_hex(s, n):
    return isinstance(s, str) and len(s) == n and all(c in "0123456789abcdef" for c in s)


def check_result(method, params, result):
    """None, or what is wrong with a successful result's shape."""
    if not isinstance(result, dict):
        return "result is not an object"
    if method == "device.register":
        if not is_hex(result.get("device_id"), 32) or not is_hex(result.get("token_hash"), 64):
            return "device_id/token_hash malformed"
        if not all(isinstance(result.get(k), bool) for k in ("created", "reclaimed")) \
                or not isinstance(result.get("evicted"), list):
            return "created/reclaimed/evicted malformed"
    elif method == "push.send":
        if not is_hex(result.get("message_id"), 32) or not isinstance(result.get("devices"), int) \
                or not isinstance(result.get("skipped"), int):
            return "message_id/devices/skipped malformed"
    elif method == "push.status":
        if result.get("message_id") != params["message_id"] or result.get("state") not in ("pending", "complete"):
            return "message_id/state malformed"
        c = result.get("counts")
        if not isinstance(c, dict) or set(c) != set(STATES) or not all(isinstance(v, int) for v in c.values()):
            return "counts malformed"
        if params.get("detail") and not isinstance(result.get("devices"), list):
            return "detail without devices"
    elif method == "device.list":
        d = result.get("devices")
        if not isinstance(d, list) or not all(is_hex(x.get("device_id"), 32) for x in d):
            return "devices malformed"
        if len(d) > 20:
            return f"{len(d)} devices, over device_cap 20"
    elif method == "system.stats":
        q = result.get("queue")
        if not isinstance(q, dict) or not isinstance(q.get("depth"), int) or not isinstance(q.get("in_flight"), int):
            return "queue malformed"
    return None


# ---------------------------------------------------------------- async client


class AsyncRPC:
    """One connection, one request at a time (closed loop); every answer checked."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.next_id = 1
        self.pending = set()

    @classmethod
    async def open(cls, path):
        r, w = await asyncio.open_unix_connection(path, limit=64 << 20)
        return cls(r, w)

    async def call(self, method, params):
        rid = self.next_id
        self.next_id += 1
        self.pending.add(rid)
        self.writer.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params},
                                     separators=(",", ":")).encode() + b"\n")
        await self.writer.drain()
        line = await self.reader.readline()
        if not line:
            raise ConnectionError("herald closed the connection")
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ProtocolViolation(f"{method}: response is not JSON ({e}): {line[:300]!r}")
        check_response(obj, self.pending)
        if obj["id"] != rid:
            raise ProtocolViolation(f"{method}: answer to id {rid} came back with id {obj['id']}")
        return obj

    def close(self):
        self.writer.close()


class Stats:
    def __init__(self):
        self.by_method = {}     # method -> count
        self.errors = {}        # (method, code) -> count
        self.latency = {}       # method -> [seconds]
        self.failures = Failures()

    total = 0
    # How much work the answers carry: devices listed by device.list, devices a push.send
    # fanned out to, devices in push.status detail (running sums, sampled by the monitor).
    listed = lists = fanned = sends = 0

    def note(self, method, obj, seconds):
        self.total += 1
        self.by_method[method] = self.by_method.get(method, 0) + 1
        self.latency.setdefault(method, []).append(seconds)
        if "error" in obj:
            k = (method, obj["error"]["code"])
            self.errors[k] = self.errors.get(k, 0) + 1
            return
        res = obj.get("result") or {}
        if method == "device.list":
            self.lists += 1
            self.listed += len(res.get("devices", ()))
        elif method == "push.send":
            self.sends += 1
            self.fanned += res.get("devices", 0)


class Bucket:
    """Deliveries per second the sends may create (the gateways are Python)."""

    def __init__(self, rate):
        self.rate, self.tokens, self.t = rate, rate, time.monotonic()

    def take(self, n):
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


def series(samples, step):
    """Every `step` seconds: requests/s over the step, RSS (MiB), queue (waiting + in flight)."""
    out, last = [], None
    for smp in samples:
        if last is None or smp["t"] - last["t"] >= step - 1e-3:
            if last is not None:
                out.append({"t_s": round(smp["t"] - samples[0]["t"], 1),
                            "requests_per_s": round((smp["requests"] - last["requests"]) / (smp["t"] - last["t"]), 1),
                            "rss_mib": round((smp["rss_kb"] or 0) / 1024, 1),
                            "anon_mib": round((smp["anon_kb"] or 0) / 1024, 1),
                            "file_mib": round((smp["file_kb"] or 0) / 1024, 1),
                            "shmem_mib": round((smp["shmem_kb"] or 0) / 1024, 1),
                            "queue": smp["depth"] + smp["in_flight"],
                            # herald's CPU per request over the step: flat while throughput falls means
                            # the time goes to waiting (fsync, other processes), not to more work per call
                            "herald_cpu_ms_per_request": round(
                                1000 * (smp["cpu_s"] - last["cpu_s"]) / max(1, smp["requests"] - last["requests"]), 3)
                            if smp.get("cpu_s") is not None and last.get("cpu_s") is not None else None,
                            # devices per device.list answer and per push.send over the step: the
                            # workload itself grows while users fill up to device_cap
                            "devices_per_list": _ratio(smp, last, 0, 1),
                            "devices_per_send": _ratio(smp, last, 2, 3)})
            last = smp
    return out


def _ratio(smp, last, num, den):
    if not smp.get("work") or not last.get("work"):
        return None
    d = smp["work"][den] - last["work"][den]
    return round((smp["work"][num] - last["work"][num]) / d, 1) if d else None


def percentile(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


# ---------------------------------------------------------------- the gateways' record


def device_key(params):
    """(gateway, token as the gateway records it) of a device.register's params."""
    if params["platform"] == "apns":
        return ("apns", params["token"])
    if params["platform"] == "fcm":
        return ("fcm", params["token"])
    return ("webpush", params["token"].rsplit("/push/", 1)[1])


def record_tag(gateway, rec, key):
    """The message tag (data[key]) a gateway record carries, as the gateway read it
    (Web Push: from the plaintext it decrypted); None when it carries none."""
    body = rec.get("plaintext_json") if gateway == "webpush" else rec.get("body")
    if not isinstance(body, dict):
        return None
    if gateway == "fcm":
        body = ((body.get("message") or {}).get("data") or {}) if isinstance(body.get("message"), dict) else {}
    elif gateway == "webpush":
        body = body.get("data") if isinstance(body.get("data"), dict) else {}
    tag = body.get(key)
    return tag if isinstance(tag, str) else None


def check_receipts(label, gw, daemon, msg_info, device_tokens, key, failures, since=0, refused=()):
    """Every accepted message judged by what the gateways recorded, not by Herald's counts.

    For each message (its tag in data[key]) and each delivery push.status lists for it
    (detail): `delivered` must have exactly one 2xx request at the gateway for that
    device's token (Herald is not restarted here, so no duplicate is allowed),
    `superseded` none, and a later message of the same client with the same collapse
    key must have reached that token; `skipped` none. The deliveries listed must be
    the accepted count (devices + skipped), within the devices named, and hold every
    device the harness knows the recipients have (`must`). No request may reach a
    token that is not one of the message's devices, carry a tag of no accepted message
    (or of a refused one), carry no tag, or be answered other than 2xx. Returns the
    highest record seq seen and a summary."""
    seq = since
    stats = gw.stats()
    for g in ("apns", "fcm", "webpush"):
        if stats["received"][g] >= 100_000:
            failures.add(f"{label}: the {g} gateway kept only its last 100,000 records: the receipts cannot be "
                         "checked (fewer deliveries per run)")
    by_tag = {}          # tag -> Counter((gateway, token)) of 2xx answers
    non_2xx, untagged, records = [], [], 0
    for g in ("apns", "fcm", "webpush"):
        for r in gw.received(g, since=since):
            seq = max(seq, r["seq"])
            if r.get("unprocessed") and r.get("response") is None:
                continue  # above a GOAWAY's last stream: never processed, sent again by design
            if g == "fcm" and r.get("kind", "send") != "send":
                continue
            records += 1
            tag = record_tag(g, r, key)
            status = (r.get("response") or {}).get("status")
            if tag is None:
                untagged.append((g, r.get("token"), r.get("path"), status, r.get("errors")))
            elif status is not None and 200 <= status < 300:
                by_tag.setdefault(tag, collections.Counter())[(g, r.get("token"))] += 1
            else:
                non_2xx.append((g, r.get("token"), tag, status, r.get("errors")))
    if untagged:
        failures.add(f"{label}: {len(untagged)} request(s) at the gateways carry no {key!r} tag of this run, "
                     f"e.g. {untagged[:3]}")
    if non_2xx:
        failures.add(f"{label}: {len(non_2xx)} request(s) answered other than 2xx by the gateways, e.g. {non_2xx[:3]}")
    # Herald's own list of each message's deliveries, only to know which device each one is
    details = {}
    ids = list(msg_info)
    with RPC(daemon.socket, timeout=120) as c:
        for i in range(0, len(ids), 200):
            part = ids[i:i + 200]
            for m, a in zip(part, c.pipelined("push.status", [{"message_id": m, "detail": True} for m in part])):
                if "result" not in a:
                    failures.add(f"{label}: push.status {m} detail answered {a.get('error')}")
                else:
                    details[m] = a["result"].get("devices") or []
    tags = {info["tag"]: m for m, info in msg_info.items()}
    # (client, collapse key) -> [(n, tag)], for superseded deliveries
    by_ck = {}
    for info in msg_info.values():
        if info.get("ck"):
            by_ck.setdefault((info["client"], info["ck"]), []).append((info["n"], info["tag"]))
    problems = collections.Counter()
    examples = {}

    def bad(kind, what):
        problems[kind] += 1
        examples.setdefault(kind, what)

    delivered = superseded = 0
    for m, info in msg_info.items():
        listed = details.get(m)
        if listed is None:
            continue
        got = by_tag.get(info["tag"], collections.Counter())
        ids_listed = {d["device_id"] for d in listed}
        if len(listed) != info["devices"] + info["skipped"] or len(ids_listed) != len(listed):
            bad("deliveries listed", f"{m}: {len(listed)} listed ({len(ids_listed)} distinct), accepted "
                                     f"{info['devices']} + {info['skipped']} skipped")
        if info["named"] is not None and not ids_listed <= info["named"]:
            bad("device not named", f"{m}: {sorted(ids_listed - info['named'])[:3]}")
        if not info["must"] <= ids_listed:
            bad("recipient left out", f"{m} ({info['tag']}): devices {sorted(info['must'] - ids_listed)[:3]} "
                                      "of its recipients are not among its deliveries")
        tokens = set()
        for d in listed:
            tok = device_tokens.get(d["device_id"])
            if tok is None:
                bad("unknown device", f"{m}: {d['device_id']}")
                continue
            tokens.add(tok)
            n = got.get(tok, 0)
            st = d["state"]
            if st == "delivered":
                delivered += 1
                if n == 0:
                    bad("missing", f"{m} ({info['tag']}) to {tok}: Herald says delivered, the gateway has no "
                                   "2xx request")
                elif n > 1:
                    bad("duplicate", f"{m} ({info['tag']}) to {tok}: {n} requests answered 2xx")
            elif st == "superseded":
                superseded += 1
                later = [t for (k, t) in by_ck.get((info["client"], info["ck"]), ()) if k > info["n"]]
                if n:
                    bad("superseded yet sent", f"{m} ({info['tag']}) to {tok}: {n} request(s)")
                elif not any(by_tag.get(t, {}).get(tok) for t in later):
                    bad("superseded by nothing", f"{m} ({info['tag']}) to {tok}: no later message of its "
                                                 f"collapse key {info['ck']!r} reached that device")
            elif st == "skipped":
                if n:
                    bad("skipped yet sent", f"{m} ({info['tag']}) to {tok}: {n} request(s)")
            else:
                bad("not delivered", f"{m} ({info['tag']}) to {tok}: {st}")
        stray = {t: n for t, n in got.items() if t not in tokens}
        if stray:
            bad("to a device not in the message", f"{m} ({info['tag']}): {sorted(stray.items())[:3]}")
    refused = set(refused)
    unknown_tags = {t: sum(c.values()) for t, c in by_tag.items() if t not in tags}
    for t, n in sorted(unknown_tags.items())[:1000]:
        bad("refused push sent" if t in refused else "tag of no accepted message", f"{t}: {n} request(s)")
    for kind, n in sorted(problems.items()):
        failures.add(f"{label}: receipts: {n} x {kind}, e.g. {examples[kind]}")
    summary = {"gateway_records": records, "deliveries_delivered": delivered, "superseded": superseded,
               "checked_messages": len(details), "problems": dict(problems)}
    log(f"  receipts ({label}): {len(details)} messages, {delivered} deliveries delivered and {superseded} "
        f"superseded by Herald's word, against {records} gateway records: "
        + ("every one matches" if not problems and not non_2xx and not untagged else "MISMATCH"))
    return seq, summary


# ---------------------------------------------------------------- phase 1


class MixedClient:
    def __init__(self, idx, env, rng):
        self.idx, self.env, self.rng = idx, env, rng
        self.users = [f"c{idx:02d}-u{j:03d}" for j in range(USERS_PER_CLIENT)]
        self.next_user = 0
        self.devices = {}        # user -> set(device_id)
        self.messages = []       # message ids sent by this client
        self.serial = 0
        self.sends = 0           # push.send calls made: each one's tag is unique

    def register_params(self):
        user = self.users[self.next_user % len(self.users)]
        self.next_user += 1
        self.serial += 1
        r = self.rng.random()
        if r < 0.45:
            return {"user": user, "platform": "apns", "token": f"{self.idx:08x}{self.serial:056x}",
                    "name": f"phone {self.serial}", "app_version": "1.0"}
        if r < 0.85:
            return {"user": user, "platform": "fcm", "token": f"lt-{self.idx}-{self.serial}-{self.rng.getrandbits(64):x}"}
        s = self.rng.choice(self.env.web_pool)
        return {"user": user, "platform": "web", "token": s["endpoint"],
                "keys": {"p256dh": s["p256dh"], "auth": s["auth"]}}

    def pick(self):
        rng = self.rng
        r = rng.random()
        with_devices = [u for u, d in self.devices.items() if d]
        if r < 0.30 or not with_devices:
            return "device.register", self.register_params()
        if r < 0.45:
            if rng.random() < 0.5:
                u = rng.choice(with_devices)
                params = {"to": {"users": [u]}}
                n = len(self.devices[u])
            else:
                pool = [d for u in with_devices for d in self.devices[u]]
                devs = rng.sample(pool, min(len(pool), rng.randint(1, 4)))
                params = {"to": {"devices": devs}}
                n = len(devs)
            if self.env.bucket.take(n):
                params["data"] = {"lt": f"{self.idx}-{self.sends}"}
                self.sends += 1
                if rng.random() < 0.3:
                    params["collapse_key"] = f"ck-{self.idx}-{rng.randint(0, 5)}"
                return "push.send", params
        if r < 0.75 and self.messages:
            return "push.status", {"message_id": rng.choice(self.messages[-20:]), "detail": rng.random() < 0.3}
        return "device.list", {"user": rng.choice(self.users)}

    def learn(self, method, params, obj):
        res = obj.get("result")
        if res is None:
            return
        if method == "device.register":
            self.env.device_tokens[res["device_id"]] = device_key(params)
            self.devices.setdefault(params["user"], set()).add(res["device_id"])
            for e in res["evicted"]:
                self.devices[params["user"]].discard(e)
            if res["reclaimed"]:
                # the endpoint was another user's: forget it wherever this client had it
                for u, ds in self.devices.items():
                    if u != params["user"]:
                        ds.discard(res["device_id"])
        elif method == "device.list":
            self.devices[params["user"]] = {d["device_id"] for d in res["devices"]}
        elif method == "push.send":
            self.messages.append(res["message_id"])
            self.env.sent_messages.append(res["message_id"])
            # What the harness knows the message must reach, from its own registrations: a
            # user's APNs and FCM devices (its web ones may have been reclaimed by another
            # client's user meanwhile), or the devices named.
            if "devices" in params["to"]:
                named = set(params["to"]["devices"])
                must = {d for d in named if self.env.device_tokens[d][0] != "webpush"}
            else:
                named = None
                must = {d for d in self.devices[params["to"]["users"][0]] if self.env.device_tokens[d][0] != "webpush"}
            self.env.msg_info[res["message_id"]] = {
                "tag": params["data"]["lt"], "client": self.idx, "n": int(params["data"]["lt"].split("-")[1]),
                "ck": params.get("collapse_key"), "named": named, "must": must,
                "devices": res["devices"], "skipped": res["skipped"]}


class Env:
    pass


async def mixed_client(c, deadline, stats, allowed):
    conn = await AsyncRPC.open(c.env.socket)
    try:
        while time.monotonic() < deadline:
            method, params = c.pick()
            t0 = time.perf_counter()
            obj = await conn.call(method, params)
            stats.note(method, obj, time.perf_counter() - t0)
            if "error" in obj:
                code = obj["error"]["code"]
                if code not in allowed.get(method, ()):
                    stats.failures.add(f"{method} {json.dumps(params)[:160]} answered an unexpected error "
                                       f"{obj['error']}")
                elif code == 1002:
                    await asyncio.sleep(min(obj["error"]["data"]["retry_after_ms"], 2000) / 1000)
                continue
            problem = check_result(method, params, obj["result"])
            if problem:
                stats.failures.add(f"{method}: {problem}: {json.dumps(obj)[:300]}")
            c.learn(method, params, obj)
    except (ProtocolViolation, ConnectionError, OSError) as e:
        stats.failures.add(f"client {c.idx}: {e!r}")
    finally:
        conn.close()


async def monitor(env, stop, interval, samples):
    conn = await AsyncRPC.open(env.socket)
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            obj = await conn.call("system.stats", {})
            dt = time.perf_counter() - t0
            if "result" in obj:
                q = obj["result"]["queue"]
                mem = proc_memory_kb(env.pid)
                samples.append({"t": time.monotonic(), "depth": q["depth"], "in_flight": q["in_flight"],
                                "rss_kb": mem.get("VmRSS"), "hwm_kb": mem.get("VmHWM"),
                                "anon_kb": mem.get("RssAnon"), "file_kb": mem.get("RssFile"),
                                "shmem_kb": mem.get("RssShmem"), "stats_s": dt,
                                "cpu_s": cpu_seconds(env.pid),
                                "work": (env.stats.listed, env.stats.lists, env.stats.fanned, env.stats.sends)
                                if getattr(env, "stats", None) else None,
                                "requests": env.stats.total if getattr(env, "stats", None) else None})
            else:
                env.failures.add(f"system.stats answered {obj['error']}")
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass
    except (ProtocolViolation, ConnectionError, OSError) as e:
        env.failures.add(f"monitor: {e!r}")
    finally:
        conn.close()


def wait_messages(daemon, ids, timeout, failures, label):
    """Polls push.status until every message is complete; (counts, seconds)."""
    t0 = time.monotonic()
    remaining = list(dict.fromkeys(ids))
    totals = {s: 0 for s in STATES}
    with RPC(daemon.socket, timeout=60) as c:
        while remaining:
            still = []
            for chunk in range(0, len(remaining), 500):
                part = remaining[chunk:chunk + 500]
                answers = c.pipelined("push.status", [{"message_id": m} for m in part])
                for m, a in zip(part, answers):
                    if "result" not in a:
                        failures.add(f"{label}: push.status {m} answered {a['error']}")
                    elif a["result"]["state"] != "complete":
                        still.append(m)
                    else:
                        for s, n in a["result"]["counts"].items():
                            totals[s] += n
            remaining = still
            if remaining and time.monotonic() - t0 > timeout:
                failures.add(f"{label}: {len(remaining)} message(s) not complete {timeout:.0f} s after the load, "
                             f"e.g. {remaining[:3]}")
                break
            if remaining:
                time.sleep(0.25)
    return totals, time.monotonic() - t0


def summarize(stats, seconds):
    methods = {}
    for m, n in sorted(stats.by_method.items()):
        lat = stats.latency.get(m, [])
        methods[m] = {"requests": n, "per_s": round(n / seconds, 1),
                      "p50_ms": round(percentile(lat, 0.5) * 1000, 2) if lat else None,
                      "p99_ms": round(percentile(lat, 0.99) * 1000, 2) if lat else None}
    errors = {f"{m} {code}": n for (m, code), n in sorted(stats.errors.items())}
    return methods, errors


async def run_mixed(env, clients, seconds, stats):
    rng = random.Random(env.seed)
    cs = [MixedClient(i, env, random.Random(rng.getrandbits(64))) for i in range(clients)]
    stop = asyncio.Event()
    samples = []
    mon = asyncio.create_task(monitor(env, stop, 0.5, samples))
    deadline = time.monotonic() + seconds
    allowed = {"device.register": (1002,)}
    t0 = time.monotonic()
    await asyncio.gather(*(mixed_client(c, deadline, stats, allowed) for c in cs))
    elapsed = time.monotonic() - t0
    stop.set()
    await mon
    return elapsed, samples


# ---------------------------------------------------------------- phase 2


async def overload_client(idx, env, deadline, stats, users, rng):
    conn = await AsyncRPC.open(env.socket)
    try:
        n = 0
        while time.monotonic() < deadline:
            params = {"to": {"users": rng.sample(users, rng.randint(1, 3))}, "data": {"ov": f"{idx}-{n}"}}
            n += 1
            t0 = time.perf_counter()
            obj = await conn.call("push.send", params)
            stats.note("push.send", obj, time.perf_counter() - t0)
            if "error" in obj:
                e = obj["error"]
                if e["code"] != 1007:
                    stats.failures.add(f"overload: push.send answered an unexpected error {e}")
                    continue
                env.overloaded += 1
                env.refused_tags.add(params["data"]["ov"])
                ra = e["data"]["retry_after_ms"]
                env.retry_after.add(ra)
                if ra <= 0:
                    stats.failures.add(f"overload: retry_after_ms {ra}")
                await asyncio.sleep(min(ra, 5000) / 1000 * rng.uniform(0.5, 1.0))
                continue
            problem = check_result("push.send", params, obj["result"])
            if problem:
                stats.failures.add(f"overload push.send: {problem}")
                continue
            env.accepted_devices += obj["result"]["devices"]
            env.sent_messages.append(obj["result"]["message_id"])
            # the users' devices are fixed in this phase: every one of them, and no other
            must = set().union(*(env.user_devices[u] for u in params["to"]["users"]))
            env.msg_info[obj["result"]["message_id"]] = {
                "tag": params["data"]["ov"], "client": idx, "n": n - 1, "ck": None, "named": must, "must": must,
                "devices": obj["result"]["devices"], "skipped": obj["result"]["skipped"]}
    except (ProtocolViolation, ConnectionError, OSError) as e:
        stats.failures.add(f"overload client {idx}: {e!r}")
    finally:
        conn.close()


async def run_overload(env, clients, seconds, users, stats):
    rng = random.Random(env.seed + 1)
    stop = asyncio.Event()
    samples = []
    mon = asyncio.create_task(monitor(env, stop, 0.1, samples))
    deadline = time.monotonic() + seconds
    t0 = time.monotonic()
    await asyncio.gather(*(overload_client(i, env, deadline, stats, users, random.Random(rng.getrandbits(64)))
                           for i in range(clients)))
    elapsed = time.monotonic() - t0
    stop.set()
    await mon
    return elapsed, samples


def connection_limit(daemon, failures, total=520):
    """Opens `total` connections at once: those past the daemon's limit must be told
    1007 overloaded (id null, retry_after_ms) and closed; the rest must work."""
    socks, refused, served, other = [], 0, 0, []
    refused_socks = set()
    try:
        for _ in range(total):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(daemon.socket)
            socks.append(s)
        time.sleep(1.0)
        for s in socks:
            s.setblocking(False)
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue  # admitted: nothing to say until asked
            except OSError as e:
                other.append(repr(e))
                continue
            if not data:
                other.append("closed without a 1007")
                continue
            try:
                obj = json.loads(data.split(b"\n")[0])
            except ValueError:
                other.append(data[:200])
                continue
            e = obj.get("error") or {}
            if obj.get("jsonrpc") == "2.0" and "id" in obj and obj["id"] is None and e.get("code") == 1007 \
                    and isinstance((e.get("data") or {}).get("retry_after_ms"), int):
                refused += 1
                s.settimeout(2)
                try:
                    rest = data[len(data.split(b"\n")[0]) + 1:] or s.recv(100)
                    if rest:
                        other.append(f"bytes after the 1007: {rest[:100]!r}")
                except socket.timeout:
                    other.append("a refused connection was not closed")
                except OSError:
                    pass
                refused_socks.add(s)
            else:
                other.append(obj)
        # the connections that were not refused must be served
        for s in socks:
            if served >= 20:
                break
            if s in refused_socks:
                continue
            try:
                s.settimeout(10)
                s.sendall(b'{"jsonrpc":"2.0","id":7,"method":"system.health","params":{}}\n')
                line = s.recv(65536)
                if line and json.loads(line.split(b"\n")[0]).get("id") == 7:
                    served += 1
            except (OSError, ValueError):
                continue
    finally:
        for s in socks:
            s.close()
    if refused == 0:
        failures.add(f"connection limit: none of {total} connections was refused with 1007")
    if served < 20:
        failures.add(f"connection limit: only {served} of the admitted connections answered system.health")
    for o in other[:5]:
        failures.add(f"connection limit: unexpected {o!r:.200}")
    return {"opened": total, "refused_1007": refused, "served_checked": served, "unexpected": len(other)}


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--herald", default=None)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--deliveries-per-s", type=float, default=300)
    ap.add_argument("--overload-seconds", type=float, default=20)
    ap.add_argument("--max-queued", type=int, default=400)
    ap.add_argument("--slow-ms", type=int, default=2000)
    ap.add_argument("--rss-ceiling-mib", type=float, default=512)
    ap.add_argument("--max-wal-mib", type=float, default=128,
                    help="ceiling on herald.db-wal after phase 1 (0: not checked)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=os.path.join(REPO, "build/reliability/load.json"))
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    binary = herald_binary(args.herald)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    work = tempfile.mkdtemp(prefix="herald-load-")
    failures = Failures()
    summary = {"seed": seed, "herald": binary, "clients": args.clients, "seconds": args.seconds,
               "rss_ceiling_mib": args.rss_ceiling_mib}
    gw = None
    daemons = []
    t_start = time.monotonic()
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    try:
        gw = Gateways(work, timeout=120)
        web_pool = [gw.subscription() for _ in range(WEB_POOL)]

        # ---------------- phase 1
        d1dir = os.path.join(work, "mixed")
        # Every client is this process's uid: room for all of them past the per-uid cap's default (64).
        # The monitor and the clients' mix read system.stats far past the per-uid limit on system.*
        # calls (system_calls_per_minute), which is not what this run measures.
        server = {"max_connections_per_uid": min(512, max(64, args.clients + 16)), "system_calls_per_minute": 1_000_000}
        d1 = Daemon(binary=binary, directory=d1dir, gateways=gw, delivery=DELIVERY, store={"synchronous": "full"},
                    log_level="info", start=False, server=server)
        daemons.append(("mixed", d1))
        d1.start(timeout=60, probe_timeout=5)
        env = Env()
        env.socket, env.pid, env.seed, env.web_pool = d1.socket, d1.pid, seed, web_pool
        env.bucket = Bucket(args.deliveries_per_s)
        env.sent_messages = []
        env.device_tokens, env.msg_info = {}, {}
        env.failures = failures
        s1 = Stats()
        s1.failures = failures
        env.stats = s1
        log(f"phase 1: {args.clients} clients for {args.seconds:.0f} s against herald pid {d1.pid} (seed {seed})")
        cpu0 = (cpu_seconds(d1.pid), cpu_seconds(gw.pid), cpu_seconds(os.getpid()))
        elapsed, samples = asyncio.run(run_mixed(env, args.clients, args.seconds, s1))
        cpu1 = (cpu_seconds(d1.pid), cpu_seconds(gw.pid), cpu_seconds(os.getpid()))
        cpu_share = {k: round((b - a) / elapsed, 2) for k, a, b in zip(("herald", "gateways", "clients"), cpu0, cpu1)}
        methods, errors = summarize(s1, elapsed)
        total = sum(s1.by_method.values())
        counts, drain_s = wait_messages(d1, env.sent_messages, 120, failures, "phase 1")
        not_delivered = {k: v for k, v in counts.items() if k not in ("delivered", "superseded", "skipped") and v}
        if not_delivered:
            failures.add(f"phase 1: deliveries not delivered: {not_delivered}")
        seq1, receipts1 = check_receipts("phase 1", gw, d1, env.msg_info, env.device_tokens, "lt", failures)
        hwm1 = d1.peak_rss_kb()
        files1 = d1.store_files()
        max_q1 = max((s["depth"] + s["in_flight"] for s in samples), default=None)
        p1 = {"elapsed_s": round(elapsed, 1), "requests": total, "requests_per_s": round(total / elapsed, 1),
              "methods": methods, "errors": errors, "messages": len(env.sent_messages),
              "delivery_outcomes": counts, "drain_s": round(drain_s, 1), "peak_rss_kib": hwm1,
              "series_5s": series(samples, 5.0), "receipts": receipts1,
              "max_queue_depth_plus_in_flight": max_q1, "cpu_cores_used": cpu_share,
              "stats_latency_max_ms": round(max((s["stats_s"] for s in samples), default=0) * 1000, 1)}
        summary["phase1"] = p1
        log(f"  {total} requests in {elapsed:.1f} s ({total / elapsed:.0f}/s); {len(env.sent_messages)} messages, "
            f"drained in {drain_s:.1f} s; peak RSS {hwm1 / 1024:.1f} MiB; max queue {max_q1}")
        st1 = d1.stop(timeout=30)
        if st1 != 0:
            failures.add(f"phase 1: herald exited {st1} on SIGTERM")
        files1_stopped = d1.store_files()
        p1["store_files_bytes"] = {"after_load": files1, "after_sigterm": files1_stopped}
        wal_mib = files1["herald.db-wal"] / (1 << 20)
        log(f"  store after the load: herald.db {files1['herald.db'] / (1 << 20):.1f} MiB, WAL {wal_mib:.1f} MiB; "
            f"after SIGTERM: WAL {files1_stopped['herald.db-wal'] / (1 << 20):.1f} MiB")
        if args.max_wal_mib and wal_mib > args.max_wal_mib:
            failures.add(f"phase 1: the SQLite WAL is {wal_mib:.0f} MiB after {elapsed:.0f} s of load (herald.db "
                         f"{files1['herald.db']} bytes): it is never checkpointed, so disk use grows without bound "
                         f"(ceiling --max-wal-mib {args.max_wal_mib})")

        # ---------------- phase 2
        d2dir = os.path.join(work, "overload")
        d2 = Daemon(binary=binary, directory=d2dir, gateways=gw, delivery=dict(DELIVERY, max_queued=args.max_queued),
                    store={"synchronous": "full"}, log_level="info", start=False,
                    # The 520 connections test the global cap, each with a system.health.
                    server={"max_connections_per_uid": 512, "system_calls_per_minute": 1_000_000})
        daemons.append(("overload", d2))
        d2.start(timeout=60, probe_timeout=5)
        users = [f"ov-u{i:03d}" for i in range(60)]
        regs = []
        for i, u in enumerate(users):
            for k in range(10):
                if k < 5:
                    regs.append({"user": u, "platform": "apns", "token": f"0f{i:06x}{k:056x}"})
                elif k < 9:
                    regs.append({"user": u, "platform": "fcm", "token": f"ov-{i}-{k}"})
                else:
                    s = web_pool[i]
                    regs.append({"user": u, "platform": "web", "token": s["endpoint"],
                                 "keys": {"p256dh": s["p256dh"], "auth": s["auth"]}})
        device_tokens2, user_devices = {}, {}
        with RPC(d2.socket, timeout=120) as c:
            for p, a in zip(regs, c.pipelined("device.register", regs)):
                if "result" not in a:
                    raise HarnessFailure(f"phase 2 registration failed: {a}")
                device_tokens2[a["result"]["device_id"]] = device_key(p)
                user_devices.setdefault(p["user"], set()).add(a["result"]["device_id"])
        gw.set_delay(args.slow_ms)
        env2 = Env()
        env2.socket, env2.pid, env2.seed = d2.socket, d2.pid, seed
        env2.sent_messages, env2.failures = [], failures
        env2.overloaded, env2.accepted_devices, env2.retry_after = 0, 0, set()
        env2.refused_tags, env2.msg_info, env2.user_devices = set(), {}, user_devices
        s2 = Stats()
        s2.failures = failures
        log(f"phase 2: {args.clients} clients sending 10-30-device fan-outs for {args.overload_seconds:.0f} s, "
            f"max_queued {args.max_queued}, gateways answering after {args.slow_ms} ms")
        elapsed2, samples2 = asyncio.run(run_overload(env2, args.clients, args.overload_seconds, users, s2))
        max_q2 = max((s["depth"] + s["in_flight"] for s in samples2), default=0)
        if max_q2 > args.max_queued:
            failures.add(f"phase 2: the queue held {max_q2} deliveries (waiting + in flight), past max_queued "
                         f"{args.max_queued}")
        if env2.overloaded == 0:
            failures.add("phase 2: no push.send was refused with 1007 overloaded: the limit was never reached")
        conn_limit = connection_limit(d2, failures)
        gw.set_delay(0)
        counts2, drain2 = wait_messages(d2, env2.sent_messages, 120, failures, "phase 2")
        not_delivered2 = {k: v for k, v in counts2.items() if k != "delivered" and v}
        if not_delivered2:
            failures.add(f"phase 2: deliveries not delivered: {not_delivered2}")
        _, receipts2 = check_receipts("phase 2", gw, d2, env2.msg_info, device_tokens2, "ov", failures, since=seq1,
                                      refused=env2.refused_tags)
        with RPC(d2.socket, timeout=120) as c:
            # The store's figures are read at most once a second: give them that to catch up.
            deadline = time.monotonic() + 3
            q_end = c.ok("system.stats")["queue"]
            while (q_end["depth"] or q_end["in_flight"]) and time.monotonic() < deadline:
                time.sleep(0.2)
                q_end = c.ok("system.stats")["queue"]
        if q_end["depth"] or q_end["in_flight"]:
            failures.add(f"phase 2: queue not empty after every message completed: {q_end}")
        hwm2 = d2.peak_rss_kb()
        methods2, errors2 = summarize(s2, elapsed2)
        p2 = {"elapsed_s": round(elapsed2, 1), "max_queued": args.max_queued, "slow_ms": args.slow_ms,
              "methods": methods2, "errors": errors2, "overloaded_answers": env2.overloaded,
              "retry_after_ms_values": sorted(env2.retry_after), "accepted_messages": len(env2.sent_messages),
              "accepted_deliveries": env2.accepted_devices, "max_queue_depth_plus_in_flight": max_q2,
              "queue_samples": len(samples2), "delivery_outcomes": counts2, "drain_s": round(drain2, 1),
              "queue_at_end": q_end, "peak_rss_kib": hwm2, "connection_limit": conn_limit, "receipts": receipts2}
        summary["phase2"] = p2
        log(f"  {env2.overloaded} overloaded answers, {len(env2.sent_messages)} sends accepted "
            f"({env2.accepted_devices} deliveries); max queue {max_q2} of {args.max_queued}; "
            f"connections: {conn_limit}; peak RSS {hwm2 / 1024:.1f} MiB")
        st2 = d2.stop(timeout=30)
        if st2 != 0:
            failures.add(f"phase 2: herald exited {st2} on SIGTERM")
        for label, hwm in (("phase 1", hwm1), ("phase 2", hwm2)):
            if hwm is None or hwm / 1024 > args.rss_ceiling_mib:
                failures.add(f"{label}: peak RSS {hwm} KiB is over the ceiling {args.rss_ceiling_mib} MiB")
    except HarnessFailure as e:
        failures.add(f"aborted: {e}")
    except Exception as e:  # noqa: BLE001
        failures.add(f"harness error: {e!r}\n{traceback.format_exc()}")
    finally:
        for label, d in daemons:
            if d.running:
                d.stop(timeout=30)
            ev = d.log_events()
            summary.setdefault("log_events", {})[label] = {f"<{p}>": e for p, e in sorted(ev.items())}
            shutil.copyfile(d.log_path, os.path.join(out_dir, f"load-herald-{label}.log"))
        if gw is not None:
            gw.stop(timeout=15)
    summary["total_s"] = round(time.monotonic() - t_start, 1)
    summary["failures"] = failures
    summary["ok"] = not failures
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    report(summary, args)
    if failures:
        for label, d in daemons:
            log(f"herald stderr ({label}, tail):\n" + tail(d.log_path, 20))
    # a failure kept for inspection, except the WAL one alone (its evidence, the sizes, is in the summary,
    # and the directory holds hundreds of MiB of WAL)
    if args.keep or any("SQLite WAL" not in f for f in failures):
        log(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if summary["ok"] else 1)


def report(s, args):
    log("")
    log(f"load test summary (seed {s['seed']}, {s['clients']} clients)")
    for phase in ("phase1", "phase2"):
        p = s.get(phase)
        if not p:
            continue
        title = "mixed load" if phase == "phase1" else f"past the limits (max_queued {p['max_queued']})"
        log(f"  {phase}: {title}, {p['elapsed_s']} s")
        log(f"    {'method':16} {'requests':>9} {'per s':>8} {'p50 ms':>8} {'p99 ms':>8}")
        for m, r in p["methods"].items():
            log(f"    {m:16} {r['requests']:9d} {r['per_s']:8.1f} {r['p50_ms'] or 0:8.2f} {r['p99_ms'] or 0:8.2f}")
        log(f"    errors by method and code: {p['errors'] or 'none'}")
        log(f"    peak RSS (VmHWM) {p['peak_rss_kib'] / 1024:.1f} MiB (ceiling {args.rss_ceiling_mib:.0f} MiB)"
            if p.get("peak_rss_kib") else "    peak RSS: unknown")
        if phase == "phase1":
            log(f"    CPU (cores busy on average): {p['cpu_cores_used']}")
            log("    every 5 s (requests/s, RSS = anon + file + shmem MiB): " + ", ".join(
                f"{x['t_s']:.0f}s {x['requests_per_s']:.0f}/s {x['rss_mib']:.0f}={x['anon_mib']:.0f}+{x['file_mib']:.0f}"
                f"+{x['shmem_mib']:.0f}" for x in p["series_5s"]))
            log("    herald CPU ms per request, every 5 s: " + ", ".join(
                f"{x['herald_cpu_ms_per_request']}" for x in p["series_5s"]))
            log("    devices per device.list / per push.send, every 5 s: " + ", ".join(
                f"{x['devices_per_list']}/{x['devices_per_send']}" for x in p["series_5s"]))
            sf = p.get("store_files_bytes")
            if sf:
                log(f"    store files after the load: herald.db {sf['after_load']['herald.db']} bytes, WAL "
                    f"{sf['after_load']['herald.db-wal'] / (1 << 20):.1f} MiB (after SIGTERM: WAL "
                    f"{sf['after_sigterm']['herald.db-wal'] / (1 << 20):.1f} MiB)")
            log(f"    max queue (waiting + in flight) {p['max_queue_depth_plus_in_flight']}, messages {p['messages']}, "
                f"outcomes {({k: v for k, v in p['delivery_outcomes'].items() if v})}, drained in {p['drain_s']} s")
        else:
            log(f"    overloaded (1007) answers {p['overloaded_answers']}, retry_after_ms {p['retry_after_ms_values']}; "
                f"max queue {p['max_queue_depth_plus_in_flight']} of max_queued {p['max_queued']} over "
                f"{p['queue_samples']} samples")
            log(f"    accepted {p['accepted_messages']} messages / {p['accepted_deliveries']} deliveries, outcomes "
                f"{({k: v for k, v in p['delivery_outcomes'].items() if v})}, drained in {p['drain_s']} s")
            log(f"    connection limit: {p['connection_limit']}")
    for label, ev in (s.get("log_events") or {}).items():
        warn = ev.get("<3>", {}) | ev.get("<4>", {})
        if warn:
            log(f"  daemon errors/warnings ({label}): {warn}")
    log(f"  total {s['total_s']} s")
    log("PASSED" if s["ok"] else f"FAILED: {len(s['failures'])} problem(s)")


if __name__ == "__main__":
    main()
