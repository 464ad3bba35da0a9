"""Self-tests for the provider test gateways (run: .venv/bin/python -m pytest Tests/gateways -q)."""

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse

import h2.config
import h2.connection
import h2.events
import http_ece
import httpx
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "a1" * 32
TOPIC = "com.example.app"
KID, TEAM = "KEYID12345", "TEAMID1234"


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def b64u_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def jwt_es256(key, header, claims):
    si = b64u(json.dumps(header).encode()) + "." + b64u(json.dumps(claims).encode())
    r, s = decode_dss_signature(key.sign(si.encode(), ec.ECDSA(hashes.SHA256())))
    return si + "." + b64u(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


def jwt_rs256(key, claims):
    si = b64u(json.dumps({"alg": "RS256", "typ": "JWT"}).encode()) + "." + b64u(json.dumps(claims).encode())
    return si + "." + b64u(key.sign(si.encode(), padding.PKCS1v15(), hashes.SHA256()))


def pem(pub):
    return pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def raw_pub(pub):
    return pub.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


class GW:
    def __init__(self, info):
        self.info = info
        self.ctl = httpx.Client(base_url=info["urls"]["control"], timeout=5)

    def post(self, path, body):
        r = self.ctl.post(path, json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def get(self, path, **q):
        r = self.ctl.get(path, params=q)
        assert r.status_code == 200, r.text
        return r.json()

    def received(self, gw, **q):
        return self.get("/control/received", gateway=gw, **q)["requests"]

    def client(self, http2=True):
        return httpx.Client(http2=http2, verify=ssl.create_default_context(cafile=self.info["ca"]), timeout=5)


@pytest.fixture(scope="module")
def gw_proc(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("gw"))
    log = open(os.path.join(d, "gateways.log"), "wb")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "gateways.py"), "--dir", d],
                         stdout=log, stderr=subprocess.STDOUT)
    path = os.path.join(d, "gateways.json")
    deadline = time.time() + 15
    while not os.path.exists(path):
        assert p.poll() is None, open(log.name).read()
        assert time.time() < deadline, "gateways did not start"
        time.sleep(0.05)
    with open(path) as f:
        info = json.load(f)
    yield p, info
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
    log.close()
    text = open(log.name).read()
    assert "Traceback" not in text, text


@pytest.fixture
def gw(gw_proc):
    g = GW(gw_proc[1])
    g.post("/control/reset", {"all": True})
    yield g
    g.ctl.close()


@pytest.fixture
def apns(gw):
    key = ec.generate_private_key(ec.SECP256R1())
    gw.post("/control/apns-key", {"key_id": KID, "team_id": TEAM, "public_key_pem": pem(key.public_key()),
                                  "topics": [TOPIC, TOPIC + ".voip"]})
    gw.key = key
    gw.jwt = jwt_es256(key, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": int(time.time())})
    gw.apns = gw.info["urls"]["apns"]
    return gw


def apns_headers(jwt, **extra):
    h = {"authorization": f"bearer {jwt}", "apns-topic": "com.example.app", "apns-push-type": "alert",
         "apns-priority": "10", "apns-expiration": "0"}
    h.update(extra)
    return h


PAYLOAD = json.dumps({"aps": {"alert": {"loc-key": "NEW"}, "mutable-content": 1}}).encode()


# ------------------------------------------------------------------ raw h2 client

class RawH2:
    def __init__(self, port, ca):
        ctx = ssl.create_default_context(cafile=ca)
        ctx.set_alpn_protocols(["h2"])
        self.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                                    server_hostname="localhost")
        assert self.sock.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.events = []
        self.port = port

    def request(self, path, headers, body=b""):
        sid = self.conn.get_next_available_stream_id()
        hs = [(":method", "POST"), (":scheme", "https"), (":authority", f"127.0.0.1:{self.port}"),
              (":path", path)] + list(headers.items())
        self.conn.send_headers(sid, hs, end_stream=not body)
        if body:
            self.conn.send_data(sid, body, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        return sid

    def pump(self, until, timeout=3.0):
        deadline = time.time() + timeout
        while not until(self.events):
            if time.time() > deadline:
                return False
            self.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                return until(self.events)
            if not data:
                return until(self.events)
            evs = self.conn.receive_data(data)
            self.events.extend(evs)
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)
        return True

    def status(self, sid):
        for e in self.events:
            if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid:
                return int(dict(e.headers)[b":status"])
        return None

    def ended(self, sid):
        return any(isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) and e.stream_id == sid
                   for e in self.events)

    def close(self):
        self.sock.close()


def settings_values(events):
    return [e.changed_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS].new_value
            for e in events if isinstance(e, h2.events.RemoteSettingsChanged)
            and h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS in e.changed_settings]


# ------------------------------------------------------------------ APNs

def test_apns_good_jwt_recorded_and_reused(apns):
    with apns.client() as c:
        r = c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD,
                   headers=apns_headers(apns.jwt, **{"apns-id": "123e4567-e89b-12d3-a456-426614174000",
                                                     "apns-collapse-id": "c1"}))
        assert r.http_version == "HTTP/2"
        assert r.status_code == 200 and r.content == b""
        assert r.headers["apns-id"] == "123e4567-e89b-12d3-a456-426614174000"
        r2 = c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD, headers=apns_headers(apns.jwt))
        assert r2.status_code == 200 and len(r2.headers["apns-id"]) == 36
    recs = apns.received("apns")
    assert len(recs) == 2
    assert recs[0]["valid"] and recs[0]["token"] == TOKEN and recs[0]["jwt"]["valid"]
    assert recs[0]["body"]["aps"]["mutable-content"] == 1
    assert recs[0]["headers"]["apns-collapse-id"] == "c1"
    conns = apns.get("/control/connections", gateway="apns")["connections"]
    assert len(conns) == 1 and conns[0]["distinct_jwts"] == 1 and conns[0]["jwts"][0]["uses"] == 2


def test_apns_bad_jwt(apns):
    other = ec.generate_private_key(ec.SECP256R1())
    bad = jwt_es256(other, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": int(time.time())})
    old = jwt_es256(apns.key, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": int(time.time()) - 4000})
    with apns.client() as c:
        r = c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD, headers=apns_headers(bad))
        assert r.status_code == 403 and r.json() == {"reason": "InvalidProviderToken"}
        r = c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD, headers=apns_headers(old))
        assert r.status_code == 403 and r.json()["reason"] == "ExpiredProviderToken"
        h = apns_headers(apns.jwt)
        del h["authorization"]
        r = c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD, headers=h)
        assert r.status_code == 403 and r.json()["reason"] == "MissingProviderToken"
    recs = apns.received("apns")
    assert [x["valid"] for x in recs] == [False, False, False]
    assert "signature" in recs[0]["jwt_error"]


def test_apns_never_issued_token_is_judged_after_the_provider_token(apns):
    """A token of zeros is BadDeviceToken with a good JWT and InvalidProviderToken with a bad one
    (Apple authenticates first); such requests are probes, left out of `received` unless asked."""
    zeros = "0" * 64
    other = ec.generate_private_key(ec.SECP256R1())
    bad = jwt_es256(other, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": int(time.time())})
    bg = {"apns-push-type": "background", "apns-priority": "5"}
    body = json.dumps({"aps": {"content-available": 1}}).encode()
    with apns.client() as c:
        r = c.post(f"{apns.apns}/3/device/{zeros}", content=body, headers=apns_headers(apns.jwt, **bg))
        assert r.status_code == 400 and r.json()["reason"] == "BadDeviceToken"
        r = c.post(f"{apns.apns}/3/device/{zeros}", content=body, headers=apns_headers(bad, **bg))
        assert r.status_code == 403 and r.json()["reason"] == "InvalidProviderToken"
        r = c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD, headers=apns_headers(apns.jwt))
        assert r.status_code == 200
    assert [x["token"] for x in apns.received("apns")] == [TOKEN]
    probes = apns.received("apns", probes="only")
    assert [x["response"]["status"] for x in probes] == [400, 403] and all(x["probe"] for x in probes)
    assert len(apns.received("apns", probes="include")) == 3


def test_apns_header_and_payload_checks(apns):
    with apns.client() as c:
        def post(token=TOKEN, body=PAYLOAD, **h):
            return c.post(f"{apns.apns}/3/device/{token}", content=body, headers=apns_headers(apns.jwt, **h))
        assert post(**{"apns-collapse-id": "x" * 65}).json()["reason"] == "BadCollapseId"
        assert post(**{"apns-priority": "7"}).json()["reason"] == "BadPriority"
        assert post(**{"apns-push-type": "bogus"}).json()["reason"] == "InvalidPushType"
        assert post(**{"apns-topic": ""}).json()["reason"] == "MissingTopic"
        big = json.dumps({"aps": {}, "x": "y" * 4100}).encode()
        r = post(body=big)
        assert r.status_code == 413 and r.json()["reason"] == "PayloadTooLarge"
        voip = json.dumps({"aps": {}, "x": "y" * 4500}).encode()
        assert post(body=voip, **{"apns-push-type": "voip", "apns-topic": "com.example.app.voip",
                                  "apns-priority": "10"}).status_code == 200
        assert post(token="zz").json()["reason"] == "BadDeviceToken"
        assert post(body=b"").json()["reason"] == "PayloadEmpty"


def test_apns_programmed_410_then_200(apns):
    ts = 1700000000123
    apns.post("/control/program", {"gateway": "apns", "token": TOKEN, "responses": [
        {"status": 410, "reason": "Unregistered", "timestamp": ts}, {"status": 429, "reason": "TooManyRequests",
                                                                      "retry_after": 3}, {"status": 200}]})
    with apns.client() as c:
        rs = [c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD, headers=apns_headers(apns.jwt))
              for _ in range(4)]
    assert rs[0].status_code == 410 and rs[0].json() == {"reason": "Unregistered", "timestamp": ts}
    assert rs[1].status_code == 429 and rs[1].headers["retry-after"] == "3"
    assert [r.status_code for r in rs[2:]] == [200, 200]


def test_apns_curl_http2(apns):
    if not shutil.which("curl"):
        pytest.skip("no curl")
    out = subprocess.run(["curl", "-s", "--http2", "--cacert", apns.info["ca"], "-o", "/dev/null",
                          "-w", "%{http_code} %{http_version}", "-X", "POST", "--data-binary", PAYLOAD.decode(),
                          *sum((["-H", f"{k}: {v}"] for k, v in apns_headers(apns.jwt).items()), []),
                          f"{apns.apns}/3/device/{TOKEN}"], capture_output=True, text=True, timeout=10)
    assert out.stdout == "200 2", out


def test_apns_settings_1_stream_then_raised_and_refused(apns):
    apns.post("/control/program", {"gateway": "apns", "token": "ab" * 32, "responses": [{"hang": True}]})
    c = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        assert c.pump(lambda ev: settings_values(ev))
        assert settings_values(c.events)[0] == 1
        s1 = c.request(f"/3/device/{'ab' * 32}", apns_headers(apns.jwt), PAYLOAD)   # left unanswered
        time.sleep(0.2)
        # Bypass the client-side limit to provoke the server: a second concurrent stream.
        c.conn.remote_settings._settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = \
            __import__("collections").deque([100])
        s2 = c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: c.ended(s2))
        reset = [e for e in c.events if isinstance(e, h2.events.StreamReset) and e.stream_id == s2]
        assert reset and reset[0].error_code == h2.errors.ErrorCodes.REFUSED_STREAM
        assert not c.ended(s1)
        # The hung stream produced the raise to 500? No: raising happens after the first answer.
        assert settings_values(c.events) == [1]
    finally:
        c.close()
    conn = apns.get("/control/connections", gateway="apns")["connections"][-1]
    assert conn["stream_violations"] == 1
    # A fresh connection: after the first answered valid request, SETTINGS raises the limit to 500.
    c = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        s = c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: c.ended(s) and len(settings_values(ev)) >= 2)
        assert c.status(s) == 200
        assert settings_values(c.events) == [1, 500]
    finally:
        c.close()


