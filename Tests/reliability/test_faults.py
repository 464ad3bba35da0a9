"""Provider faults, per transport (apns, fcm, web) × fault, through a real daemon.

Each fault is one scenario: a daemon with all three transports, one user with one device per
transport, one message. Every (transport, fault) cell then checks, for its own device:
  * what the receiver recorded, which is the judge: the gateways' records (each request's arrival
    time, connection and the answer it got), or the fault listener's connections, handshakes and
    requests (one listener per transport), the stub name server's queries, the accept queue of a
    listener that never accepts. The attempts ``push.status`` reports must match them, and the
    spacing of retries has lower bounds that scheduling cannot break (Retry-After in seconds and
    as an HTTP date, the 15 s request deadline, a listener that accepts after 2 s, the credential
    retry after 1 s then 60 s); see "receipts" below;
  * the final delivery state, attempts and reason in ``push.status`` detail, as SPEC.md
    "Delivery rules" and docs/delivery.md "What an answer means" name them;
  * the Prometheus counters that must move (herald_retries_total, herald_outcomes_total,
    herald_provider_connect_failures_total, herald_provider_goaways_total,
    herald_provider_timeouts_total, herald_transport_state), and those that must not
    (herald_stale_removed_total);
  * that ``device.list`` still holds every device: no fault deletes one;
  * that each daemon ends with SIGTERM and exit status 0 within the shutdown budget
    (``Daemon.cleanup``).

Metrics are read strictly (``metric``): a family, label or label value /metrics does not have
fails the check instead of reading as 0.

Faults the gateways cannot make (a connection reset mid-stream, TLS failures, a certificate for
another host, DNS failures, a listener that accepts slowly or never) come from listeners in
herald_fixtures.py. DNS is controlled by running the daemon in a mount namespace whose
/etc/hosts the test writes (``hosts: files`` only: no DNS server is ever asked), except for "a
name server that never answers": there the daemon runs in a network namespace whose only name
server is a stub (``StubNameServer``) that drops every query.

Also here: the stale-storm guards per platform that the Swift suites do not cover yet
(DeliveryRulesTests has the APNs 1,000-device storm and the FCM window cap).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

import pytest

from herald_fixtures import (CertAuthority, Daemon, FaultServer, Gateways, Namespace, SlowAcceptProxy, _Listener,
                             check_metric_families, hex_token, metric, record_counts, reset_counts, wait_until,
                             web_keys)
from herald_fixtures import NamespaceRelay, StubNameServer

SUITE = "faults"
TRANSPORTS = ("apns", "fcm", "web")
MAX_RETRIES = 2
DELIVERY = {"max_retries": MAX_RETRIES, "backoff_base_ms": 50, "backoff_max_ms": 200}
USER = "fault-user"
APNS_TOKEN = hex_token(1, prefix=0xFA)
FCM_TOKEN = "fault-fcm-token"
COUNTER_FAMILIES = ("herald_retries_total", "herald_outcomes_total", "herald_provider_connect_failures_total",
                    "herald_provider_goaways_total", "herald_provider_timeouts_total", "herald_sends_total",
                    "herald_stale_removed_total", "herald_provider_connections_opened_total",
                    "herald_provider_silent_closes_total", "herald_stale_refused_total", "herald_breaker_trips_total")
GAUGE_FAMILIES = ("herald_transport_state",)
# Gateway clock (record "time", epoch s) against ours: both read this host's wall clock. Herald
# rounds a Retry-After up to whole ms and keeps due times in ms: a retry may look a few ms early.
CLOCK_TOLERANCE_S = 0.1
RETRY_AFTER_S = 2            # Retry-After (seconds form) of the 429 cells
REQUEST_DEADLINE_S = 15      # a request without an answer ends at 15 s (docs/delivery.md)


@pytest.fixture(scope="module", autouse=True)
def _suite_counts():
    reset_counts(SUITE)
    yield


@pytest.fixture(scope="module")
def gw():
    return Gateways.shared()


@pytest.fixture(scope="module")
def pki(gw, tmp_path_factory):
    """Certificates for the TLS faults, and a CA bundle trusting the gateways' CA and ours."""
    d = tmp_path_factory.mktemp("pki")
    ca = CertAuthority()
    bundle = d / "bundle.pem"
    bundle.write_bytes(open(gw.ca, "rb").read() + ca.pem())
    return {
        "bundle": str(bundle),
        "right": ca.leaf(dns_names=["localhost", "provider.herald.test"], ips=["127.0.0.1"], directory=str(d)),
        "wrong_host": ca.leaf(dns_names=["other.herald.test"], directory=str(d)),
        "untrusted": CertAuthority("not-trusted").leaf(dns_names=["localhost", "provider.herald.test"],
                                                       ips=["127.0.0.1"], directory=str(d)),
    }


# ----------------------------------------------------------------------------- scenario runner

@dataclass
class Result:
    fault: str
    status: dict
    before: dict
    after: dict
    kept: dict
    elapsed: float
    extra: dict = field(default_factory=dict)
    log: str = ""

    def device(self, transport):
        for d in self.status["devices"]:
            if d["platform"] == transport:
                return d
        raise AssertionError(f"no {transport} delivery in {self.status}")

    def delta(self, name, **labels):
        return metric(self.after, name, **labels) - metric(self.before, name, **labels)


def _daemon(gw, *, endpoints=None, ns=None, delivery=None, ca_file=None, token_uri=None):
    ep = dict(endpoints or {})
    if ca_file:
        ep["ca_file"] = ca_file
    return Daemon(gateways=gw, endpoints=ep, ns=ns, delivery=dict(DELIVERY, **(delivery or {})),
                  token_uri=token_uri)


def _settle(d, timeout=20):
    """Waits until each credential check the daemon runs as it starts has a verdict: their probes
    reach the same gateways and listeners as the pushes, and a scenario that counts what a
    connection or a listener saw starts after them."""
    def checked():
        creds = d.call("system.health").get("credentials") or {}
        return all(v.get("status") != "unknown" for app in creds.values() for v in app.values())
    wait_until(checked, timeout=timeout, what="the start-up credential checks")


def _register(d, web_endpoint, web_sub=None):
    keys = {"p256dh": web_sub["p256dh"], "auth": web_sub["auth"]} if web_sub else web_keys()
    d.register(USER, "apns", APNS_TOKEN)
    d.register(USER, "fcm", FCM_TOKEN)
    d.register(USER, "web", web_endpoint, keys=keys)


def _run(fault, d, *, sends=1, timeout_ms=60000, between=None, extra=None) -> Result:
    """Sends `sends` messages (waiting for each), collects status, metrics and the devices.
    ``extra["sent_at"]`` holds the wall-clock time (the gateways' clock) just before each send."""
    before = d.metrics()
    t0 = time.monotonic()
    status = None
    ids = []
    sent_at = []
    for i in range(sends):
        if i and between:
            between()
        sent_at.append(time.time())
        r = d.send_wait({"to": {"users": [USER]}}, timeout_ms=timeout_ms)
        ids.append(r["message_id"])
    elapsed = time.monotonic() - t0
    statuses = [d.wait_complete(m, timeout=10) for m in ids]
    status = statuses[0]
    after = d.metrics()
    listed = {x["platform"] for x in d.devices(USER)}
    res = Result(fault, status, before, after, {t: t in listed for t in TRANSPORTS}, elapsed,
                 dict(extra or {}, statuses=statuses, health=d.call("system.health"), sent_at=sent_at), d.log())
    injected = sum(x["attempts"] - (1 if x["state"] == "delivered" else 0) for s in statuses for x in s["devices"])
    record_counts(SUITE, faults_injected=max(injected, 0))
    return res


def _program_all(gw, entries_for):
    """entries_for(gateway) -> programmed responses for our device on that gateway."""
    gw.program("apns", entries_for("apns"), token=APNS_TOKEN)
    gw.program("fcm", entries_for("fcm"), token=FCM_TOKEN)
    sub = gw.subscription()
    gw.program("webpush", entries_for("webpush"), token=sub["id"])
    return sub


def _records(gw, sub_id):
    """Per transport, what the gateways recorded for our device (the send requests, in arrival order)."""
    return {
        "apns": [r for r in gw.received("apns") if r.get("token") == APNS_TOKEN],
        "fcm": [r for r in gw.received("fcm", kind="send") if r.get("token") == FCM_TOKEN],
        "web": [r for r in gw.received("webpush") if r.get("token") == sub_id],
    }


