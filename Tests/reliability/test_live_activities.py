"""Live Activities through the socket, judged by the APNs test gateway's records (issue 32).

* A whole life: an iPhone registers a push-to-start token for its activity type; a start reaches it
  (apns-push-type liveactivity, topic <bundle>.push-type.liveactivity, the event, attributes, the
  alert, input-push-token); the app registers the running activity's update token; while APNs
  hangs, ten updates are sent: each newer one supersedes the older queued one, so after the pause
  only the latest queued one (and the one already in flight) reaches the gateway; an end reaches
  it and the activity's update token is let go.
* Priority: 5 unless the call asks for high; past the app's live_activity_high_per_hour for one
  activity a high update goes at 5 and push.status says so.
* Tokens go with their device (device.unregister), and bad input is -32602 naming the field.
* The APNs kinds with tokens of their own (widgets, location, pushtotalk) and Declarative Web Push's
  `notification` shorthand, on this backend.

HERALD_STORE_BACKEND=postgres runs these on PostgreSQL (``backend_store``).
"""

from __future__ import annotations

import time

import pytest

from herald_fixtures import TOPIC, Daemon, Gateways, RPCError, backend_store, hex_token


@pytest.fixture()
def gw():
    g = Gateways.shared()
    g.reset()
    yield g
    g.reset()


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def la_records(gw, token):
    return [r for r in gw.received("apns") if r.get("token") == token]


def test_a_live_activity_from_start_to_end(gw):
    d = Daemon(gateways=gw, transports=("apns",), store=backend_store(),
               delivery={"backoff_base_ms": 300, "backoff_max_ms": 600, "max_retries": 20})
    try:
        phone = hex_token(1, prefix=0x1A)
        start_token = hex_token(2, prefix=0x1A)
        update_token = hex_token(3, prefix=0x1A)
        gw.apns_devices([phone], kind="alert")
        gw.apns_devices([start_token, update_token], kind="liveactivity")
        device = d.register("rider", "apns", phone)["device_id"]
        reg = d.call("activity.register", {"user": "rider", "device_id": device,
                                           "push_to_start_token": start_token, "activity_type": "RideAttributes"})
        assert reg["created"] is True and len(reg["token_id"]) == 32

        # Start: the push-to-start tokens of the type get it, nothing else does.
        started = d.call("push.send", {
            "to": {"users": ["rider"]}, "kind": "live_activity", "event": "start", "activity_id": "ride-7",
            "attributes_type": "RideAttributes", "attributes": {"driver": "Zoë"},
            "content_state": {"eta_min": 9}, "alert": {"title_loc_key": "RIDE_TITLE", "loc_key": "RIDE_STARTED"},
            "wait": True, "timeout_ms": 20000})
        assert started["counts"]["delivered"] == 1 and started["devices"] == 1, started
        (rec,) = la_records(gw, start_token)
        assert rec["valid"], rec
        h = rec["headers"]
        assert h["apns-push-type"] == "liveactivity" and h["apns-topic"] == TOPIC + ".push-type.liveactivity"
        assert h["apns-priority"] == "5" and "apns-collapse-id" not in h
        aps = rec["body"]["aps"]
        assert aps["event"] == "start" and aps["attributes-type"] == "RideAttributes"
        assert aps["attributes"] == {"driver": "Zoë"} and aps["content-state"] == {"eta_min": 9}
        assert aps["input-push-token"] == 1 and abs(aps["timestamp"] - time.time()) < 60
        assert aps["alert"]["title"] == {"loc-key": "RIDE_TITLE"} and aps["alert"]["body"] == {"loc-key": "RIDE_STARTED"}
        assert la_records(gw, phone) == []

        # The app reports the running activity's update token.
        d.call("activity.register", {"user": "rider", "device_id": device, "update_token": update_token,
                                     "activity_id": "ride-7"})
        listed = d.call("activity.list", {"user": "rider"})["activities"]
        assert {(a["role"], a["activity_type"], a["activity_id"]) for a in listed} == {
            ("push_to_start", "RideAttributes", None), ("update", None, "ride-7")}
        assert all(a["device_id"] == device for a in listed)
        assert [x["platform"] for x in d.call("device.list", {"user": "rider"})["devices"]] == ["apns"]

        # Ten updates while APNs answers 503 for the token (a pause): each waits to be retried, and
        # each newer one supersedes the older one waiting; once APNs answers again only the latest
        # is sent.
        gw.program("apns", [{"status": 503, "reason": "ServiceUnavailable"}] * 40, token=update_token)
        ids = []
        for i in range(10):
            ids.append(d.call("push.send", {"to": {"users": ["rider"]}, "kind": "live_activity", "event": "update",
                                            "activity_id": "ride-7", "content_state": {"eta_min": 8 - i % 8},
                                            "timestamp": 1_900_000_000 + i})["message_id"])
        wait_for(lambda: all(d.call("push.status", {"message_id": m})["counts"]["superseded"] == 1
                             for m in ids[:9]), 20, "the older updates superseded")
        gw.program("apns", [], token=update_token)
        wait_for(lambda: d.call("push.status", {"message_id": ids[9]})["state"] == "complete", 60,
                 "the latest update sent")
        last = d.call("push.status", {"message_id": ids[9]})
        assert last["counts"]["delivered"] == 1, last
        accepted = [r["body"]["aps"]["timestamp"] for r in la_records(gw, update_token)
                    if r.get("valid") and not r.get("programmed")]
        assert accepted == [1_900_000_009], accepted

        # End: it reaches the update token, which then goes.
        ended = d.call("push.send", {"to": {"users": ["rider"]}, "kind": "live_activity", "event": "end",
                                     "activity_id": "ride-7", "content_state": {"eta_min": 0},
                                     "dismissal_date": int(time.time()) + 60, "wait": True, "timeout_ms": 20000})
        assert ended["counts"]["delivered"] == 1, ended
        end_rec = la_records(gw, update_token)[-1]
        assert end_rec["body"]["aps"]["event"] == "end" and "dismissal-date" in end_rec["body"]["aps"]
        wait_for(lambda: [a["role"] for a in d.call("activity.list", {"user": "rider"})["activities"]]
                 == ["push_to_start"], 10, "the ended activity's token let go")
        after = d.call("push.send", {"to": {"users": ["rider"]}, "kind": "live_activity", "event": "update",
                                     "activity_id": "ride-7", "content_state": {"eta_min": 1}})
        assert after["devices"] == 0, after

        # A device that goes takes its activity tokens with it.
        d.call("device.unregister", {"user": "rider", "device_id": device})
        assert d.call("activity.list", {"user": "rider"})["activities"] == []
    finally:
        d.cleanup()


