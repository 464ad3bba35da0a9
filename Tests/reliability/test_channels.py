"""APNs broadcast channels through the socket, judged by the test gateways (issue 32; first cut).

* channel.create reaches APNs' channel management host (apns_manage), is recorded, listed by
  channel.list; push.broadcast reaches the broadcast endpoint as one request with the channel in
  apns-channel-id, apns-push-type liveactivity and, on a channel that stores nothing,
  apns-expiration 0; channel.delete removes it at APNs and in Herald.

HERALD_STORE_BACKEND=postgres runs these on PostgreSQL (``backend_store``).
"""

from __future__ import annotations

import pytest

from herald_fixtures import Daemon, Gateways, RPCError, backend_store, hex_token


@pytest.fixture()
def gw():
    g = Gateways.shared()
    g.reset()
    yield g
    g.reset()


def test_create_broadcast_delete(gw):
    ep = {"apns_manage_production": f"https://127.0.0.1:{gw.ports['apns_manage']}",
          "apns_manage_development": f"https://127.0.0.1:{gw.ports['apns_manage_dev']}"}
    d = Daemon(gateways=gw, transports=("apns",), store=backend_store(), endpoints=ep)
    try:
        ch = d.call("channel.create", {"storage": "none"})
        assert ch["storage"] == "none" and ch["environment"] == "production"
        assert [c["channel_id"] for c in gw.channels("apns_manage")] == [ch["channel_id"]]
        assert d.call("channel.list", {})["channels"] == [ch]
        r = d.call("push.broadcast", {"channel_id": ch["channel_id"], "event": "update",
                                      "content_state": {"score": "1-0"}, "wait": True, "timeout_ms": 20000})
        assert r["counts"]["delivered"] == 1, r
        (rec,) = [x for x in gw.received("apns") if x.get("broadcast")]
        assert rec["valid"] and rec["channel_id"] == ch["channel_id"], rec
        assert rec["headers"]["apns-expiration"] == "0" and rec["headers"]["apns-push-type"] == "liveactivity"
        assert rec["body"]["aps"]["content-state"] == {"score": "1-0"}
        assert d.call("channel.delete", {"channel_id": ch["channel_id"]}) == {"removed": 1}
        assert d.call("channel.list", {})["channels"] == []
        assert gw.channels("apns_manage") == []
    finally:
        d.cleanup()


def test_three_devices_started_on_a_channel_get_one_broadcast(gw):
    ep = {"apns_manage_production": f"https://127.0.0.1:{gw.ports['apns_manage']}",
          "apns_manage_development": f"https://127.0.0.1:{gw.ports['apns_manage_dev']}"}
    d = Daemon(gateways=gw, transports=("apns",), store=backend_store(), endpoints=ep)
    try:
        ch = d.call("channel.create", {"storage": "latest"})
        starts = []
        for i in range(3):
            device = d.register(f"fan-{i}", "apns", hex_token(40 + i, prefix=0x2C))["device_id"]
            token = hex_token(50 + i, prefix=0x2C)
            starts.append(token)
            d.call("activity.register", {"user": f"fan-{i}", "device_id": device, "push_to_start_token": token,
                                         "activity_type": "MatchAttributes"})
        r = d.call("push.send", {"to": {"users": [f"fan-{i}" for i in range(3)]}, "kind": "live_activity",
                                 "event": "start", "attributes_type": "MatchAttributes", "attributes": {},
                                 "content_state": {"score": "0-0"}, "alert": {"loc_key": "KICKOFF"},
                                 "channel_id": ch["channel_id"], "wait": True, "timeout_ms": 20000})
        assert r["counts"]["delivered"] == 3, r
        for token in starts:
            (rec,) = [x for x in gw.received("apns") if x.get("token") == token]
            assert rec["body"]["aps"]["input-push-channel"] == ch["channel_id"], rec["body"]
            assert "input-push-token" not in rec["body"]["aps"]
        before = len([x for x in gw.received("apns") if x.get("broadcast")])
        b = d.call("push.broadcast", {"channel_id": ch["channel_id"], "event": "update",
                                      "content_state": {"score": "1-0"}, "wait": True, "timeout_ms": 20000})
        assert b["counts"]["delivered"] == 1 and b["devices"] == 1, b
        broadcasts = [x for x in gw.received("apns") if x.get("broadcast")]
        assert len(broadcasts) - before == 1, "one request for every subscribed activity"
        assert broadcasts[-1]["headers"]["apns-expiration"] != "0", "a channel that stores keeps its TTL"
    finally:
        d.cleanup()


def test_the_channel_limit_and_the_environments(gw):
    """Past APNs' channel limit (the gateway's knob, 10,000 at Apple) channel.create is -32602 with
    APNs' reason and nothing is recorded; a development channel is created at the sandbox's host and
    broadcast to the development push host; bad input names the field."""
    ep = {"apns_manage_production": f"https://127.0.0.1:{gw.ports['apns_manage']}",
          "apns_manage_development": f"https://127.0.0.1:{gw.ports['apns_manage_dev']}"}
    d = Daemon(gateways=gw, transports=("apns",), store=backend_store(), endpoints=ep)
    try:
        gw.knobs("apns_manage", channel_limit=1)
        first = d.call("channel.create", {"storage": "latest"})
        with pytest.raises(RPCError) as e:
            d.call("channel.create", {"storage": "none"})
        assert e.value.code == -32602 and "CannotCreateChannelConfig" in e.value.data["reason"], e.value.data
        dev = d.call("channel.create", {"storage": "none", "environment": "development"})
        assert dev["environment"] == "development"
        assert [c["channel_id"] for c in gw.channels("apns_manage_dev")] == [dev["channel_id"]]
        assert {c["channel_id"] for c in d.call("channel.list", {})["channels"]} == {first["channel_id"],
                                                                                    dev["channel_id"]}
        r = d.call("push.broadcast", {"channel_id": dev["channel_id"], "event": "end", "wait": True,
                                      "timeout_ms": 20000})
        assert r["counts"]["delivered"] == 1, r
        assert [x for x in gw.received("apns_dev") if x.get("broadcast")][-1]["channel_id"] == dev["channel_id"]
        for params, field in [({"storage": "some"}, "storage"), ({"storage": "none", "bundle_id": "com.other"},
                                                                  "bundle_id")]:
            with pytest.raises(RPCError) as e:
                d.call("channel.create", params)
            assert e.value.data["field"] == field
        for params, field in [({"channel_id": dev["channel_id"], "event": "start"}, "event"),
                              ({"channel_id": dev["channel_id"], "event": "update"}, "content_state"),
                              ({"channel_id": "AAAA", "event": "end"}, "channel_id"),
                              ({"channel_id": "not base64!", "event": "end"}, "channel_id")]:
            with pytest.raises(RPCError) as e:
                d.call("push.broadcast", params)
            assert e.value.data["field"] == field, (params, e.value.data)
    finally:
        d.cleanup()