def test_apns_raised_limit_applies_once_acknowledged(apns):
    """Each SETTINGS ACK puts the oldest unacknowledged limit in force: after the raise to
    500 is acknowledged, 100 concurrent streams are served, none refused."""
    c = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        s = c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: c.ended(s) and len(settings_values(ev)) >= 2)
        c.pump(lambda ev: False, timeout=0.2)  # our ACK of the raise reaches the gateway
        sids = [c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD) for _ in range(100)]
        assert c.pump(lambda ev: all(c.ended(x) for x in sids), timeout=10)
        assert all(c.status(x) == 200 for x in sids)
    finally:
        c.close()
    conn = apns.get("/control/connections", gateway="apns")["connections"][-1]
    assert conn["stream_violations"] == 0 and conn["advertised_max_streams"] == 500


def test_apns_goaway_answers_streams_it_keeps(apns):
    """A GOAWAY after the Nth request, with N left unprocessed: every earlier stream still
    gets its answer (sent before the GOAWAY frame), N and later get none."""
    apns.post("/control/knobs", {"gateway": "apns", "goaway_after": 5, "goaway_answer_last": False,
                                 "delay_ms": 100})
    c = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        s = c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: c.ended(s) and len(settings_values(ev)) >= 2)
        c.pump(lambda ev: False, timeout=0.2)
        sids = [c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD) for _ in range(6)]
        assert c.pump(lambda ev: any(isinstance(e, h2.events.ConnectionTerminated) for e in ev), timeout=5)
        term = [e for e in c.events if isinstance(e, h2.events.ConnectionTerminated)][0]
        kept = [x for x in sids if x <= term.last_stream_id]
        assert len(kept) == 3  # requests 2-4 of the connection; the 5th triggered the GOAWAY
        assert all(c.status(x) == 200 for x in kept)
        assert all(c.status(x) is None for x in sids if x > term.last_stream_id)
    finally:
        c.close()


def test_apns_goaway_after_n(apns):
    apns.post("/control/knobs", {"gateway": "apns", "goaway_after": 2, "goaway_reason": "Shutdown"})
    c = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        s1 = c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: c.ended(s1))
        s2 = c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: any(isinstance(e, h2.events.ConnectionTerminated) for e in ev))
        assert c.status(s1) == 200 and c.status(s2) == 200
        term = [e for e in c.events if isinstance(e, h2.events.ConnectionTerminated)][0]
        assert term.last_stream_id == s2
        assert json.loads(term.additional_data) == {"reason": "Shutdown"}
    finally:
        c.close()
    conn = apns.get("/control/connections", gateway="apns")["connections"][-1]
    assert conn["goaway_sent"]["reason"] == "Shutdown"


def test_apns_hang_token(apns):
    apns.post("/control/knobs", {"gateway": "apns", "hang_tokens": ["cd" * 32]})
    with apns.client() as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post(f"{apns.apns}/3/device/{'cd' * 32}", content=PAYLOAD, headers=apns_headers(apns.jwt),
                   timeout=0.5)
    rec = apns.received("apns", token="cd" * 32)[0]
    assert rec["response"]["hang"] is True


def test_zero_window_times(apns):
    """The next N connections advertise INITIAL_WINDOW_SIZE 0 and never open it (request bodies
    cannot be sent) yet answer PINGs; later connections are normal."""
    apns.post("/control/knobs", {"gateway": "apns", "zero_window_times": 1})
    iws = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE

    def window_setting(c):
        vals = [e.changed_settings[iws].new_value for e in c.events
                if isinstance(e, h2.events.RemoteSettingsChanged) and iws in e.changed_settings]
        return vals[-1] if vals else None

    c1 = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        assert c1.pump(lambda ev: window_setting(c1) == 0)
        sid = c1.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt))  # headers only: no window for a body
        assert c1.conn.local_flow_control_window(sid) == 0
        c1.conn.ping(b"12345678")
        c1.sock.sendall(c1.conn.data_to_send())
        assert c1.pump(lambda ev: any(isinstance(e, h2.events.PingAckReceived) for e in ev))
        assert not c1.pump(lambda ev: any(isinstance(e, h2.events.WindowUpdated) and e.stream_id == sid
                                          for e in ev), timeout=0.5)
    finally:
        c1.close()
    c2 = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        assert c2.pump(lambda ev: any(isinstance(e, h2.events.SettingsAcknowledged) for e in ev))
        assert window_setting(c2) in (None, 65535)
        s2 = c2.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c2.pump(lambda ev: c2.ended(s2))
        assert c2.status(s2) == 200
    finally:
        c2.close()
    conns = apns.get("/control/connections", gateway="apns")["connections"]
    assert [c["zero_window"] for c in conns[-2:]] == [True, False]


# ------------------------------------------------------------------ FCM

@pytest.fixture
def fcm(gw):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    gw.post("/control/fcm-key", {"client_email": "sa@p.iam.gserviceaccount.com", "public_key_pem": pem(key.public_key())})
    gw.rsa = key
    gw.fcm = gw.info["urls"]["fcm"]
    return gw


def fcm_assertion(key, email="sa@p.iam.gserviceaccount.com", **over):
    now = int(time.time())
    claims = {"iss": email, "scope": "https://www.googleapis.com/auth/firebase.messaging",
              "aud": "https://oauth2.googleapis.com/token", "iat": now, "exp": now + 3600}
    claims.update(over)
    return jwt_rs256(key, claims)


def fcm_token(c, fcm, assertion):
    return c.post(f"{fcm.fcm}/token", data={"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                                            "assertion": assertion})


def test_fcm_token_send_and_errors(fcm):
    fcm.post("/control/knobs", {"gateway": "fcm", "expires_in": 1800})
    with fcm.client() as c:
        r = fcm_token(c, fcm, fcm_assertion(fcm.rsa))
        assert r.status_code == 200, r.text
        tok = r.json()
        assert tok["token_type"] == "Bearer" and tok["expires_in"] == 1800
        auth = {"authorization": f"Bearer {tok['access_token']}"}
        msg = {"message": {"token": "dev1", "data": {"kind": "x"},
                           "android": {"priority": "high", "ttl": "60s"}}}
        r = c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json=msg, headers=auth)
        assert r.status_code == 200 and r.json()["name"].startswith("projects/p1/messages/")
        fcm.post("/control/program", {"gateway": "fcm", "token": "dev2", "responses": [
            {"error": "UNREGISTERED"}, {"error": "QUOTA_EXCEEDED", "retry_after": 7}, {"error": "UNAVAILABLE"},
            {"error": "INTERNAL"}, {"error": "THIRD_PARTY_AUTH_ERROR"}, {"error": "INVALID_ARGUMENT"}]})
        msg["message"]["token"] = "dev2"
        rs = [c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json=msg, headers=auth) for _ in range(7)]
        assert rs[0].status_code == 404
        assert rs[0].json() == {"error": {"code": 404, "message": "Requested entity was not found.",
                                          "status": "NOT_FOUND", "details": [
                                              {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                                               "errorCode": "UNREGISTERED"}]}}
        assert rs[1].status_code == 429 and rs[1].headers["retry-after"] == "7"
        assert rs[1].json()["error"]["status"] == "RESOURCE_EXHAUSTED"
        assert [r.status_code for r in rs[2:]] == [503, 500, 401, 400, 400]
        assert rs[4].json()["error"]["details"][0]["errorCode"] == "THIRD_PARTY_AUTH_ERROR"
        # data values must be strings
        bad = {"message": {"token": "dev1", "data": {"n": 12}}}
        r = c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json=bad, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
        # unknown access token
        r = c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json=msg, headers={"authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
        # revoked access token → 401
        fcm.post("/control/fcm-revoke", {"all": True})
        r = c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json=msg, headers=auth)
        assert r.status_code == 401
    stats = fcm.get("/control/stats")
    assert stats["fcm_token_requests"] == 1 and stats["fcm_tokens_issued"] == 1
    sends = fcm.received("fcm", kind="send")
    assert sends[0]["body"]["message"]["token"] == "dev1" and sends[0]["valid"]


def test_fcm_validate_only_and_revoked_key(fcm):
    """validate_only: authenticated and checked, answered with FCM's fixed name, never delivered
    (a probe record, no program used up). A revoked key: invalid_grant at the token endpoint and
    401 for the access tokens it issued, until the key is registered again."""
    email = "sa@p.iam.gserviceaccount.com"
    fcm.post("/control/program", {"gateway": "fcm", "token": "*", "responses": [{"error": "UNAVAILABLE"}]})
    dry = {"validate_only": True, "message": {"topic": "herald-credential-check", "data": {"k": "v"}}}
    with fcm.client() as c:
        tok = fcm_token(c, fcm, fcm_assertion(fcm.rsa)).json()["access_token"]
        auth = {"authorization": f"Bearer {tok}"}
        r = c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json=dry, headers=auth)
        assert r.status_code == 200 and r.json() == {"name": "projects/p1/messages/fake_message_id"}
        r = c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json=dry, headers={"authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
        fcm.post("/control/fcm-revoke", {"client_email": email, "key": True})
        r = fcm_token(c, fcm, fcm_assertion(fcm.rsa))
        assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
        assert r.json()["error_description"] == "Invalid JWT Signature."
        assert c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json=dry, headers=auth).status_code == 401
        fcm.post("/control/fcm-key", {"client_email": email, "public_key_pem": pem(fcm.rsa.public_key())})
        assert fcm_token(c, fcm, fcm_assertion(fcm.rsa)).status_code == 200
    assert fcm.received("fcm", kind="send") == []
    probes = fcm.received("fcm", kind="send", probes="only")
    assert [x["response"]["status"] for x in probes] == [200, 401, 401]
    assert all(x["validate_only"] and x["probe"] for x in probes)
    assert [x.get("key_revoked", False) for x in fcm.received("fcm", kind="token")] == [False, True, False]


def test_fcm_bad_assertions(fcm):
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    with fcm.client(http2=False) as c:   # HTTP/1.1 is allowed on the token endpoint
        r = fcm_token(c, fcm, fcm_assertion(other))
        assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
        assert fcm_token(c, fcm, fcm_assertion(fcm.rsa, exp=now + 7200)).status_code == 400
        assert fcm_token(c, fcm, fcm_assertion(fcm.rsa, scope="email")).status_code == 400
        assert fcm_token(c, fcm, fcm_assertion(fcm.rsa, aud="https://evil/token")).status_code == 400
        r = fcm_token(c, fcm, fcm_assertion(fcm.rsa, aud=fcm.info["urls"]["fcm_token"]))
        assert r.status_code == 200 and r.http_version == "HTTP/1.1"
    recs = fcm.received("fcm", kind="token")
    assert [x["valid"] for x in recs] == [False, False, False, False, True]


def test_fcm_h1_listener_offers_only_http11(fcm):
    """fcm_h1 serves the fcm gateway (same keys, access tokens, programs, records), never selecting h2."""
    port = fcm.info["fcm_h1"]
    assert port and port != fcm.info["fcm"]
    base = fcm.info["urls"]["fcm_h1"]
    assert base == f"https://127.0.0.1:{port}"
    # A client that offers only h2 gets no ALPN protocol at all.
    ctx = ssl.create_default_context(cafile=fcm.info["ca"])
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.selected_alpn_protocol() is None
    msg = {"message": {"token": "dev1", "data": {"kind": "x"}}}
    with fcm.client() as c:
        tok = fcm_token(c, fcm, fcm_assertion(fcm.rsa)).json()["access_token"]   # from the h2 listener
        auth = {"authorization": f"Bearer {tok}"}
        r = c.post(f"{base}/v1/projects/p1/messages:send", json=msg, headers=auth)
        assert r.status_code == 200 and r.http_version == "HTTP/1.1"
        fcm.post("/control/program", {"gateway": "fcm", "token": "dev1", "responses": [{"error": "UNREGISTERED"}]})
        r = c.post(f"{base}/v1/projects/p1/messages:send", json=msg, headers=auth)
        assert r.status_code == 404
        r = c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json=msg, headers=auth)
        assert r.status_code == 404 and r.http_version == "HTTP/2"
    recs = fcm.received("fcm_h1", kind="send")
    assert [x["response"]["status"] for x in recs] == [200, 404]
    assert all(x["listener"] == "fcm_h1" and x["http_version"] == "http/1.1" for x in recs)
    everything = fcm.received("fcm")
    assert [x["listener"] for x in everything] == ["fcm", "fcm_h1", "fcm_h1", "fcm"]
    conns = fcm.get("/control/connections", gateway="fcm_h1")["connections"]
    assert [c["alpn"] for c in conns] == [None, "http/1.1"]
    assert all(c["listener"] == "fcm_h1" and c["gateway"] == "fcm" for c in conns)
    assert conns[1]["requests"] == 2
    assert len(fcm.get("/control/connections", gateway="fcm")["connections"]) == 3