def test_priority_budget_and_bad_input(gw):
    d = Daemon(gateways=gw, transports=("apns",), store=backend_store(),
               app_default_extra="live_activity_high_per_hour = 2\n")
    try:
        phone = hex_token(11, prefix=0x1B)
        token = hex_token(12, prefix=0x1B)
        device = d.register("fan", "apns", phone)["device_id"]
        d.call("activity.register", {"user": "fan", "device_id": device, "update_token": token,
                                     "activity_id": "match-1"})
        priorities, lowered = [], []
        for i in range(4):
            r = d.call("push.send", {"to": {"users": ["fan"]}, "kind": "live_activity", "event": "update",
                                     "activity_id": "match-1", "content_state": {"score": f"{i}-0"},
                                     "priority": "high", "wait": True, "timeout_ms": 20000})
            assert r["counts"]["delivered"] == 1, r
            status = d.call("push.status", {"message_id": r["message_id"], "detail": True})
            lowered.append(status.get("live_activity", {}).get("priority_lowered"))
            priorities.append(la_records(gw, token)[-1]["headers"]["apns-priority"])
        assert priorities == ["10", "10", "5", "5"], priorities
        assert lowered == [False, False, True, True], lowered

        bad = [
            ({"kind": "live_activity"}, "event"),
            ({"kind": "live_activity", "event": "update", "content_state": {}}, "activity_id"),
            ({"kind": "live_activity", "event": "update", "activity_id": "m"}, "content_state"),
            ({"kind": "live_activity", "event": "start", "content_state": {}, "attributes": {},
              "alert": {"loc_key": "X"}}, "attributes_type"),
            ({"kind": "live_activity", "event": "start", "attributes_type": "A", "attributes": {},
              "content_state": {}}, "alert"),
            ({"kind": "live_activity", "event": "update", "activity_id": "m", "content_state": {},
              "data": {"a": "b"}}, "data"),
            ({"kind": "live_activity", "event": "update", "activity_id": "m", "content_state": {},
              "collapse_key": "c"}, "collapse_key"),
            ({"kind": "live_activity", "event": "update", "activity_id": "m", "content_state": "x"},
             "content_state"),
            ({"kind": "live_activity", "event": "update", "activity_id": "m", "content_state": {},
              "timestamp": 1_900_000_000_000}, "timestamp"),
            ({"kind": "live_activity", "event": "update", "activity_id": "m", "content_state": {},
              "dismissal_date": 1}, "dismissal_date"),
            ({"kind": "notification", "event": "update"}, "event"),
            ({"kind": "notification", "content_state": {}}, "content_state"),
        ]
        for extra, field in bad:
            with pytest.raises(RPCError) as e:
                d.call("push.send", {"to": {"users": ["fan"]}, **extra})
            assert e.value.code == -32602 and e.value.data["field"] == field, (extra, e.value.data)
        for params, field in [
            ({"device_id": device, "push_to_start_token": token}, "activity_type"),
            ({"device_id": device, "update_token": token}, "activity_id"),
            ({"device_id": device, "update_token": "zz", "activity_id": "m"}, "update_token"),
            ({"device_id": device, "push_to_start_token": token, "update_token": token, "activity_type": "A"},
             "push_to_start_token"),
            ({"device_id": "0" * 32, "update_token": token, "activity_id": "m"}, "device_id"),
        ]:
            with pytest.raises(RPCError) as e:
                d.call("activity.register", {"user": "fan", **params})
            assert e.value.code == -32602 and e.value.data["field"] == field, (params, e.value.data)
        with pytest.raises(RPCError) as e:
            d.call("device.register", {"user": "fan", "platform": "apns_liveactivity", "token": token})
        assert e.value.data["field"] == "platform"
    finally:
        d.cleanup()


