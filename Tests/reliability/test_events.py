"""The event stream (`events.subscribe`) judged by what the gateways recorded.

* Every final outcome of a push appears as one event on a subscriber's connection, with the ids
  the provider saw: the `apns-id` of the request the APNs gateway received, the `apns-unique-id`
  the development gateway answered, the FCM message `name`, the Web Push `Location`; each device
  Herald removed as stale is a `device_removed` event; the message's completion comes last.
* A subscriber that closes and subscribes again `since` its last cursor misses nothing.
* A subscriber that stops reading during a send does not slow it: past its buffer it is sent one
  `gap` event, and a replay from the gap's cursor has every delivery.
* `events.subscribe`'s params are checked like every method's.

HERALD_STORE_BACKEND=postgres runs these on PostgreSQL (``backend_store``).
"""

from __future__ import annotations

import socket
import time

import pytest

from herald_fixtures import Daemon, Gateways, RPCError, backend_store, hex_token, record_counts, reset_counts

SUITE = "events"


@pytest.fixture(scope="module", autouse=True)
def _suite_counts():
    reset_counts(SUITE)
    yield


@pytest.fixture()
def gw():
    g = Gateways.shared()
    g.reset()
    yield g
    g.reset()


def read_events(conn, until, timeout=30.0):
    """Events from `events` notifications on ``conn`` until ``until(event)`` holds for one (or the
    timeout passes: AssertionError). Answers to calls (with an id) are skipped."""
    out = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no event matched within {timeout} s; got {len(out)}: {out[-3:]}"
        try:
            msg = conn.read_json(timeout=left)
        except TimeoutError:
            continue
        if msg.get("method") != "events":
            continue
        events = msg["params"]["events"]
        assert events, msg
        # Where to resume: the last event's cursor, or past it (events examined and not wanted).
        if events[-1]["kind"] != "gap":
            assert cursor_key(msg["params"]["cursor"]) >= cursor_key(events[-1]["cursor"]), msg
        out += events
        if any(until(e) for e in events):
            return out


def cursor_key(c: str):
    return tuple(int(x) for x in c.split("-"))


