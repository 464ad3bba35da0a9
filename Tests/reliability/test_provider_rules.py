"""Provider rules judged by the test gateways' records, through a real daemon.

APNs production and development are two hosts: each device goes to its environment's host.

Herald's ``apns_production`` points at the gateways' ``apns`` listener and ``apns_development``
at ``apns_dev``, a gateway of its own (records, programs, connections). Judged by what each
gateway recorded: every production token at the production host only, every development token
at the development host only, and a device moved to the other environment goes to the other
host from then on. The gateways refuse what APNs refuses (push type, aps, topic, a too-soon
token update), so every record must also be valid.

FCM's payload limit: whatever size Herald accepts, FCM (the gateway, counting keys and values
as FCM does) must accept too.
"""

from __future__ import annotations

import pytest

from herald_fixtures import TOPIC, Daemon, Gateways, RPCError, hex_token

USERS = 20


@pytest.fixture()
def gw():
    g = Gateways.shared()
    g.reset()
    yield g
    g.reset()


def tokens_at(gw, gateway):
    recs = gw.received(gateway)
    bad = [(r["token"], r["errors"]) for r in recs if not r["valid"]]
    assert not bad, f"{gateway} refused: {bad[:5]}"
    return [r["token"] for r in recs]


def test_each_apns_device_goes_to_its_environments_host(gw):
    d = Daemon(gateways=gw)
    try:
        prod, dev, voip_prod, voip_dev = {}, {}, {}, {}
        params = []
        for u in range(USERS):
            user = f"env-{u}"
            prod[user] = hex_token(u, prefix=0xE1)
            dev[user] = hex_token(u, prefix=0xE2)
            voip_prod[user] = hex_token(u, prefix=0xE3)
            voip_dev[user] = hex_token(u, prefix=0xE4)
            params += [
                {"user": user, "platform": "apns", "token": prod[user]},
                {"user": user, "platform": "apns", "token": dev[user], "environment": "development"},
                {"user": user, "platform": "apns_voip", "token": voip_prod[user], "environment": "production"},
                {"user": user, "platform": "apns_voip", "token": voip_dev[user], "environment": "development"},
            ]
        # The same token in both environments, for two users: one copy to each host.
        params += [{"user": "env-twin-p", "platform": "apns", "token": hex_token(0, prefix=0xEE)},
                   {"user": "env-twin-d", "platform": "apns", "token": hex_token(0, prefix=0xEE),
                    "environment": "development"}]
        d.register_many(params)
        users = [f"env-{u}" for u in range(USERS)]
        # The gateways know which environment issued each token (the twin aside): one sent to
        # the other environment's host is refused with BadDeviceToken, as at Apple.
        gw.post("/control/apns-devices", {"gateway": "apns", "tokens": [*prod.values(), *voip_prod.values()]})
        gw.post("/control/apns-devices", {"gateway": "apns_dev", "tokens": [*dev.values(), *voip_dev.values()]})

        for kind in ("notification", "clear", "call_ring"):
            gw.reset()
            r = d.send_wait({"to": {"users": users + ["env-twin-p", "env-twin-d"]}, "kind": kind})
            assert r["state"] == "complete" and r["counts"]["delivered"] == r["devices"], (kind, r)
            at_prod, at_dev = tokens_at(gw, "apns"), tokens_at(gw, "apns_dev")
            if kind == "call_ring":
                want_prod, want_dev = set(voip_prod.values()), set(voip_dev.values())
            else:
                want_prod = set(prod.values()) | {hex_token(0, prefix=0xEE)}
                want_dev = set(dev.values()) | {hex_token(0, prefix=0xEE)}
            # Each token arrives at its own environment's host, and never at the other.
            assert set(at_prod) == want_prod, (kind, set(at_prod) ^ want_prod)
            assert set(at_dev) == want_dev, (kind, set(at_dev) ^ want_dev)
            topics = {r["headers"]["apns-topic"] for g in ("apns", "apns_dev") for r in gw.received(g)}
            assert topics == {TOPIC + ".voip" if kind == "call_ring" else TOPIC}, (kind, topics)

        # A device moved to the other environment (a newer registration version) goes to the
        # other host from then on, and no longer to the old one.
        moved = hex_token(7, prefix=0xE7)
        gw.post("/control/apns-devices", {"gateway": "apns_dev", "tokens": [moved]})
        d.call("device.register", {"user": "env-mover", "platform": "apns", "token": moved,
                                   "registration_id": "mover-install", "version": 1})
        d.call("device.register", {"user": "env-mover", "platform": "apns", "token": moved,
                                   "environment": "development", "registration_id": "mover-install",
                                   "version": 2})
        gw.reset()
        r = d.send_wait({"to": {"users": ["env-mover"]}})
        assert r["state"] == "complete" and r["counts"]["delivered"] == 1, r
        assert set(tokens_at(gw, "apns_dev")) == {moved} and tokens_at(gw, "apns") == []
        # One provider token per connection at each host.
        for g in ("apns", "apns_dev"):
            for c in gw.connections(g)["connections"]:
                assert c["distinct_jwts"] <= 1, (g, c)
    finally:
        d.cleanup()


def test_fcm_payload_herald_accepts_fcm_accepts(gw):
    """A sweep of data sizes around FCM's 4096-byte limit: each message Herald accepts is
    delivered, and the gateway (which refuses a payload over 4096 bytes of keys and values)
    recorded it as valid; the ones over the limit Herald refuses (1005) and never sends."""
    d = Daemon(gateways=gw, transports=("fcm",))   # APNs, whose JSON limit is tighter, left out
    try:
        d.register("fcm-size", "fcm", "fcm-size-token")
        accepted = refused = 0
        # data = kind:notification (16 bytes) + b0..b3 of 1000 bytes (4 x 1002) + b4:<n> (2 + n),
        # and android.notification channel_id:new_messages + body_loc_key:NEW_MESSAGE (45 bytes):
        # 4096 at n = 25 (a data value is at most 1024 bytes).
        seq = 0
        for n in range(15, 35):
            data = {f"b{i}": str(i) * 1000 for i in range(4)}
            data["b4"] = "x" * n
            try:
                r = d.send_wait({"to": {"users": ["fcm-size"]}, "data": data})
            except RPCError as e:
                assert e.code == 1005, e
                refused += 1
                assert gw.received("fcm", kind="send", since=seq) == [], "a refused message was sent"
                continue
            accepted += 1
            recs = gw.received("fcm", kind="send", since=seq)
            seq = max(x["seq"] for x in recs)
            assert len(recs) == 1 and recs[0]["valid"], (n, [x["errors"] for x in recs])
            assert r["counts"]["delivered"] == 1, (n, r)
            assert recs[0]["body"]["message"]["data"]["b4"] == "x" * n
        assert accepted == 11 and refused == 9, (accepted, refused)
    finally:
        d.cleanup()
