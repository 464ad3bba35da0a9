"""Send-time DNS of Web Push against slow and failing name servers (SPEC.md Revision 2,
"Delivery semantics"; docs/delivery.md "Web Push").

The daemon runs in a network namespace this suite creates, whose only name server is
``StubNameServer`` on 127.0.0.1:53 inside it (``hosts: dns``, resolv.conf ``timeout:30
attempts:1``: glibc alone would wait 30 s for a name server that never answers). The Web Push
gateway of this host is reached from inside through ``NamespaceRelay`` at ``localhost``, a name
the stub answers (the gateway's certificate is for ``localhost``).

One app, one message to three kinds of subscription:
  * ``good``: on ``localhost``, answered at once;
  * ``hung``: names whose name server answered at registration and never answers afterwards;
  * ``fail``: names whose name server answers SERVFAIL after registration.
Checked: every good subscription is delivered before any hung lookup has ended (the sends do not
wait for them; today's 2 s timeout would otherwise serialise them), the hung and failing ones end
with ``dns_failure`` after the retries, and the name server was asked once per name (the failure
is remembered for 30 s), not once per delivery, retry or message.
"""

from __future__ import annotations

import time

import pytest

from herald_fixtures import (Daemon, Gateways, Namespace, NamespaceRelay, RPCError, StubNameServer, metric,
                             record_counts, reset_counts)

SUITE = "dns"
GOOD, HUNG, FAIL = 20, 12, 6
DELIVERY = {"max_retries": 3, "backoff_base_ms": 50, "backoff_max_ms": 200}


@pytest.fixture(scope="module", autouse=True)
def _suite_counts():
    reset_counts(SUITE)
    yield


@pytest.fixture(scope="module")
def gw():
    return Gateways.shared()


@pytest.fixture(scope="module")
def world(gw):
    gw.reset()
    ns = Namespace(net=True, dns=True)
    dns = StubNameServer(ns, {"localhost": ["127.0.0.1"], "hang.herald.test": ["127.0.0.1"],
                              "fail.herald.test": ["127.0.0.1"]}, timeout=30, dns_only=True)
    relay = NamespaceRelay(ns, ("127.0.0.1", gw.ports["webpush"]))
    d = Daemon(gateways=gw, transports=("web",), ns=ns, delivery=DELIVERY)
    try:
        yield {"ns": ns, "dns": dns, "relay": relay, "d": d, "gw": gw}
    finally:
        d.cleanup()
        relay.close()
        dns.close()
        ns.close()


def _subscribe(world, user, host, n):
    """n gateway subscriptions registered for `user` at https://<host(i)>:<port>/push/<id>."""
    gw, d, port = world["gw"], world["d"], world["relay"].port
    subs = []
    for i in range(n):
        sub = gw.subscription()
        endpoint = f"https://{host(i)}:{port}/push/{sub['id']}"
        d.register(user, "web", endpoint, keys={"p256dh": sub["p256dh"], "auth": sub["auth"]})
        subs.append(sub)
    assert len(d.devices(user)) == n
    return subs


def test_trailing_dot_is_one_subscription(world):
    """`localhost.` and `localhost` are one host: one device, one binding (SPEC.md Revision 2)."""
    gw, d, port = world["gw"], world["d"], world["relay"].port
    sub = gw.subscription()
    keys = {"p256dh": sub["p256dh"], "auth": sub["auth"]}
    first = d.register("dot-user", "web", f"https://localhost.:{port}/push/{sub['id']}", keys=keys)
    second = d.register("dot-user", "web", f"https://LOCALHOST:{port}/push/{sub['id']}", keys=keys)
    assert first["created"] is True
    assert second["created"] is False and second["device_id"] == first["device_id"]
    assert second["token_hash"] == first["token_hash"]
    devices = d.devices("dot-user")
    assert len(devices) == 1, devices
    r = d.send_wait({"to": {"users": ["dot-user"]}})
    assert r["counts"]["delivered"] == 1, r