def test_every_recorded_outcome_is_one_event_with_the_providers_ids(gw):
    d = Daemon(gateways=gw, transports=("apns", "fcm", "web"), store=backend_store())
    try:
        prod = [hex_token(i, prefix=0xEA) for i in range(5)]
        dev = [hex_token(i, prefix=0xEB) for i in range(2)]
        fcm = [f"ev-fcm-{i}" for i in range(3)]
        gw.program("apns", [{"status": 410, "reason": "Unregistered"}], token=prod[0])
        gw.program("apns", [{"status": 400, "reason": "BadDeviceToken"}], token=prod[1])
        gw.program("fcm", [{"error": "INVALID_ARGUMENT"}], token=fcm[0])
        by_token = {}
        for t in prod:
            by_token[t] = d.register("eve", "apns", t)["device_id"]
        for t in dev:
            by_token[t] = d.register("eve", "apns", t, environment="development")["device_id"]
        for t in fcm:
            by_token[t] = d.register("eve", "fcm", t)["device_id"]
        sub = gw.subscription()
        web_device = d.register("eve", "web", sub["endpoint"], keys=gw.web_keys(sub))["device_id"]

        watcher = d.connect()
        started = watcher.call("events.subscribe", {})
        assert "default" in started["apps"] and "delivery" in started["kinds"], started
        mid = d.call("push.send", {"to": {"users": ["eve"]}, "kind": "notification"})["message_id"]
        events = read_events(watcher, lambda e: e["kind"] == "message_complete" and e["message_id"] == mid)
        status = d.wait_complete(mid)

        deliveries = [e for e in events if e["kind"] == "delivery" and e["message_id"] == mid]
        by_device = {}
        for e in deliveries:
            assert e["device_id"] not in by_device, f"an outcome twice on one connection: {e}"
            by_device[e["device_id"]] = e
        # One per device, with the state push.status says.
        assert set(by_device) == {x["device_id"] for x in status["devices"]}, (by_device, status)
        for x in status["devices"]:
            assert by_device[x["device_id"]]["state"] == x["state"], (x, by_device[x["device_id"]])
            assert by_device[x["device_id"]]["user"] == "eve"

        # Judged by the gateways' records: every answer they gave is an event with its ids.
        checked = 0
        for rec in gw.received("apns") + gw.received("apns_dev"):
            if rec.get("token") not in by_token or not rec.get("response"):
                continue
            e = by_device[by_token[rec["token"]]]
            assert e["apns_id"] == rec["headers"]["apns-id"], (e, rec["headers"])
            status_code = rec["response"]["status"]
            assert e["http_status"] == status_code, (e, rec["response"])
            if status_code == 200:
                assert e["state"] == "delivered"
                assert e["provider_id"] == rec["response"]["headers"].get("apns-unique-id"), (e, rec["response"])
            checked += 1
        assert any(by_device[by_token[t]]["provider_id"] for t in dev), "apns_dev answers carry apns-unique-id"
        assert by_device[by_token[prod[0]]]["state"] == "removed_stale"
        assert by_device[by_token[prod[1]]]["state"] == "failed"
        for rec in gw.received("fcm", kind="send"):
            tok = rec.get("token")
            if tok not in by_token or not rec.get("response"):
                continue
            e = by_device[by_token[tok]]
            if rec["response"]["status"] == 200:
                assert e["state"] == "delivered" and e["provider_id"] == rec["response"]["body"]["name"], (e, rec)
            else:
                assert e["state"] == "failed" and e["http_status"] == rec["response"]["status"], (e, rec)
            checked += 1
        web = [r for r in gw.received("webpush") if r.get("response")]
        assert web, "the Web Push gateway got the push"
        location = {k.lower(): v for k, v in web[-1]["response"]["headers"].items()}.get("location")
        assert by_device[web_device]["state"] == "delivered"
        assert by_device[web_device]["provider_id"] == location, (by_device[web_device], web[-1]["response"])
        checked += 1
        assert checked == len(by_device), (checked, len(by_device))

        # The stale device's removal, with its user and why; the completion last, with the counts.
        removed = [e for e in events if e["kind"] == "device_removed"]
        assert [(e["device_id"], e["reason"], e["user"]) for e in removed] == [
            (by_token[prod[0]], "stale", "eve")], removed
        complete = events[-1]
        assert complete["kind"] == "message_complete", complete
        assert complete["counts"] == {k: v for k, v in status["counts"].items() if v}, (complete, status)
        cursors = [cursor_key(e["cursor"]) for e in events]
        assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors), "cursors only grow"

        # push.status detail lists the attempts with the same ids.
        detail = d.call("push.status", {"message_id": mid, "detail": True})
        attempts = {a["device_id"]: a for a in detail["attempts"]}
        for device_id, e in by_device.items():
            assert attempts[device_id]["provider_id"] == e["provider_id"], (attempts[device_id], e)
            assert attempts[device_id].get("apns_id") == e.get("apns_id")
            assert attempts[device_id]["origin"].startswith("https://127.0.0.1:"), attempts[device_id]
            assert attempts[device_id]["elapsed_ms"] >= 0
        record_counts(SUITE, events_checked=len(events))
    finally:
        d.cleanup()