# ------------------------------------------------------------------ Web Push

@pytest.fixture
def webpush(gw):
    vapid = ec.generate_private_key(ec.SECP256R1())
    sub = gw.post("/control/webpush-subscription", {"id": "sub1", "vapid_public_key": b64u(raw_pub(vapid.public_key()))})
    gw.vapid = vapid
    gw.sub = sub
    gw.origin = f"https://127.0.0.1:{gw.info['webpush']}"
    return gw


def vapid_header(key, aud, sub="mailto:ops@example.com", exp_in=12 * 3600, k=None):
    t = jwt_es256(key, {"typ": "JWT", "alg": "ES256"}, {"aud": aud, "exp": int(time.time()) + exp_in, "sub": sub})
    return f"vapid t={t}, k={b64u(raw_pub(k or key.public_key()))}"


def wp_encrypt(sub, plaintext, pad_to=2816):
    eph = ec.generate_private_key(ec.SECP256R1())
    body = http_ece.encrypt(plaintext, private_key=eph, dh=b64u_decode(sub["p256dh"]),
                            auth_secret=b64u_decode(sub["auth"]), version="aes128gcm", rs=4096)
    return body


def test_webpush_delivery_decrypted(webpush):
    plain = json.dumps({"kind": "message", "data": {}, "badge": 3}).encode()
    for http2 in (True, False):
        body = wp_encrypt(webpush.sub, plain)
        with webpush.client(http2=http2) as c:
            r = c.post(webpush.sub["endpoint"], content=body, headers={
                "content-encoding": "aes128gcm", "ttl": "60", "urgency": "high", "topic": "abc_DEF-123",
                "authorization": vapid_header(webpush.vapid, webpush.origin)})
            assert r.status_code == 201, r.text
            assert r.headers["location"]
    recs = webpush.received("webpush")
    assert len(recs) == 2
    assert recs[0]["plaintext_json"] == {"kind": "message", "data": {}, "badge": 3}
    assert recs[0]["body_len"] == len(body) and recs[0]["valid"] and recs[0]["topic"] == "abc_DEF-123"
    assert recs[0]["vapid"]["sub"] == "mailto:ops@example.com" and recs[0]["http_version"] == "h2"
    assert recs[1]["http_version"] == "http/1.1"
    assert not recs[1].get("salt_reused") and not recs[1].get("ecdh_key_reused")


def test_webpush_h1_listener_offers_only_http11(webpush):
    """webpush_h1 serves the same subscriptions and records as webpush, but never selects h2."""
    port = webpush.info["webpush_h1"]
    assert port and port != webpush.info["webpush"]
    assert webpush.info["urls"]["webpush_h1"] == f"https://127.0.0.1:{port}/push/"
    sub = webpush.post("/control/webpush-subscription", {"id": "sub1", "listener": "webpush_h1",
                                                         "vapid_public_key": b64u(raw_pub(webpush.vapid.public_key()))})
    assert sub["endpoint"] == f"https://127.0.0.1:{port}/push/sub1"
    # A client that offers only h2 gets no ALPN protocol at all.
    ctx = ssl.create_default_context(cafile=webpush.info["ca"])
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.selected_alpn_protocol() is None
    # One that offers both gets HTTP/1.1; the request is checked and recorded like any Web Push request.
    origin = f"https://127.0.0.1:{port}"
    plain = b'{"kind":"message"}'
    with webpush.client(http2=True) as c:
        r = c.post(sub["endpoint"], content=wp_encrypt(sub, plain), headers={
            "content-encoding": "aes128gcm", "ttl": "60", "authorization": vapid_header(webpush.vapid, origin)})
        assert r.status_code == 201, r.text
        assert r.http_version == "HTTP/1.1"
        # The VAPID aud must be this listener's origin, not the h2 listener's.
        r = c.post(sub["endpoint"], content=wp_encrypt(sub, plain), headers={
            "content-encoding": "aes128gcm", "ttl": "60", "authorization": vapid_header(webpush.vapid, webpush.origin)})
        assert r.status_code == 401
        webpush.post("/control/program", {"gateway": "webpush", "token": "sub1", "responses": [{"status": 410}]})
        r = c.post(sub["endpoint"], content=wp_encrypt(sub, plain), headers={
            "content-encoding": "aes128gcm", "ttl": "60", "authorization": vapid_header(webpush.vapid, origin)})
        assert r.status_code == 410
    recs = webpush.received("webpush_h1")
    assert [x["response"]["status"] for x in recs] == [201, 401, 410]
    assert all(x["listener"] == "webpush_h1" and x["http_version"] == "http/1.1" for x in recs)
    assert recs[0]["valid"] and recs[0]["plaintext"] == plain.decode()
    assert [x["seq"] for x in webpush.received("webpush")] == [x["seq"] for x in recs]   # one gateway, one record list
    conns = webpush.get("/control/connections", gateway="webpush_h1")["connections"]
    assert [c["alpn"] for c in conns] == [None, "http/1.1"]
    assert all(c["listener"] == "webpush_h1" and c["gateway"] == "webpush" for c in conns)
    assert conns[1]["requests"] == 3
    all_conns = webpush.get("/control/connections", gateway="webpush")["connections"]
    assert [c["id"] for c in all_conns] == [c["id"] for c in conns]
    assert webpush.received("webpush_h1", token="sub1") == recs
    r = webpush.ctl.post("/control/webpush-subscription", json={"listener": "apns"})
    assert r.status_code == 400


def test_webpush_rejections(webpush):
    other = ec.generate_private_key(ec.SECP256R1())
    good = {"content-encoding": "aes128gcm", "ttl": "60"}
    with webpush.client() as c:
        def post(extra, content=None, url=webpush.sub["endpoint"]):
            if content is None:
                content = wp_encrypt(webpush.sub, b'{"kind":"x"}')   # a new salt and key each time
            h = dict(good, authorization=vapid_header(webpush.vapid, webpush.origin))
            h.update(extra)
            h = {k: v for k, v in h.items() if v is not None}
            return c.post(url, content=content, headers=h)
        # signed by another key but claiming the subscription's k → bad signature
        bad_sig = vapid_header(other, webpush.origin, k=webpush.vapid.public_key())
        assert post({"authorization": bad_sig}).status_code == 401
        # a different (self-consistent) key that is not the subscription's applicationServerKey
        assert post({"authorization": vapid_header(other, webpush.origin)}).status_code == 401
        assert post({"authorization": vapid_header(webpush.vapid, "https://push.example.net")}).status_code == 401
        assert post({"authorization": vapid_header(webpush.vapid, webpush.origin, exp_in=2 * 86400)}).status_code == 401
        assert post({"authorization": vapid_header(webpush.vapid, webpush.origin, sub="ops@example.com")}).status_code == 401
        assert post({"ttl": None}).status_code == 400
        assert post({"urgency": "urgent"}).status_code == 400
        assert post({"topic": "x" * 33}).status_code == 400
        assert post({"content-encoding": "aesgcm"}).status_code == 400
        assert post({}, content=b"\0" * 4097).status_code == 413
        assert post({}, url=webpush.origin + "/push/nosuch").status_code == 404
        assert post({}).status_code == 201
        webpush.post("/control/program", {"gateway": "webpush", "token": "sub1", "responses": [
            {"status": 410}, {"status": 429, "retry_after": 30}, {"status": 413}]})
        assert post({}).status_code == 410
        r = post({})
        assert r.status_code == 429 and r.headers["retry-after"] == "30"
        assert post({}).status_code == 413
    errs = [x["errors"] for x in webpush.received("webpush") if not x["valid"]]
    assert "VAPID public key mismatch" in errs[1]


def test_control_errors(gw):
    r = gw.ctl.post("/control/program", json={"gateway": "nope", "responses": []})
    assert r.status_code == 400
    r = gw.ctl.post("/control/knobs", json={"gateway": "apns", "no_such_knob": 1})
    assert r.status_code == 400
    assert gw.ctl.get("/control/nothing").status_code == 404


def test_sigterm_clean_exit(tmp_path):
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "gateways.py"), "--dir", str(tmp_path)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # little output: PIPE is safe
    deadline = time.time() + 15
    while not (tmp_path / "gateways.json").exists():
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.05)
    info = json.loads((tmp_path / "gateways.json").read_text())
    # an open HTTP/2 connection must not block shutdown
    c = RawH2(info["apns"], info["ca"])
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0, p.stderr.read().decode()
    c.close()


def test_apns_goaway_unprocessed_and_violation_goaway(apns):
    apns.post("/control/knobs", {"gateway": "apns", "goaway_after": 1, "goaway_answer_last": False,
                                 "goaway_reason": "Shutdown", "goaway_times": 1})
    c = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        s1 = c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: any(isinstance(e, h2.events.ConnectionTerminated) for e in ev))
        term = [e for e in c.events if isinstance(e, h2.events.ConnectionTerminated)][0]
        assert term.last_stream_id == 0 and c.status(s1) is None
    finally:
        c.close()
    # goaway_times exhausted: the next connection works normally
    with apns.client() as hc:
        assert hc.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD, headers=apns_headers(apns.jwt)).status_code == 200
    apns.post("/control/knobs", {"gateway": "apns", "stream_violation": "goaway", "goaway_after": None,
                                 "hang_tokens": ["ef" * 32]})
    c = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        c.conn.remote_settings._settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = \
            __import__("collections").deque([100])
        c.request(f"/3/device/{'ef' * 32}", apns_headers(apns.jwt), PAYLOAD)
        c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: any(isinstance(e, h2.events.ConnectionTerminated) for e in ev))
        term = [e for e in c.events if isinstance(e, h2.events.ConnectionTerminated)][0]
        assert term.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
        assert b"Maximum active streams" in term.additional_data
    finally:
        c.close()


def test_control_goaway_and_fcm_token_program(fcm):
    fcm.post("/control/program", {"gateway": "fcm-token", "token": "*", "responses": [
        {"status": 503}, {"status": 200, "expires_in": 5}]})
    with fcm.client() as c:
        assert fcm_token(c, fcm, fcm_assertion(fcm.rsa)).status_code == 503
        r = fcm_token(c, fcm, fcm_assertion(fcm.rsa))
        assert r.status_code == 200 and r.json()["expires_in"] == 5
        assert fcm.post("/control/goaway", {"gateway": "fcm", "reason": "maintenance"})["connections"] == 1
        time.sleep(0.7)
    # (httpx only sees the GOAWAY when it next reads, so a reused client may hit the closed socket)
    with fcm.client() as c:
        r = fcm_token(c, fcm, fcm_assertion(fcm.rsa))
        assert r.status_code == 200
    conns = fcm.get("/control/connections", gateway="fcm")["connections"]
    assert conns[0]["goaway_sent"]["reason"] == "maintenance" and len(conns) == 2
    assert fcm.get("/control/stats")["fcm_token_requests"] == 3


# ------------------------------------------------------------------ what real providers refuse