def test_slow_name_server_holds_up_nothing(world):
    gw, d, dns = world["gw"], world["d"], world["dns"]
    good = _subscribe(world, "dns-good", lambda i: "localhost", GOOD)
    hung_names = [f"h{i}.hang.herald.test" for i in range(HUNG)]
    fail_names = [f"f{i}.fail.herald.test" for i in range(FAIL)]
    _subscribe(world, "dns-hung", lambda i: hung_names[i], HUNG)
    _subscribe(world, "dns-fail", lambda i: fail_names[i], FAIL)
    # From now on the name server never answers the hung names and refuses the failing ones.
    dns.rules["hang.herald.test"] = "hang"
    dns.rules["fail.herald.test"] = "servfail"
    asked_at_registration = {n: dns.count(n) for n in hung_names + fail_names}
    good_ids = {s["id"] for s in good}
    hung_ids = {x["device_id"] for x in d.devices("dns-hung")}
    before = d.metrics()

    t0 = time.time()
    m0 = time.monotonic()
    mid = d.call("push.send", {"to": {"users": ["dns-hung", "dns-good", "dns-fail"]}})["message_id"]

    # When did the first hung delivery end an attempt? (polled; the good ones go meanwhile)
    first_hung_end = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = d.status(mid)
        hung = [x for x in s["devices"] if x["device_id"] in hung_ids]
        if first_hung_end is None and any(x["state"] in ("retrying", "failed", "expired") for x in hung):
            first_hung_end = time.time()
        if s["state"] == "complete":
            break
        time.sleep(0.02)
    s = d.wait_complete(mid, timeout=30)
    assert s["state"] == "complete", s

    receipts = [r for r in gw.received("webpush") if r.get("token") in good_ids and r["time"] >= t0 - 1]
    assert {r["token"] for r in receipts} == good_ids, "every good subscription was delivered"
    last_good = max(r["time"] for r in receipts)
    assert first_hung_end is not None
    assert last_good < first_hung_end, (
        f"the good subscriptions waited for the hung lookups: last receipt {last_good - t0:.3f} s after the send, "
        f"first hung attempt ended {first_hung_end - t0:.3f} s after it")
    # The hung lookups ended at the 2 s timeout: not at once, and not when glibc gives up (30 s).
    assert first_hung_end - t0 >= 1.9
    assert time.monotonic() - m0 < 20, "the message took as long as glibc's own timeout"

    by_state = {}
    for x in s["devices"]:
        by_state.setdefault((x["state"], x["reason"]), 0)
        by_state[(x["state"], x["reason"])] += 1
    assert by_state.get(("delivered", None), 0) == GOOD, by_state
    dns_ended = sum(v for (state, reason), v in by_state.items()
                    if state in ("failed", "expired", "retrying") and reason and reason.startswith("dns_failure"))
    assert dns_ended == HUNG + FAIL, by_state

    # Each failing name was asked once (A and AAAA), whatever the retries: the failure is remembered.
    for n in hung_names + fail_names:
        assert dns.count(n, "A") - asked_at_registration[n] <= 1, (n, dns.count(n, "A"))
    after = d.metrics()
    retries = metric(after, "herald_retries_total", platform="web") - metric(before, "herald_retries_total",
                                                                                platform="web")
    assert retries >= (HUNG + FAIL) * DELIVERY["max_retries"]

    # A second message within the 30 s: the good ones are delivered, the failing names are not asked again.
    asked = {n: dns.count(n, "A") for n in hung_names + fail_names}
    r = d.send_wait({"to": {"users": ["dns-good", "dns-hung", "dns-fail"]}}, timeout_ms=20000)
    s2 = d.wait_complete(r["message_id"], timeout=20)
    assert s2["counts"]["delivered"] == GOOD, s2["counts"]
    assert {n: dns.count(n, "A") for n in asked} == asked, "a remembered failure was asked again"
    health = d.call("system.health")
    assert health["transports"]["default"]["web"] == "ready", health
    record_counts(SUITE, faults_injected=HUNG + FAIL, fault_cases=2)


def test_registration_gives_up_after_2_s(world):
    """Registration resolves afresh (no cache), but on the resolver's threads and for 2 s at most:
    a name server that never answers gets a clear error, not a call held until glibc gives up
    (30 s here, past the client's 10 s)."""
    gw, d, dns, port = world["gw"], world["d"], world["dns"], world["relay"].port
    dns.rules["slow.herald.test"] = "hang"
    sub = gw.subscription()
    keys = {"p256dh": sub["p256dh"], "auth": sub["auth"]}
    for i in range(3):
        with pytest.raises(RPCError) as e:
            d.register("dns-reg", "web", f"https://r{i}.slow.herald.test:{port}/push/{sub['id']}", keys=keys)
        assert e.value.code == -32602, e.value.response
        assert e.value.data["field"] == "token"
        assert e.value.data["reason"] == f"endpoint host r{i}.slow.herald.test lookup failed: no answer within 2000 ms"
    assert d.devices("dns-reg") == []
    # Registration remembers nothing: the same name is asked again.
    with pytest.raises(RPCError):
        d.register("dns-reg", "web", f"https://r0.slow.herald.test:{port}/push/{sub['id']}", keys=keys)
    assert dns.count("r0.slow.herald.test") == 2