def _gateway_scenario(gw, fault, entries_for, **kw):
    gw.reset()
    sub = _program_all(gw, entries_for)
    d = _daemon(gw, delivery=kw.pop("delivery", None))
    try:
        _register(d, sub["endpoint"], sub)
        res = _run(fault, d, extra={"sub": sub}, **kw)
        res.extra["records"] = _records(gw, sub["id"])
        return res
    finally:
        d.cleanup()


def _listener_scenario(gw, fault, make_server, *, host="127.0.0.1", ns=None, ca_file=None, delivery=None,
                       settle=False):
    """APNs, FCM and the Web Push endpoint each pointed at a listener of its own (``make_server()``),
    so that what each listener saw is that transport's attempts (``extra["servers"]``). With
    ``settle``, the pushes start once the start-up credential checks have their verdicts, and
    ``extra["before"]`` holds each listener's requests then (the checks' probes)."""
    gw.reset()
    servers = {}
    try:
        for t in TRANSPORTS:
            servers[t] = make_server()
        url = {t: f"https://{host}:{srv.port}" for t, srv in servers.items()}
        d = _daemon(gw, endpoints={"apns_production": url["apns"], "apns_development": url["apns"],
                                   "fcm": url["fcm"]}, ns=ns, ca_file=ca_file, delivery=delivery)
        try:
            before = {}
            if settle:
                _settle(d)
                before = {t: srv.requests for t, srv in servers.items()}
            _register(d, url["web"] + "/push/fault")
            return _run(fault, d, extra={"servers": servers, "before": before})
        finally:
            d.cleanup()
    finally:
        for srv in servers.values():
            srv.close()


def s_http_429(gw, pki):
    # Retry-After (2 s) well over backoff_max_ms (200 ms): only the header can hold the retry back.
    def entries(g):
        if g == "fcm":
            return [{"error": "QUOTA_EXCEEDED", "retry_after": RETRY_AFTER_S}, {"status": 200}]
        if g == "apns":
            return [{"status": 429, "reason": "TooManyRequests", "retry_after": RETRY_AFTER_S}, {"status": 200}]
        return [{"status": 429, "retry_after": RETRY_AFTER_S}, {"status": 201}]
    return _gateway_scenario(gw, "http_429_retry_after", entries)


def s_http_503_retry_after_date(gw, pki):
    """503 with Retry-After as an HTTP date (RFC 9110 IMF-fixdate) 3 whole seconds ahead: the
    retry must not reach the gateway before that instant (``extra["retry_at"]``, epoch s)."""
    from email.utils import formatdate
    retry_at = float(int(time.time()) + 4)
    date = formatdate(retry_at, usegmt=True)

    def entries(g):
        if g == "fcm":
            return [{"error": "UNAVAILABLE", "retry_after": date}, {"status": 200}]
        return [{"status": 503, "retry_after": date}, {"status": 201 if g == "webpush" else 200}]
    res = _gateway_scenario(gw, "http_503_retry_after_date", entries)
    res.extra.update(retry_at=retry_at, retry_after_header=date)
    return res


def s_http_500(gw, pki):
    return _gateway_scenario(gw, "http_500", lambda g: [{"error": "INTERNAL"}] if g == "fcm" else [{"status": 500}])


def s_http_503(gw, pki):
    def entries(g):
        if g == "fcm":
            return [{"error": "UNAVAILABLE", "retry_after": 0}, {"status": 200}]
        return [{"status": 503}, {"status": 201 if g == "webpush" else 200}]
    return _gateway_scenario(gw, "http_503_then_ok", entries)


def s_stream_reset(gw, pki):
    return _gateway_scenario(gw, "stream_reset", lambda g: [{"reset": "CANCEL"}, {"status": 201 if g == "webpush" else 200}])


def s_refused_stream(gw, pki):
    return _gateway_scenario(gw, "refused_stream",
                             lambda g: [{"reset": "REFUSED_STREAM"}, {"status": 201 if g == "webpush" else 200}])


def s_no_answer(gw, pki):
    return _gateway_scenario(gw, "no_answer", lambda g: [{"hang": True}, {"status": 201 if g == "webpush" else 200}],
                             timeout_ms=60000)


def s_goaway_unprocessed(gw, pki):
    gw.reset()
    token_uri = f"https://127.0.0.1:{gw.ports['fcm_h1']}/token"
    gw.knobs("fcm", token_aud=[token_uri])
    sub = gw.subscription()
    # The OAuth token comes from the HTTP/1.1-only FCM listener, so that the one GOAWAY the
    # gateway sends lands on the connection that carries the push.
    d = _daemon(gw, token_uri=token_uri)
    try:
        # The start-up credential checks' probes (APNs, FCM) went first on the connections the
        # push will take: the GOAWAY comes after their second request, the push (Web Push has no
        # probe: after its first).
        _settle(d)
        for g in ("apns", "fcm", "webpush"):
            gw.knobs(g, goaway_after=1 if g == "webpush" else 2, goaway_answer_last=False, goaway_times=1,
                     goaway_reason="Shutdown")
        _register(d, sub["endpoint"], sub)
        res = _run("goaway_unprocessed", d, extra={"sub": sub})
        counters = gw.stats()["counters"]
        res.extra["gateway_goaways"] = {g: counters.get(f"{g}_goaways", 0) for g in ("apns", "fcm", "webpush")}
        res.extra["records"] = _records(gw, sub["id"])
        # The GOAWAY each gateway sent: its connection and last_stream_id (streams above it were
        # not processed: the gateway recorded the request but never answered it).
        res.extra["goaways"] = {t: [(c["id"], c["goaway_sent"]["last_stream_id"])
                                    for c in gw.connections(GATEWAY_OF[t])["connections"] if c.get("goaway_sent")]
                                for t in TRANSPORTS}
        return res
    finally:
        d.cleanup()


def s_goaway_answered(gw, pki):
    """The push is answered, then GOAWAY; a second message must go out on a new connection."""
    def entries(g):
        ok = {"status": 201 if g == "webpush" else 200, "goaway": "Shutdown"}
        return [ok, {"status": 201 if g == "webpush" else 200}]
    gw.reset()
    sub = _program_all(gw, entries)
    d = _daemon(gw)
    try:
        _register(d, sub["endpoint"], sub)
        res = _run("goaway_answered", d, sends=2, between=lambda: time.sleep(0.7), extra={"sub": sub})
        res.extra["records"] = _records(gw, sub["id"])
        res.extra["send_connections"] = {t: [r["conn"] for r in recs] for t, recs in res.extra["records"].items()}
        return res
    finally:
        d.cleanup()


def s_connection_reset(gw, pki):
    return _listener_scenario(gw, "connection_reset", lambda: FaultServer("reset", *pki["right"]),
                              ca_file=pki["bundle"], settle=True)


def s_tls_untrusted(gw, pki):
    return _listener_scenario(gw, "tls_handshake_untrusted_ca", lambda: FaultServer("tls", *pki["untrusted"]),
                              ca_file=pki["bundle"])


def s_tls_not_tls(gw, pki):
    return _listener_scenario(gw, "tls_handshake_not_tls", lambda: FaultServer("garbage"), ca_file=pki["bundle"])


def s_tls_wrong_host(gw, pki):
    """provider.herald.test resolves (in the daemon's namespace) to our listeners, whose certificate
    (from a trusted CA) names only other.herald.test."""
    ns = Namespace(hosts="127.0.0.1 provider.herald.test\n")
    try:
        return _listener_scenario(gw, "tls_wrong_host", lambda: FaultServer("tls", *pki["wrong_host"]),
                                  host="provider.herald.test", ns=ns, ca_file=pki["bundle"])
    finally:
        ns.close()


DNS_NAMES = {"apns": "apns.nonexistent.invalid", "fcm": "fcm.nonexistent.invalid", "web": "web-gone.herald.test"}


def _dns_endpoints():
    apns = f"https://{DNS_NAMES['apns']}"
    return {"apns_production": apns, "apns_development": apns, "fcm": f"https://{DNS_NAMES['fcm']}"}


