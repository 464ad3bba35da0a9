"""Each device's own rules through the socket, judged by the test gateways' records.

* A message's topics and the devices' topics: a device that wants none of the message's topics is
  `skipped` (`not_subscribed`) and the gateways never see it.
* Quiet hours at the time of the send: `hold` is `held` with the period's end as `due_at` (and
  `push.cancel` drops it), `silent` reaches each provider without sound or banner (APNs
  `interruption-level: passive` and no `sound`, FCM `notification_priority: PRIORITY_MIN`, Web Push
  `Urgency: low` and `"silent": true` in the record), `drop` is `skipped` (`quiet_hours`); a
  time-sensitive message and one of the app's bypassing topics break through, and the status says so.
* `not_before`: every delivery is `held` with its `due_at`, none reaches a gateway before it, each
  reaches it once right after; one whose TTL runs out first ends `expired` and never reaches one;
  `at_local` for a device without a time zone is sent at once and says why.
* With the daemon's wall clock moved (clockshift.c) to a few seconds before a minute begins: a
  quiet period that ends at that minute releases its held delivery then, and `at_local` of that
  minute sends then (SQLite: the daemon's clock is the store's).
* Bad input gets `-32602` naming the field, nothing is stored, the connection stays usable.

HERALD_STORE_BACKEND=postgres runs these on PostgreSQL (``backend_store``), but for the clock-moved
test, which needs the store's clock to be the daemon's.
"""

from __future__ import annotations

import datetime
import time

import pytest

from herald_fixtures import STORE_BACKEND, Daemon, Gateways, RPCError, backend_store, hex_token

UTC = datetime.timezone.utc


@pytest.fixture()
def gw():
    g = Gateways.shared()
    g.reset()
    yield g
    g.reset()


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(t * 1000) % 1000:03d}Z"