def test_own_kinds_and_declarative_web_push_on_this_backend(gw):
    """widgets, location and pushtotalk reach their own tokens only, with Apple's topics; a
    `notification` shorthand reaches a Web Push subscription as the declarative form."""
    d = Daemon(gateways=gw, transports=("apns", "web"), store=backend_store())
    try:
        tokens = {kind: hex_token(20 + i, prefix=0x1C) for i, kind in enumerate(("widgets", "location", "pushtotalk"))}
        for kind, token in tokens.items():
            gw.apns_devices([token], kind=kind)
            d.call("device.register", {"user": "own", "platform": "apns_" + kind, "token": token})
        sub = gw.subscription()
        d.call("device.register", {"user": "own", "platform": "web", "token": sub["endpoint"],
                                   "keys": gw.web_keys(sub)})
        suffix = {"widgets": ".push-type.widgets", "location": ".location-query", "pushtotalk": ".voip-ptt"}
        for kind, token in tokens.items():
            r = d.call("push.send", {"to": {"users": ["own"]}, "kind": kind, "wait": True, "timeout_ms": 20000})
            assert r["counts"]["delivered"] == 1 and r["skipped"] == 3, (kind, r)
            (rec,) = la_records(gw, token)
            assert rec["valid"] and rec["headers"]["apns-topic"] == TOPIC + suffix[kind], rec
        r = d.call("push.send", {"to": {"users": ["own"]}, "wait": True, "timeout_ms": 20000,
                                 "notification": {"title": "Hi", "navigate": "https://a.example/x"}})
        assert r["counts"]["delivered"] == 1, r
        (pushed,) = gw.received("webpush", token=sub["id"])
        assert pushed["plaintext_json"] == {"web_push": 8030, "notification": {"title": "Hi",
                                                                               "navigate": "https://a.example/x"}}
    finally:
        d.cleanup()