def _dns_scenario(gw, fault, *, dns):
    """APNs and FCM endpoints that do not resolve; a Web Push endpoint (the gateway) that resolved
    at registration and does not at send time."""
    gw.reset()
    ns = Namespace(hosts=f"127.0.0.1 {DNS_NAMES['web']}\n", dns=dns)
    sub = gw.subscription()
    d = _daemon(gw, endpoints=_dns_endpoints(), ns=ns)
    try:
        _register(d, f"https://{DNS_NAMES['web']}:{gw.ports['webpush']}/push/{sub['id']}", sub)
        ns.set_hosts("")
        assert ns.resolve(DNS_NAMES["web"]) == []
        res = _run(fault, d, extra={"sub": sub})
        res.extra["records"] = _records(gw, sub["id"])
        return res
    finally:
        d.cleanup()
        ns.close()


def s_dns_nxdomain(gw, pki):
    return _dns_scenario(gw, "dns_failure", dns=False)


def s_dns_servfail(gw, pki):
    # hosts: files dns, and the only name server (127.0.0.1:53) does not answer: EAI_AGAIN.
    return _dns_scenario(gw, "dns_temporary_failure", dns=True)


def _proxy_scenario(gw, fault, delay_s, delivery=None, reset=True):
    if reset:
        gw.reset()
    proxies = {g: SlowAcceptProxy(("127.0.0.1", gw.ports[g]), delay_s) for g in ("apns", "fcm", "webpush")}
    sub = gw.subscription()
    d = _daemon(gw, endpoints={"apns_production": f"https://127.0.0.1:{proxies['apns'].port}",
                               "apns_development": f"https://127.0.0.1:{proxies['apns'].port}",
                               "fcm": f"https://127.0.0.1:{proxies['fcm'].port}"}, delivery=delivery)
    try:
        _register(d, f"https://127.0.0.1:{proxies['webpush'].port}/push/{sub['id']}", sub)
        res = _run(fault, d, extra={"sub": sub})
        res.extra["accepted"] = {g: p.accepted for g, p in proxies.items()}
        # Connections the kernel completed and nobody accepted: each attempt's connection.
        res.extra["accept_queue"] = {g: accept_queue(p.port) for g, p in proxies.items()}
        if reset:
            # (never_accepts runs beside no_answer, whose records carry the same tokens.)
            res.extra["records"] = _records(gw, sub["id"])
        return res
    finally:
        d.cleanup()
        for p in proxies.values():
            p.close()


def accept_queue(port):
    """Connections waiting in the accept queue of this network namespace's TCP listener on
    127.0.0.1:``port`` (/proc/net/tcp: a LISTEN socket's rx_queue is its accept backlog)."""
    want = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == want and fields[3] == "0A":
                return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"no listener on 127.0.0.1:{port}")


def s_accepts_slowly(gw, pki):
    return _proxy_scenario(gw, "accepts_slowly", 2.0)


def s_never_accepts(gw, pki):
    # Each attempt waits out the connect timeout (10 s; Web Push: webpush_connect_timeout, 5 s):
    # one retry only, to keep the run short.
    # It runs side by side with no_answer, whose gateway programs it must leave alone: no reset.
    return _proxy_scenario(gw, "never_accepts", None, delivery={"max_retries": 1}, reset=False)


def s_auth_rejected(gw, pki):
    """Every answer refuses the credential. APNs and FCM: the transports go degraded and the
    deliveries wait (retrying, credential_rejected, not counted toward max_retries) until a
    reload; Web Push: a 403 concerns that push service only, retried and failed once
    max_retries are spent, the app's Web Push stays ready. No device is deleted. Then the
    providers accept again and a reload brings the waiting deliveries back: delivered, ready."""
    gw.reset()
    sub = _program_all(gw, lambda g: [{"status": 403, "reason": "InvalidProviderToken"}] if g == "apns" else
                       [{"error": "THIRD_PARTY_AUTH_ERROR"}] if g == "fcm" else [{"status": 403}])
    d = _daemon(gw)
    try:
        _register(d, sub["endpoint"], sub)
        before = d.metrics()
        t0 = time.monotonic()
        mid = d.call("push.send", {"to": {"users": [USER]}})["message_id"]

        def settled():
            by = {x["platform"]: x for x in d.status(mid)["devices"]}
            return (all(by[t]["state"] == "retrying" and by[t]["reason"] == "credential_rejected"
                        for t in ("apns", "fcm")) and by["web"]["state"] == "failed")
        wait_until(settled, timeout=30, what="the credential waits and the Web Push failure")
        waiting = d.status(mid)
        degraded_metrics = d.metrics()
        health = d.call("system.health")
        degraded_log = d.log()
        for g, tok in (("apns", APNS_TOKEN), ("fcm", FCM_TOKEN), ("webpush", sub["id"])):
            gw.program(g, [], token=tok)
        # What reached the gateways while they refused (the records up to the reload).
        refused_records = _records(gw, sub["id"])
        os.kill(d.pid, signal.SIGHUP)
        wait_until(lambda: "config_reloaded" in d.log(), timeout=15, what="the reload")
        # Well within the 60 s credential cadence: only the reload can bring them back this soon.
        status = d.wait_complete(mid, timeout=30)
        elapsed = time.monotonic() - t0
        after = d.metrics()
        r2 = d.send_wait({"to": {"users": [USER]}})
        kept = {t: t in {x["platform"] for x in d.devices(USER)} for t in TRANSPORTS}
        res = Result("auth_rejected", status, before, after, kept, elapsed,
                     {"statuses": [status], "waiting": waiting, "health": health,
                      "degraded_metrics": degraded_metrics, "degraded_log": degraded_log, "recovery": r2,
                      "recovered_metrics": d.metrics(), "recovered_health": d.call("system.health"),
                      "refused_records": refused_records, "records": _records(gw, sub["id"])}, d.log())
        injected = sum(x["attempts"] for x in waiting["devices"])
        record_counts(SUITE, faults_injected=injected + 2)
        return res
    finally:
        d.cleanup()

# ----------------------------------------------------------------------------- silent connections (issue 14, item 3)
#
# SPEC.md Revision 2, "Delivery semantics": after a request times out on a provider connection, a
# PING must be answered within [delivery] ping_timeout or the connection is closed, and its
# unanswered requests are retried on a new connection.

PING_TIMEOUT = "0.5"