def parse_rfc3339(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def hhmm(minutes: int) -> str:
    minutes %= 1440
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def by_device(status) -> dict:
    return {x["device_id"]: x for x in status["devices"]}


def records_for(gw, token):
    out = []
    for name in ("apns", "fcm", "webpush"):
        kw = {"kind": "send"} if name == "fcm" else {}
        out += [r for r in gw.received(name, **kw) if r.get("token") == token]
    return out


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_topics_and_quiet_hours_judged_by_the_gateways(gw):
    d = Daemon(gateways=gw, transports=("apns", "fcm", "web"), store=backend_store(),
               app_default_extra="quiet_hours_bypass_topics = security\n")
    try:
        # A quiet period around now in Kolkata (+05:30): from an hour ago to an hour ahead.
        now = time.time()
        local_min = int((now + 5.5 * 3600) // 60)
        start, end = hhmm(local_min - 60), hhmm(local_min + 60)
        period_end = (local_min + 60) * 60 - 5.5 * 3600
        def quiet(during):
            return {"time_zone": "Asia/Kolkata", "quiet_hours": {"start": start, "end": end, "during": during}}

        hold_token = hex_token(1, prefix=0xD1)
        hold = d.register("qa", "apns", hold_token, **quiet("hold"))["device_id"]
        silent_apns_token = hex_token(2, prefix=0xD1)
        silent_apns = d.register("qa", "apns", silent_apns_token, **quiet("silent"))["device_id"]
        silent_fcm = d.register("qa", "fcm", "dr-fcm-silent", **quiet("silent"))["device_id"]
        sub = gw.subscription()
        silent_web = d.register("qa", "web", sub["endpoint"], keys=gw.web_keys(sub), **quiet("silent"))["device_id"]
        drop = d.register("qa", "fcm", "dr-fcm-drop", **quiet("drop"))["device_id"]
        other_topics = d.register("qa", "fcm", "dr-fcm-billing", topics=["billing"])["device_id"]
        plain = d.register("qa", "fcm", "dr-fcm-plain")["device_id"]

        listed = {x["device_id"]: x for x in d.devices("qa")}
        assert listed[hold]["time_zone"] == "Asia/Kolkata"
        assert listed[hold]["quiet_hours"] == {"start": start, "end": end, "days": None, "during": "hold"}
        assert listed[other_topics]["topics"] == ["billing"] and listed[plain]["topics"] is None

        sent = d.call("push.send", {"to": {"users": ["qa"]}, "topics": ["mention"], "collapse_key": "dr-1"})
        assert sent["devices"] == 5 and sent["skipped"] == 2, sent
        mid = sent["message_id"]
        wait_for(lambda: d.status(mid)["counts"]["delivered"] == 4, 20, "the four sent at once")
        status = d.status(mid)
        assert status["state"] == "pending" and status["counts"]["held"] == 1, status
        x = by_device(status)
        assert x[hold]["state"] == "held" and x[hold]["timing"] == ["quiet_hours:hold"], x[hold]
        assert abs(parse_rfc3339(x[hold]["due_at"]) - period_end) < 0.001, (x[hold], period_end)
        for dev in (silent_apns, silent_fcm, silent_web):
            assert x[dev]["state"] == "delivered" and x[dev]["timing"] == ["quiet_hours:silent"], x[dev]
        assert x[drop]["state"] == "skipped" and x[drop]["reason"] == "quiet_hours", x[drop]
        assert x[drop]["timing"] == ["quiet_hours:drop"]
        assert x[other_topics]["state"] == "skipped" and x[other_topics]["reason"] == "not_subscribed"
        assert x[plain]["state"] == "delivered" and x[plain]["timing"] == [] and x[plain]["due_at"] is None

        # What each provider saw of the silent ones, and of the one without quiet hours.
        [apns_rec] = records_for(gw, silent_apns_token)
        aps = apns_rec["body"]["aps"]
        assert aps.get("interruption-level") == "passive" and "sound" not in aps, aps
        [fcm_rec] = records_for(gw, "dr-fcm-silent")
        note = fcm_rec["body"]["message"]["android"]["notification"]
        assert note.get("notification_priority") == "PRIORITY_MIN", note
        [plain_rec] = records_for(gw, "dr-fcm-plain")
        assert "notification_priority" not in plain_rec["body"]["message"]["android"]["notification"]
        [web_rec] = records_for(gw, sub["id"])
        headers = {k.lower(): v for k, v in web_rec["headers"].items()}
        assert headers["urgency"] == "low", headers
        assert web_rec["plaintext_json"].get("silent") is True, web_rec["plaintext_json"]
        assert records_for(gw, hold_token) == [] and records_for(gw, "dr-fcm-drop") == []
        assert records_for(gw, "dr-fcm-billing") == []

        # What breaks through: a time-sensitive message, and one of a bypassing topic.
        urgent = d.call("push.send", {"to": {"devices": [hold]}, "interruption_level": "time-sensitive"})
        security = d.call("push.send", {"to": {"devices": [drop]}, "topics": ["security"]})
        u = by_device(d.wait_complete(urgent["message_id"]))[hold]
        s = by_device(d.wait_complete(security["message_id"]))[drop]
        assert u["state"] == "delivered" and u["timing"] == ["quiet_hours:bypassed:time-sensitive"], u
        assert s["state"] == "delivered" and s["timing"] == ["quiet_hours:bypassed:topic:security"], s
        assert len(records_for(gw, hold_token)) == 1

        # The held one is dropped by push.cancel, and never sent.
        assert d.call("push.cancel", {"message_id": mid})["cancelled"] == 1
        after = by_device(d.wait_complete(mid))
        assert after[hold]["state"] == "skipped" and after[hold]["reason"] == "cancelled", after[hold]
        assert len(records_for(gw, hold_token)) == 1
    finally:
        d.stop()


def test_not_before_holds_each_delivery_until_its_time(gw):
    d = Daemon(gateways=gw, transports=("apns", "fcm"), store=backend_store())
    try:
        tokens = [hex_token(i, prefix=0xD2) for i in range(3)]
        ids = {d.register("nb", "apns", t)["device_id"]: t for t in tokens}
        fcm_id = d.register("nb", "fcm", "dr-nb-fcm", time_zone="Europe/Paris")["device_id"]
        ids[fcm_id] = "dr-nb-fcm"
        watcher = d.connect()
        watcher.call("events.subscribe", {"kinds": ["delivery"]})
        due = time.time() + 3.0
        sent = d.call("push.send", {"to": {"users": ["nb"]}, "not_before": rfc3339(due)})
        # Its acceptance is an event per held delivery, with the time it is due.
        held_events = {}
        while len(held_events) < 4:
            msg = watcher.read_json(timeout=10)
            for e in msg.get("params", {}).get("events", []) if msg.get("method") == "events" else []:
                if e["message_id"] == sent["message_id"]:
                    assert e["state"] == "held" and e["due_at"] == rfc3339(due), e
                    assert e["timing"] == ["not_before"], e
                    held_events[e["device_id"]] = e
        assert set(held_events) == set(ids), (held_events, ids)
        watcher.close()
        expiring = d.call("push.send", {"to": {"devices": [fcm_id]}, "not_before": rfc3339(due), "ttl": 0,
                                        "kind": "clear"})
        status = d.status(sent["message_id"])
        assert status["counts"]["held"] == 4, status
        for x in status["devices"]:
            assert x["state"] == "held" and x["timing"] == ["not_before"], x
            assert x["due_at"] == rfc3339(due), (x, rfc3339(due))
        assert all(records_for(gw, t) == [] for t in ids.values())

        done = d.wait_complete(sent["message_id"], timeout=20)
        assert done["state"] == "complete" and done["counts"]["delivered"] == 4, done
        for dev, token in ids.items():
            recs = records_for(gw, token)
            ours = [r for r in recs if r.get("response", {}) and r["response"]["status"] == 200]
            assert len(ours) == 1, (token, recs)
            assert ours[0]["time"] >= due - 0.05, ("sent before its time", ours[0]["time"], due)
            assert ours[0]["time"] <= due + 3.0, ("sent long after its time", ours[0]["time"], due)
        # TTL 0 counts from acceptance: its deadline (2 s on) comes before its time.
        e = by_device(d.wait_complete(expiring["message_id"], timeout=20))[fcm_id]
        assert e["state"] == "expired" and e["timing"] == ["not_before"], e
        assert len(records_for(gw, "dr-nb-fcm")) == 1, "only the first message reached the FCM device"

        # at_local for devices without a time zone: at once, and the status says why.
        local = d.call("push.send", {"to": {"users": ["nb"]}, "at_local": "09:00"})
        x = by_device(d.status(local["message_id"]))
        for dev in ids:
            if dev == fcm_id:
                assert x[dev]["state"] in ("held", "delivered"), x[dev]
                if x[dev]["state"] == "held":
                    assert x[dev]["timing"] == ["at_local"], x[dev]
            else:
                assert x[dev]["timing"] == ["at_local:no_time_zone"] and x[dev]["due_at"] is None, x[dev]
        d.call("push.cancel", {"message_id": local["message_id"]})
    finally:
        d.stop()


@pytest.mark.skipif(STORE_BACKEND == "postgres", reason="the store's clock is the database's, not the daemon's")
def test_a_quiet_period_and_at_local_end_when_the_devices_clock_says(gw):
    from test_multi_host import shifted_env
    # The daemon's clock reads 53 s past a minute now: that minute ends in about 7 s.
    real = time.time()
    offset = int(round(53 - real % 60)) % 60
    d = Daemon(gateways=gw, transports=("apns",), store=backend_store(), env=shifted_env(offset))
    try:
        clock = time.time() + offset
        assert 48 <= clock % 60 <= 58.5, clock % 60
        minute = int(clock // 60)
        boundary_real = (minute + 1) * 60 - offset
        held_token, local_token = hex_token(1, prefix=0xD3), hex_token(2, prefix=0xD3)
        quiet = {"start": hhmm(minute), "end": hhmm(minute + 1), "during": "hold"}
        held = d.register("qc", "apns", held_token, time_zone="UTC", quiet_hours=quiet)["device_id"]
        local = d.register("qc", "apns", local_token, time_zone="UTC")["device_id"]
        a = d.call("push.send", {"to": {"devices": [held]}})
        b = d.call("push.send", {"to": {"devices": [local]}, "at_local": hhmm(minute + 1)})
        for mid, dev, why in ((a["message_id"], held, "quiet_hours:hold"), (b["message_id"], local, "at_local")):
            x = by_device(d.status(mid))[dev]
            assert x["state"] == "held" and x["timing"] == [why], x
            assert abs(parse_rfc3339(x["due_at"]) + 0 - (minute + 1) * 60) < 0.001, x
        for mid, token in ((a["message_id"], held_token), (b["message_id"], local_token)):
            s = d.wait_complete(mid, timeout=30)
            assert s["counts"]["delivered"] == 1, s
            [rec] = records_for(gw, token)
            assert rec["time"] >= boundary_real - 0.05, ("before the period's end", rec["time"], boundary_real)
            assert rec["time"] <= boundary_real + 3.0, ("long after the period's end", rec["time"], boundary_real)
    finally:
        d.stop()


def test_bad_preferences_and_send_times_are_refused_and_nothing_is_stored(gw):
    d = Daemon(gateways=gw, transports=("fcm",), store=backend_store())
    try:
        with d.connect() as c:
            cases = [
                ("device.register", {"time_zone": "Mars/Olympus_Mons"}, "time_zone"),
                ("device.register", {"time_zone": "../../etc/passwd"}, "time_zone"),
                ("device.register", {"time_zone": "localtime"}, "time_zone"),
                ("device.register", {"time_zone": "right/Europe/Paris"}, "time_zone"),
                ("device.register", {"time_zone": "UTC", "quiet_hours": {"start": "25:00", "end": "07:00"}},
                 "quiet_hours.start"),
                ("device.register", {"time_zone": "UTC", "quiet_hours": {"start": "22:00", "end": "7:00"}},
                 "quiet_hours.end"),
                ("device.register", {"time_zone": "UTC", "quiet_hours": {"start": "22:00", "end": "22:00"}},
                 "quiet_hours.end"),
                ("device.register", {"time_zone": "UTC",
                                     "quiet_hours": {"start": "22:00", "end": "07:00", "days": ["mon", "funday"]}},
                 "quiet_hours.days[1]"),
                ("device.register", {"time_zone": "UTC",
                                     "quiet_hours": {"start": "22:00", "end": "07:00", "during": "snooze"}},
                 "quiet_hours.during"),
                ("device.register", {"quiet_hours": {"start": "22:00", "end": "07:00"}}, "quiet_hours"),
                ("device.register", {"topics": ["mention", ""]}, "topics[1]"),
                ("device.register", {"topics": ["a b"]}, "topics[0]"),
                ("device.register", {"topics": "mention"}, "topics"),
            ]
            for method, extra, field in cases:
                r = c.request(method, {"user": "bad", "platform": "fcm", "token": "dr-bad", **extra})
                assert r.get("error", {}).get("code") == -32602, (extra, r)
                assert r["error"]["data"]["field"] == field, (extra, r["error"])
            assert c.call("device.list", {"user": "bad"})["devices"] == [], "nothing was stored"
            dev = c.call("device.register", {"user": "bad", "platform": "fcm", "token": "dr-bad"})["device_id"]
            sends = [
                ({"topics": [""]}, "topics[0]"),
                ({"not_before": "tomorrow"}, "not_before"),
                ({"not_before": "2026-12-07T09:00:00"}, "not_before"),
                ({"not_before": rfc3339(time.time() + 40 * 86400)}, "not_before"),
                ({"at_local": "25:00"}, "at_local"),
                ({"at_local": "09:00", "not_before": rfc3339(time.time() + 60)}, "at_local"),
                ({"kind": "call_ring", "not_before": rfc3339(time.time() + 60)}, "not_before"),
            ]
            for extra, field in sends:
                r = c.request("push.send", {"to": {"devices": [dev]}, **extra})
                assert r.get("error", {}).get("code") == -32602, (extra, r)
                assert r["error"]["data"]["field"] == field, (extra, r["error"])
            # Clearing the time zone under stored quiet hours: refused, nothing changed.
            c.call("device.update", {"device_id": dev, "time_zone": "UTC",
                                     "quiet_hours": {"start": "22:00", "end": "07:00"}})
            r = c.request("device.update", {"device_id": dev, "time_zone": None})
            assert r["error"]["code"] == -32602 and r["error"]["data"]["field"] == "time_zone", r
            [listed] = c.call("device.list", {"user": "bad"})["devices"]
            assert listed["time_zone"] == "UTC" and listed["quiet_hours"]["start"] == "22:00", listed
            # And cleared together, it goes.
            cleared = c.call("device.update", {"device_id": dev, "time_zone": None, "quiet_hours": None})["device"]
            assert cleared["time_zone"] is None and cleared["quiet_hours"] is None, cleared
            assert c.call("system.health")["status"] in ("ok", "degraded")
    finally:
        d.stop()