def test_a_subscriber_that_comes_back_with_its_cursor_misses_nothing(gw):
    d = Daemon(gateways=gw, transports=("fcm",), store=backend_store())
    try:
        for i in range(40):
            d.register(f"back-{i}", "fcm", f"back-{i}")
        first = d.connect()
        first.call("events.subscribe", {"kinds": ["delivery"]})
        m1 = d.call("push.send", {"to": {"users": [f"back-{i}" for i in range(20)]}})["message_id"]
        seen = read_events(first, lambda e: True)
        last = seen[-1]["cursor"]
        first.close()
        # Sent while nobody listens.
        d.wait_complete(m1)
        m2 = d.call("push.send", {"to": {"users": [f"back-{i}" for i in range(20, 40)]}})["message_id"]
        d.wait_complete(m2)
        again = d.connect()
        again.call("events.subscribe", {"kinds": ["delivery"], "since": last})
        want = {m1: 20, m2: 20}
        got = {m1: set(), m2: set()}
        for e in [x for x in seen if x["kind"] == "delivery"]:
            got[e["message_id"]].add(e["device_id"])

        def complete(e):
            got[e["message_id"]].add(e["device_id"])
            return all(len(got[m]) == n for m, n in want.items())

        more = read_events(again, complete)
        assert all(cursor_key(e["cursor"]) > cursor_key(last) for e in more)
        assert {e["kind"] for e in more} == {"delivery"}, "kinds filter"
        record_counts(SUITE, events_checked=len(seen) + len(more))
    finally:
        d.cleanup()


def test_a_subscriber_that_stops_reading_gets_a_gap_and_replays_everything(gw):
    n = 3000
    d = Daemon(gateways=gw, transports=("fcm",), store=backend_store(), server={"event_buffer_bytes": 65536})
    try:
        d.register_many([{"user": f"slow-{i}", "platform": "fcm", "token": f"slow-{i}"} for i in range(n)])
        # A small receive buffer: what the daemon may write ahead is its own business.
        stalled = d.connect()
        stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        start = stalled.call("events.subscribe", {"kinds": ["delivery", "message_complete"]})
        t0 = time.monotonic()
        mid = d.call("push.send", {"to": {"users": [f"slow-{i}" for i in range(n)]}})["message_id"]
        status = d.wait_complete(mid, timeout=120)
        took = time.monotonic() - t0
        assert status["counts"]["delivered"] == n, status
        # Reads again: one gap, then live events; the replay from the gap's cursor has them all.
        seen = read_events(stalled, lambda e: e["kind"] == "gap", timeout=30)
        gap = [e for e in seen if e["kind"] == "gap"]
        assert len(gap) == 1 and gap[0]["reason"] == "slow", gap
        before_gap = {e["device_id"] for e in seen if e["kind"] == "delivery"}
        replay = d.connect()
        replay.call("events.subscribe", {"kinds": ["delivery", "message_complete"],
                                         "since": gap[0]["cursor"] or start["cursor"] or "0"})
        replayed = read_events(replay, lambda e: e["kind"] == "message_complete" and e["message_id"] == mid,
                               timeout=60)
        devices = before_gap | {e["device_id"] for e in replayed if e["kind"] == "delivery"}
        assert len(devices) == n, f"{n - len(devices)} deliveries missed after the gap"
        assert d.call("system.health")["status"] in ("ok", "degraded")
        record_counts(SUITE, events_checked=len(seen) + len(replayed), gaps=1)
        print(f"{n} deliveries in {took:.1f} s with a stalled subscriber")
    finally:
        d.cleanup()


def test_params_are_checked_and_the_connection_stays_usable():
    d = Daemon(transports=("fcm",))
    try:
        c = d.connect()
        for params, field in [({"kinds": ["nope"]}, "kinds[0]"), ({"kinds": []}, "kinds"),
                              ({"since": "x"}, "since"), ({"since": 5}, "since"), ({"bogus": 1}, "bogus")]:
            with pytest.raises(RPCError) as e:
                c.call("events.subscribe", params)
            assert e.value.code == -32602, (params, e.value.response)
            assert field in str(e.value.response["error"]), (params, e.value.response)
        with pytest.raises(RPCError) as e:
            c.call("events.subscribe", {"app": "nope"})
        assert e.value.code == 1004
        assert c.call("events.unsubscribe") == {"unsubscribed": False}
        assert c.call("events.subscribe", {"kinds": ["message_complete"]})["kinds"] == ["message_complete"]
        assert c.call("events.unsubscribe") == {"unsubscribed": True}
        assert c.call("system.health")["status"] in ("ok", "degraded")
    finally:
        d.cleanup()