class BlackHoleProxy(_Listener):
    """A TCP proxy to ``target`` (host, port) that pipes each connection both ways until
    ``silence()``; from then on the connections open at that moment forward nothing more in either
    direction (what arrives is read and dropped) and stay open: a provider gone silent behind a NAT,
    or a half-open TCP connection. Connections opened later are piped as usual. ``links`` holds,
    per connection in accept order, whether it is silenced and whether the client closed it."""

    def __init__(self, target):
        self.target = target
        self.links: list[dict] = []
        self.sock = FaultServer._listen("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self._serve_in_background()

    def silence(self):
        for link in list(self.links):
            link["silenced"] = True

    def _handle(self, c):
        try:
            u = socket.create_connection(self.target)
        except OSError:
            c.close()
            return
        link = {"silenced": False, "client_closed": False, "dropped": 0}
        self.links.append(link)
        socks = [c, u]
        try:
            while not self._stop:
                r, _, _ = select.select(socks, [], [], 0.2)
                for s in r:
                    try:
                        data = s.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        if s is c:
                            link["client_closed"] = True
                            return
                        if link["silenced"]:
                            socks.remove(u)   # the server left; the client still sees nothing
                            continue
                        return
                    if link["silenced"]:
                        link["dropped"] += len(data) if s is c else 0
                        continue
                    (u if s is c else c).sendall(data)
        except OSError:
            pass
        finally:
            for s in (c, u):
                with contextlib.suppress(OSError):
                    s.close()


def _silent_proxies(gw):
    return {g: BlackHoleProxy(("127.0.0.1", gw.ports[g])) for g in ("apns", "fcm", "webpush")}


def _proxied_endpoints(proxies):
    apns = f"https://127.0.0.1:{proxies['apns'].port}"
    return {"apns_production": apns, "apns_development": apns, "fcm": f"https://127.0.0.1:{proxies['fcm'].port}"}


def _closed_by_herald(proxy, links, timeout=10.0):
    """Whether Herald closed every one of ``links`` (the silenced ones) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if links and all(link["client_closed"] for link in links):
            return True
        time.sleep(0.05)
    return False


def s_silent_mid_stream(gw, pki):
    """A first message is delivered on live connections; then the proxies in front of the three
    gateways black-hole those connections, and a second message is sent. Its first attempt times
    out on the silent connection (15 s), the PING goes unanswered for ping_timeout, and the retry
    must go out on a new connection and be delivered; the silent connection is closed."""
    gw.reset()
    proxies = _silent_proxies(gw)
    sub = gw.subscription()
    d = _daemon(gw, endpoints=_proxied_endpoints(proxies), delivery={"ping_timeout": PING_TIMEOUT})
    silenced = {}

    def silence():
        for g, p in proxies.items():
            silenced[g] = list(p.links)
            p.silence()

    try:
        # The start-up credential checks open the APNs and FCM connections the first message takes.
        _settle(d)
        _register(d, f"https://127.0.0.1:{proxies['webpush'].port}/push/{sub['id']}", sub)
        res = _run("silent_mid_stream", d, sends=2, between=silence, extra={"sub": sub})
        res.status = res.extra["statuses"][1]
        res.extra["silenced"] = {g: len(links) for g, links in silenced.items()}
        res.extra["closed"] = {g: _closed_by_herald(proxies[g], silenced[g]) for g in proxies}
        res.log = d.log()
        res.after = d.metrics()
        res.extra["records"] = {
            "apns": [r for r in gw.received("apns") if r.get("token") == APNS_TOKEN],
            "fcm": [r for r in gw.received("fcm", kind="send") if r.get("token") == FCM_TOKEN],
            "web": [r for r in gw.received("webpush") if r.get("token") == sub["id"]],
        }
        return res
    finally:
        d.cleanup()
        for p in proxies.values():
            p.close()


def _expect_auth_receipts(res, t, waiting):
    """What the gateway saw of auth_rejected: for APNs and FCM the refused tries (the first retried
    after 1 s, then no sooner than every 60 s: a refused credential must not spin), and after the
    reload one delivery of the waiting message and one of the recovery message; for Web Push
    max_retries + 1 refused tries, then the recovery message only."""
    refused = res.extra["refused_records"][t]
    recs = res.extra["records"][t]
    assert recs[:len(refused)] == refused, f"{t}: records changed under the test"
    assert [_answer(r) for r in refused] == [403 if t != "fcm" else 401] * len(refused), \
        [r["response"] for r in refused]
    if t == "web":
        assert len(refused) == waiting["attempts"] == MAX_RETRIES + 1, (len(refused), waiting)
        assert [_answer(r) for r in recs[len(refused):]] == ["ok"], [r["response"] for r in recs]
        return
    assert refused, f"{t}: nothing reached the gateway before the reload"
    tries = [[r] for r in refused]
    if t == "fcm":
        # docs/delivery.md: a 401 drops the access token and the push is sent once more at once
        # with a fresh one: each try is two requests, the second with another bearer token.
        assert len(refused) % 2 == 0, f"fcm: {len(refused)} refused requests: each try is a 401 and its resend"
        tries = [refused[i:i + 2] for i in range(0, len(refused), 2)]
        for a, b in tries:
            assert a["headers"].get("authorization") != b["headers"].get("authorization"), \
                "fcm: the resend after a 401 carried the same access token"
    for i, (a, b) in enumerate(zip(tries, tries[1:])):
        _not_before(t, f"refused try {i + 2} of a credential", b[0]["time"], a[-1]["time"] + (1 if i == 0 else 60))
    after = recs[len(refused):]
    assert [_answer(r) for r in after] == ["ok", "ok"], \
        f"{t}: after the reload the gateway answered {[_answer(r) for r in after]}: expected the waiting delivery " \
        f"and the recovery message, once each"


def _expect_silent_mid_stream(res, t):
    dev = _expect_delivered(res, t, attempts=2)
    g = GATEWAY_OF[t]
    assert res.extra["silenced"][g] >= 1, "the first message left no connection to silence"
    # Both messages reached the gateway once each; the second on a connection opened after the
    # silence (what went to the silent one never arrived).
    recs = res.extra["records"][t]
    assert [_answer(r) for r in recs] == ["ok", "ok"], recs
    assert not [r for r in recs if not r.get("valid")], recs
    assert recs[1]["conn"] != recs[0]["conn"], f"{t}: the retry went to the silent connection: {recs}"
    # The second message's first try went into the black hole: its retry came after the deadline.
    _not_before(t, "the retry of a request sent on a silent connection", recs[1]["time"],
                res.extra["sent_at"][1] + REQUEST_DEADLINE_S)
    assert res.extra["closed"][g], f"{t}: the silent connection was not closed after ping_timeout"
    assert res.delta("herald_provider_timeouts_total", transport=t) >= 1
    # At least the retry's (the first message may have gone on a connection the start-up
    # credential check opened before the figures were read).
    assert res.delta("herald_provider_connections_opened_total", transport=t) >= 1
    assert res.delta("herald_retries_total", platform=t) == 1
    assert res.delta("herald_provider_silent_closes_total", transport=t) == 1
    assert "http2_connection_silent" in res.log, "the close is logged"
    return dev


SCENARIOS = {
    "http_429_retry_after": s_http_429,
    "http_503_retry_after_date": s_http_503_retry_after_date,
    "http_500": s_http_500,
    "http_503_then_ok": s_http_503,
    "no_answer": s_no_answer,
    "stream_reset": s_stream_reset,
    "refused_stream": s_refused_stream,
    "connection_reset": s_connection_reset,
    "goaway_unprocessed": s_goaway_unprocessed,
    "goaway_answered": s_goaway_answered,
    "tls_handshake_untrusted_ca": s_tls_untrusted,
    "tls_handshake_not_tls": s_tls_not_tls,
    "tls_wrong_host": s_tls_wrong_host,
    "dns_failure": s_dns_nxdomain,
    "dns_temporary_failure": s_dns_servfail,
    "accepts_slowly": s_accepts_slowly,
    "never_accepts": s_never_accepts,
    "auth_rejected": s_auth_rejected,
    "silent_mid_stream": s_silent_mid_stream,
}


# ----------------------------------------------------------------------------- a name server that never answers

def s_dns_no_answer(gw, pki):
    """Every name goes to a name server that never answers (in a network namespace: the stub on
    127.0.0.1:53 drops every query; glibc gives up after 3 s). APNs and FCM endpoints are names;
    the Web Push endpoint resolved from the hosts file at registration, and only through DNS at
    send time. The FCM token endpoint (the gateway) is relayed into the namespace."""
    gw.reset()
    ns = Namespace(net=True, hosts=f"127.0.0.1 {DNS_NAMES['web']}\n", dns=True)
    dns = StubNameServer(ns, {"*": "hang"}, timeout=3)
    relay = NamespaceRelay(ns, ("127.0.0.1", gw.ports["fcm"]))
    sub = gw.subscription()
    d = _daemon(gw, endpoints=_dns_endpoints(), ns=ns)
    try:
        _register(d, f"https://{DNS_NAMES['web']}:{gw.ports['webpush']}/push/{sub['id']}", sub)
        ns.set_hosts("")
        res = _run("dns_no_answer", d, extra={"sub": sub})
        # The name server's own record of each transport's lookups (A queries, with their times).
        with dns._lock:
            res.extra["queries"] = {t: [q[0] for q in dns.queries if q[1] == DNS_NAMES[t] and q[2] == "A"]
                                    for t in TRANSPORTS}
        res.extra["web_queries"] = len(res.extra["queries"]["web"])
        res.extra["records"] = _records(gw, sub["id"])
        return res
    finally:
        d.cleanup()
        relay.close()
        dns.close()
        ns.close()


def _expect_dns_no_answer(res, t):
    # SPEC: send-time DNS gives up after 2 s, as a DNS failure (transient: retried, then failed
    # once max_retries are spent). Every transport remembers the failure for 30 s (Web Push
    # endpoints, and APNs and FCM hosts alike), so the retries do not ask the name server again:
    # the one query is what made the attempts fail as DNS.
    dev = _expect_exhausted(res, t, "dns_failure")
    queries = res.extra["queries"][t]
    assert dev["attempts"] >= 2, dev
    assert len(queries) == 1, f"{t}: {dev['attempts']} attempts, {len(queries)} A queries"
    assert res.extra["records"][t] == [], f"{t}: a request reached the gateway"
    return dev


SCENARIOS["dns_no_answer"] = s_dns_no_answer

# The two slowest scenarios (15 s request deadline, 10 s connect timeout; 5 s for Web Push) run side by side.
PARALLEL_GROUPS = [("no_answer", "never_accepts")]
_RESULTS: dict = {}
_LOCK = threading.Lock()


def result(fault, gw, pki) -> Result:
    with _LOCK:
        if fault not in _RESULTS:
            group = next((g for g in PARALLEL_GROUPS if fault in g), (fault,))
            errors = {}

            def run(f):
                try:
                    _RESULTS[f] = SCENARIOS[f](gw, pki)
                except BaseException as e:  # noqa: BLE001
                    errors[f] = e

            threads = [threading.Thread(target=run, args=(f,)) for f in group]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            record_counts(SUITE, fault_cases=3 * len(group))
            if fault in errors:
                raise errors[fault]
        return _RESULTS[fault]


# ----------------------------------------------------------------------------- the matrix

CELLS = []
for _fault in SCENARIOS:
    for _t in TRANSPORTS:
        CELLS.append(pytest.param(_fault, _t, id=f"{_t}-{_fault}"))

GATEWAY_OF = {"apns": "apns", "fcm": "fcm", "web": "webpush"}


def _common(res: Result, t: str):
    dev = res.device(t)
    assert res.kept[t], f"{t}: the device was deleted by {res.fault}: {res.status}"
    assert res.delta("herald_stale_removed_total", platform=t) == 0
    assert res.status["counts"]["removed_stale"] == 0
    if res.fault != "auth_rejected":
        # Only a refused credential degrades a transport; transient faults leave it ready.
        assert res.extra["health"]["transports"]["default"][t] == "ready", res.extra["health"]
        assert metric(res.after, "herald_transport_state", app="default", transport=t, state="ready") == 1
        assert metric(res.after, "herald_outcomes_total", platform=t, outcome="auth_rejected") == 0
    return dev


def _expect_delivered(res, t, *, attempts=None, max_attempts=None, retries=None):
    dev = _common(res, t)
    assert dev["state"] == "delivered", f"{t}: {dev}\n{res.log[-3000:]}"
    assert dev["http_status"] in (200, 201)
    if attempts is not None:
        assert dev["attempts"] == attempts, dev
    if max_attempts is not None:
        assert 1 <= dev["attempts"] <= max_attempts, dev
    if retries is not None:
        assert res.delta("herald_retries_total", platform=t) == retries
    assert res.delta("herald_outcomes_total", platform=t, outcome="delivered") >= 1
    assert res.delta("herald_outcomes_total", platform=t, outcome="failed") == 0
    return dev


def _expect_exhausted(res, t, reason, *, attempts=MAX_RETRIES + 1):
    dev = _common(res, t)
    assert dev["state"] == "failed", f"{t}: {dev}\n{res.log[-3000:]}"
    assert dev["attempts"] == attempts, dev
    assert dev["reason"] == f"{reason} (retries exhausted)", dev
    assert res.delta("herald_retries_total", platform=t) == attempts - 1
    assert res.delta("herald_outcomes_total", platform=t, outcome="failed") == 1
    assert res.delta("herald_outcomes_total", platform=t, outcome="delivered") == 0
    return dev


# ----------------------------------------------------------------------------- receipts
#
# What the receivers recorded is the judge: the gateways' records (one per request that reached
# them: arrival time, connection, the answer given), the fault listeners' counts, the name
# server's queries, the accept queues. push.status ``attempts`` must match them. Spacing checks
# are lower bounds only (a loaded machine can make a retry late, never early): a retry after
# Retry-After: N reaches the gateway no earlier than N s after the answer that carried it; a retry
# after a request without an answer no earlier than the 15 s deadline after the send. Backoff
# without Retry-After is full jitter from 0 (docs/delivery.md "Retries"): it has no lower bound,
# so those cells check the count, the order and the answers.

def _answer(rec):
    """What the gateway did with a request: "ok" (2xx), an HTTP status, "hang" or "reset"."""
    r = rec["response"]
    if r.get("hang"):
        return "hang"
    if r.get("reset") is not None:
        return "reset"
    return "ok" if 200 <= (r.get("status") or 0) < 300 else r["status"]


def _receipts(res, t, answers, *, attempts=True):
    """The gateway records of our device on ``t``'s gateway: each passed the gateway's checks,
    they arrived in order after the send, they were answered as ``answers`` says (in order), and
    (``attempts``) there is one per attempt push.status counts. Returns the records."""
    recs = res.extra["records"][t]
    dev = res.device(t)
    got = [_answer(r) for r in recs]
    assert got == list(answers), f"{t}: the gateway answered {got}, expected {list(answers)}: {dev}"
    bad = [(r["seq"], r["errors"]) for r in recs if not r.get("valid")]
    assert not bad, f"{t}: requests the gateway refused as invalid: {bad}"
    times = [r["time"] for r in recs]
    assert times == sorted(times), f"{t}: records out of order: {times}"
    if recs:
        assert recs[0]["time"] >= res.extra["sent_at"][0] - CLOCK_TOLERANCE_S, "a record from before the send"
    if attempts:
        assert dev["attempts"] == len(recs), \
            f"{t}: push.status says {dev['attempts']} attempts, the gateway received {len(recs)}: {dev}"
    return recs


def _not_before(t, what, arrived, earliest):
    """A lower bound on an arrival (epoch s), with the clock tolerance."""
    assert arrived >= earliest - CLOCK_TOLERANCE_S, \
        f"{t}: {what} reached the gateway {earliest - arrived:.3f} s too early"


@pytest.mark.parametrize("fault,transport", CELLS)
def test_fault(fault, transport, gw, pki):
    res = result(fault, gw, pki)
    t = transport
    if fault == "http_429_retry_after":
        _expect_delivered(res, t, attempts=2, retries=1)
        first, retry = _receipts(res, t, [429, "ok"])
        assert first["response"]["headers"].get("retry-after") == str(RETRY_AFTER_S), first["response"]
        _not_before(t, f"the retry after a 429 with Retry-After: {RETRY_AFTER_S}", retry["time"],
                    first["time"] + RETRY_AFTER_S)
    elif fault == "http_503_retry_after_date":
        _expect_delivered(res, t, attempts=2, retries=1)
        first, retry = _receipts(res, t, [503, "ok"])
        assert first["response"]["headers"].get("retry-after") == res.extra["retry_after_header"]
        _not_before(t, f"the retry after a 503 with Retry-After: {res.extra['retry_after_header']}", retry["time"],
                    res.extra["retry_at"])
    elif fault == "http_500":
        dev = _expect_exhausted(res, t, {"apns": "InternalServerError", "fcm": "INTERNAL", "web": "http_500"}[t])
        assert dev["http_status"] == 500
        _receipts(res, t, [500] * (MAX_RETRIES + 1))
    elif fault == "http_503_then_ok":
        _expect_delivered(res, t, attempts=2, retries=1)
        _receipts(res, t, [503, "ok"])
    elif fault == "stream_reset":
        _expect_delivered(res, t, attempts=2, retries=1)
        _receipts(res, t, ["reset", "ok"])
    elif fault == "refused_stream":
        # A refused stream was not processed (RFC 9113 8.7): the HTTP/2 client may put it back on
        # its own queue before the scheduler sees it, so push.status counts one or two attempts;
        # the gateway saw the refused request and the delivered one, nothing more.
        dev = _expect_delivered(res, t, max_attempts=2)
        _receipts(res, t, ["reset", "ok"], attempts=False)
        assert dev["attempts"] <= 2
    elif fault == "no_answer":
        _expect_delivered(res, t, attempts=2, retries=1)
        assert res.delta("herald_provider_timeouts_total", transport=t) >= 1
        _, retry = _receipts(res, t, ["hang", "ok"])
        _not_before(t, "the retry of a request left without an answer", retry["time"],
                    res.extra["sent_at"][0] + REQUEST_DEADLINE_S)
    elif fault == "connection_reset":
        dev = _expect_exhausted(res, t, "connection_reset")
        srv = res.extra["servers"][t]
        seen = srv.requests - res.extra["before"].get(t, 0)
        assert seen == dev["attempts"], \
            f"{t}: push.status says {dev['attempts']} attempts, the listener saw {seen} requests (besides the probes)"
    elif fault == "goaway_unprocessed":
        assert res.extra["gateway_goaways"][GATEWAY_OF[t]] == 1, res.extra["gateway_goaways"]
        dev = _expect_delivered(res, t, max_attempts=2)
        assert res.delta("herald_provider_goaways_total", transport=t) >= 1
        # The gateway took the request in, then sent GOAWAY with a last_stream_id below it (not
        # processed, never answered); the push went again on a new connection and was delivered.
        (gconn, last), = res.extra["goaways"][t]
        recs = res.extra["records"][t]
        assert len(recs) == 2, f"{t}: {[(r['conn'], r['stream']) for r in recs]}"
        assert (recs[0]["conn"], recs[0]["stream"] > last) == (gconn, True), (recs[0]["conn"], gconn, last)
        assert recs[1]["conn"] != gconn and _answer(recs[1]) == "ok", recs[1]["response"]
        # That first try counts as an attempt only if the scheduler saw it (a client may retry a
        # request the server did not process on its own): never more attempts than requests.
        assert dev["attempts"] <= len(recs)
    elif fault == "goaway_answered":
        for s in res.extra["statuses"]:
            d = next(x for x in s["devices"] if x["platform"] == t)
            assert d["state"] == "delivered" and d["attempts"] == 1, d
        assert res.delta("herald_provider_goaways_total", transport=t) >= 1
        _common(res, t)
        # One request per message, both answered; the second on a new connection.
        recs = res.extra["records"][t]
        assert [_answer(r) for r in recs] == ["ok", "ok"], [r["response"] for r in recs]
        conns = res.extra["send_connections"][t]
        assert len(conns) == 2 and conns[0] != conns[1], \
            f"{t}: the message after GOAWAY did not go out on a new connection: {conns}"
        assert res.kept[t]
    elif fault in ("tls_handshake_untrusted_ca", "tls_handshake_not_tls", "tls_wrong_host"):
        dev = _expect_exhausted(res, t, "tls_failure")
        assert res.delta("herald_provider_connect_failures_total", transport=t) >= MAX_RETRIES + 1
        assert res.delta("herald_provider_connections_opened_total", transport=t) == 0
        srv = res.extra["servers"][t]
        assert srv.requests == 0, "no request may be sent over a connection that failed its check"
        assert srv.handshakes == 0, f"{t}: {srv.handshakes} TLS handshakes completed with a bad certificate"
        # Each attempt dialled the listener (a client that stopped trying would not).
        assert srv.connections >= dev["attempts"], \
            f"{t}: {dev['attempts']} attempts, but the listener saw {srv.connections} connections"
    elif fault in ("dns_failure", "dns_temporary_failure"):
        # SPEC: DNS failures are transient: retried, then failed once max_retries are spent.
        dev = _common(res, t)
        assert dev["state"] == "failed", dev
        assert dev["attempts"] == MAX_RETRIES + 1, dev
        assert dev["reason"].endswith("(retries exhausted)"), dev
        assert res.delta("herald_retries_total", platform=t) == MAX_RETRIES
        if t != "web":
            assert dev["reason"] == "dns_failure (retries exhausted)", dev
            assert res.delta("herald_provider_connect_failures_total", transport=t) >= 1
        # The Web Push endpoint is the gateway under a name that no longer resolves: nothing came.
        assert res.extra["records"][t] == [], f"{t}: {len(res.extra['records'][t])} requests got through"
    elif fault == "accepts_slowly":
        _expect_delivered(res, t, attempts=1, retries=0)
        assert res.delta("herald_provider_timeouts_total", transport=t) == 0
        push, = _receipts(res, t, ["ok"])
        # The proxy held the connection 2 s before accepting it: the push cannot have come sooner.
        _not_before(t, "the push through a listener that accepts after 2 s", push["time"],
                    res.extra["sent_at"][0] + 2.0)
    elif fault == "never_accepts":
        dev = _expect_exhausted(res, t, "timeout", attempts=2)
        assert (res.delta("herald_provider_connect_failures_total", transport=t)
                + res.delta("herald_provider_timeouts_total", transport=t)) >= 2
        # Every attempt's connection is still in the listener's accept queue (nothing got past it).
        queued = res.extra["accept_queue"][GATEWAY_OF[t]]
        assert queued >= dev["attempts"], f"{t}: {dev['attempts']} attempts, {queued} connections queued"
    elif fault == "auth_rejected":
        _common(res, t)
        m = res.extra["degraded_metrics"]
        waiting = next(x for x in res.extra["waiting"]["devices"] if x["platform"] == t)
        dev = res.device(t)
        assert res.delta("herald_outcomes_total", platform=t, outcome="auth_rejected") >= 1
        assert res.extra["health"]["status"] == "degraded"
        if t == "web":
            # One push service refusing Herald degrades that origin only, never Web Push.
            assert waiting["state"] == "failed" and waiting["attempts"] == MAX_RETRIES + 1, waiting
            assert waiting["reason"] == "http_403 (retries exhausted)", waiting
            assert res.extra["health"]["transports"]["default"][t] == "ready", res.extra["health"]
            assert metric(m, "herald_transport_state", app="default", transport=t, state="ready") == 1
        else:
            # Waiting for the credential, uncounted; a reload brought it back: delivered.
            assert waiting["state"] == "retrying" and waiting["attempts"] == 0, waiting
            assert waiting["reason"] == "credential_rejected", waiting
            assert metric(m, "herald_transport_state", app="default", transport=t, state="degraded") == 1, \
                "the transport is degraded while the provider refuses the credential"
            assert metric(m, "herald_transport_state", app="default", transport=t, state="ready") == 0
            assert res.extra["health"]["transports"]["default"][t].startswith("degraded:")
            assert dev["state"] == "delivered" and dev["attempts"] == 1, dev
        # The provider takes the credential again: delivered, and the transport is ready.
        assert res.extra["recovery"]["counts"]["delivered"] == 3, res.extra["recovery"]
        rm = res.extra["recovered_metrics"]
        assert metric(rm, "herald_transport_state", app="default", transport=t, state="ready") == 1
        assert metric(rm, "herald_transport_state", app="default", transport=t, state="degraded") == 0
        assert res.extra["recovered_health"]["transports"]["default"][t] == "ready"
        _expect_auth_receipts(res, t, waiting)
    elif fault == "dns_no_answer":
        _expect_dns_no_answer(res, t)
    elif fault == "silent_mid_stream":
        _expect_silent_mid_stream(res, t)
    else:
        raise AssertionError(f"no expectation for {fault}")


def test_metric_reads_fail_on_what_metrics_lacks():
    """metric() never reads a missing family, label or sample as 0; metric_or_zero() reads an absent
    label set as 0 only in a family /metrics declares, with label names it knows."""
    from herald_fixtures import MetricsMissing, metric_or_zero, parse_metrics
    m = parse_metrics('# HELP herald_retries_total Retries.\n# TYPE herald_retries_total counter\n'
                      'herald_retries_total{platform="apns"} 2\nherald_retries_total{platform="web"} 1\n'
                      '# TYPE fake_lazy_total counter\n'
                      '# TYPE herald_send_duration_seconds histogram\n'
                      'herald_send_duration_seconds_count{platform="apns"} 4\nherald_queue_depth 0\n')
    assert metric(m, "herald_retries_total") == 3
    assert metric(m, "herald_retries_total", platform="web") == 1
    assert metric(m, "herald_send_duration_seconds_count", platform="apns") == 4
    for name, labels in (("herald_retry_total", {}), ("herald_retries_total", {"transport": "web"}),
                         ("herald_retries_total", {"platform": "fcm"}), ("herald_queue_depth", {}),
                         ("fake_lazy_total", {"platform": "web"})):
        with pytest.raises(MetricsMissing):
            metric(m, name, **labels)
    assert metric_or_zero(m, "herald_retries_total", platform="fcm") == 0
    assert metric_or_zero(m, "fake_lazy_total", platform="web") == 0
    for name, labels in (("herald_retry_total", {"platform": "fcm"}), ("herald_retries_total", {"transport": "x"})):
        with pytest.raises(MetricsMissing):
            metric_or_zero(m, name, **labels)


def test_metric_families_the_suites_read_exist(gw):
    """Every metric family the reliability suites read (metric(), metric_or_zero(), Result.delta())
    and the families the fault matrix names are declared in the daemon's /metrics output with the
    right type: a rename fails here, as well as in each check that reads it."""
    import re
    from pathlib import Path
    used = set()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        text = path.read_text()
        used |= set(re.findall(r'(?:metric|metric_or_zero|delta)\([^()"]*"(herald_[a-z0-9_]+)"', text))
    assert {"herald_retries_total", "herald_outcomes_total", "herald_transport_state"} <= used, used
    d = Daemon(gateways=gw)
    try:
        m = d.metrics()
        expected = {n: "counter" for n in COUNTER_FAMILIES} | {n: "gauge" for n in GAUGE_FAMILIES}
        check_metric_families(m, expected)
        missing = sorted(n for n in used if m.family_of(n) is None)
        assert not missing, f"the suites read metric families /metrics does not declare: {missing}"
    finally:
        d.cleanup()


def test_silent_connection_every_push_on_a_new_one(gw):
    """Issue 14 item 3 as it was seen: a proxy in front of the APNs gateway keeps a live
    connection open but forwards nothing more; 60 pushes are then sent. Every one is delivered, on
    a connection opened after the silence, and the silent connection is closed (before the fix all
    60 ended failed: every retry went to the same dead connection)."""
    n = 60
    gw.reset()
    proxies = _silent_proxies(gw)
    d = _daemon(gw, endpoints=_proxied_endpoints(proxies), delivery={"ping_timeout": PING_TIMEOUT})
    try:
        users = [f"silent-{i}" for i in range(n)]
        tokens = {hex_token(i, prefix=0x5E) for i in range(n)}
        ids = d.register_many([{"user": u, "platform": "apns", "token": hex_token(i, prefix=0x5E)}
                               for i, u in enumerate(users)])
        token_of = {dev: hex_token(i, prefix=0x5E) for i, dev in enumerate(ids)}
        r = d.send_wait({"to": {"users": users}})
        assert r["counts"]["delivered"] == n, r
        warm = {x["conn"] for x in gw.received("apns") if x.get("token") in tokens}
        silent = list(proxies["apns"].links)
        proxies["apns"].silence()
        since = max(x["seq"] for x in gw.received("apns"))
        sent_at = time.time()
        r = d.send_wait({"to": {"users": users}}, timeout_ms=60000)
        assert r["counts"]["delivered"] == n, (r, d.log(40))
        status = d.status(r["message_id"])
        assert all(x["state"] == "delivered" and x["attempts"] <= 2 for x in status["devices"]), status
        later = [x for x in gw.received("apns", since=since) if x.get("token") in tokens]
        # Each push reached the gateway exactly once (what went to the silent connection was lost),
        # on a connection opened after the silence, and answered.
        assert sorted(x["token"] for x in later) == sorted(tokens), \
            f"{len(later)} requests for {n} devices after the silence"
        assert all(_answer(x) == "ok" and x.get("valid") for x in later), [x["response"] for x in later]
        assert not {x["conn"] for x in later} & warm, "a push went out on the silent connection"
        assert _closed_by_herald(proxies["apns"], silent), "the silent connection was not closed"
        # A push whose first try went to the silent connection was retried only after its deadline.
        arrived = {x["token"]: x["time"] for x in later}
        retried = [token_of[x["device_id"]] for x in status["devices"] if x["attempts"] == 2]
        for tok in retried:
            _not_before("apns", "a retry off the silent connection", arrived[tok], sent_at + REQUEST_DEADLINE_S)
        record_counts(SUITE, faults_injected=n, fault_cases=1)
    finally:
        d.cleanup()
        for p in proxies.values():
            p.close()


# ----------------------------------------------------------------------------- the libcurl (HTTP/1.1) path
#
# Web Push to a push service whose TLS offers no h2: the HTTP/2 client finds out (ALPN) and the
# sends go through libcurl (HTTP/1.1), the origin remembered for an hour. The same faults as
# above where they make sense for HTTP/1.1: 429/500/503, a connection closed or reset mid-request,
# no answer (a silent connection: libcurl closes it at the deadline, the retry opens another), and
# a TLS failure on the libcurl connection itself.

def _h1_register(d, endpoint, sub=None):
    keys = {"p256dh": sub["p256dh"], "auth": sub["auth"]} if sub else web_keys()
    d.register(USER, "web", endpoint, keys=keys)


def _h1_gateway_scenario(gw, fault, responses, **kw):
    gw.reset()
    sub = gw.subscription(listener="webpush_h1")
    gw.program("webpush", responses, token=sub["id"])
    d = _daemon(gw)
    try:
        _h1_register(d, sub["endpoint"], sub)
        res = _run(fault, d, extra={"sub": sub}, **kw)
        res.extra["records"] = {"web": [r for r in gw.received("webpush_h1") if r.get("token") == sub["id"]]}
        return res
    finally:
        d.cleanup()


def _h1_only(srv):
    """Makes a FaultServer offer only ALPN http/1.1 (a push service without HTTP/2)."""
    srv.ctx.set_alpn_protocols(["http/1.1"])
    return srv


def _h1_listener_scenario(gw, fault, srv, pki, *, before=None):
    """``before(d)`` runs after registration, before the measured message."""
    gw.reset()
    d = _daemon(gw, ca_file=pki["bundle"])
    try:
        _h1_register(d, f"https://127.0.0.1:{srv.port}/push/fault")
        first = before(d) if before else None
        return _run(fault, d, extra={"server": srv, "first": first})
    finally:
        d.cleanup()


def h1_http_429(gw, pki):
    return _h1_gateway_scenario(gw, "h1_http_429", [{"status": 429, "retry_after": RETRY_AFTER_S}, {"status": 201}])


def h1_http_500(gw, pki):
    return _h1_gateway_scenario(gw, "h1_http_500", [{"status": 500}])


def h1_http_503(gw, pki):
    return _h1_gateway_scenario(gw, "h1_http_503", [{"status": 503}, {"status": 201}])


def h1_connection_closed(gw, pki):
    # {"reset": …} on HTTP/1.1: the gateway closes the connection without an answer.
    return _h1_gateway_scenario(gw, "h1_connection_closed", [{"reset": "CANCEL"}, {"status": 201}])


def h1_no_answer(gw, pki):
    return _h1_gateway_scenario(gw, "h1_no_answer", [{"hang": True}, {"status": 201}], timeout_ms=60000)


def h1_connection_reset(gw, pki):
    srv = _h1_only(FaultServer("reset", *pki["right"]))
    try:
        return _h1_listener_scenario(gw, "h1_connection_reset", srv, pki)
    finally:
        srv.close()


def h1_tls_untrusted(gw, pki):
    """A first message is delivered through libcurl (the origin is now known to speak HTTP/1.1
    only); then the service presents a certificate from an untrusted CA (a fresh TLS context: no
    session to resume), and the second message fails its TLS check in libcurl."""
    srv = _h1_only(FaultServer("tls", *pki["right"]))

    def first_then_swap(d):
        first = d.send_wait({"to": {"users": [USER]}})
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*pki["untrusted"])
        ctx.set_alpn_protocols(["http/1.1"])
        srv.ctx = ctx
        return first

    try:
        return _h1_listener_scenario(gw, "h1_tls_untrusted", srv, pki, before=first_then_swap)
    finally:
        srv.close()


H1_SCENARIOS = {
    "http_429_retry_after": h1_http_429,
    "http_500": h1_http_500,
    "http_503_then_ok": h1_http_503,
    "connection_closed": h1_connection_closed,
    "no_answer": h1_no_answer,
    "connection_reset": h1_connection_reset,
    "tls_handshake_untrusted_ca": h1_tls_untrusted,
}
_H1_RESULTS: dict = {}


def h1_result(fault, gw, pki) -> Result:
    with _LOCK:
        if fault not in _H1_RESULTS:
            _H1_RESULTS[fault] = H1_SCENARIOS[fault](gw, pki)
            record_counts(SUITE, fault_cases=1)
        return _H1_RESULTS[fault]


@pytest.mark.parametrize("fault", list(H1_SCENARIOS), ids=[f"web_h1-{f}" for f in H1_SCENARIOS])
def test_fault_http1(fault, gw, pki):
    res = h1_result(fault, gw, pki)
    t = "web"
    if fault in ("http_429_retry_after", "http_500", "http_503_then_ok", "connection_closed", "no_answer"):
        recs = res.extra["records"][t]
        assert recs and all(r["http_version"] == "http/1.1" for r in recs), recs
    if fault == "http_429_retry_after":
        _expect_delivered(res, t, attempts=2, retries=1)
        first, retry = _receipts(res, t, [429, "ok"])
        assert first["response"]["headers"].get("retry-after") == str(RETRY_AFTER_S), first["response"]
        _not_before(t, f"the retry after a 429 with Retry-After: {RETRY_AFTER_S}", retry["time"],
                    first["time"] + RETRY_AFTER_S)
    elif fault == "http_500":
        dev = _expect_exhausted(res, t, "http_500")
        assert dev["http_status"] == 500
        _receipts(res, t, [500] * (MAX_RETRIES + 1))
    elif fault == "http_503_then_ok":
        _expect_delivered(res, t, attempts=2, retries=1)
        _receipts(res, t, [503, "ok"])
    elif fault == "connection_closed":
        _expect_delivered(res, t, attempts=2, retries=1)
        recs = _receipts(res, t, ["reset", "ok"])
        assert recs[1]["conn"] != recs[0]["conn"], "the retry needs a new connection"
    elif fault == "no_answer":
        dev = _expect_delivered(res, t, attempts=2, retries=1)
        recs = _receipts(res, t, ["hang", "ok"])
        # libcurl gave up the silent HTTP/1.1 connection at the deadline: the retry opened another.
        assert recs[1]["conn"] != recs[0]["conn"], recs
        _not_before(t, "the retry of a request left without an answer", recs[1]["time"],
                    res.extra["sent_at"][0] + REQUEST_DEADLINE_S)
        assert dev["http_status"] == 201
    elif fault == "connection_reset":
        dev = _expect_exhausted(res, t, "connection_reset")
        srv = res.extra["server"]
        assert srv.requests == dev["attempts"], \
            f"push.status says {dev['attempts']} attempts, the listener saw {srv.requests} requests"
    elif fault == "tls_handshake_untrusted_ca":
        assert res.extra["first"]["counts"]["delivered"] == 1, res.extra["first"]
        dev = _expect_exhausted(res, t, "tls_failure")
        srv = res.extra["server"]
        assert srv.requests == 1, "no request may be sent over a connection that failed its check"
        # The first message's connection, then one per attempt of the second at least.
        assert srv.connections >= 1 + dev["attempts"], (srv.connections, dev)
    else:
        raise AssertionError(f"no expectation for {fault}")


# ----------------------------------------------------------------------------- stale storms per platform

STORM = 1000


def _storm_daemon(gw, **delivery):
    gw.reset()
    return Daemon(gateways=gw, delivery=dict(DELIVERY, **delivery))


@pytest.mark.parametrize("platform", ["fcm", "web"])
def test_stale_storm_deletes_none(platform, gw):
    """100% stale answers on a 1,000-device fan-out: the batch breaker refuses every deletion
    (the APNs storm is DeliveryRulesTests.staleStorm)."""
    d = _storm_daemon(gw)
    try:
        # Subscriptions the gateway holds the keys of: every stale answer follows a decrypted body.
        subs = gw.subscriptions([f"storm-{i}" for i in range(STORM)]) if platform == "web" else None
        params = []
        for i in range(STORM):
            user = f"storm-{i // 10}"
            if platform == "fcm":
                params.append({"user": user, "platform": "fcm", "token": f"storm-fcm-{i}"})
            else:
                params.append({"user": user, "platform": "web", "keys": gw.web_keys(subs),
                               "token": subs["endpoints"][i]})
        d.register_many(params)
        if platform == "fcm":
            gw.program("fcm", [{"error": "UNREGISTERED"}])
        else:
            gw.program("webpush", [{"status": 410}])
        before = d.metrics()
        r = d.send_wait({"to": {"users": [f"storm-{u}" for u in range(STORM // 10)]}}, timeout_ms=60000)
        assert r["devices"] == STORM
        assert r["state"] == "complete", r
        assert r["counts"]["removed_stale"] == 0 and r["counts"]["failed"] == STORM, r["counts"]
        stats = d.call("system.stats")
        assert stats["devices"][platform] == STORM, "a stale storm deleted devices"
        t = stats["transports"][platform]
        assert t["breaker_trips"] == 1 and t["stale_refused"] == STORM and t["removed_stale"] == 0, t
        after = d.metrics()
        assert metric(after, "herald_stale_refused_total", platform=platform) - \
            metric(before, "herald_stale_refused_total", platform=platform) == STORM
        assert metric(after, "herald_breaker_trips_total", platform=platform) - \
            metric(before, "herald_breaker_trips_total", platform=platform) == 1
        assert metric(after, "herald_stale_removed_total", platform=platform) == 0
        reasons = {x["reason"] for x in d.status(r["message_id"])["devices"]}
        stale_reason = "UNREGISTERED" if platform == "fcm" else "http_410"
        assert reasons == {f"{stale_reason} (stale; not deleted: breaker_tripped)"}, reasons
        assert sum(len(d.devices(f"storm-{u}")) for u in range(0, STORM // 10, 9)) == 10 * len(range(0, 100, 9))
        if platform == "web":
            # The gateway decrypted every stale-answered body before answering 410.
            # (At least once: a push resent after a connection was suspected is sealed again.)
            recs = [x for x in gw.received("webpush") if x["token"].startswith("storm-")]
            assert len(recs) >= STORM and {x["token"] for x in recs} == {f"storm-{i}" for i in range(STORM)}
            assert all(x["valid"] and x["response"]["status"] == 410 and
                       (x.get("plaintext_json") or {}).get("kind") == "notification" for x in recs), \
                [x.get("errors") for x in recs if not x["valid"]][:3]
        record_counts(SUITE, faults_injected=STORM, fault_cases=1)
    finally:
        d.cleanup()


@pytest.mark.parametrize("platform", ["apns", "web"])
def test_stale_trickle_stops_at_window_cap(platform, gw):
    """Single-device messages, each answered stale: deletions stop at stale_window_cap per
    platform in 60 s (the FCM case is DeliveryRulesTests.windowCap). Another platform's
    window is its own."""
    cap = 3
    d = _storm_daemon(gw, stale_window_cap=cap)
    try:
        subs = gw.subscriptions([f"trickle-{i}" for i in range(2 * cap)])
        for i in range(2 * cap):
            if platform == "apns":
                d.register(f"trickle-{i}", "apns", hex_token(i, prefix=0x7C))
            else:
                d.register(f"trickle-{i}", "web", subs["endpoints"][i], keys=gw.web_keys(subs))
        # A witness on FCM: its window must be untouched by this platform's trickle.
        d.register("trickle-fcm", "fcm", "trickle-fcm-token")
        if platform == "apns":
            gw.program("apns", [{"status": 410, "reason": "Unregistered"}])
        else:
            gw.program("webpush", [{"status": 410}])
        gw.program("fcm", [{"error": "UNREGISTERED"}])
        removed = refused = 0
        for i in range(2 * cap):
            r = d.send_wait({"to": {"users": [f"trickle-{i}"]}})
            removed += r["counts"]["removed_stale"]
            refused += r["counts"]["failed"]
        assert (removed, refused) == (cap, cap)
        left = sum(len(d.devices(f"trickle-{i}")) for i in range(2 * cap))
        assert left == cap, "the devices over the cap are kept"
        t = d.call("system.stats")["transports"][platform]
        assert t["removed_stale"] == cap and t["stale_refused"] == cap and t["breaker_trips"] == 0, t
        # FCM has a window of its own: its stale device is still deleted.
        r = d.send_wait({"to": {"users": ["trickle-fcm"]}})
        assert r["counts"]["removed_stale"] == 1, r
        record_counts(SUITE, faults_injected=2 * cap + 1, fault_cases=1)
    finally:
        d.cleanup()
