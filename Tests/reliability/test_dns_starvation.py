"""Name lookups that cannot be starved (issue 27, part 3; SPEC.md Revision 3, "Shared bounds": name
lookups never hold a thread per hung query).

The daemon runs in a network namespace whose only name server is ``StubNameServer`` (``hosts: dns``,
resolv.conf ``timeout:60 attempts:1``: glibc alone would wait 60 s on a name server that never
answers). The known-good origin is the Web Push gateway at ``localhost`` (through
``NamespaceRelay``), answered at once.

Twenty registrable domains (``hang0.test`` … ``hang19.test``) are served by a name server that
answered at registration and never answers afterwards. Two waves of pushes go to 10 fresh names
under each of them (200 names a wave): the first right after the good origin's name was looked up,
the second once that answer is older than its 30 s TTL, so the good origin needs a new lookup while
200 hung ones are asked for. The good origin must keep delivering within 2 s of each send, during
both waves, and once more after them; a registration on the good origin must pass during the second
wave. Before this change each hung lookup held a thread for glibc's 60 s: 128 threads (8 per domain
by its last two labels) were all taken by the first wave, and the good origin's refresh failed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from herald_fixtures import (Daemon, Gateways, Namespace, NamespaceRelay, StubNameServer, metric, record_counts,
                             reset_counts)

SUITE = "dns_starvation"
DOMAINS, PER_DOMAIN_AND_WAVE, GOOD = 20, 10, 4
DELIVERY = {"max_retries": 1, "backoff_base_ms": 50, "backoff_max_ms": 100}
TTL_S = 30
PROMPT_S = 2.0
PSL_PATH = "/usr/share/publicsuffix/public_suffix_list.dat"


@pytest.fixture(scope="module", autouse=True)
def _suite_counts():
    reset_counts(SUITE)
    yield


@pytest.fixture(scope="module")
def world():
    gw = Gateways.shared()
    gw.reset()
    ns = Namespace(net=True, dns=True)
    rules = {"localhost": ["127.0.0.1"]}
    rules.update({f"hang{i}.test": ["127.0.0.1"] for i in range(DOMAINS)})
    dns = StubNameServer(ns, rules, timeout=60, dns_only=True)
    relay = NamespaceRelay(ns, ("127.0.0.1", gw.ports["webpush"]))
    d = Daemon(gateways=gw, transports=("web",), ns=ns, delivery=DELIVERY)
    try:
        yield {"ns": ns, "dns": dns, "relay": relay, "d": d, "gw": gw}
    finally:
        d.cleanup()
        relay.close()
        dns.close()
        ns.close()


def _register(world, user, hosts):
    gw, d, port = world["gw"], world["d"], world["relay"].port
    params, subs = [], []
    for host in hosts:
        sub = gw.subscription()
        params.append({"user": user, "platform": "web", "token": f"https://{host}:{port}/push/{sub['id']}",
                       "keys": {"p256dh": sub["p256dh"], "auth": sub["auth"]}})
        subs.append(sub)
    d.register_many(params)
    assert len(d.devices(user)) == len(hosts)
    return subs


def _good_delivered(world, good_ids, what):
    """Sends to the good user and waits until every good subscription has a receipt: within 2 s."""
    gw, d = world["gw"], world["d"]
    t0 = time.time()
    mid = d.call("push.send", {"to": {"users": ["good"]}})["message_id"]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        got = {r["token"] for r in gw.received("webpush") if r.get("token") in good_ids and r["time"] >= t0}
        if got == good_ids:
            break
        time.sleep(0.02)
    receipts = [r for r in gw.received("webpush") if r.get("token") in good_ids and r["time"] >= t0]
    s = d.status(mid)
    assert {r["token"] for r in receipts} == good_ids, f"{what}: the good origin was not delivered: {s}"
    took = max(r["time"] for r in receipts) - t0
    assert took < PROMPT_S, f"{what}: the good origin took {took:.2f} s"
    return took


def test_hung_name_servers_on_20_domains_do_not_starve_a_good_origin(world):
    gw, d, dns, port = world["gw"], world["d"], world["dns"], world["relay"].port
    good = _register(world, "good", ["localhost"] * GOOD)
    good_ids = {s["id"] for s in good}
    # One user per domain and wave (10 devices: within device_cap and the registration rate).
    waves, users = [], []
    for w in range(2):
        hosts, wave_users = [], []
        for i in range(DOMAINS):
            names = [f"w{w}n{j}.hang{i}.test" for j in range(PER_DOMAIN_AND_WAVE)]
            _register(world, f"hung{w}-{i}", names)
            hosts += names
            wave_users.append(f"hung{w}-{i}")
        waves.append(hosts)
        users.append(wave_users)
    # From now on the twenty domains' name server never answers.
    for i in range(DOMAINS):
        dns.rules[f"hang{i}.test"] = "hang"
    asked_at_registration = {n: dns.count(n) for wave in waves for n in wave}
    before = d.metrics()

    # The good origin's name is looked up at send time (and remembered for 30 s).
    looked_up = time.monotonic()
    _good_delivered(world, good_ids, "before the hung lookups")

    # Wave 1: 200 hung names at once; the good origin (its answer cached) goes on.
    first = d.call("push.send", {"to": {"users": users[0]}})["message_id"]
    time.sleep(0.3)
    _good_delivered(world, good_ids, "during the first wave")

    # Past the good name's TTL: wave 2 (200 fresh hung names) just before the good origin needs
    # a new lookup.
    time.sleep(max(0.0, looked_up + TTL_S + 1 - time.monotonic()))
    second = d.call("push.send", {"to": {"users": users[1]}})["message_id"]
    time.sleep(0.2)
    _good_delivered(world, good_ids, "during the second wave, its answer expired")
    # A registration on the good origin passes meanwhile.
    sub = gw.subscription()
    t = time.monotonic()
    d.register("good-late", "web", f"https://localhost:{port}/push/{sub['id']}",
               keys={"p256dh": sub["p256dh"], "auth": sub["auth"]})
    assert time.monotonic() - t < PROMPT_S

    # Every hung push ends as a DNS failure; the good origin still delivers afterwards.
    for mid in (first, second):
        s = d.wait_complete(mid, timeout=30)
        assert s["state"] == "complete", s
        assert all(x["state"] in ("failed", "expired") and (x["reason"] or "").startswith("dns_failure")
                   for x in s["devices"]), s["counts"]
    _good_delivered(world, good_ids, "after the hung lookups")

    # No name was asked more than once per wave (A): the failures are remembered.
    for wave in waves:
        for n in wave:
            assert dns.count(n, "A") - asked_at_registration[n] <= 1, (n, dns.count(n, "A"))
    after = d.metrics()

    dropped = (metric(after, "herald_dns_dropped_total", resolver="webpush")
               - metric(before, "herald_dns_dropped_total", resolver="webpush"))
    timeouts = (metric(after, "herald_dns_timeouts_total", resolver="webpush")
                - metric(before, "herald_dns_timeouts_total", resolver="webpush"))
    lookups = (metric(after, "herald_dns_lookups_total", resolver="webpush")
               - metric(before, "herald_dns_lookups_total", resolver="webpush"))
    # Bounded: of 400 names, at most 4 per domain were asked at a time; the others were dropped from
    # the queue after 2 s, never asked, and at most 64 lookups are out.
    assert dropped > 0
    assert timeouts > 0
    assert lookups + dropped >= 2 * DOMAINS * PER_DOMAIN_AND_WAVE
    assert metric(after, "herald_dns_outstanding", resolver="webpush") <= 64
    asked = sum(1 for wave in waves for n in wave if dns.count(n, "A") > asked_at_registration[n])
    assert asked < 2 * DOMAINS * PER_DOMAIN_AND_WAVE, "every hung name was asked: nothing bounded them"
    record_counts(SUITE, faults_injected=2 * DOMAINS * PER_DOMAIN_AND_WAVE, fault_cases=1)


def test_without_the_public_suffix_list_the_last_two_labels_stand_in():
    """Debian's public_suffix_list.dat unreadable (an empty file bound over it in a mount namespace):
    the daemon starts, says so once (`public_suffix_list_missing`), and still resolves; with the list
    it says nothing."""
    ns = Namespace(hosts="")
    empty = os.path.join(ns.dir, "empty.dat")
    Path(empty).write_text("")
    ns.run(["mount", "--bind", empty, PSL_PATH])
    without = Daemon(transports=(), ns=ns)
    with_list = Daemon(transports=())
    try:
        lines = without.log_lines("public_suffix_list_missing")
        assert len(lines) == 1 and lines[0].startswith("<4>"), lines
        assert PSL_PATH in lines[0] and "last two labels" in lines[0], lines
        assert with_list.log_lines("public_suffix_list_missing") == []
        assert without.call("system.health")["status"] == "ok", "the daemon serves"
    finally:
        without.cleanup()
        with_list.cleanup()
        ns.close()