def test_apns_token_update_within_20_min_refused(apns):
    """A second provider token on one connection within 20 min of the first: 429
    TooManyProviderTokenUpdates, every time it is tried; the first keeps working, and a new
    connection may start with the second."""
    newer = jwt_es256(apns.key, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": int(time.time()) + 1})
    assert newer != apns.jwt
    with apns.client() as c:
        url = f"{apns.apns}/3/device/{TOKEN}"
        assert c.post(url, content=PAYLOAD, headers=apns_headers(apns.jwt)).status_code == 200
        for _ in range(2):
            r = c.post(url, content=PAYLOAD, headers=apns_headers(newer))
            assert r.status_code == 429 and r.json() == {"reason": "TooManyProviderTokenUpdates"}
        assert c.post(url, content=PAYLOAD, headers=apns_headers(apns.jwt)).status_code == 200
    with apns.client() as c:
        assert c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD, headers=apns_headers(newer)).status_code == 200
    recs = apns.received("apns")
    assert [x["response"]["status"] for x in recs] == [200, 429, 429, 200, 200]
    assert [bool(x.get("token_update_too_soon")) for x in recs] == [False, True, True, False, False]
    assert apns.get("/control/stats")["counters"]["apns_token_updates_too_soon"] == 2


def test_apns_push_type_and_aps_required(apns):
    """apns-push-type is required and must match the payload; the payload must carry aps."""
    with apns.client() as c:
        def post(body, drop=(), **h):
            headers = apns_headers(apns.jwt, **h)
            for name in drop:
                del headers[name]
            return c.post(f"{apns.apns}/3/device/{TOKEN}", content=json.dumps(body).encode(), headers=headers)
        bg = {"apns-push-type": "background", "apns-priority": "5"}
        cases = [
            (post({"aps": {"alert": {"loc-key": "K"}}}, drop=["apns-push-type"]), 400, "InvalidPushType"),
            (post({"aps": {"badge": 1}}, **bg), 400, "InvalidPushType"),          # no content-available
            (post({"aps": {"content-available": 1, "alert": "hi"}}, **bg), 400, "InvalidPushType"),
            (post({"aps": {"content-available": 1, "sound": "default"}}, **bg), 400, "InvalidPushType"),
            (post({"aps": {"mutable-content": 1}}), 400, "InvalidPushType"),     # alert that shows nothing
            (post({"data": "x"}), 400, "BadPayload"),                            # no aps
            (post({"aps": "x"}), 400, "BadPayload"),
            (post({"x": "y"}, **{"apns-push-type": "voip", "apns-topic": TOPIC + ".voip"}), 400, "BadPayload"),
            (post({"aps": {"content-available": 1, "badge": 2}}, **bg), 200, None),
            (post({"aps": {"sound": "default"}}), 200, None),
            (post({"aps": {}, "call": "1"}, **{"apns-push-type": "voip", "apns-topic": TOPIC + ".voip"}), 200, None),
        ]
        for i, (r, status, reason) in enumerate(cases):
            assert r.status_code == status, (i, r.text)
            if reason:
                assert r.json() == {"reason": reason}, i
    recs = apns.received("apns")
    assert recs[0]["push_type_missing"] and recs[1]["payload_error"] == "background push without content-available: 1"
    assert recs[5]["payload_error"] == "no aps dictionary"


def test_apns_topic_must_be_registered(apns):
    """A key is registered with the topics it serves; any other apns-topic is 400 TopicDisallowed,
    and a key registered without topics is refused by the control API."""
    with apns.client() as c:
        r = c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD,
                   headers=apns_headers(apns.jwt, **{"apns-topic": "com.example.other"}))
        assert r.status_code == 400 and r.json() == {"reason": "TopicDisallowed"}
        r = c.post(f"{apns.apns}/3/device/{TOKEN}", content=PAYLOAD,
                   headers=apns_headers(apns.jwt, **{"apns-topic": TOPIC + ".voip"}))
        assert r.status_code == 400 and r.json() == {"reason": "InvalidPushType"}   # .voip with push type alert
    assert apns.received("apns")[0]["topic_not_registered"] == "com.example.other"
    key = ec.generate_private_key(ec.SECP256R1())
    for topics in (None, [], [""]):
        body = {"key_id": "K2", "team_id": TEAM, "public_key_pem": pem(key.public_key())}
        if topics is not None:
            body["topics"] = topics
        assert apns.ctl.post("/control/apns-key", json=body).status_code == 400


