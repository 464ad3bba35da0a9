"""Send slots shared fairly (issue 27): no origin, lane or app can hold all of `max_inflight`,
and no app all of `max_queued`. A Web Push service that accepts HTTP/2 and never answers (a
tarpit) holds 2,000 subscriptions of one app; another app's APNs message still goes out at once,
the tarpit gets at most `webpush_origin_inflight` streams, and once it has timed out
`webpush_origin_timeouts` times in a row its deliveries wait in the queue instead of going to it
again. Judged by what the test gateways received. Each fails on the code before these bounds.

Run: HERALD_BIN=.build/debug/herald .venv/bin/python -m pytest -q Tests/reliability/test_send_slots.py
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from herald_fixtures import Daemon, Gateways, RPCError, hex_token, metric

TARPIT_USERS = 100          # 20 devices each (the default device_cap): 2,000 subscriptions
APNS_DEVICES = 50
ORIGIN_CAP = 200            # the default webpush_origin_inflight
SECOND_APP = "other"


@pytest.fixture(scope="module")
def gw():
    return Gateways.shared()


def wait_for(what, predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def daemon_with_second_app(gw, *, delivery=None, second_transports=("apns",)) -> Daemon:
    """The default app with Web Push only, and app `other` with `second_transports` (its own
    credentials, the same keys), both on the gateways."""
    d = Daemon(gateways=gw, transports=("web",), delivery=delivery, start=False)
    text = Path(d.config).read_text()
    text += f"\n[app.{SECOND_APP}]\n" + d.credentials(second_transports) + "\n"
    Path(d.config).write_text(text)
    d.start()
    return d


def hanging(gw):
    """The Web Push requests the gateway took in and left unanswered."""
    return [r for r in gw.received("webpush") if (r.get("response") or {}).get("hang")]


@pytest.fixture(scope="module")
def tarpit(gw):
    """2,000 subscriptions of the default app (half `web`, half `unified_push`) at a push
    service that accepts HTTP/2 (1,000 streams per connection) and never answers, all pushed to
    at once; app `other` has 50 APNs devices."""
    gw.reset()
    ids = [f"tarpit-{i}" for i in range(TARPIT_USERS * 20)]
    subs = gw.subscriptions(ids)
    gw.knobs("webpush", hang_tokens=ids, initial_max_streams=1000)
    d = daemon_with_second_app(gw)
    params = []
    for i, endpoint in enumerate(subs["endpoints"]):
        params.append({"user": f"tarpit-{i // 20}", "platform": "web" if i % 2 == 0 else "unified_push",
                       "token": endpoint, "keys": {"p256dh": subs["p256dh"], "auth": subs["auth"]}})
    d.register_many(params)
    d.register_many([{"user": f"apns-{i // 10}", "platform": "apns", "token": hex_token(i), "app": SECOND_APP}
                     for i in range(APNS_DEVICES)])
    users = [f"tarpit-{u}" for u in range(TARPIT_USERS)]
    sent_at = time.time()
    accepted = d.call("push.send", {"to": {"users": users}})
    assert accepted["devices"] == TARPIT_USERS * 20
    try:
        yield d, sent_at
    finally:
        d.cleanup()
        gw.reset()


def test_apns_of_another_app_goes_out_while_a_tarpit_holds_its_share(gw, tarpit):
    """The finding: 2,000 Web Push subscriptions at a tarpit, then another app's APNs message:
    0 of its pushes within 5 s before (every slot held until the 15 s deadline). Now each lane
    keeps a floor of slots and the tarpit origin gets at most `webpush_origin_inflight`: the
    APNs pushes reach the APNs gateway within 1 s of their push.send."""
    d, _ = tarpit
    # The tarpit holds what it can get before the other app sends.
    wait_for("the tarpit's streams", lambda: len(hanging(gw)) >= ORIGIN_CAP // 2)
    time.sleep(0.5)
    start = time.time()
    accepted = d.call("push.send", {"to": {"users": [f"apns-{u}" for u in range(APNS_DEVICES // 10)]},
                                    "app": SECOND_APP})
    assert accepted["devices"] == APNS_DEVICES
    got = wait_for("the APNs pushes", lambda: (lambda r: r if len(r) >= APNS_DEVICES else None)(
        gw.received("apns")), timeout=20)
    late = [r["time"] - start for r in got if r["time"] - start > 1.0]
    assert not late, f"{len(late)} of {len(got)} APNs pushes later than 1 s (up to {max(late):.1f} s)"
    assert len(got) == APNS_DEVICES


def test_the_tarpit_origin_is_held_to_its_cap(gw, tarpit):
    """While the tarpit answers nothing, it has at most `webpush_origin_inflight` (200)
    requests of Herald's: the other 1,800 wait in Herald, not on the push service's streams
    (before, both lanes filled their 1,000 slots with it)."""
    d, sent_at = tarpit
    time.sleep(max(0.0, sent_at + 3 - time.time()))
    held = len(hanging(gw))
    assert 0 < held <= ORIGIN_CAP, f"the tarpit holds {held} requests"
    m = d.metrics()
    # The rest of the claimed ones wait for the origin; what the lanes could not take, in the store.
    waiting = metric(m, "herald_webpush_origin_waiting")
    assert 0 < waiting <= TARPIT_USERS * 20 - held
    assert metric(m, "herald_lane_floor") > 0


def test_an_origin_that_keeps_timing_out_is_not_sent_its_backlog(gw, tarpit):
    """Past the 15 s request deadline the tarpit's requests time out; after 5 in a row the
    origin is unresponsive: what waited for it goes back to the queue (`retrying`,
    `origin_unresponsive`, not counted as an attempt) and the origin gets one probe at a time,
    not the whole backlog again (before: every delivery went to it again, retries and all)."""
    d, sent_at = tarpit
    time.sleep(max(0.0, sent_at + 19 - time.time()))
    held = len(hanging(gw))
    assert held <= ORIGIN_CAP + 5, f"the tarpit was sent {held} requests"
    lines = wait_for("webpush_origin_unresponsive", lambda: d.log_lines("webpush_origin_unresponsive"), timeout=5)
    assert len(lines) == 1, lines
    m = d.metrics()
    assert metric(m, "herald_webpush_origins_unresponsive") == 1
    assert metric(m, "herald_webpush_origin_deferred_total") >= TARPIT_USERS * 20 - ORIGIN_CAP


def test_max_queued_is_shared_among_the_apps(gw):
    """`max_queued = 100`, two apps. One app's deliveries that do not finish (a push service that
    never answers) hold 40; a message that would take it past half of `max_queued` and past its
    share (50: the limit between the two apps) is refused (`overloaded`), while the other app,
    under its share, is still admitted (before: the first app took all 100 and the other was
    refused)."""
    gw.reset()
    ids = [f"queued-{i}" for i in range(80)]
    subs = gw.subscriptions(ids)
    gw.knobs("webpush", hang_tokens=ids)
    d = daemon_with_second_app(gw, delivery={"max_queued": 100})
    try:
        d.register_many([{"user": f"q-{i // 20}", "platform": "web", "token": e,
                          "keys": {"p256dh": subs["p256dh"], "auth": subs["auth"]}}
                         for i, e in enumerate(subs["endpoints"])])
        d.register_many([{"user": "b-user", "platform": "apns", "token": hex_token(i), "app": SECOND_APP}
                         for i in range(10)])
        first = d.call("push.send", {"to": {"users": ["q-0", "q-1"]}})
        assert first["devices"] == 40
        for user in ("q-2", "q-3", "q-2"):
            with pytest.raises(RPCError) as refused:
                d.call("push.send", {"to": {"users": [user]}})
            assert refused.value.code == 1007, refused.value
        other = d.call("push.send", {"to": {"users": ["b-user"]}, "app": SECOND_APP})
        assert other["devices"] == 10
    finally:
        d.cleanup()
        gw.reset()


def test_webpush_deadlines_and_the_unresponsive_origin_are_settings(gw):
    """`webpush_timeout = 1`: a request to a push service that never answers times out after
    1 s, not 15; `webpush_origin_inflight = 2` and `webpush_origin_timeouts = 2`: 2 requests
    go to it, and when both have timed out the origin is unresponsive: the other deliveries wait
    in the queue (`retrying`, `origin_unresponsive`, no attempt counted), the timed-out ones are
    retried at the origin's pace, not the backoff's (before: no such settings, and the daemon
    does not start with them)."""
    gw.reset()
    ids = [f"slow-{i}" for i in range(8)]
    subs = gw.subscriptions(ids)
    gw.knobs("webpush", hang_tokens=ids)
    d = Daemon(gateways=gw, transports=("web",), start=False,
               delivery={"webpush_timeout": 1, "webpush_origin_inflight": 2, "webpush_origin_timeouts": 2})
    try:
        d.start()
        d.register_many([{"user": "slow", "platform": "web", "token": e,
                          "keys": {"p256dh": subs["p256dh"], "auth": subs["auth"]}} for e in subs["endpoints"]])
        start = time.monotonic()
        message = d.call("push.send", {"to": {"users": ["slow"]}})["message_id"]
        wait_for("webpush_origin_unresponsive", lambda: d.log_lines("webpush_origin_unresponsive"), timeout=10)
        assert time.monotonic() - start < 5, "the requests timed out at webpush_timeout"
        time.sleep(1.5)
        status = d.status(message)
        reasons = sorted(dev["reason"] for dev in status["devices"])
        assert all(dev["state"] == "retrying" for dev in status["devices"]), status
        assert reasons.count("origin_unresponsive") == 6 and reasons.count("timeout") == 2, reasons
        assert all(dev["attempts"] <= 1 for dev in status["devices"]), status
        # The first 2, and one in the slot of the first timeout (the origin was not yet
        # unresponsive); then nothing more.
        sent = len(hanging(gw))
        assert 2 <= sent <= 3, sent
        time.sleep(1)
        assert len(hanging(gw)) == sent, "nothing more went to the origin"
        assert metric(d.metrics(), "herald_webpush_origins_unresponsive") == 1
    finally:
        d.cleanup()
        gw.reset()