def test_apns_development_host_is_separate(apns):
    """apns_dev is APNs development on a listener of its own, with its own records, programs,
    knobs, counters and connections."""
    dev = apns.info["urls"]["apns_dev"]
    assert apns.info["apns_dev"] != apns.info["apns"] and dev == f"https://127.0.0.1:{apns.info['apns_dev']}"
    apns.post("/control/program", {"gateway": "apns", "token": "*", "responses": [{"status": 410}]})
    apns.post("/control/program", {"gateway": "apns_dev", "token": "*", "responses": [{"status": 400}]})
    with apns.client() as c:
        assert c.post(f"{dev}/3/device/{'d0' * 32}", content=PAYLOAD, headers=apns_headers(apns.jwt)).status_code == 400
        assert c.post(f"{apns.apns}/3/device/{'e0' * 32}", content=PAYLOAD,
                      headers=apns_headers(apns.jwt)).status_code == 410
    prod, devrecs = apns.received("apns"), apns.received("apns_dev")
    assert [x["token"] for x in prod] == ["e0" * 32] and [x["token"] for x in devrecs] == ["d0" * 32]
    assert devrecs[0]["gateway"] == devrecs[0]["listener"] == "apns_dev"
    assert len(apns.get("/control/connections", gateway="apns_dev")["connections"]) == 1
    assert len(apns.get("/control/connections", gateway="apns")["connections"]) == 1
    apns.post("/control/reset", {"gateway": "apns"})
    assert apns.received("apns") == [] and len(apns.received("apns_dev")) == 1
    assert apns.get("/control/programs")["programs"] == [{"gateway": "apns_dev", "token": "*",
                                                          "responses": [{"status": 400}]}]
    # A too-soon token update is counted per environment.
    newer = jwt_es256(apns.key, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": int(time.time()) + 1})
    apns.post("/control/program", {"gateway": "apns_dev", "responses": []})
    with apns.client() as c:
        assert c.post(f"{dev}/3/device/{TOKEN}", content=PAYLOAD, headers=apns_headers(apns.jwt)).status_code == 200
        assert c.post(f"{dev}/3/device/{TOKEN}", content=PAYLOAD, headers=apns_headers(newer)).status_code == 429
    counters = apns.get("/control/stats")["counters"]
    assert counters.get("apns_dev_token_updates_too_soon") == 1 and "apns_token_updates_too_soon" not in counters


def test_fcm_reserved_data_keys_and_size(fcm):
    """Reserved data keys and a payload over 4096 bytes (keys and values) are 400 INVALID_ARGUMENT."""
    with fcm.client() as c:
        auth = {"authorization": "Bearer " + fcm_token(c, fcm, fcm_assertion(fcm.rsa)).json()["access_token"]}

        def send(message):
            return c.post(f"{fcm.fcm}/v1/projects/p1/messages:send", json={"message": message}, headers=auth)
        for key in ("from", "message_type", "collapse_key", "google.c.a.e", "googleStuff", "gcm.n.e", "gcm"):
            r = send({"token": "dev1", "data": {"kind": "x", key: "v"}})
            assert r.status_code == 400, key
            err = r.json()["error"]
            assert err["status"] == "INVALID_ARGUMENT" and key in err["message"]
            assert err["details"][0]["errorCode"] == "INVALID_ARGUMENT"
            r = send({"token": "dev1", "android": {"data": {key: "v"}}})
            assert r.status_code == 400, key
        assert send({"token": "dev1", "data": {"notification": "ok", "fromage": "ok"}}).status_code == 200
        # 4 + 4092 = 4096 bytes: at the limit; one more byte is over it, wherever it is.
        assert send({"token": "dev1", "data": {"blob": "x" * 4092}}).status_code == 200
        r = send({"token": "dev1", "data": {"blob": "x" * 4093}})
        assert r.status_code == 400 and "too big" in r.json()["error"]["message"]
        assert send({"token": "dev1", "data": {"blob": "x" * 4000},
                     "android": {"notification": {"body_loc_key": "K", "body_loc_args": ["a" * 80]}}}).status_code == 400
        assert send({"token": "dev1", "data": {"é": "é" * 2047}}).status_code == 200   # UTF-8 bytes: 2 + 4094
        assert send({"token": "dev1", "data": {"é": "é" * 2048}}).status_code == 400   # 2 + 4096
        # To a topic the limit is 2048.
        assert send({"topic": "news", "data": {"blob": "x" * 2044}}).status_code == 200
        assert send({"topic": "news", "data": {"blob": "x" * 2045}}).status_code == 400
    assert [x["response"]["status"] for x in fcm.received("fcm", kind="send")][-3:] == [400, 200, 400]


def test_fcm_token_request_content_type(fcm):
    """The OAuth token request must be a form: any other Content-Type is 400 invalid_request."""
    form = {"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer", "assertion": fcm_assertion(fcm.rsa)}
    with fcm.client() as c:
        r = c.post(f"{fcm.fcm}/token", json=form)
        assert r.status_code == 400 and r.json()["error"] == "invalid_request"
        r = c.post(f"{fcm.fcm}/token", content=urllib.parse.urlencode(form).encode(),
                   headers={"content-type": "text/plain"})
        assert r.status_code == 400 and r.json()["error"] == "invalid_request"
        r = c.post(f"{fcm.fcm}/token", content=urllib.parse.urlencode(form).encode())   # no content-type
        assert r.status_code == 400
        r = c.post(f"{fcm.fcm}/token", content=urllib.parse.urlencode(form).encode(),
                   headers={"content-type": "application/x-www-form-urlencoded; charset=utf-8"})
        assert r.status_code == 200
    recs = fcm.received("fcm", kind="token")
    assert [x["valid"] for x in recs] == [False, False, False, True]
    assert fcm.get("/control/stats")["fcm_tokens_issued"] == 1


def wp_encrypt_with(sub, plaintext, eph=None, salt=None):
    eph = eph or ec.generate_private_key(ec.SECP256R1())
    return http_ece.encrypt(plaintext, private_key=eph, dh=b64u_decode(sub["p256dh"]),
                            auth_secret=b64u_decode(sub["auth"]), version="aes128gcm", rs=4096,
                            salt=salt or os.urandom(16))


def test_webpush_salt_or_key_reuse_refused_for_life(webpush):
    """A salt or an ephemeral ECDH key seen before (even before a reset) is 400; the body is
    still decrypted and recorded first."""
    hdrs = lambda: {"content-encoding": "aes128gcm", "ttl": "60",   # noqa: E731
                    "authorization": vapid_header(webpush.vapid, webpush.origin)}
    eph = ec.generate_private_key(ec.SECP256R1())
    salt = os.urandom(16)
    first = wp_encrypt_with(webpush.sub, b'{"n":1}', eph=eph, salt=salt)
    with webpush.client() as c:
        url = webpush.sub["endpoint"]
        assert c.post(url, content=first, headers=hdrs()).status_code == 201
        r = c.post(url, content=first, headers=hdrs())                                # the same body again
        assert r.status_code == 400 and "salt reused" in r.json()["error"]
        r = c.post(url, content=wp_encrypt_with(webpush.sub, b'{"n":2}', salt=salt), headers=hdrs())
        assert r.status_code == 400 and "salt reused" in r.json()["error"]          # new key, old salt
        r = c.post(url, content=wp_encrypt_with(webpush.sub, b'{"n":3}', eph=eph), headers=hdrs())
        assert r.status_code == 400 and "ECDH key reused" in r.json()["error"]      # old key, new salt
        webpush.post("/control/reset", {})
        r = c.post(url, content=first, headers=hdrs())
        assert r.status_code == 400 and "salt reused" in r.json()["error"]          # a reset forgets nothing
        webpush.post("/control/program", {"gateway": "webpush", "token": "sub1", "responses": [{"status": 410}]})
        r = c.post(url, content=wp_encrypt_with(webpush.sub, b'{"n":4}', eph=eph), headers=hdrs())
        assert r.status_code == 400                                                  # a program does not hide it
        assert c.post(url, content=wp_encrypt_with(webpush.sub, b'{"n":5}'), headers=hdrs()).status_code == 410
    recs = webpush.received("webpush")
    assert [x["plaintext_json"] for x in recs] == [{"n": 1}, {"n": 4}, {"n": 5}]
    assert recs[0]["salt_reused"] and recs[1]["ecdh_key_reused"] and not recs[1].get("programmed")
    assert recs[2]["programmed"] == {"status": 410}


def test_webpush_programmed_answers_decrypt_first(webpush):
    """Programmed answers, hangs and unknown subscriptions: every body that is answered is
    decrypted and recorded first; a program never stands in for a registered subscription."""
    hdrs = lambda: {"content-encoding": "aes128gcm", "ttl": "60",   # noqa: E731
                    "authorization": vapid_header(webpush.vapid, webpush.origin)}
    webpush.post("/control/program", {"gateway": "webpush", "token": "*", "responses": [{"status": 410}]})
    webpush.post("/control/program", {"gateway": "webpush", "token": "ghost", "responses": [{"status": 201}]})
    webpush.post("/control/knobs", {"gateway": "webpush", "hang_tokens": ["sub2"]})
    sub2 = webpush.post("/control/webpush-subscription", {"id": "sub2"})
    many = webpush.post("/control/webpush-subscription", {"ids": [f"storm-{i}" for i in range(50)]})
    assert len(many["endpoints"]) == 50 and many["endpoints"][7].endswith("/push/storm-7")
    with webpush.client() as c:
        for i in range(50):
            body = wp_encrypt_with(many, json.dumps({"i": i}).encode())
            assert c.post(many["endpoints"][i], content=body, headers=hdrs()).status_code == 410
        assert c.post(webpush.sub["endpoint"], content=wp_encrypt(webpush.sub, b'{"s":1}'),
                      headers=hdrs()).status_code == 410
        ghost = webpush.origin + "/push/ghost"
        assert c.post(ghost, content=wp_encrypt(webpush.sub, b'{"g":1}'), headers=hdrs()).status_code == 404
        with pytest.raises(httpx.ReadTimeout):
            c.post(sub2["endpoint"], content=wp_encrypt(sub2, b'{"h":1}'), headers=hdrs(), timeout=0.5)
    recs = webpush.received("webpush")
    storm = [x for x in recs if x["token"].startswith("storm-")]
    assert [x["plaintext_json"] for x in storm] == [{"i": i} for i in range(50)]
    assert all(x["response"]["status"] == 410 and x["programmed"] for x in storm)
    assert webpush.received("webpush", token="sub1")[0]["plaintext_json"] == {"s": 1}
    g = webpush.received("webpush", token="ghost")[0]
    assert g["response"]["status"] == 404 and "plaintext" not in g and not g.get("programmed")
    h = webpush.received("webpush", token="sub2")[0]
    assert h["response"]["hang"] and h["plaintext_json"] == {"h": 1}
    assert {"gateway": "webpush", "token": "ghost", "responses": [{"status": 201}]} in \
        webpush.get("/control/programs")["programs"]                                  # not used up


def test_goaway_unprocessed_request_is_recorded_as_unprocessed(apns):
    """With goaway_answer_last false the Nth request is left unprocessed: no answer, and a record
    marked unprocessed, without a response (a receipt of where it went, not of a delivery)."""
    apns.post("/control/knobs", {"gateway": "apns", "goaway_after": 2, "goaway_answer_last": False})
    c = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        s1 = c.request(f"/3/device/{TOKEN}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: c.ended(s1))
        s2 = c.request(f"/3/device/{'b2' * 32}", apns_headers(apns.jwt), PAYLOAD)
        assert c.pump(lambda ev: any(isinstance(e, h2.events.ConnectionTerminated) for e in ev))
        assert c.status(s1) == 200 and c.status(s2) is None
    finally:
        c.close()
    recs = apns.received("apns")
    assert [x["token"] for x in recs] == [TOKEN, "b2" * 32]
    assert not recs[0].get("unprocessed") and recs[0]["response"]["status"] == 200
    assert recs[1]["unprocessed"] is True and recs[1]["response"] is None and recs[1]["stream"] == s2


def test_apns_token_update_after_20_min_of_iat_accepted(apns):
    """The 20 minutes are counted between the tokens' iat: a token issued 20 min after the
    connection's current one replaces it; after that, the old one is the too-soon update."""
    now = int(time.time())
    old = jwt_es256(apns.key, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": now - 1300})
    with apns.client() as c:
        url = f"{apns.apns}/3/device/{TOKEN}"
        assert c.post(url, content=PAYLOAD, headers=apns_headers(old)).status_code == 200
        assert c.post(url, content=PAYLOAD, headers=apns_headers(apns.jwt)).status_code == 200
        assert c.post(url, content=PAYLOAD, headers=apns_headers(old)).status_code == 429
    conn = apns.get("/control/connections", gateway="apns")["connections"][-1]
    assert conn["distinct_jwts"] == 2


def test_webpush_refused_stream_leaves_the_body_unused(webpush):
    """A programmed REFUSED_STREAM means "not processed": the body is decrypted and recorded,
    and the same bytes may be sent again (as an HTTP/2 client does after REFUSED_STREAM);
    after a processed answer they may not."""
    webpush.post("/control/program", {"gateway": "webpush", "token": "sub1", "responses": [
        {"reset": "REFUSED_STREAM"}, {"reset": "CANCEL"}, {"status": 201}]})
    hdrs = {"content-encoding": "aes128gcm", "ttl": "60", "authorization": vapid_header(webpush.vapid, webpush.origin)}
    body = wp_encrypt(webpush.sub, b'{"r":1}')
    c = RawH2(webpush.info["webpush"], webpush.info["ca"])
    try:
        path = urllib.parse.urlsplit(webpush.sub["endpoint"]).path
        statuses = []
        for _ in range(3):
            sid = c.request(path, hdrs, body)
            assert c.pump(lambda ev: c.ended(sid))
            statuses.append(c.status(sid))
    finally:
        c.close()
    assert statuses == [None, None, 400]   # refused, then cancelled (processed), then a reuse
    recs = webpush.received("webpush")
    assert [x.get("unprocessed", False) for x in recs] == [True, False, False]
    assert all(x["plaintext_json"] == {"r": 1} for x in recs)
    assert recs[2]["salt_reused"] and not recs[1].get("salt_reused")


def test_apns_token_update_boundary_is_20_minutes(apns):
    """1199 s between the iat values is too soon; 1200 s is allowed."""
    now = int(time.time())
    mk = lambda iat: jwt_es256(apns.key, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": iat})  # noqa: E731
    first, soon, later = mk(now - 1200), mk(now - 1), mk(now)
    with apns.client() as c:
        url = f"{apns.apns}/3/device/{TOKEN}"
        assert c.post(url, content=PAYLOAD, headers=apns_headers(first)).status_code == 200
        assert c.post(url, content=PAYLOAD, headers=apns_headers(soon)).status_code == 429
        assert c.post(url, content=PAYLOAD, headers=apns_headers(later)).status_code == 200


def test_apns_token_of_the_other_environment_is_bad_device_token(apns):
    """A device token registered as issued by one environment is 400 BadDeviceToken at the
    other; unregistered tokens are accepted by both."""
    prod_tok, dev_tok = "c1" * 32, "d1" * 32
    apns.post("/control/apns-devices", {"gateway": "apns", "tokens": [prod_tok]})
    apns.post("/control/apns-devices", {"gateway": "apns_dev", "tokens": [dev_tok.upper()]})
    dev = apns.info["urls"]["apns_dev"]
    with apns.client() as c:
        def post(base, tok):
            return c.post(f"{base}/3/device/{tok}", content=PAYLOAD, headers=apns_headers(apns.jwt))
        assert post(apns.apns, prod_tok).status_code == 200
        assert post(dev, dev_tok).status_code == 200
        r = post(apns.apns, dev_tok)
        assert r.status_code == 400 and r.json() == {"reason": "BadDeviceToken"}
        r = post(dev, prod_tok)
        assert r.status_code == 400 and r.json() == {"reason": "BadDeviceToken"}
        assert post(apns.apns, TOKEN).status_code == 200 and post(dev, TOKEN).status_code == 200
    assert apns.received("apns", token=dev_tok)[0]["wrong_environment"] == "apns_dev"
    assert apns.ctl.post("/control/apns-devices", json={"gateway": "fcm", "tokens": ["ab"]}).status_code == 400


# ------------------------------------------------------------------ APNs: Live Activity, widgets, location, push to talk

LA_TOPIC, WIDGETS_TOPIC = TOPIC + ".push-type.liveactivity", TOPIC + ".push-type.widgets"
LOCATION_TOPIC, PTT_TOPIC = TOPIC + ".location-query", TOPIC + ".voip-ptt"
WIDGETS_BODY = {"aps": {"content-changed": True}}


def la_aps(event="update", **extra):
    aps = {"timestamp": int(time.time()), "event": event, "content-state": {"score": 1}}
    if event == "start":
        aps.update({"alert": {"title": "Kick-off", "body": {"loc-key": "K", "loc-args": ["a"]}, "sound": "ding"},
                    "attributes-type": "MatchAttributes", "attributes": {"home": "A"}})
    aps.update(extra)
    return {k: v for k, v in aps.items() if v is not None}


# (push type, topic, headers, body) of a push Apple takes, per special push type
SPECIAL = {
    "liveactivity": (LA_TOPIC, {"apns-priority": "5"}, {"aps": la_aps()}),
    "widgets": (WIDGETS_TOPIC, {"apns-priority": "5"}, WIDGETS_BODY),
    "location": (LOCATION_TOPIC, {"apns-priority": "10"}, {"aps": {}}),
    "pushtotalk": (PTT_TOPIC, {"apns-priority": "10", "apns-expiration": "0"}, {"aps": {}, "activeSpeaker": "Ada"}),
}


def special_post(c, apns, push_type, token=TOKEN, body=None, base=None, drop=(), **h):
    topic, headers, good = SPECIAL.get(push_type, (TOPIC, {}, None))
    hs = apns_headers(apns.jwt, **{"apns-push-type": push_type, "apns-topic": topic, **headers})
    hs.update(h)
    for name in drop:
        del hs[name]
    payload = good if body is None else body
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return c.post(f"{base or apns.apns}/3/device/{token}", content=content, headers=hs)


def test_apns_special_push_types_accepted_on_their_topics(apns):
    """A key registered for the bundle id may send each push type to the bundle id plus that
    type's suffix, without registering the suffixed topic."""
    with apns.client() as c:
        for pt in SPECIAL:
            r = special_post(c, apns, pt)
            assert r.status_code == 200, (pt, r.text)
        r = special_post(c, apns, "liveactivity", base=apns.info["urls"]["apns_dev"])
        assert r.status_code == 200 and "apns-unique-id" in r.headers
    recs = apns.received("apns")
    assert [x["headers"]["apns-push-type"] for x in recs] == list(SPECIAL) and all(x["valid"] for x in recs)


def test_apns_push_type_topic_suffix_mismatch(apns):
    """A push type whose topic carries another type's suffix, or none where one is needed, is
    400 DeviceTokenNotForTopic with `topic_mismatch`; a suffix on a bundle id the key does not
    serve is TopicDisallowed; explicitly registered topics are still accepted."""
    with apns.client() as c:
        cases = [
            (special_post(c, apns, "liveactivity", **{"apns-topic": TOPIC}), "DeviceTokenNotForTopic"),
            (special_post(c, apns, "liveactivity", **{"apns-topic": WIDGETS_TOPIC}), "DeviceTokenNotForTopic"),
            (special_post(c, apns, "widgets", **{"apns-topic": LA_TOPIC}), "DeviceTokenNotForTopic"),
            (special_post(c, apns, "location", **{"apns-topic": TOPIC + ".voip"}), "DeviceTokenNotForTopic"),
            (special_post(c, apns, "pushtotalk", **{"apns-topic": TOPIC + ".voip"}), "DeviceTokenNotForTopic"),
            (special_post(c, apns, "alert", body=json.loads(PAYLOAD), **{"apns-topic": LA_TOPIC}),
             "DeviceTokenNotForTopic"),
            (special_post(c, apns, "voip", body={"aps": {}}, **{"apns-topic": PTT_TOPIC}), "DeviceTokenNotForTopic"),
            (special_post(c, apns, "widgets", **{"apns-topic": "com.example.other.push-type.widgets"}),
             "TopicDisallowed"),
            # unchanged: a .voip topic with another push type, an unregistered .voip topic
            (special_post(c, apns, "alert", body=json.loads(PAYLOAD), **{"apns-topic": TOPIC + ".voip"}),
             "InvalidPushType"),
        ]
        for i, (r, reason) in enumerate(cases):
            assert r.status_code == 400 and r.json() == {"reason": reason}, (i, r.text)
    recs = apns.received("apns")
    assert recs[0]["topic_mismatch"] == {"push_type": "liveactivity", "topic": TOPIC, "topic_suffix": None,
                                         "expected_suffix": ".push-type.liveactivity"}
    assert recs[1]["topic_mismatch"]["topic_suffix"] == ".push-type.widgets"
    assert recs[5]["topic_mismatch"] == {"push_type": "alert", "topic": LA_TOPIC,
                                         "topic_suffix": ".push-type.liveactivity", "expected_suffix": None}
    assert recs[6]["voip_topic_suffix_missing"] and recs[6]["topic_mismatch"]["topic_suffix"] == ".voip-ptt"
    assert recs[7]["topic_not_registered"] == "com.example.other.push-type.widgets"
    # A key registered with only a suffixed topic (no bundle id) may use exactly that topic.
    key = ec.generate_private_key(ec.SECP256R1())
    apns.post("/control/apns-key", {"key_id": "SOLOKEY123", "team_id": TEAM, "public_key_pem": pem(key.public_key()),
                                    "topics": ["com.solo.push-type.widgets", "com.solo.voip"]})
    solo = jwt_es256(key, {"alg": "ES256", "kid": "SOLOKEY123"}, {"iss": TEAM, "iat": int(time.time())})
    with apns.client() as c:
        hs = apns_headers(solo, **{"apns-push-type": "widgets", "apns-topic": "com.solo.push-type.widgets"})
        assert c.post(f"{apns.apns}/3/device/{TOKEN}", content=json.dumps(WIDGETS_BODY), headers=hs).status_code == 200
        hs["apns-topic"] = "com.solo.voip-ptt"   # com.solo is not a registered bundle id
        hs["apns-push-type"] = "pushtotalk"
        r = c.post(f"{apns.apns}/3/device/{TOKEN}", content=b'{"aps":{}}', headers=hs)
        assert r.json() == {"reason": "TopicDisallowed"}


def test_apns_token_kinds(apns):
    """A token registered with a kind takes only that kind of push (alert and background are
    both alert); another is 400 DeviceTokenNotForTopic with `token_kind_mismatch`."""
    la_tok, alert_tok, ptt_tok, free = "1a" * 32, "2a" * 32, "3a" * 32, "4a" * 32
    apns.post("/control/apns-devices", {"gateway": "apns", "tokens": [la_tok], "kind": "liveactivity"})
    apns.post("/control/apns-devices", {"tokens": [alert_tok.upper()], "kind": "alert"})
    apns.post("/control/apns-devices", {"gateway": "apns_dev", "tokens": [ptt_tok], "kind": "pushtotalk"})
    bg = {"apns-push-type": "background", "apns-priority": "5"}
    with apns.client() as c:
        assert special_post(c, apns, "liveactivity", token=la_tok).status_code == 200
        r = c.post(f"{apns.apns}/3/device/{la_tok}", content=PAYLOAD, headers=apns_headers(apns.jwt))
        assert r.status_code == 400 and r.json() == {"reason": "DeviceTokenNotForTopic"}
        assert c.post(f"{apns.apns}/3/device/{alert_tok}", content=PAYLOAD,
                      headers=apns_headers(apns.jwt)).status_code == 200
        assert c.post(f"{apns.apns}/3/device/{alert_tok}", content=b'{"aps":{"content-available":1}}',
                      headers=apns_headers(apns.jwt, **bg)).status_code == 200
        assert special_post(c, apns, "widgets", token=alert_tok).json() == {"reason": "DeviceTokenNotForTopic"}
        dev = apns.info["urls"]["apns_dev"]
        assert special_post(c, apns, "pushtotalk", token=ptt_tok, base=dev).status_code == 200
        assert special_post(c, apns, "location", token=ptt_tok, base=dev).json() == {"reason": "DeviceTokenNotForTopic"}
        # the environment is judged first: a development token at production is BadDeviceToken
        assert special_post(c, apns, "pushtotalk", token=ptt_tok).json() == {"reason": "BadDeviceToken"}
        for pt in SPECIAL:
            assert special_post(c, apns, pt, token=free).status_code == 200
    recs = apns.received("apns", token=la_tok)
    assert recs[1]["token_kind_mismatch"] == {"token_kind": "liveactivity", "push_type": "alert"}
    apns.post("/control/apns-devices", {"tokens": [la_tok], "kind": None})
    with apns.client() as c:
        assert c.post(f"{apns.apns}/3/device/{la_tok}", content=PAYLOAD,
                      headers=apns_headers(apns.jwt)).status_code == 200
    for bad in ({"tokens": [free], "kind": "complication"}, {"tokens": [free]},
                {"gateway": "fcm", "tokens": [free], "kind": "alert"}):
        assert apns.ctl.post("/control/apns-devices", json=bad).status_code == 400, bad


def test_apns_special_push_type_priority_and_expiration(apns):
    """liveactivity, location and widgets take priority 5 or 10; pushtotalk takes 10 and
    apns-expiration 0."""
    with apns.client() as c:
        ok = [special_post(c, apns, pt, **{"apns-priority": p}) for pt in ("liveactivity", "location", "widgets")
              for p in ("5", "10")]
        ok.append(special_post(c, apns, "pushtotalk", drop=["apns-priority"]))   # omitted: 10
        assert [r.status_code for r in ok] == [200] * 7, [r.text for r in ok]
        cases = [
            (special_post(c, apns, "liveactivity", **{"apns-priority": "1"}), "BadPriority"),
            (special_post(c, apns, "location", **{"apns-priority": "1"}), "BadPriority"),
            (special_post(c, apns, "widgets", **{"apns-priority": "1"}), "BadPriority"),
            (special_post(c, apns, "pushtotalk", **{"apns-priority": "5"}), "BadPriority"),
            (special_post(c, apns, "pushtotalk", **{"apns-expiration": str(int(time.time()) + 60)}),
             "BadExpirationDate"),
            (special_post(c, apns, "pushtotalk", drop=["apns-expiration"]), "BadExpirationDate"),
        ]
        for i, (r, reason) in enumerate(cases):
            assert r.status_code == 400 and r.json() == {"reason": reason}, (i, r.text)
    bad = [x for x in apns.received("apns") if not x["valid"]]
    assert bad[0]["priority_error"] == "liveactivity takes apns-priority 5 or 10"
    assert bad[3]["priority_error"] == "pushtotalk takes apns-priority 10"
    assert bad[5]["expiration_error"] == "pushtotalk needs apns-expiration 0 (none sent)"


def test_apns_widgets_location_pushtotalk_payloads(apns):
    with apns.client() as c:
        good = [
            special_post(c, apns, "location", body={"aps": {}, "query": "where"}),
            special_post(c, apns, "pushtotalk", body={"aps": {}}),
            special_post(c, apns, "pushtotalk", body=b'{"aps":{},"activeSpeaker":"x"}'),
        ]
        assert [r.status_code for r in good] == [200] * 3
        cases = [
            (special_post(c, apns, "widgets", body={"aps": {"content-changed": 1}}), 400, "BadPayload"),
            (special_post(c, apns, "widgets", body={"aps": {"content-changed": True, "badge": 1}}), 400, "BadPayload"),
            (special_post(c, apns, "widgets", body={"aps": {"content-changed": True}, "x": 1}), 400, "BadPayload"),
            (special_post(c, apns, "widgets", body={"aps": {}}), 400, "BadPayload"),
            (special_post(c, apns, "location", body={"query": "where"}), 400, "BadPayload"),
            (special_post(c, apns, "pushtotalk", body={"aps": []}), 400, "BadPayload"),
            (special_post(c, apns, "pushtotalk", body=b"[1]"), 400, "BadPayload"),
            (special_post(c, apns, "location", body={"aps": {}, "x": "y" * 4100}), 413, "PayloadTooLarge"),
            (special_post(c, apns, "pushtotalk", body={"aps": {}, "x": "y" * 4100}), 413, "PayloadTooLarge"),
            (special_post(c, apns, "liveactivity", body={"aps": la_aps(), "x": "y" * 4100}), 413, "PayloadTooLarge"),
            (special_post(c, apns, "location", body=b""), 400, "PayloadEmpty"),
        ]
        for i, (r, status, reason) in enumerate(cases):
            assert r.status_code == status and r.json() == {"reason": reason}, (i, r.text)
    bad = [x for x in apns.received("apns") if not x["valid"]]
    assert bad[0]["payload_error"] == 'a widgets payload is exactly {"aps":{"content-changed":true}}'
    assert bad[4]["payload_error"] == "no aps dictionary"
    assert bad[6]["payload_error"] == "payload is not a JSON object"


LA_BAD = [
    (dict(event="begin"), 'aps.event must be "start", "update" or "end", not "begin"'),
    (dict(timestamp=None), "aps.timestamp must be an integer (seconds since 1970)"),
    (dict(timestamp="1700000000"), "aps.timestamp must be an integer (seconds since 1970)"),
    (dict(timestamp=1700000000.5), "aps.timestamp must be an integer (seconds since 1970)"),
    (dict(timestamp=1700000000000), "aps.timestamp 1700000000000 looks like milliseconds: it must be seconds since 1970"),
    (dict(**{"content-state": None}), "aps.content-state is required for update"),
    (dict(**{"content-state": [1]}), "aps.content-state must be an object"),
    (dict(**{"stale-date": "soon"}), "aps.stale-date must be an integer (seconds since 1970)"),
    (dict(event="end", **{"dismissal-date": 1.5}), "aps.dismissal-date must be an integer (seconds since 1970)"),
    (dict(**{"relevance-score": "high"}), "aps.relevance-score must be a number"),
    (dict(alert="Goal!"), "aps.alert must be an object"),
    (dict(alert={"title": 3}), 'aps.alert.title must be a string or {"loc-key","loc-args"}'),
    (dict(alert={"body": {"loc-args": ["x"]}}), "aps.alert.body.loc-key must be a string"),
    (dict(alert={"body": {"loc-key": "K", "loc-args": [1]}}), "aps.alert.body.loc-args must be a list of strings"),
    (dict(alert={"title": "t", "sound": {"critical": 1}}), "aps.alert.sound must be a string"),
    (dict(**{"input-push-token": 1}), "aps.input-push-token is only for start"),
    (dict(**{"input-push-channel": "dHN0LXNyY2gtY2hubA=="}), "aps.input-push-channel is only for start"),
]
LA_START_BAD = [
    (dict(alert=None), "start needs aps.alert"),
    (dict(**{"attributes-type": ""}), "start needs aps.attributes-type (a non-empty string)"),
    (dict(attributes=None), "start needs aps.attributes (an object)"),
    (dict(**{"content-state": None}), "aps.content-state is required for start"),
    (dict(**{"input-push-token": True}), "aps.input-push-token must be 1"),
    (dict(**{"input-push-token": 2}), "aps.input-push-token must be 1"),
    (dict(**{"input-push-channel": "not base64!"}), "aps.input-push-channel must be a base64 channel id"),
]


def _la_with(event, changes):
    aps = la_aps(event)
    for k, v in changes.items():
        if v is None:
            aps.pop(k, None)
        else:
            aps[k] = v
    return {"aps": aps}


def test_apns_live_activity_payloads(apns):
    ts = int(time.time())
    good = [
        {"aps": la_aps("update", **{"stale-date": ts + 60, "relevance-score": 50.5,
                                    "alert": {"title": "Goal", "body": "1-0", "sound": "default"}})},
        {"aps": la_aps("end", **{"content-state": None, "dismissal-date": ts + 3600})},
        {"aps": la_aps("end", **{"relevance-score": 100})},
        {"aps": la_aps("start")},
        {"aps": la_aps("start", **{"input-push-token": 1, "input-push-channel": "dHN0LXNyY2gtY2hubA=="})},
        {"aps": la_aps("start", alert={"title": {"loc-key": "T"}})},
        {"aps": la_aps("update"), "custom": 1},
    ]
    bad = [(_la_with("update", ch), why) for ch, why in LA_BAD] + \
          [(_la_with("start", ch), why) for ch, why in LA_START_BAD] + [({"aps": {}}, LA_BAD[0][1].replace('"begin"', "null"))]
    with apns.client() as c:
        for i, body in enumerate(good):
            r = special_post(c, apns, "liveactivity", body=body)
            assert r.status_code == 200, (i, r.text)
        for body, _ in bad:
            r = special_post(c, apns, "liveactivity", body=body)
            assert r.status_code == 400 and r.json() == {"reason": "BadPayload"}, (body, r.text)
    recs = [x for x in apns.received("apns") if not x["valid"]]
    assert [x["payload_error"] for x in recs] == [why for _, why in bad]


# ------------------------------------------------------------------ APNs channel management and broadcast

BUNDLE = TOPIC


def manage_headers(jwt, **extra):
    h = {"authorization": f"bearer {jwt}"}
    h.update(extra)
    return h


class Manage:
    """A client of one channel-management gateway."""

    def __init__(self, gw, c, name="apns_manage"):
        self.gw, self.c, self.url = gw, c, gw.info["urls"][name]

    def req(self, method, bundle=BUNDLE, what="channels", body=None, jwt=None, **h):
        content = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        return self.c.request(method, f"{self.url}/1/apps/{bundle}/{what}", content=content,
                              headers=manage_headers(jwt or self.gw.jwt, **h))

    def create(self, policy=0, bundle=BUNDLE, **h):
        return self.req("POST", bundle, body={"message-storage-policy": policy, "push-type": "LiveActivity"}, **h)

    def channel(self, policy=0, bundle=BUNDLE):
        r = self.create(policy, bundle)
        assert r.status_code == 201, r.text
        return r.headers["apns-channel-id"]


def test_apns_manage_listeners_in_gateways_json(apns):
    info = apns.info
    for name in ("apns_manage", "apns_manage_dev"):
        assert info["urls"][name] == f"https://127.0.0.1:{info[name]}"
    assert len({info[n] for n in ("apns", "apns_dev", "apns_manage", "apns_manage_dev")}) == 4
    assert apns.get("/control/health")["ports"]["apns_manage_dev"] == info["apns_manage_dev"]
    # h2 only, like APNs: a client offering only http/1.1 gets the connection closed
    with apns.client(http2=False) as c, pytest.raises(httpx.HTTPError):
        c.get(f"{info['urls']['apns_manage']}/1/apps/{BUNDLE}/all-channels")
    assert apns.get("/control/knobs", gateway="apns_manage")["knobs"]["channel_limit"] == 10000


def test_apns_channel_create_read_list_delete(apns):
    rid = "2288cf3f-0a7b-4c8f-8e3e-1f1a1b2c3d4e"
    with apns.client() as c:
        m = Manage(apns, c)
        r = m.create(1, **{"apns-request-id": rid})
        assert r.status_code == 201 and r.content == b"" and r.headers["apns-request-id"] == rid
        cid = r.headers["apns-channel-id"]
        assert len(base64.b64decode(cid, validate=True)) == 16
        r = m.req("GET", **{"apns-channel-id": cid})
        assert r.status_code == 200 and r.json() == {"message-storage-policy": 1, "push-type": "LiveActivity"}
        assert len(r.headers["apns-request-id"]) == 36
        cid2 = m.channel(0)
        r = m.req("GET", what="all-channels")
        assert r.status_code == 200 and r.json() == {"channels": [cid, cid2]}
        r = m.req("DELETE", **{"apns-channel-id": cid})
        assert r.status_code == 204 and r.content == b"" and "apns-request-id" in r.headers
        assert m.req("GET", what="all-channels").json() == {"channels": [cid2]}
        r = m.req("GET", **{"apns-channel-id": cid})
        assert r.status_code == 400 and r.json() == {"reason": "ChannelNotRegistered"}
        assert m.req("DELETE", **{"apns-channel-id": cid}).json() == {"reason": "ChannelNotRegistered"}
    chans = apns.get("/control/channels", gateway="apns_manage")["channels"]
    assert [(x["channel_id"], x["bundle"], x["policy"]) for x in chans] == [(cid2, BUNDLE, 0)]
    assert isinstance(chans[0]["created"], float)
    recs = apns.received("apns_manage")
    assert [x["op"] for x in recs] == ["create", "read", "create", "list", "delete", "list", "read", "delete"]
    assert recs[0]["gateway"] == "apns_manage" and recs[0]["request_id"] == rid and recs[0]["channel_id"] == cid
    assert recs[0]["policy"] == 1 and recs[0]["bundle"] == BUNDLE and recs[0]["valid"]
    assert recs[0]["response"]["status"] == 201 and recs[3]["channels"] == 2
    assert recs[6]["channel_error"] == "no such channel"
    apns.post("/control/reset", {})
    assert apns.get("/control/channels", gateway="apns_manage")["channels"] == []


def test_apns_channel_management_errors(apns):
    other_key = ec.generate_private_key(ec.SECP256R1())
    bad_jwt = jwt_es256(other_key, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": int(time.time())})
    with apns.client() as c:
        m = Manage(apns, c)
        cid = m.channel()
        lt = {"push-type": "LiveActivity"}
        cases = [
            (m.req("POST", body=b"{not json"), 400, "BadRequestPayload"),
            (m.req("POST", body=b""), 400, "BadRequestPayload"),
            (m.req("POST", body=[1]), 400, "BadRequestPayload"),
            (m.req("POST", body={"message-storage-policy": 0, "push-type": "LiveActivity", "ttl": 1}), 400,
             "BadRequestParams"),
            (m.req("POST", body={"message-storage-policy": 2, **lt}), 400, "BadRequestParams"),
            (m.req("POST", body={"message-storage-policy": "1", **lt}), 400, "BadRequestParams"),
            (m.req("POST", body={"message-storage-policy": True, **lt}), 400, "BadRequestParams"),
            (m.req("POST", body={"message-storage-policy": 0, "push-type": "liveactivity"}), 400, "BadRequestParams"),
            (m.req("POST", body={"message-storage-policy": 0}), 400, "BadRequestParams"),
            (m.req("GET"), 400, "MissingChannelId"),
            (m.req("DELETE"), 400, "MissingChannelId"),
            (m.req("GET", **{"apns-channel-id": "not*base64"}), 400, "BadChannelId"),
            (m.req("GET", **{"apns-channel-id": base64.b64encode(b"x" * 60).decode()}), 400, "BadChannelId"),
            (m.req("GET", **{"apns-channel-id": "dHN0LXNyY2gtY2hubA=="}), 400, "ChannelNotRegistered"),
            (m.create(bundle=LA_TOPIC), 400, "TopicDisallowed"),
            (m.req("GET", bundle=TOPIC + ".voip", what="all-channels"), 400, "TopicDisallowed"),
            (m.create(bundle="com.example.other"), 403, "TopicMismatch"),
            (m.create(jwt=bad_jwt), 403, "InvalidProviderToken"),
            (m.create(**{"apns-request-id": "not-a-uuid"}), 400, "BadMessageId"),
            (m.req("GET", what="nothing"), 404, "BadPath"),
            (c.get(f"{m.url}/3/device/{TOKEN}", headers=manage_headers(apns.jwt)), 404, "BadPath"),
            (m.req("PUT", **{"apns-channel-id": cid}), 405, "MethodNotAllowed"),
            (m.req("POST", what="all-channels"), 405, "MethodNotAllowed"),
        ]
        for i, (r, status, reason) in enumerate(cases):
            assert r.status_code == status and r.json() == {"reason": reason}, (i, r.text)
            assert len(r.headers["apns-request-id"]) == 36
        r = m.create(**{"apns-request-id": "not-a-uuid"})
        assert r.headers["apns-request-id"] != "not-a-uuid"
        # without a provider token
        r = c.get(f"{m.url}/1/apps/{BUNDLE}/all-channels")
        assert r.status_code == 403 and r.json() == {"reason": "MissingProviderToken"}
    recs = [x for x in apns.received("apns_manage") if not x["valid"]]
    assert recs[3]["params_error"] == "unknown members ['ttl']"
    assert recs[5]["params_error"] == 'message-storage-policy must be the integer 0 or 1, not "1"'
    assert recs[14]["bundle_error"] == f"bundle id '{LA_TOPIC}' carries the push-type suffix '.push-type.liveactivity'"
    assert apns.get("/control/channels", gateway="apns_manage")["channels"][0]["channel_id"] == cid


def test_apns_channel_limit_and_environments(apns):
    """At `channel_limit` channels per app and environment, create is 400
    CannotCreateChannelConfig; the two environments never share channels."""
    apns.post("/control/knobs", {"gateway": "apns_manage", "channel_limit": 2})
    apns.post("/control/apns-key", {"key_id": KID, "team_id": TEAM, "public_key_pem": pem(apns.key.public_key()),
                                    "topics": [TOPIC, TOPIC + ".voip", "com.example.second"]})
    with apns.client() as c:
        prod, dev = Manage(apns, c), Manage(apns, c, "apns_manage_dev")
        a, b = prod.channel(), prod.channel(1)
        r = prod.create()
        assert r.status_code == 400 and r.json() == {"reason": "CannotCreateChannelConfig"}
        assert "apns-channel-id" not in r.headers
        assert prod.create(bundle="com.example.second").status_code == 201    # per app
        d = dev.channel()                                                        # per environment
        assert dev.req("GET", **{"apns-channel-id": a}).json() == {"reason": "ChannelNotRegistered"}
        assert prod.req("GET", **{"apns-channel-id": d}).json() == {"reason": "ChannelNotRegistered"}
        assert prod.req("GET", bundle="com.example.second", **{"apns-channel-id": a}).json() == \
            {"reason": "ChannelNotRegistered"}
        assert dev.req("GET", what="all-channels").json() == {"channels": [d]}
        assert prod.req("GET", what="all-channels").json() == {"channels": [a, b]}
        assert prod.req("DELETE", **{"apns-channel-id": a}).status_code == 204
        assert prod.create().status_code == 201
    assert apns.received("apns_manage_dev")[1]["channel_error"] == "a channel of the other environment (apns_manage)"
    assert len(apns.get("/control/channels", gateway="apns_dev")["channels"]) == 1
    assert len(apns.get("/control/channels", gateway="apns_manage", bundle=BUNDLE)["channels"]) == 2
    apns.post("/control/reset", {"gateway": "apns_manage"})
    assert apns.get("/control/channels", gateway="apns_manage")["channels"] == []
    assert len(apns.get("/control/channels", gateway="apns_manage_dev")["channels"]) == 1
    assert apns.get("/control/knobs", gateway="apns_manage")["knobs"]["channel_limit"] == 10000
    assert apns.ctl.get("/control/channels", params={"gateway": "fcm"}).status_code == 400


def test_apns_channel_programmed_answers(apns):
    with apns.client() as c:
        m = Manage(apns, c)
        cid = m.channel()
        apns.post("/control/program", {"gateway": "apns_manage", "token": cid, "responses": [
            {"status": 500}, {"status": 200, "headers": {"x-seen": "1"}}]})
        apns.post("/control/program", {"gateway": "apns_manage", "token": BUNDLE, "responses": [
            {"status": 429, "reason": "TooManyRequests"}, {"status": 200}]})
        r = m.req("GET", **{"apns-channel-id": cid})
        assert r.status_code == 500 and r.json() == {"reason": "InternalServerError"}
        assert len(r.headers["apns-request-id"]) == 36 and "apns-id" not in r.headers
        r = m.req("GET", **{"apns-channel-id": cid})
        assert r.status_code == 200 and r.json()["message-storage-policy"] == 0 and r.headers["x-seen"] == "1"
        r = m.create()
        assert r.status_code == 429 and r.json() == {"reason": "TooManyRequests"}
        assert len(apns.get("/control/channels", gateway="apns_manage")["channels"]) == 1   # not created
        assert m.create().status_code == 201
    stats = apns.get("/control/stats")["counters"]
    assert stats["apns_manage_programmed_500"] == 1 and stats["apns_manage_programmed_429"] == 1


def broadcast_headers(jwt, cid, **extra):
    h = {"authorization": f"bearer {jwt}", "apns-channel-id": cid, "apns-push-type": "liveactivity",
         "apns-priority": "10", "apns-expiration": "0"}
    h.update(extra)
    return h


def test_apns_broadcast_success(apns):
    rid = "123e4567-e89b-12d3-a456-426614174000"
    with apns.client() as c:
        cid = Manage(apns, c).channel(0)
        dcid = Manage(apns, c, "apns_manage_dev").channel(1)
        body = json.dumps({"aps": la_aps("update")}).encode()
        r = c.post(f"{apns.apns}/4/broadcasts/apps/{BUNDLE}", content=body,
                   headers=broadcast_headers(apns.jwt, cid, **{"apns-request-id": rid, "apns-topic": "ignored"}))
        assert r.status_code == 200 and r.content == b"" and r.headers["apns-request-id"] == rid
        assert "apns-unique-id" not in r.headers
        dev = apns.info["urls"]["apns_dev"]
        r = c.post(f"{dev}/4/broadcasts/apps/{BUNDLE}", content=json.dumps({"aps": la_aps("end")}).encode(),
                   headers=broadcast_headers(apns.jwt, dcid, **{"apns-push-type": "LiveActivity",
                                                                  "apns-priority": "5",
                                                                  "apns-expiration": str(int(time.time()) + 3600)}))
        assert r.status_code == 200 and len(r.headers["apns-request-id"]) == 36 and "apns-unique-id" in r.headers
        big = json.dumps({"aps": la_aps("update", **{"content-state": {"x": "y" * 4900}})}).encode()
        assert 4096 < len(big) <= 5120
        r = c.post(f"{apns.apns}/4/broadcasts/apps/{BUNDLE}", content=big, headers=broadcast_headers(apns.jwt, cid))
        assert r.status_code == 200
        r = c.post(f"{apns.apns}/4/broadcasts/apps/{BUNDLE}", content=body,
                   headers=broadcast_headers(apns.jwt, cid, **{"apns-priority": "1"}))
        assert r.status_code == 200
    recs = apns.received("apns")
    assert len(recs) == 3 and all(x["broadcast"] and x["valid"] for x in recs)
    assert recs[0]["channel_id"] == cid and recs[0]["bundle"] == BUNDLE and recs[0]["request_id"] == rid
    assert recs[0]["body"]["aps"]["event"] == "update" and recs[0]["channel_policy"] == 0 and recs[0]["token"] is None
    assert apns.received("apns", channel=cid) == recs
    assert apns.received("apns_dev")[0]["channel_id"] == dcid


def test_apns_broadcast_errors(apns):
    other_key = ec.generate_private_key(ec.SECP256R1())
    bad_jwt = jwt_es256(other_key, {"alg": "ES256", "kid": KID}, {"iss": TEAM, "iat": int(time.time())})
    with apns.client() as c:
        cid0 = Manage(apns, c).channel(0)
        cid1 = Manage(apns, c).channel(1)
        dev_cid = Manage(apns, c, "apns_manage_dev").channel(0)
        good = json.dumps({"aps": la_aps("update")}).encode()

        def post(cid=cid0, body=good, bundle=BUNDLE, jwt=None, drop=(), method="POST", **h):
            hs = broadcast_headers(jwt or apns.jwt, cid, **h)
            for name in drop:
                del hs[name]
            return c.request(method, f"{apns.apns}/4/broadcasts/apps/{bundle}", content=body, headers=hs)
        la = lambda **kw: json.dumps({"aps": la_aps(**kw)}).encode()  # noqa: E731
        cases = [
            (post(bundle=LA_TOPIC), 400, "TopicDisallowed"),
            (post(bundle="com.example.other"), 403, "TopicMismatch"),
            (post(jwt=bad_jwt), 403, "InvalidProviderToken"),
            (post(drop=["apns-channel-id"]), 400, "MissingChannelId"),
            (post(cid="@@not base64@@"), 400, "BadChannelId"),
            (post(cid="QUJD" * 17), 400, "BadChannelId"),
            (post(cid="dHN0LXNyY2gtY2hubA=="), 400, "ChannelNotRegistered"),
            (post(cid=dev_cid), 400, "ChannelNotRegistered"),
            (post(drop=["apns-push-type"]), 400, "MissingPushType"),
            (post(**{"apns-push-type": "alert"}), 400, "InvalidPushType"),
            (post(**{"apns-priority": "7"}), 400, "BadPriority"),
            (post(**{"apns-expiration": "3600"}), 400, "BadExpirationDate"),
            (post(drop=["apns-expiration"]), 400, "BadExpirationDate"),
            (post(cid=cid1, **{"apns-expiration": "soon"}), 400, "BadExpirationDate"),
            (post(**{"apns-request-id": "nope"}), 400, "BadMessageId"),
            (post(body=json.dumps({"aps": {}, "x": "y" * 5200}).encode()), 413, "PayloadTooLarge"),
            (post(body=b""), 400, "PayloadEmpty"),
            (post(body=b"not json"), 400, "BadPayload"),
            (post(body=b'{"x":1}'), 400, "BadPayload"),
            (post(body=la(event="start")), 400, "BadPayload"),
            (post(body=la(timestamp=int(time.time() * 1000))), 400, "BadPayload"),
            (post(body=la(**{"content-state": "x"})), 400, "BadPayload"),
            (post(method="GET"), 405, "MethodNotAllowed"),
            (c.post(f"{apns.apns}/4/broadcasts/apps/", content=good, headers=broadcast_headers(apns.jwt, cid0)), 404,
             "BadPath"),
        ]
        for i, (r, status, reason) in enumerate(cases):
            assert r.status_code == status and r.json() == {"reason": reason}, (i, r.text)
        # policy 1 channels take any expiration date, and none
        assert post(cid=cid1, drop=["apns-expiration"]).status_code == 200
        assert post(cid=cid1, **{"apns-expiration": str(int(time.time()) + 3600)}).status_code == 200
    recs = [x for x in apns.received("apns") if not x["valid"]]
    assert len(recs) == len(cases)
    assert all(x["broadcast"] for x in recs[:-1]) and "broadcast" not in recs[-1] and recs[-2]["bundle"] == BUNDLE
    assert recs[0]["bundle"] == LA_TOPIC
    assert recs[7]["channel_error"] == "a channel of the other environment (apns_manage_dev)"
    assert recs[12]["expiration_error"] == "a No Message Stored channel (policy 0) takes apns-expiration 0 (none sent)"
    assert recs[19]["payload_error"] == "broadcast cannot start a Live Activity"
    assert "milliseconds" in recs[20]["payload_error"]


def test_apns_broadcast_programmed_by_channel_id(apns):
    """A program keyed by channel id answers broadcasts to that channel as a device token's
    answers its pushes: 500 then 429 with Retry-After, then the default 200."""
    with apns.client() as c:
        cid = Manage(apns, c).channel(0)
        other = Manage(apns, c).channel(0)
        apns.post("/control/program", {"gateway": "apns", "token": cid, "responses": [
            {"status": 500}, {"status": 429, "retry_after": 2}, {"status": 200}]})
        body = json.dumps({"aps": la_aps("update")}).encode()
        url = f"{apns.apns}/4/broadcasts/apps/{BUNDLE}"
        rs = [c.post(url, content=body, headers=broadcast_headers(apns.jwt, cid)) for _ in range(3)]
        assert rs[0].status_code == 500 and rs[0].json() == {"reason": "InternalServerError"}
        assert "apns-request-id" in rs[0].headers and "apns-id" not in rs[0].headers
        assert rs[1].status_code == 429 and rs[1].headers["retry-after"] == "2"
        assert rs[1].json() == {"reason": "TooManyRequests"}
        assert rs[2].status_code == 200 and "apns-request-id" in rs[2].headers
        assert c.post(url, content=body, headers=broadcast_headers(apns.jwt, other)).status_code == 200
        # a program for a device token does not touch broadcasts, and a broadcast's refusal uses none up
        apns.post("/control/program", {"gateway": "apns", "token": other, "responses": [{"hang": True}]})
        r = c.post(url, content=b"", headers=broadcast_headers(apns.jwt, other))
        assert r.json() == {"reason": "PayloadEmpty"}
    recs = apns.received("apns", channel=cid)
    assert [x["response"]["status"] for x in recs] == [500, 429, 200]
    assert recs[0]["programmed"] == {"status": 500}


def test_control_channels_seed_and_reset(apns):
    """POST /control/channels makes a channel without the management API; broadcasts to it are
    accepted; /control/reset (all, or that environment's manage gateway) forgets it."""
    ch = apns.post("/control/channels", {"gateway": "apns_dev", "bundle": BUNDLE, "policy": 1})["channel"]
    assert ch["bundle"] == BUNDLE and ch["policy"] == 1 and base64.b64decode(ch["channel_id"])
    fixed = apns.post("/control/channels", {"gateway": "apns_manage", "bundle": BUNDLE,
                                            "channel_id": "dHN0LXNyY2gtY2hubA=="})["channel"]
    assert fixed["channel_id"] == "dHN0LXNyY2gtY2hubA==" and fixed["policy"] == 0
    for bad in ({"gateway": "apns_manage", "bundle": BUNDLE, "channel_id": "dHN0LXNyY2gtY2hubA=="},
                {"gateway": "apns_manage", "bundle": BUNDLE, "policy": 3},
                {"gateway": "webpush", "bundle": BUNDLE}):
        assert apns.ctl.post("/control/channels", json=bad).status_code == 400, bad
    with apns.client() as c:
        dev = apns.info["urls"]["apns_dev"]
        r = c.post(f"{dev}/4/broadcasts/apps/{BUNDLE}", content=json.dumps({"aps": la_aps()}).encode(),
                   headers=broadcast_headers(apns.jwt, ch["channel_id"], **{"apns-expiration": "1"}))
        assert r.status_code == 200
        r = Manage(apns, c, "apns_manage_dev").req("GET", **{"apns-channel-id": ch["channel_id"]})
        assert r.json() == {"message-storage-policy": 1, "push-type": "LiveActivity"}
    listed = apns.post("/control/channels", {"gateway": "apns_manage_dev"})["channels"]
    assert [x["channel_id"] for x in listed] == [ch["channel_id"]]
    apns.post("/control/reset", {"gateway": "apns_dev"})       # APNs development's records, not its channels
    assert len(apns.get("/control/channels", gateway="apns_manage_dev")["channels"]) == 1
    apns.post("/control/reset", {"all": True})
    assert apns.get("/control/channels", gateway="apns_manage_dev")["channels"] == []
    assert apns.get("/control/channels", gateway="apns_manage")["channels"] == []


def test_apns_manage_streams_and_unprocessed_broadcast(apns):
    """The management hosts start at 1 stream and raise to 500 after a valid provider token, as
    APNs; a broadcast left unprocessed by a GOAWAY is recorded with its channel."""
    with apns.client() as c:
        cid = Manage(apns, c).channel()
        Manage(apns, c).req("GET", what="all-channels")
    conn = apns.get("/control/connections", gateway="apns_manage")["connections"][0]
    assert [h["value"] for h in conn["settings_history"]] == [1, 500] and conn["distinct_jwts"] == 1
    apns.post("/control/knobs", {"gateway": "apns", "goaway_after": 1, "goaway_answer_last": False})
    c = RawH2(apns.info["apns"], apns.info["ca"])
    try:
        s1 = c.request(f"/4/broadcasts/apps/{BUNDLE}", broadcast_headers(apns.jwt, cid),
                       json.dumps({"aps": la_aps()}).encode())
        assert c.pump(lambda ev: any(isinstance(e, h2.events.ConnectionTerminated) for e in ev))
        assert c.status(s1) is None
    finally:
        c.close()
    rec = apns.received("apns")[0]
    assert rec["unprocessed"] and rec["broadcast"] and rec["channel_id"] == cid and rec["bundle"] == BUNDLE
