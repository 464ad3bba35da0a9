#!/usr/bin/env python3
"""Loopback test gateways for Herald: APNs, FCM HTTP v1 (+ OAuth2 token endpoint) and Web Push.

One process, nine loopback listeners:
  * apns        TLS, ALPN h2 only            (APNs production: api.push.apple.com; device pushes and
                                           broadcast sends)
  * apns_dev    TLS, ALPN h2 only            (APNs development: api.sandbox.push.apple.com; a gateway of
                                           its own: its records, programs, knobs and connections)
  * apns_manage TLS, ALPN h2 only            (APNs channel management, production:
                                           api-manage-broadcast.push.apple.com:2196)
  * apns_manage_dev TLS, ALPN h2 only        (the same, development: api-manage-broadcast.sandbox.push.apple.com:2195;
                                           its own channels)
  * fcm         TLS, ALPN h2 or http/1.1   (POST /token and POST /v1/projects/P/messages:send)
  * fcm_h1      TLS, ALPN http/1.1 only    (the fcm gateway again, for an FCM origin without HTTP/2)
  * webpush     TLS, ALPN h2 or http/1.1   (POST /push/ID)
  * webpush_h1  TLS, ALPN http/1.1 only    (the webpush gateway again: same subscriptions, records, programs
                                           and knobs; a push service that does not speak HTTP/2)
  * control     plain HTTP/1.1 JSON API    (see README.md)

Usage: python gateways.py --dir STATE_DIR
Writes STATE_DIR/ca.pem, server.pem, server-key.pem and (once listening) gateways.json.
Exits 0 on SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import datetime
import hashlib
import ipaddress
import json
import os
import re
import secrets
import signal
import ssl
import struct
import sys
import time
import urllib.parse
import uuid

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

import http_ece
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import NameOID

HOST = "127.0.0.1"
MAX_BODY = 256 * 1024          # hard cap on any request body (transport level)
MAX_HEADER_BYTES = 32 * 1024   # HTTP/1.1 header block cap
MAX_RECORDS = 100_000          # cap on recorded requests per gateway
BIG_STREAMS = 2**31 - 1
MCS = SettingCodes.MAX_CONCURRENT_STREAMS

GATEWAYS = ("apns", "apns_dev", "fcm", "webpush", "apns_manage", "apns_manage_dev")
# The two APNs environments: one handler, separate hosts (listeners) and separate state, like
# api.push.apple.com and api.sandbox.push.apple.com.
APNS_GATEWAYS = ("apns", "apns_dev")
# APNs channel management (broadcast push), one per environment: api-manage-broadcast.push.apple.com:2196
# and api-manage-broadcast.sandbox.push.apple.com:2195. Each holds the channels of its environment.
MANAGE_GATEWAYS = ("apns_manage", "apns_manage_dev")
MANAGE_OF = {"apns": "apns_manage", "apns_dev": "apns_manage_dev"}
# Listeners that speak only h2 (a TLS connection without ALPN h2 is closed) and raise
# MAX_CONCURRENT_STREAMS after the first valid provider token, as APNs does.
H2_ONLY_GATEWAYS = APNS_GATEWAYS + MANAGE_GATEWAYS
# Extra TLS listeners that serve a gateway of GATEWAYS (its handler, state, records and knobs)
# with other ALPN offers. Read-only views (received, connections) take their name as a filter.
EXTRA_LISTENERS = {"webpush_h1": "webpush", "fcm_h1": "fcm"}

DEFAULT_KNOBS = {
    "apns": {
        "initial_max_streams": 1,      # SETTINGS_MAX_CONCURRENT_STREAMS advertised on connect
        "raised_max_streams": 500,     # advertised after the first request with a valid JWT (null: never)
        "stream_violation": "refuse",  # "refuse" (RST_STREAM REFUSED_STREAM) or "goaway"
        "goaway_after": None,          # send GOAWAY on a connection after its Nth request
        "goaway_reason": "Shutdown",   # JSON {"reason": …} in the GOAWAY debug data (null: none)
        "goaway_error_code": 0,
        "goaway_answer_last": True,    # answer the Nth request before GOAWAY (else it is left unprocessed)
        "goaway_times": None,          # how many connections may get the GOAWAY (null: unlimited)
        "goaway_flood": 0,             # after the GOAWAY, this many more GOAWAY frames in a burst (a hostile server)
        "hang_tokens": [],             # device tokens whose streams are never answered
        "zero_window_times": 0,        # the next N new h2 connections never let a request body in (window 0)
        "strict_token": True,          # device token must be even-length hex (else 400 BadDeviceToken)
        "iat_max_age": 3600,
        "iat_future_skew": 60,
        "delay_ms": 0,
    },
    "fcm": {
        "initial_max_streams": 100,
        "raised_max_streams": None,
        "stream_violation": "refuse",
        "goaway_after": None,
        "goaway_reason": None,
        "goaway_error_code": 0,
        "goaway_answer_last": True,
        "goaway_times": None,
        "goaway_flood": 0,
        "hang_tokens": [],
        "zero_window_times": 0,
        "expires_in": 3600,            # expires_in of issued access tokens
        "token_aud": None,             # list of accepted assertion aud values (null: Google's URL or this gateway's /token URL)
        "delay_ms": 0,
    },
    "webpush": {
        "initial_max_streams": 100,
        "raised_max_streams": None,
        "stream_violation": "refuse",
        "goaway_after": None,
        "goaway_reason": None,
        "goaway_error_code": 0,
        "goaway_answer_last": True,
        "goaway_times": None,
        "goaway_flood": 0,
        "hang_tokens": [],
        "zero_window_times": 0,
        "max_body": 4096,              # larger bodies → 413
        "auth_fail_status": 401,       # status for VAPID failures (401 like autopush, 403 like FCM)
        "exp_future_skew": 5,
        "delay_ms": 0,
    },
}


DEFAULT_KNOBS["apns_dev"] = json.loads(json.dumps(DEFAULT_KNOBS["apns"]))
# The channel-management hosts: the HTTP/2 knobs and provider-token knobs of APNs (Apple documents
# no SETTINGS of their own: they are given APNs' 1-then-500 streams), and the channel limit.
DEFAULT_KNOBS["apns_manage"] = {k: v for k, v in json.loads(json.dumps(DEFAULT_KNOBS["apns"])).items()
                                if k != "strict_token"}
DEFAULT_KNOBS["apns_manage"]["channel_limit"] = 10_000   # channels per app (bundle id) in this environment
DEFAULT_KNOBS["apns_manage_dev"] = json.loads(json.dumps(DEFAULT_KNOBS["apns_manage"]))


# ---------------------------------------------------------------- helpers

def b64u_decode(s: str | bytes) -> bytes:
    if isinstance(s, bytes):
        s = s.decode("ascii")
    s = s.strip().replace("+", "-").replace("/", "_").rstrip("=")
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def b64u(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")


def now_ms() -> int:
    return int(time.time() * 1000)


def short_hash(s: str | bytes) -> str:
    if isinstance(s, str):
        s = s.encode()
    return hashlib.sha256(s).hexdigest()[:16]


class JWTError(Exception):
    pass


def parse_jwt(token: str):
    parts = token.split(".")
    if len(parts) != 3:
        raise JWTError("JWT must have 3 parts")
    try:
        header = json.loads(b64u_decode(parts[0]))
        claims = json.loads(b64u_decode(parts[1]))
        sig = b64u_decode(parts[2])
    except Exception as e:  # noqa: BLE001
        raise JWTError(f"JWT not decodable: {e}")
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise JWTError("JWT header/claims not objects")
    return header, claims, sig, (parts[0] + "." + parts[1]).encode("ascii")


def verify_es256(pub: ec.EllipticCurvePublicKey, signing_input: bytes, sig: bytes):
    if len(sig) != 64:
        raise JWTError(f"ES256 signature must be raw 64-byte R||S, got {len(sig)} bytes"
                       + (" (DER?)" if sig[:1] == b"\x30" else ""))
    der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
    try:
        pub.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise JWTError("bad ES256 signature")


def verify_rs256(pub: rsa.RSAPublicKey, signing_input: bytes, sig: bytes):
    try:
        pub.verify(sig, signing_input, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise JWTError("bad RS256 signature")


def load_public_key(pem: str):
    return serialization.load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)


def decode_body(body: bytes) -> dict:
    out = {"body_len": len(body)}
    try:
        text = body.decode("utf-8")
        out["body_text"] = text
        try:
            out["body"] = json.loads(text)
        except ValueError:
            out["body"] = None
    except UnicodeDecodeError:
        out["body_b64"] = b64u(body)
        out["body"] = None
    return out


# ---------------------------------------------------------------- certificates

def make_certs(state_dir: str):
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Herald Test Gateway CA")])
    ca_cert = (x509.CertificateBuilder()
               .subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {
        "ca": os.path.join(state_dir, "ca.pem"),
        "cert": os.path.join(state_dir, "server.pem"),
        "key": os.path.join(state_dir, "server-key.pem"),
    }
    with open(paths["ca"], "wb") as f:
        f.write(ca_cert.public_bytes(serialization.Encoding.PEM))
    with open(paths["cert"], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(paths["key"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return paths


def tls_context(paths, alpn):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(paths["cert"], paths["key"])
    ctx.set_alpn_protocols(alpn)
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


# ---------------------------------------------------------------- shared state

class Request:
    def __init__(self, gateway, conn, method, path, authority, headers, body, stream_id, http_version):
        self.gateway = gateway
        self.conn = conn
        self.method = method
        self.path = path
        self.authority = authority
        self.headers = headers  # list of (lower-name, value) str pairs, pseudo headers excluded
        self.body = body
        self.stream_id = stream_id
        self.http_version = http_version
        self.time = time.time()

    def header(self, name):
        vals = [v for k, v in self.headers if k == name]
        return vals[0] if vals else None

    def header_all(self, name):
        return [v for k, v in self.headers if k == name]


class Response:
    def __init__(self, status=200, headers=None, body=b"", hang=False, reset=None,
                 delay_ms=0, goaway=None, close=False):
        self.status = status
        self.headers = headers or []
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.hang = hang
        self.reset = reset
        self.delay_ms = delay_ms
        self.goaway = goaway   # reason string: send GOAWAY (with that debug reason) after this response
        self.close = close
        self.record = None     # the request's record: gets "answered_at" once the answer is written whole

    @classmethod
    def json(cls, status, obj, headers=None, **kw):
        h = [("content-type", "application/json; charset=utf-8")] + (headers or [])
        return cls(status, h, json.dumps(obj).encode(), **kw)


class ConnInfo:
    _ids = 0

    def __init__(self, gateway, peer, alpn, listener=None):
        ConnInfo._ids += 1
        self.id = ConnInfo._ids
        self.gateway = gateway
        self.listener = listener or gateway   # which listener accepted it (e.g. webpush or webpush_h1)
        self.peer = peer
        self.alpn = alpn
        self.opened = time.time()
        self.closed = None
        self.requests = 0
        self.open_streams = 0
        self.peak_open_streams = 0
        self.advertised_max_streams = None    # value the client has acknowledged
        self.settings_history = []           # [(time, value, acked_time)]
        self.stream_violations = 0
        self.violation_before_settings_ack = 0
        self.initial_settings_acked = False
        self.jwts = collections.OrderedDict()  # jwt -> info (APNs)
        self.jwt_sequence = []                # distinct JWT hashes in first-use order
        self.current_jwt = None               # APNs: {token, iat, since} of the token in force
        self.goaway_sent = None
        self.goaway_flood_sent = 0            # raw GOAWAY frames sent after the first (knob goaway_flood)
        self.valid_auth_seen = False
        self.raised = False
        self.h2 = None                        # H2Server object, for actions
        self.zero_window = False              # opened with knob zero_window_times (window never opens)
        self.pings = []                       # times of the client's PINGs

    def to_json(self):
        return {
            "id": self.id, "gateway": self.gateway, "listener": self.listener, "peer": self.peer,
            "alpn": self.alpn,
            "opened": self.opened, "closed": self.closed, "requests": self.requests,
            "open_streams": self.open_streams, "peak_open_streams": self.peak_open_streams,
            "advertised_max_streams": self.advertised_max_streams,
            "settings_history": self.settings_history,
            "stream_violations": self.stream_violations,
            "violation_before_settings_ack": self.violation_before_settings_ack,
            "jwts": list(self.jwts.values()),
            "distinct_jwts": len(self.jwts),
            "goaway_sent": self.goaway_sent,
            "goaway_flood_sent": self.goaway_flood_sent,
            "zero_window": self.zero_window,
            "pings": self.pings[-100:],
        }


class State:
    def __init__(self):
        self.ports = {}
        self.seq = 0
        self.apns_keys = {}        # kid -> {team_id, pub, topics}
        self.fcm_keys = {}         # client_email -> {pub, project_id}
        self.webpush_subs = {}     # id -> {priv, auth, vapid_keys:set|None}
        self.webpush_vapid_keys = set()  # global accepted application-server keys (raw 65-byte b64url)
        self.apns_device_env = {}  # device token (lower case) -> the APNs gateway (environment) that issued it
        self.apns_device_kind = {}  # device token (lower case) -> the kind of token it is (alert, voip, liveactivity…)
        self.issued_channel_ids = set()  # every channel id ever issued: a deleted id is never issued again
        self.reset_all()

    def reset_all(self):
        self.reset()
        self.apns_keys.clear()
        self.fcm_keys.clear()
        self.webpush_subs.clear()
        self.webpush_vapid_keys.clear()
        self.apns_device_env.clear()
        self.apns_device_kind.clear()

    def reset(self, gateway=None):
        gws = [gateway] if gateway else list(GATEWAYS)
        if not hasattr(self, "received"):
            self.received = {g: [] for g in GATEWAYS}
            self.programs = {}
            self.knobs = {}
            self.connections = {g: [] for g in GATEWAYS}
            self.fcm_tokens = {}
            self.counters = collections.Counter()
            # Salts and ECDH keys of every Web Push body seen since the gateways started: a
            # reset does not forget them (a reuse is refused across the gateways' lifetime).
            self.webpush_seen_salts = set()
            self.webpush_seen_keyids = set()
            # Broadcast channels per channel-management gateway (environment):
            # channel id -> {channel_id, bundle, policy, push_type, created}, in creation order.
            self.channels = {g: collections.OrderedDict() for g in MANAGE_GATEWAYS}
        for g in gws:
            if g in MANAGE_GATEWAYS:
                self.channels[g].clear()
            self.received[g] = []
            self.knobs[g] = json.loads(json.dumps(DEFAULT_KNOBS[g]))
            self.connections[g] = [c for c in self.connections[g] if c.closed is None]
            for k in [k for k in self.programs if k[0] == g or k[0].startswith(g + "-")]:
                del self.programs[k]
            for k in [k for k in self.counters if _counter_gateway(k) == g]:
                del self.counters[k]
        if "fcm" in gws:
            self.fcm_tokens.clear()

    def record(self, gateway, rec):
        self.seq += 1
        rec["seq"] = self.seq
        lst = self.received[gateway]
        lst.append(rec)
        if len(lst) > MAX_RECORDS:
            del lst[: len(lst) - MAX_RECORDS]
        return rec

    def next_program(self, gateway, token):
        for key in ((gateway, token), (gateway, "*")):
            lst = self.programs.get(key)
            if lst:
                entry = lst[0] if len(lst) == 1 else lst.pop(0)
                return entry
        return None


def _counter_gateway(name):
    """The gateway a counter belongs to: the longest gateway name it starts with (apns_dev_…
    is apns_dev's, apns_… apns's)."""
    owners = [g for g in GATEWAYS if name.startswith(g + "_")]
    return max(owners, key=len) if owners else None


STATE = State()


def conn_knob(gw, name):
    return STATE.knobs[gw].get(name)


# ---------------------------------------------------------------- APNs

APNS_PUSH_TYPES = {"alert", "background", "location", "voip", "complication", "fileprovider",
                   "mdm", "liveactivity", "pushtotalk", "widgets"}
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
APNS_PATH_RE = re.compile(r"^/3/device/([^/?]*)$")


def apns_error(status, reason, timestamp=None, extra_headers=None, apns_id=None, id_header="apns-id"):
    """Apple's error answer: {"reason"} with the request's id (`apns-id`, or `apns-request-id` for
    broadcast sends and channel management)."""
    body = {"reason": reason}
    if timestamp is not None:
        body["timestamp"] = timestamp
    h = [(id_header, apns_id or str(uuid.uuid4()))] + (extra_headers or [])
    return Response.json(status, body, h)


def check_apns_jwt(req, rec):
    """Returns None if the JWT is acceptable, else a Response."""
    k = STATE.knobs[req.gateway]
    auth = req.header_all("authorization")
    if not auth:
        return apns_error(403, "MissingProviderToken")
    m = re.match(r"^bearer\s+(\S+)$", auth[0], re.I)
    if not m:
        rec["jwt_error"] = "authorization is not 'bearer <jwt>'"
        return apns_error(403, "InvalidProviderToken")
    token = m.group(1)
    info = {"hash": short_hash(token)}
    rec["jwt"] = info
    conn = req.conn
    try:
        header, claims, sig, signing_input = parse_jwt(token)
        info.update({"kid": header.get("kid"), "alg": header.get("alg"), "iss": claims.get("iss"),
                     "iat": claims.get("iat")})
        if header.get("alg") != "ES256":
            raise JWTError("alg must be ES256")
        kid = header.get("kid")
        key = STATE.apns_keys.get(kid)
        if key is None:
            raise JWTError(f"unknown kid {kid!r}")
        if claims.get("iss") != key["team_id"]:
            raise JWTError(f"iss {claims.get('iss')!r} != team id")
        verify_es256(key["pub"], signing_input, sig)
        iat = claims.get("iat")
        if not isinstance(iat, int) or isinstance(iat, bool):
            raise JWTError("iat missing or not an integer")
        nowt = time.time()
        if iat > nowt + k["iat_future_skew"]:
            raise JWTError("iat in the future")
        if iat < nowt - k["iat_max_age"]:
            rec["jwt_error"] = "iat older than 1 h"
            info["valid"] = False
            _note_conn_jwt(conn, token, info)
            return apns_error(403, "ExpiredProviderToken")
    except JWTError as e:
        rec["jwt_error"] = str(e)
        info["valid"] = False
        _note_conn_jwt(conn, token, info)
        return apns_error(403, "InvalidProviderToken")
    info["valid"] = True
    current = conn.current_jwt
    first_valid = next((v for v in conn.jwts.values() if v.get("valid")), None)
    _note_conn_jwt(conn, token, info)
    if current is not None and current["token"] != token:
        if first_valid is not None and first_valid.get("kid") != info.get("kid"):
            rec["unrelated_kid"] = True
        if info["iat"] - current["iat"] < 20 * 60:
            # APNs: "Refresh your token no more than once every 20 minutes". A connection's
            # token may be replaced by one issued (iat) at least 20 min after it; a token
            # issued sooner is refused, as often as it is tried. (Judged by iat, not by the
            # arrival time, so a sender on a simulated clock is judged by its own timeline.)
            rec["token_update_too_soon"] = True
            STATE.counters[f"{req.gateway}_token_updates_too_soon"] += 1
            conn.jwts[token]["valid"] = False
            conn.jwts[token]["refused"] = conn.jwts[token].get("refused", 0) + 1
            return apns_error(429, "TooManyProviderTokenUpdates")
    if current is None or current["token"] != token:
        conn.current_jwt = {"token": token, "iat": info["iat"], "since": time.time()}
    return None


def _note_conn_jwt(conn, token, info):
    e = conn.jwts.get(token)
    if e is None:
        e = dict(info)
        e["first_seen"] = time.time()
        e["uses"] = 0
        conn.jwts[token] = e
        conn.jwt_sequence.append(info["hash"])
    e["uses"] += 1
    e["last_seen"] = time.time()
    e["valid"] = info.get("valid")


def handle_apns(req: Request) -> Response:
    gw = req.gateway
    k = STATE.knobs[gw]
    rec = {"gateway": gw, "listener": gw, "time": req.time, "conn": req.conn.id, "stream": req.stream_id,
           "http_version": req.http_version, "method": req.method, "path": req.path,
           "headers": dict(req.headers), "header_list": req.headers}
    rec.update(decode_body(req.body))
    errors = []
    rec["errors"] = errors
    resp = _apns_validate(req, rec, errors, k)
    if resp is None:
        # A broadcast is programmed (and hung) by its channel id, as a device push by its token.
        token = rec.get("channel_id") if rec.get("broadcast") else rec.get("token")
        prog = STATE.next_program(gw, token)
        if token in (k.get("hang_tokens") or []):
            prog = {"hang": True}
        resp = build_programmed(prog, "apns", req, rec) if prog else None
        if resp is None and rec.get("broadcast"):
            resp = Response(200, [("apns-request-id", rec["request_id"])], b"")
        elif resp is None:
            apns_id = req.header("apns-id") or str(uuid.uuid4())
            resp = Response(200, [("apns-id", apns_id)], b"")
    if gw == "apns_dev" and resp.status == 200 and not resp.hang and resp.reset is None:
        # Apple's development environment names each push it accepted for
        # its delivery log (production does not).
        resp.headers.append(("apns-unique-id", str(uuid.uuid4())))
    rec["valid"] = not errors
    _finish_record(gw, rec, resp)
    return resp


# A device token no device can have (all zeros): APNs answers BadDeviceToken once the provider
# token passed. Requests to it are credential probes (`probe: true` in the record).
APNS_NEVER_ISSUED_RE = re.compile(r"(?:00){32,}")


def _apns_validate(req, rec, errors, k):
    def err(status, reason):
        errors.append(reason)
        return apns_error(status, reason, apns_id=req.header("apns-id") if req.header("apns-id") and
                          UUID_RE.match(req.header("apns-id")) else None)
    bm = APNS_BROADCAST_PATH_RE.match(req.path)
    if bm:
        return _apns_broadcast_validate(req, rec, errors, urllib.parse.unquote(bm.group(1)))
    if req.method != "POST":
        return err(405, "MethodNotAllowed")
    m = APNS_PATH_RE.match(req.path)
    if not m:
        return err(404, "BadPath")
    token = urllib.parse.unquote(m.group(1))
    rec["token"] = token
    if APNS_NEVER_ISSUED_RE.fullmatch(token):
        rec["probe"] = True
    if not token:
        return err(400, "MissingDeviceToken")
    names = [n for n, _ in req.headers]
    dups = {n for n in names if names.count(n) > 1 and (n.startswith("apns-") or n == "authorization")}
    if dups:
        rec["duplicate_headers"] = sorted(dups)
        return err(400, "DuplicateHeaders")
    auth_resp = check_apns_jwt(req, rec)
    if auth_resp is not None:
        errors.append(json.loads(auth_resp.body)["reason"])
        return auth_resp
    req.conn.valid_auth_seen = True
    if k["strict_token"] and not re.fullmatch(r"(?:[0-9a-fA-F]{2})+", token):
        return err(400, "BadDeviceToken")
    if APNS_NEVER_ISSUED_RE.fullmatch(token):
        # A well-formed token Apple never issued (all zeros): judged after the provider token,
        # as at Apple, so a credential check learns whether its JWT was accepted.
        return err(400, "BadDeviceToken")
    issued_by = STATE.apns_device_env.get(token.lower())
    if issued_by is not None and issued_by != req.gateway:
        # A token from the other environment: APNs answers 400 BadDeviceToken.
        rec["wrong_environment"] = issued_by
        return err(400, "BadDeviceToken")
    topic = req.header("apns-topic")
    if not topic:
        return err(400, "MissingTopic")
    key = STATE.apns_keys.get((rec.get("jwt") or {}).get("kid")) or {}
    if not apns_topic_allowed(key, topic):
        rec["topic_not_registered"] = topic
        return err(400, "TopicDisallowed")
    push_type = req.header("apns-push-type")
    if push_type is None:
        rec["push_type_missing"] = True
        return err(400, "InvalidPushType")
    if push_type not in APNS_PUSH_TYPES:
        return err(400, "InvalidPushType")
    suffix = apns_topic_suffix(topic)
    need = APNS_TOPIC_SUFFIX.get(push_type)

    def topic_mismatch():
        # The push type needs another topic suffix (or none): Apple's answer for a token sent
        # with the wrong topic, e.g. a Live Activity token with the bare bundle id.
        rec["topic_mismatch"] = {"push_type": push_type, "topic": topic, "topic_suffix": suffix,
                                 "expected_suffix": need}
        return err(400, "DeviceTokenNotForTopic")
    if push_type in APNS_SUFFIXED_PUSH_TYPES:
        if suffix != need:
            return topic_mismatch()
    elif push_type == "voip" and not topic.endswith(".voip"):
        rec["voip_topic_suffix_missing"] = True
        return topic_mismatch()
    elif push_type != "voip" and topic.endswith(".voip"):
        return err(400, "InvalidPushType")
    elif push_type != "voip" and suffix is not None:
        return topic_mismatch()
    token_kind = STATE.apns_device_kind.get(token.lower())
    if token_kind is not None and apns_push_kind(push_type) != token_kind:
        # A token of one kind (registered with /control/apns-devices "kind") sent another kind of push.
        rec["token_kind_mismatch"] = {"token_kind": token_kind, "push_type": push_type}
        return err(400, "DeviceTokenNotForTopic")
    prio = req.header("apns-priority")
    if prio is not None:
        if prio not in ("10", "5", "1"):
            return err(400, "BadPriority")
        if push_type == "background" and prio == "10":
            return err(400, "BadPriority")
        if push_type in ("liveactivity", "location", "widgets") and prio == "1":
            rec["priority_error"] = f"{push_type} takes apns-priority 5 or 10"
            return err(400, "BadPriority")
        if push_type == "pushtotalk" and prio != "10":
            rec["priority_error"] = "pushtotalk takes apns-priority 10"
            return err(400, "BadPriority")
    exp = req.header("apns-expiration")
    if exp is not None and not re.fullmatch(r"\d{1,12}", exp):
        return err(400, "BadExpirationDate")
    if push_type == "pushtotalk" and (exp is None or int(exp) != 0):
        # Apple's guidance for Push to Talk ("set the expiration to 0"), enforced here.
        rec["expiration_error"] = "pushtotalk needs apns-expiration 0" + (" (none sent)" if exp is None else "")
        return err(400, "BadExpirationDate")
    cid = req.header("apns-collapse-id")
    if cid is not None and len(cid.encode("utf-8")) > 64:
        return err(400, "BadCollapseId")
    aid = req.header("apns-id")
    if aid is not None and not UUID_RE.match(aid):
        return err(400, "BadMessageId")
    if not req.body:
        return err(400, "PayloadEmpty")
    limit = 5120 if push_type == "voip" else 4096
    if len(req.body) > limit:
        return err(413, "PayloadTooLarge")
    if not isinstance(rec.get("body"), dict):
        rec["payload_error"] = "payload is not a JSON object"
        return err(400, "BadPayload")
    aps = rec["body"].get("aps")
    if not isinstance(aps, dict):
        rec["payload_error"] = "no aps dictionary"
        return err(400, "BadPayload")
    mismatch = _push_type_mismatch(push_type, aps)
    if mismatch:
        rec["payload_error"] = mismatch
        return err(400, "InvalidPushType")
    problem = _special_payload_problem(push_type, rec["body"], aps)
    if problem:
        rec["payload_error"] = problem
        return err(400, "BadPayload")
    return None


# The apns-topic suffix each push type needs [Apple, "Sending notification requests to APNs"].
APNS_TOPIC_SUFFIX = {"voip": ".voip", "liveactivity": ".push-type.liveactivity", "widgets": ".push-type.widgets",
                     "location": ".location-query", "pushtotalk": ".voip-ptt"}
# Push types judged by their topic suffix alone (DeviceTokenNotForTopic when it is not theirs).
APNS_SUFFIXED_PUSH_TYPES = ("liveactivity", "widgets", "location", "pushtotalk")
# Topics a key's base topic (a bundle id) gives without being registered one by one. `.voip`
# is not among them: a VoIP topic is still registered explicitly, as before these push types.
APNS_DERIVED_SUFFIXES = (".push-type.liveactivity", ".push-type.widgets", ".location-query", ".voip-ptt")
# Kinds of device token (/control/apns-devices "kind"): the push type a token takes.
APNS_TOKEN_KINDS = ("alert", "voip", "liveactivity", "widgets", "location", "pushtotalk")


def apns_topic_suffix(topic):
    """The push-type suffix `topic` ends with (the longest), or None."""
    found = [x for x in APNS_TOPIC_SUFFIX.values() if topic.endswith(x) and len(topic) > len(x)]
    return max(found, key=len) if found else None


def apns_base_topics(key):
    """The key's registered topics that carry no push-type suffix: its bundle ids."""
    return [t for t in key.get("topics", ()) if apns_topic_suffix(t) is None]


def apns_topic_allowed(key, topic):
    if topic in key.get("topics", ()):
        return True
    suffix = apns_topic_suffix(topic)
    return suffix in APNS_DERIVED_SUFFIXES and topic[: -len(suffix)] in apns_base_topics(key)


def apns_push_kind(push_type):
    """The kind of token a push type is for: alert and background both go to an alert token."""
    return "alert" if push_type in ("alert", "background") else push_type


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_b64(s):
    if not isinstance(s, str) or not s:
        return False
    try:
        return len(base64.b64decode(s, validate=True)) > 0
    except (ValueError, TypeError):
        return False


def _special_payload_problem(push_type, body, aps):
    """Why a widgets, liveactivity, location or pushtotalk payload is not one Apple takes (None
    when it is, and for the other push types)."""
    if push_type == "widgets":
        if set(body) != {"aps"} or set(aps) != {"content-changed"} or aps["content-changed"] is not True:
            return 'a widgets payload is exactly {"aps":{"content-changed":true}}'
    elif push_type == "liveactivity":
        return live_activity_problem(aps)
    # location and pushtotalk: aps (an object, possibly empty) is all Apple asks; custom keys
    # at the top level are the app's.
    return None


def _alert_text_problem(name, v):
    if isinstance(v, str):
        return None
    if isinstance(v, dict):
        if not isinstance(v.get("loc-key"), str):
            return f"aps.alert.{name}.loc-key must be a string"
        args = v.get("loc-args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            return f"aps.alert.{name}.loc-args must be a list of strings"
        return None
    return f'aps.alert.{name} must be a string or {{"loc-key","loc-args"}}'


def live_activity_problem(aps, broadcast=False):
    """Why `aps` is not a Live Activity payload Apple takes [ActivityKit push notifications],
    or None. A broadcast (channel) push may only update or end an activity."""
    event = aps.get("event")
    if event not in ("start", "update", "end"):
        return f'aps.event must be "start", "update" or "end", not {json.dumps(event)}'
    if broadcast and event == "start":
        return "broadcast cannot start a Live Activity"
    ts = aps.get("timestamp")
    if not _is_int(ts):
        return "aps.timestamp must be an integer (seconds since 1970)"
    if ts > 10**11:
        return f"aps.timestamp {ts} looks like milliseconds: it must be seconds since 1970"
    if ts < 0:
        return "aps.timestamp must not be negative"
    if "content-state" in aps:
        if not isinstance(aps["content-state"], dict):
            return "aps.content-state must be an object"
    elif event in ("start", "update"):
        return f"aps.content-state is required for {event}"
    for name in ("stale-date", "dismissal-date"):
        if name in aps and not _is_int(aps[name]):
            return f"aps.{name} must be an integer (seconds since 1970)"
    if "relevance-score" in aps and not _is_number(aps["relevance-score"]):
        return "aps.relevance-score must be a number"
    if "alert" in aps:
        alert = aps["alert"]
        if not isinstance(alert, dict):
            return "aps.alert must be an object"
        for name in ("title", "body"):
            if name in alert:
                problem = _alert_text_problem(name, alert[name])
                if problem:
                    return problem
        if "sound" in alert and not isinstance(alert["sound"], str):
            return "aps.alert.sound must be a string"
    if event == "start":
        if "alert" not in aps:
            return "start needs aps.alert"
        if not isinstance(aps.get("attributes-type"), str) or not aps["attributes-type"]:
            return "start needs aps.attributes-type (a non-empty string)"
        if not isinstance(aps.get("attributes"), dict):
            return "start needs aps.attributes (an object)"
    if "input-push-token" in aps:
        if event != "start":
            return "aps.input-push-token is only for start"
        if not _is_int(aps["input-push-token"]) or aps["input-push-token"] != 1:
            return "aps.input-push-token must be 1"
    if "input-push-channel" in aps:
        if event != "start":
            return "aps.input-push-channel is only for start"
        if not _is_b64(aps["input-push-channel"]):
            return "aps.input-push-channel must be a base64 channel id"
    return None


# ---------------------------------------------------------------- APNs broadcast (iOS 18 channels)

APNS_BROADCAST_PATH_RE = re.compile(r"^/4/broadcasts/apps/([^/?]+)$")
MANAGE_PATH_RE = re.compile(r"^/1/apps/([^/?]+)/(channels|all-channels)$")
BROADCAST_MAX_PAYLOAD = 5120   # "max 5 KB (5,120 bytes)" for a broadcast push


def _request_id(req, rec):
    """The apns-request-id of a broadcast or channel-management request: the client's (when it is
    a UUID) or a new one. Every answer carries it."""
    rid = req.header("apns-request-id")
    rec["request_id"] = rid if rid and UUID_RE.match(rid) else str(uuid.uuid4())
    return rec["request_id"]


def _judge_bundle(req, rec, err):
    """Duplicate headers, the provider token and the bundle id of a broadcast or channel request
    (the bare bundle id in the path): None when all is well, else the error answer."""
    names = [n for n, _ in req.headers]
    dups = {n for n in names if names.count(n) > 1 and (n.startswith("apns-") or n == "authorization")}
    if dups:
        rec["duplicate_headers"] = sorted(dups)
        return err(400, "DuplicateHeaders")
    auth_resp = check_apns_jwt(req, rec)
    if auth_resp is not None:
        reason = json.loads(auth_resp.body)["reason"]
        return err(auth_resp.status, reason)
    req.conn.valid_auth_seen = True
    bundle = rec["bundle"]
    if apns_topic_suffix(bundle) is not None:
        # "Ensure that no push type suffix is added to the bundle ID"
        rec["bundle_error"] = f"bundle id {bundle!r} carries the push-type suffix {apns_topic_suffix(bundle)!r}"
        return err(400, "TopicDisallowed")
    key = STATE.apns_keys.get((rec.get("jwt") or {}).get("kid")) or {}
    if bundle not in apns_base_topics(key):
        rec["bundle_error"] = f"bundle id {bundle!r} is not among the key's topics"
        return err(403, "TopicMismatch")
    for name in ("apns-request-id", "apns-id"):
        v = req.header(name)
        if v is not None and not UUID_RE.match(v):
            rec["message_id_error"] = f"{name} is not a UUID"
            return err(400, "BadMessageId")
    return None


def _channel_id_problem(manage_gw, req, rec, err):
    """The apns-channel-id of a request: None when it names a channel of `rec["bundle"]` in that
    environment, else the error answer."""
    cid = req.header("apns-channel-id")
    if cid is None or cid == "":
        return err(400, "MissingChannelId")
    rec["channel_id"] = cid
    if len(cid) > 64 or not _is_b64(cid):
        rec["channel_error"] = "apns-channel-id is not base64" if len(cid) <= 64 else "apns-channel-id over 64 characters"
        return err(400, "BadChannelId")
    ch = STATE.channels[manage_gw].get(cid)
    if ch is None or ch["bundle"] != rec["bundle"]:
        other = next((g for g in MANAGE_GATEWAYS if g != manage_gw and cid in STATE.channels[g]), None)
        rec["channel_error"] = ("a channel of the other environment (" + other + ")" if other else
                                f"a channel of {ch['bundle']!r}" if ch else "no such channel")
        return err(400, "ChannelNotRegistered")
    rec["channel_policy"] = ch["policy"]
    return None


def _apns_broadcast_validate(req, rec, errors, bundle):
    """POST /4/broadcasts/apps/<bundle id> on apns / apns_dev: one Live Activity update or end
    to every device subscribed to the channel in `apns-channel-id` [Apple, "Sending broadcast
    push notification requests to APNs"]. `apns-topic` is not needed and not looked at."""
    rec["broadcast"] = True
    rec["token"] = None      # every record has one; a broadcast's target is its channel_id
    rec["bundle"] = bundle
    rid = _request_id(req, rec)

    def err(status, reason):
        errors.append(reason)
        return apns_error(status, reason, apns_id=rid, id_header="apns-request-id")
    if req.method != "POST":
        return err(405, "MethodNotAllowed")
    bad = _judge_bundle(req, rec, err) or _channel_id_problem(MANAGE_OF[req.gateway], req, rec, err)
    if bad is not None:
        return bad
    push_type = req.header("apns-push-type")
    if push_type is None:
        return err(400, "MissingPushType")
    if push_type.lower() != "liveactivity":
        return err(400, "InvalidPushType")
    prio = req.header("apns-priority")
    if prio is not None and prio not in ("10", "5", "1"):
        return err(400, "BadPriority")
    exp = req.header("apns-expiration")
    if exp is not None and not re.fullmatch(r"\d{1,12}", exp):
        return err(400, "BadExpirationDate")
    if rec["channel_policy"] == 0 and (exp is None or int(exp) != 0):
        # "For No-Messages-Stored channels only 0 is allowed"; a missing header is refused too.
        rec["expiration_error"] = ("a No Message Stored channel (policy 0) takes apns-expiration 0"
                                   + (" (none sent)" if exp is None else ""))
        return err(400, "BadExpirationDate")
    if not req.body:
        return err(400, "PayloadEmpty")
    if len(req.body) > BROADCAST_MAX_PAYLOAD:
        return err(413, "PayloadTooLarge")
    if not isinstance(rec.get("body"), dict):
        rec["payload_error"] = "payload is not a JSON object"
        return err(400, "BadPayload")
    aps = rec["body"].get("aps")
    if not isinstance(aps, dict):
        rec["payload_error"] = "no aps dictionary"
        return err(400, "BadPayload")
    problem = live_activity_problem(aps, broadcast=True)
    if problem:
        rec["payload_error"] = problem
        return err(400, "BadPayload")
    return None


def handle_apns_manage(req: Request) -> Response:
    """Channel management (apns_manage, apns_manage_dev) [Apple, "Sending channel management
    requests to APNs"]: create, read, delete and list the broadcast channels of a bundle id."""
    gw = req.gateway
    k = STATE.knobs[gw]
    rec = {"gateway": gw, "listener": gw, "time": req.time, "conn": req.conn.id, "stream": req.stream_id,
           "http_version": req.http_version, "method": req.method, "path": req.path,
           "headers": dict(req.headers), "header_list": req.headers, "token": None}
    rec.update(decode_body(req.body))
    errors = []
    rec["errors"] = errors
    resp = _manage_validate(req, rec, errors, k)
    if resp is None:
        resp = _manage_apply(req, rec, k)
    rec["valid"] = not errors
    _finish_record(gw, rec, resp)
    return resp


MANAGE_OPS = {("POST", "channels"): "create", ("GET", "channels"): "read", ("DELETE", "channels"): "delete",
              ("GET", "all-channels"): "list"}


def _manage_validate(req, rec, errors, k):
    rid = _request_id(req, rec)

    def err(status, reason):
        errors.append(reason)
        return apns_error(status, reason, apns_id=rid, id_header="apns-request-id")
    m = MANAGE_PATH_RE.match(req.path)
    if not m:
        return err(404, "BadPath")
    rec["bundle"] = urllib.parse.unquote(m.group(1))
    op = MANAGE_OPS.get((req.method, m.group(2)))
    if op is None:
        return err(405, "MethodNotAllowed")
    rec["op"] = op
    bad = _judge_bundle(req, rec, err)
    if bad is not None:
        return bad
    if op in ("read", "delete"):
        return _channel_id_problem(req.gateway, req, rec, err)
    if op == "create":
        try:
            body = json.loads(req.body.decode("utf-8")) if req.body else None
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            rec["params_error"] = "the body is not a JSON object"
            return err(400, "BadRequestPayload")
        unknown = sorted(set(body) - {"message-storage-policy", "push-type"})
        if unknown:
            rec["params_error"] = f"unknown members {unknown}"
            return err(400, "BadRequestParams")
        policy = body.get("message-storage-policy")
        if not _is_int(policy) or policy not in (0, 1):
            rec["params_error"] = f"message-storage-policy must be the integer 0 or 1, not {json.dumps(policy)}"
            return err(400, "BadRequestParams")
        if body.get("push-type") != "LiveActivity":
            rec["params_error"] = f'push-type must be "LiveActivity", not {json.dumps(body.get("push-type"))}'
            return err(400, "BadRequestParams")
        rec["policy"] = policy
        have = sum(1 for c in STATE.channels[req.gateway].values() if c["bundle"] == rec["bundle"])
        if have >= int(k["channel_limit"]):
            rec["params_error"] = f"{have} channels: the limit is {k['channel_limit']} per app and environment"
            return err(400, "CannotCreateChannelConfig")
    return None


def _new_channel_id():
    while True:
        cid = base64.b64encode(secrets.token_bytes(16)).decode("ascii")
        if cid not in STATE.issued_channel_ids:
            STATE.issued_channel_ids.add(cid)
            return cid


def add_channel(gw, bundle, policy, cid=None):
    cid = cid or _new_channel_id()
    STATE.issued_channel_ids.add(cid)
    ch = {"channel_id": cid, "bundle": bundle, "policy": policy, "push_type": "LiveActivity",
          "created": time.time()}
    STATE.channels[gw][cid] = ch
    return ch


def _manage_apply(req, rec, k):
    """The operation of a request that passed the checks (or its programmed answer)."""
    gw, rid, op = req.gateway, rec["request_id"], rec["op"]
    key = rec.get("channel_id") or rec["bundle"]
    prog = STATE.next_program(gw, key)
    if key in (k.get("hang_tokens") or []):
        prog = {"hang": True}
    extra, delay, goaway, close = [], 0, None, False
    if prog is not None:
        status = int(prog.get("status", 200))
        if prog.get("hang") or prog.get("reset") is not None or not 200 <= status < 300 \
                or "body" in prog or prog.get("reason"):
            return build_programmed(prog, "apns", req, rec)
        # A programmed success: the operation is done, late or with extra headers as programmed.
        rec["programmed"] = prog
        extra = [(str(a).lower(), str(b)) for a, b in (prog.get("headers") or {}).items()]
        delay, goaway, close = int(prog.get("delay_ms") or 0), prog.get("goaway"), prog.get("close", False)
    idh = [("apns-request-id", rid)]
    if op == "create":
        ch = add_channel(gw, rec["bundle"], rec["policy"])
        rec["channel_id"] = ch["channel_id"]
        resp = Response(201, idh + [("apns-channel-id", ch["channel_id"])] + extra, b"")
    elif op == "read":
        ch = STATE.channels[gw][rec["channel_id"]]
        resp = Response.json(200, {"message-storage-policy": ch["policy"], "push-type": ch["push_type"]}, idh + extra)
    elif op == "delete":
        del STATE.channels[gw][rec["channel_id"]]
        resp = Response(204, idh + extra, b"")
    else:
        ids = [c["channel_id"] for c in STATE.channels[gw].values() if c["bundle"] == rec["bundle"]]
        rec["channels"] = len(ids)
        resp = Response.json(200, {"channels": ids}, idh + extra)
    resp.delay_ms, resp.goaway, resp.close = delay, goaway, close
    return resp


def _push_type_mismatch(push_type, aps):
    """Why `aps` does not fit `apns-push-type` (None when it does). `background`: a
    content-available push (content-available 1) that shows nothing (no alert, no sound);
    `alert`: something the user sees or hears (alert, badge or sound)."""
    if push_type == "background":
        if aps.get("content-available") != 1:
            return "background push without content-available: 1"
        shown = sorted(k for k in ("alert", "sound") if k in aps)
        if shown:
            return f"background push with {', '.join(shown)}"
    elif push_type == "alert":
        if not any(k in aps for k in ("alert", "badge", "sound")):
            return "alert push with no alert, badge or sound"
    return None


def build_programmed(prog, gw, req, rec):
    """Turns a programmed entry into a Response (None = default success)."""
    if prog is None:
        return None
    rec["programmed"] = prog
    delay = int(prog.get("delay_ms") or 0)
    if prog.get("hang"):
        return Response(hang=True)
    if prog.get("reset") is not None:
        code = prog["reset"]
        if isinstance(code, str):
            code = getattr(ErrorCodes, code.upper(), ErrorCodes.REFUSED_STREAM)
        return Response(reset=int(code), delay_ms=delay)
    status = int(prog.get("status", 200))
    headers = [(str(a).lower(), str(b)) for a, b in (prog.get("headers") or {}).items()]
    if prog.get("retry_after") is not None:
        headers.append(("retry-after", str(prog["retry_after"])))
    goaway = prog.get("goaway")
    if "body" in prog:
        body = prog["body"]
        body = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        ct = [("content-type", "application/json")] if not isinstance(prog["body"], str) else []
        return Response(status, ct + headers, body, delay_ms=delay, goaway=goaway, close=prog.get("close", False))
    if gw == "apns":
        # Broadcast sends and channel-management requests answer with apns-request-id, device pushes with apns-id.
        if rec.get("request_id"):
            idh = [("apns-request-id", rec["request_id"])]
        else:
            idh = [("apns-id", req.header("apns-id") or str(uuid.uuid4()))]
        if status == 200:
            if prog.get("default", True) and not prog.get("reason"):
                return Response(200, idh + headers, b"", delay_ms=delay, goaway=goaway)
        reason = prog.get("reason") or {400: "BadRequestParams" if rec.get("request_id") else "BadDeviceToken",
                                        403: "Forbidden", 404: "BadPath",
                                        405: "MethodNotAllowed", 410: "Unregistered",
                                        413: "PayloadTooLarge", 429: "TooManyRequests",
                                        500: "InternalServerError", 503: "ServiceUnavailable"}.get(status, "Unknown")
        body = {"reason": reason}
        if status == 410:
            body["timestamp"] = int(prog.get("timestamp", now_ms()))
        elif prog.get("timestamp") is not None:
            body["timestamp"] = int(prog["timestamp"])
        r = Response.json(status, body, idh + headers, delay_ms=delay, goaway=goaway)
        return r
    if gw == "fcm":
        code = prog.get("error")
        if status == 200 and not code:
            return None if not headers and not delay and not goaway else \
                Response.json(200, {"name": fcm_name(rec)}, headers, delay_ms=delay, goaway=goaway)
        return fcm_error_response(code, status if "status" in prog else None, prog.get("message"),
                                  headers, delay, goaway, prog.get("retry_after"))
    if gw == "fcm-token":
        if status == 200:
            return None
        return Response.json(status, {"error": prog.get("error", "invalid_grant"),
                                      "error_description": prog.get("message", "programmed failure")},
                             headers, delay_ms=delay, goaway=goaway)
    if gw == "webpush":
        if status in (200, 201, 202):
            return None if not headers and not delay and not goaway and status == 201 else \
                Response(status, [("location", f"/message/{uuid.uuid4()}")] + headers, b"",
                         delay_ms=delay, goaway=goaway)
        if status == 429 and prog.get("retry_after") is None:
            headers.append(("retry-after", "1"))
        msg = prog.get("message") or {404: "Subscription not found", 410: "Subscription gone",
                                      413: "Payload too large", 429: "Too many requests",
                                      400: "Bad request"}.get(status, "error")
        return Response.json(status, {"code": status, "errno": prog.get("errno", 999), "error": msg,
                                      "message": msg}, headers, delay_ms=delay, goaway=goaway)
    return Response(status, headers, b"", delay_ms=delay, goaway=goaway)


def _unprocessed_record(gw, info, pseudo, hdrs, body, sid):
    """A request the gateway took in but left unprocessed (above a GOAWAY's last_stream_id):
    where it went and when, never a response; its body is neither checked nor decrypted."""
    path = pseudo.get(":path", "")
    rec = {"gateway": gw, "listener": info.listener,
           "time": time.time(), "conn": info.id, "stream": sid, "http_version": "h2",
           "method": pseudo.get(":method", ""), "path": path, "headers": dict(hdrs), "body_len": len(body),
           "unprocessed": True, "valid": True, "response": None}
    if gw in ("apns", "apns_dev"):
        m = APNS_PATH_RE.match(path)
        bm = APNS_BROADCAST_PATH_RE.match(path)
        if bm:
            rec.update(broadcast=True, token=None, bundle=urllib.parse.unquote(bm.group(1)),
                       channel_id=dict(hdrs).get("apns-channel-id"))
        else:
            rec["token"] = urllib.parse.unquote(m.group(1)) if m else None
        if rec.get("token") and APNS_NEVER_ISSUED_RE.fullmatch(rec["token"]):
            rec["probe"] = True
    elif gw in MANAGE_GATEWAYS:
        m = MANAGE_PATH_RE.match(path)
        rec["token"] = None
        rec["bundle"] = urllib.parse.unquote(m.group(1)) if m else None
        rec["channel_id"] = dict(hdrs).get("apns-channel-id")
    elif gw == "fcm":
        rec["kind"] = "token" if path.split("?")[0] in ("/token", "/oauth2/v4/token") else "send"
        try:
            parsed = json.loads(body)
            rec["token"] = (parsed.get("message") or {}).get("token")
            if parsed.get("validate_only") is True:
                rec["validate_only"] = rec["probe"] = True
        except (ValueError, AttributeError):
            rec["token"] = None
    else:
        m = WEBPUSH_PATH_RE.match(path)
        rec["token"] = m.group(1) if m else None
    return rec


def _finish_record(gw, rec, resp: Response):
    rec["response"] = {"status": resp.status if not (resp.hang or resp.reset is not None) else None,
                       "hang": resp.hang, "reset": resp.reset,
                       "headers": dict(resp.headers)}
    if resp.body:
        try:
            rec["response"]["body"] = json.loads(resp.body)
        except ValueError:
            rec["response"]["body_text"] = resp.body.decode("utf-8", "replace")
    if rec.get("programmed") is not None:
        STATE.counters[f"{gw}_programmed_{rec['response']['status']}"] += 1
    resp.record = rec
    STATE.record(gw, rec)


# ---------------------------------------------------------------- FCM

FCM_ERRORS = {
    "UNREGISTERED": (404, "NOT_FOUND", "Requested entity was not found."),
    "INVALID_ARGUMENT": (400, "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token"),
    "SENDER_ID_MISMATCH": (403, "PERMISSION_DENIED", "SenderId mismatch"),
    "QUOTA_EXCEEDED": (429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Send requests'"),
    "UNAVAILABLE": (503, "UNAVAILABLE", "The service is currently unavailable."),
    "INTERNAL": (500, "INTERNAL", "Internal error encountered."),
    "THIRD_PARTY_AUTH_ERROR": (401, "UNAUTHENTICATED", "Auth error from APNS or Web Push Service"),
    "UNSPECIFIED_ERROR": (500, "UNKNOWN", "Unknown error"),
}
GOOGLE_TOKEN_AUD = "https://oauth2.googleapis.com/token"
FCM_SCOPES = {"https://www.googleapis.com/auth/firebase.messaging",
              "https://www.googleapis.com/auth/cloud-platform"}
FCM_SEND_RE = re.compile(r"^/v1/projects/([^/]+)/messages:send$")


def fcm_error_response(code, status=None, message=None, headers=None, delay=0, goaway=None, retry_after=None):
    headers = list(headers or [])
    if code in FCM_ERRORS:
        st, canon, msg = FCM_ERRORS[code]
    else:
        st, canon, msg = (status or 500), "UNKNOWN", "error"
    st = status or st
    body = {"error": {"code": st, "message": message or msg, "status": canon}}
    if code:
        body["error"]["details"] = [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                                     "errorCode": code}]
    if (code in ("QUOTA_EXCEEDED", "UNAVAILABLE") or st in (429, 503)) and \
            not any(h[0] == "retry-after" for h in headers):
        headers.append(("retry-after", str(retry_after if retry_after is not None else 1)))
    return Response.json(st, body, headers, delay_ms=delay, goaway=goaway)


def fcm_plain_error(status, canon, message):
    return Response.json(status, {"error": {"code": status, "message": message, "status": canon}})


def fcm_name(rec):
    return f"projects/{rec.get('project') or 'p'}/messages/{secrets.randbelow(10**16):016d}"


def parse_form(body: bytes):
    try:
        return dict(urllib.parse.parse_qsl(body.decode("ascii"), keep_blank_values=True, strict_parsing=False))
    except UnicodeDecodeError:
        return {}


def handle_fcm(req: Request) -> Response:
    if req.path.split("?")[0] in ("/token", "/oauth2/v4/token"):
        return handle_fcm_token(req)
    k = STATE.knobs["fcm"]
    rec = {"gateway": "fcm", "listener": req.conn.listener, "kind": "send", "time": req.time, "conn": req.conn.id,
           "stream": req.stream_id,
           "http_version": req.http_version, "method": req.method, "path": req.path,
           "headers": dict(req.headers)}
    rec.update(decode_body(req.body))
    errors = []
    rec["errors"] = errors
    if isinstance(rec.get("body"), dict) and rec["body"].get("validate_only") is True:
        # A dry run (`validate_only: true`): authenticated and checked, never delivered.
        rec["validate_only"] = True
        rec["probe"] = True

    def fail(resp, why):
        errors.append(why)
        rec["valid"] = False
        _finish_record("fcm", rec, resp)
        return resp

    m = FCM_SEND_RE.match(req.path)
    if not m:
        return fail(fcm_plain_error(404, "NOT_FOUND", "Not found"), "bad path")
    if req.method != "POST":
        return fail(fcm_plain_error(405, "INVALID_ARGUMENT", "Method not allowed"), "bad method")
    rec["project"] = m.group(1)
    auth = req.header("authorization") or ""
    am = re.match(r"^Bearer\s+(\S+)$", auth, re.I)
    tok = STATE.fcm_tokens.get(am.group(1)) if am else None
    rec["access_token_hash"] = short_hash(am.group(1)) if am else None
    if tok is None or tok.get("revoked") or tok["expires_at"] < time.time():
        why = "no bearer token" if not am else ("unknown access token" if tok is None else
                                                 "revoked access token" if tok.get("revoked") else
                                                 "expired access token")
        return fail(fcm_plain_error(401, "UNAUTHENTICATED",
                                    "Request had invalid authentication credentials. Expected OAuth 2 access "
                                    "token, login cookie or other valid authentication credential."), why)
    rec["client_email"] = tok["client_email"]
    proj = STATE.fcm_keys.get(tok["client_email"], {}).get("project_id")
    if proj and proj != rec["project"]:
        return fail(fcm_plain_error(403, "PERMISSION_DENIED", "Permission denied on project"), "wrong project")
    body = rec.get("body")
    msg = body.get("message") if isinstance(body, dict) else None
    if not isinstance(msg, dict):
        return fail(fcm_plain_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received. message missing"),
                    "body is not {message: {...}}")
    targets = [t for t in ("token", "topic", "condition", "fid") if t in msg]
    if len(targets) != 1:
        return fail(fcm_plain_error(400, "INVALID_ARGUMENT", "Exactly one of token, topic, condition is required"),
                    "target count != 1")
    token = msg.get("token") or msg.get(targets[0])
    rec["token"] = token
    bad = _fcm_message_problems(msg, targets[0])
    if bad:
        return fail(fcm_error_response("INVALID_ARGUMENT", message=bad), bad)
    if rec.get("validate_only"):
        # Checked as a send would be, never delivered, no program used up: FCM's dry run
        # answers a fixed name.
        resp = Response.json(200, {"name": f"projects/{rec['project']}/messages/fake_message_id"})
        rec["valid"] = True
        _finish_record("fcm", rec, resp)
        return resp
    prog = STATE.next_program("fcm", token)
    if token in (k.get("hang_tokens") or []):
        prog = {"hang": True}
    resp = build_programmed(prog, "fcm", req, rec) if prog else None
    if resp is None:
        resp = Response.json(200, {"name": fcm_name(rec)})
    rec["valid"] = True
    _finish_record("fcm", rec, resp)
    return resp


# Data keys FCM keeps for itself: "The key should not be a reserved word ("from",
# "message_type", or any word starting with "google" or "gcm")" (Message.data); collapse_key is
# a message option of its own.
FCM_RESERVED_DATA_KEYS = {"from", "message_type", "collapse_key"}
FCM_RESERVED_DATA_PREFIXES = ("google", "gcm")
FCM_PAYLOAD_LIMIT = 4096         # "4096 bytes for most messages … both the keys and the values"
FCM_TOPIC_PAYLOAD_LIMIT = 2048   # "… or 2048 bytes in the case of messages to topics"


def fcm_reserved_data_key(key):
    return key in FCM_RESERVED_DATA_KEYS or key.startswith(FCM_RESERVED_DATA_PREFIXES)


def fcm_payload_size(msg):
    """The bytes FCM counts against its payload limit: the UTF-8 keys and values of `data`,
    `notification`, `android.data` and `android.notification` (a list value counts each of its
    strings). The token, the options and the JSON punctuation are not counted."""
    def count(obj):
        n = 0
        if isinstance(obj, dict):
            for key, value in obj.items():
                n += len(str(key).encode())
                if isinstance(value, str):
                    n += len(value.encode())
                elif isinstance(value, list):
                    n += sum(len(str(v).encode()) for v in value)
                elif value is not None:
                    n += len(json.dumps(value, separators=(",", ":")).encode())
        return n
    android = msg.get("android") if isinstance(msg.get("android"), dict) else {}
    return (count(msg.get("data")) + count(msg.get("notification"))
            + count(android.get("data")) + count(android.get("notification")))


def _fcm_message_problems(msg, target="token"):
    data = msg.get("data")
    if data is not None:
        if not isinstance(data, dict):
            return "Invalid value at 'message.data'"
        for i, (dk, dv) in enumerate(data.items()):
            if not isinstance(dv, str):
                return f"Invalid value at 'message.data[{i}].value' (TYPE_STRING), {json.dumps(dv)}"
            if fcm_reserved_data_key(dk):
                return f"Invalid data payload key: {dk}"
    android = msg.get("android")
    if android is not None:
        if not isinstance(android, dict):
            return "Invalid value at 'message.android'"
        if "priority" in android and android["priority"] not in ("normal", "high", "NORMAL", "HIGH"):
            return "Invalid value at 'message.android.priority'"
        ttl = android.get("ttl")
        if ttl is not None:
            mm = re.fullmatch(r"(\d+)(\.\d{1,9})?s", str(ttl))
            if not mm or int(mm.group(1)) > 2419200:
                return "Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration)"
        ad = android.get("data")
        if ad is not None and (not isinstance(ad, dict) or any(not isinstance(v, str) for v in ad.values())):
            return "Invalid value at 'message.android.data'"
        if isinstance(ad, dict):
            for dk in ad:
                if fcm_reserved_data_key(dk):
                    return f"Invalid data payload key: {dk}"
    limit = FCM_TOPIC_PAYLOAD_LIMIT if target in ("topic", "condition") else FCM_PAYLOAD_LIMIT
    size = fcm_payload_size(msg)
    if size > limit:
        return f"Message is too big: {size} bytes of payload, the limit is {limit}"
    return None


def handle_fcm_token(req: Request) -> Response:
    k = STATE.knobs["fcm"]
    STATE.counters["fcm_token_requests"] += 1
    rec = {"gateway": "fcm", "listener": req.conn.listener, "kind": "token", "time": req.time, "conn": req.conn.id,
           "stream": req.stream_id,
           "http_version": req.http_version, "method": req.method, "path": req.path,
           "headers": dict(req.headers), "body_len": len(req.body)}
    errors = []
    rec["errors"] = errors

    def fail(desc, error="invalid_grant", status=400):
        errors.append(desc)
        rec["valid"] = False
        resp = Response.json(status, {"error": error, "error_description": desc})
        _finish_record("fcm", rec, resp)
        return resp

    if req.method != "POST":
        return fail("method not allowed", "invalid_request", 405)
    ctype = (req.header("content-type") or "").split(";")[0].strip().lower()
    rec["content_type"] = req.header("content-type")
    if ctype != "application/x-www-form-urlencoded":
        return fail(f"Bad Request: content-type must be application/x-www-form-urlencoded, got {ctype!r}",
                    "invalid_request")
    form = parse_form(req.body)
    rec["grant_type"] = form.get("grant_type")
    if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
        return fail("Invalid grant_type", "unsupported_grant_type")
    assertion = form.get("assertion")
    if not assertion:
        return fail("Missing required parameter: assertion", "invalid_request")
    try:
        header, claims, sig, signing_input = parse_jwt(assertion)
        rec["assertion_header"] = header
        rec["claims"] = claims
        if header.get("alg") != "RS256":
            raise JWTError("alg must be RS256")
        key = STATE.fcm_keys.get(claims.get("iss"))
        if key is None:
            raise JWTError(f"Invalid issuer {claims.get('iss')!r}")
        if key.get("revoked"):
            # Google's answer for an assertion signed with a deleted or disabled key.
            rec["key_revoked"] = True
            raise JWTError("Invalid JWT Signature.")
        verify_rs256(key["pub"], signing_input, sig)
        scopes = set(str(claims.get("scope", "")).split())
        if not scopes & FCM_SCOPES:
            raise JWTError("scope lacks firebase.messaging / cloud-platform")
        port = STATE.ports.get("fcm")
        auds = k.get("token_aud") or [GOOGLE_TOKEN_AUD, f"https://127.0.0.1:{port}/token",
                                       f"https://localhost:{port}/token", f"https://[::1]:{port}/token"]
        if claims.get("aud") not in auds:
            raise JWTError(f"Invalid audience {claims.get('aud')!r}")
        iat, exp = claims.get("iat"), claims.get("exp")
        if not isinstance(iat, int) or not isinstance(exp, int):
            raise JWTError("iat/exp missing or not integers")
        nowt = time.time()
        if iat > nowt + 60:
            raise JWTError("iat in the future")
        if exp <= nowt:
            raise JWTError("Token has expired")
        if exp > iat + 3600:
            raise JWTError("exp more than 1 hour after iat")
    except JWTError as e:
        return fail(str(e))
    prog = STATE.next_program("fcm-token", "*")
    resp = build_programmed(prog, "fcm-token", req, rec) if prog else None
    if resp is not None:
        rec["valid"] = True
        _finish_record("fcm", rec, resp)
        return resp
    expires_in = int((prog or {}).get("expires_in") or k["expires_in"])
    access = "ya29.test-" + secrets.token_urlsafe(24)
    STATE.fcm_tokens[access] = {"client_email": claims["iss"], "issued": time.time(),
                                "expires_at": time.time() + expires_in, "revoked": False}
    STATE.counters["fcm_tokens_issued"] += 1
    rec["valid"] = True
    rec["access_token"] = access
    rec["expires_in"] = expires_in
    resp = Response.json(200, {"access_token": access, "expires_in": expires_in, "token_type": "Bearer"})
    _finish_record("fcm", rec, resp)
    return resp


# ---------------------------------------------------------------- Web Push

WEBPUSH_PATH_RE = re.compile(r"^/push/([A-Za-z0-9_\-.~]{1,200})$")
TOPIC_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
URGENCIES = {"very-low", "low", "normal", "high"}


def handle_webpush(req: Request) -> Response:
    k = STATE.knobs["webpush"]
    rec = {"gateway": "webpush", "listener": req.conn.listener, "time": req.time, "conn": req.conn.id,
           "stream": req.stream_id,
           "http_version": req.http_version, "method": req.method, "path": req.path,
           "headers": dict(req.headers), "body_len": len(req.body)}
    errors = []
    rec["errors"] = errors

    def fail(status, why, extra=None):
        errors.append(why)
        rec["valid"] = False
        h = []
        resp = Response.json(status, {"code": status, "errno": extra or 0, "error": why, "message": why}, h)
        _finish_record("webpush", rec, resp)
        return resp

    m = WEBPUSH_PATH_RE.match(req.path)
    if not m:
        return fail(404, "bad path", 102)
    sid = m.group(1)
    rec["token"] = sid
    if req.method != "POST":
        return fail(405, "method not allowed")
    sub = STATE.webpush_subs.get(sid)
    if sub is None:
        # Only a registered subscription has keys to decrypt with: a program alone is not enough.
        return fail(404, "unknown subscription", 102)
    # Headers
    ttl = req.header_all("ttl")
    if len(ttl) != 1 or not re.fullmatch(r"\d{1,12}", ttl[0].strip()):
        return fail(400, "TTL header missing or invalid", 111)
    rec["ttl"] = int(ttl[0])
    urg = req.header_all("urgency")
    if urg:
        if len(urg) != 1 or "," in urg[0] or urg[0].strip() not in URGENCIES:
            return fail(400, "invalid Urgency", 114)
        rec["urgency"] = urg[0].strip()
    topic = req.header_all("topic")
    if topic:
        if len(topic) != 1 or not TOPIC_RE.match(topic[0]):
            return fail(400, "invalid Topic (<= 32 base64url chars)", 113)
        rec["topic"] = topic[0]
    ce = req.header_all("content-encoding")
    if ce != ["aes128gcm"]:
        return fail(400, f"Content-Encoding must be exactly aes128gcm, got {ce}", 110)
    if req.header("encryption") or "dh=" in (req.header("crypto-key") or ""):
        return fail(400, "aes128gcm must not carry Encryption/Crypto-Key dh headers", 110)
    # VAPID
    vap = _check_vapid(req, rec, sub)
    if vap:
        return fail(k["auth_fail_status"], vap, 109)
    # Size
    if len(req.body) > k["max_body"]:
        return fail(413, f"body {len(req.body)} bytes > {k['max_body']}", 104)
    # Decrypted and recorded before anything else is decided: a programmed answer, a hang or a
    # refusal below never skips it.
    derr = _decrypt(req.body, sub, rec)
    if derr:
        return fail(400, derr, 110)
    if rec.get("as_public") and rec.get("vapid", {}).get("k") and \
            b64u_decode(rec["as_public"]) == b64u_decode(rec["vapid"]["k"]):
        return fail(400, "ECDH key equals the VAPID signing key", 110)
    if rec.get("salt_reused"):
        return fail(400, "salt reused: RFC 8291 needs a new random salt for every message", 110)
    if rec.get("ecdh_key_reused"):
        return fail(400, "ephemeral ECDH key reused: RFC 8291 needs a new key pair for every message", 110)
    prog = STATE.next_program("webpush", sid)
    if sid in (k.get("hang_tokens") or []):
        prog = {"hang": True}
    resp = build_programmed(prog, "webpush", req, rec) if prog else None
    if resp is not None and resp.reset == ErrorCodes.REFUSED_STREAM:
        # REFUSED_STREAM tells the client the request was not processed, so it may send the
        # same bytes again: this body's salt and key are not counted as used.
        rec["unprocessed"] = True
        STATE.webpush_seen_salts.discard(req.body[:16])
        STATE.webpush_seen_keyids.discard(req.body[21:21 + 65])
    if resp is None:
        mid = str(uuid.uuid4())
        resp = Response(201, [("location", f"https://{req.authority}/message/{mid}"), ("ttl", str(rec["ttl"]))],
                        b"")
    rec["valid"] = True
    _finish_record("webpush", rec, resp)
    return resp


def _check_vapid(req, rec, sub):
    auth = req.header_all("authorization")
    if len(auth) != 1:
        return "missing Authorization"
    m = re.match(r"^vapid\s+(.*)$", auth[0].strip(), re.I | re.S)
    if not m:
        return "Authorization scheme must be vapid"
    params = {}
    for part in m.group(1).split(","):
        part = part.strip()
        if "=" in part:
            a, b = part.split("=", 1)
            params[a.strip().lower()] = b.strip()
    t, kk = params.get("t"), params.get("k")
    if not t or not kk:
        return "vapid needs t= and k="
    # The JWT itself too: a test checks its signature with a verifier of its own.
    v = {"k": kk, "jwt_hash": short_hash(t), "jwt": t}
    rec["vapid"] = v
    try:
        raw = b64u_decode(kk)
        if len(raw) != 65 or raw[0] != 4:
            return "k is not an uncompressed P-256 point"
        pub = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
    except Exception:  # noqa: BLE001
        return "k is not a valid P-256 public key"
    allowed = None
    if sub is not None and sub.get("vapid_keys"):
        allowed = sub["vapid_keys"]
    elif STATE.webpush_vapid_keys:
        allowed = STATE.webpush_vapid_keys
    if allowed is not None and b64u(raw) not in allowed:
        return "VAPID public key mismatch"
    try:
        header, claims, sig, signing_input = parse_jwt(t)
        v.update({"header": header, "aud": claims.get("aud"), "exp": claims.get("exp"), "sub": claims.get("sub")})
        if header.get("alg") != "ES256":
            return "JWT alg must be ES256"
        verify_es256(pub, signing_input, sig)
    except JWTError as e:
        return f"VAPID JWT: {e}"
    origin = f"https://{req.authority}" if req.authority else None
    if claims.get("aud") != origin:
        return f"aud {claims.get('aud')!r} is not the push resource origin {origin!r}"
    exp = claims.get("exp")
    nowt = time.time()
    if not isinstance(exp, int) or isinstance(exp, bool):
        return "exp missing"
    if exp <= nowt:
        return "Auth expired"
    if exp > nowt + 86400 + STATE.knobs["webpush"]["exp_future_skew"]:
        return "Auth > 24 hours in the future"
    s = claims.get("sub")
    if not isinstance(s, str) or not (s.startswith("mailto:") or s.startswith("https:")):
        return "sub must be a mailto: or https: URI"
    return None


def _decrypt(body, sub, rec):
    if len(body) < 21:
        return "body shorter than the aes128gcm header"
    salt, rs, idlen = body[:16], int.from_bytes(body[16:20], "big"), body[20]
    keyid = body[21:21 + idlen]
    rec["salt"] = b64u(salt)
    rec["rs"] = rs
    rec["as_public"] = b64u(keyid)
    if idlen != 65 or keyid[:1] != b"\x04":
        return "keyid must be the 65-byte application-server ECDH public key"
    if rs < 18:
        return "rs < 18"
    content_len = len(body) - 21 - idlen
    if content_len > rs:
        return "more than one record (RFC 8291 requires a single record)"
    if salt in STATE.webpush_seen_salts:
        rec["salt_reused"] = True
    if bytes(keyid) in STATE.webpush_seen_keyids:
        rec["ecdh_key_reused"] = True
    STATE.webpush_seen_salts.add(salt)
    STATE.webpush_seen_keyids.add(bytes(keyid))
    try:
        plain = http_ece.decrypt(body, private_key=sub["priv"], auth_secret=sub["auth"], version="aes128gcm")
    except Exception as e:  # noqa: BLE001
        return f"decryption failed: {e}"
    rec["plaintext_len"] = len(plain)
    rec["padding_len"] = content_len - 16 - 1 - len(plain)
    try:
        text = plain.decode("utf-8")
        rec["plaintext"] = text
        try:
            rec["plaintext_json"] = json.loads(text)
        except ValueError:
            rec["plaintext_json"] = None
    except UnicodeDecodeError:
        rec["plaintext_b64"] = b64u(plain)
    return None


HANDLERS = {"apns": handle_apns, "apns_dev": handle_apns, "fcm": handle_fcm, "webpush": handle_webpush,
            "apns_manage": handle_apns_manage, "apns_manage_dev": handle_apns_manage}


# ---------------------------------------------------------------- HTTP/2 server

CONNS = set()


class H2Server:
    def __init__(self, gw, reader, writer, info: ConnInfo):
        self.gw = gw
        self.reader = reader
        self.writer = writer
        self.info = info
        info.h2 = self
        cfg = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.conn = h2.connection.H2Connection(cfg)
        self.streams = {}       # sid -> dict(headers, body, too_big)
        self.pending = {}       # sid -> [bytes remaining, end_stream]
        self.tasks = set()
        self.closing = False
        self.answered = set()
        self.records = {}           # sid -> the request's record, until its answer is written
        self.task_sids = {}         # answer task -> stream id
        self.refuse_above = None    # set by a GOAWAY: later streams above it are not processed

    def flush(self):
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def run(self):
        k = STATE.knobs[self.gw]
        initial = int(k.get("initial_max_streams") or 100)
        values = {MCS: initial, SettingCodes.MAX_HEADER_LIST_SIZE: 65536}
        if int(k.get("zero_window_times") or 0) > 0:
            # A stalled flow control: SETTINGS_INITIAL_WINDOW_SIZE 0 and no WINDOW_UPDATE ever, so
            # request bodies never arrive; PINGs are still answered.
            k["zero_window_times"] = int(k["zero_window_times"]) - 1
            values[SettingCodes.INITIAL_WINDOW_SIZE] = 0
            self.info.zero_window = True
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values=values)
        self.conn.initiate_connection()
        self.conn.local_settings._settings[MCS] = collections.deque([BIG_STREAMS])  # we enforce ourselves
        self.limit = initial
        self.pending_limits = collections.deque([initial])
        self.info.settings_history.append({"time": time.time(), "value": initial, "acked": None})
        self.flush()
        try:
            while not self.closing:
                data = await self.reader.read(65536)
                if not data:
                    break
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError as e:
                    self.info.protocol_error = str(e)
                    self.flush()
                    break
                for ev in events:
                    self.on_event(ev)
                self.flush()
                await self.writer.drain()
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            for t in list(self.tasks):
                t.cancel()
            self.info.closed = time.time()
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001
                pass

    def on_event(self, ev):
        if isinstance(ev, h2.events.RequestReceived):
            sid = ev.stream_id
            hdrs = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in ev.headers]
            self.info.open_streams += 1
            self.info.peak_open_streams = max(self.info.peak_open_streams, self.info.open_streams)
            if self.info.open_streams > self.limit:
                self.info.stream_violations += 1
                if not self.info.initial_settings_acked:
                    self.info.violation_before_settings_ack += 1
                STATE.counters[f"{self.gw}_stream_violations"] += 1
                if STATE.knobs[self.gw].get("stream_violation") == "goaway":
                    self.goaway(ErrorCodes.PROTOCOL_ERROR, "Maximum active streams violated for this endpoint.",
                                last_stream_id=sid - 2 if sid > 2 else 0)
                    return
                self.info.open_streams -= 1
                self.conn.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
                self.answered.add(sid)
                return
            self.streams[sid] = {"headers": hdrs, "body": bytearray(), "too_big": False}
            if ev.stream_ended:
                self.dispatch(sid)
        elif isinstance(ev, h2.events.DataReceived):
            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            st = self.streams.get(ev.stream_id)
            if st is not None:
                if len(st["body"]) + len(ev.data) > MAX_BODY:
                    st["too_big"] = True
                else:
                    st["body"] += ev.data
            if ev.stream_ended:
                self.dispatch(ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            self.dispatch(ev.stream_id)
        elif isinstance(ev, h2.events.StreamReset):
            if ev.stream_id in self.streams or (ev.stream_id not in self.answered):
                self.streams.pop(ev.stream_id, None)
                self.pending.pop(ev.stream_id, None)
                if ev.stream_id not in self.answered:
                    self.answered.add(ev.stream_id)
                    self.info.open_streams = max(0, self.info.open_streams - 1)
        elif isinstance(ev, h2.events.PingReceived):
            # h2 answers it; the time is kept: a client PINGs a connection it suspects of silence
            self.info.pings.append(time.time())
        elif isinstance(ev, h2.events.WindowUpdated):
            for sid in list(self.pending):
                self.push_data(sid)
        elif isinstance(ev, h2.events.SettingsAcknowledged):
            # SETTINGS are acknowledged in order: each ACK makes the oldest
            # unacknowledged MAX_CONCURRENT_STREAMS the one in force.
            if self.pending_limits:
                self.limit = self.pending_limits.popleft()
            for h in self.info.settings_history:
                if h["acked"] is None:
                    h["acked"] = time.time()
                    break
            self.info.initial_settings_acked = True
            self.info.advertised_max_streams = self.limit
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.closing = True

    def dispatch(self, sid):
        st = self.streams.pop(sid, None)
        if st is None:
            return
        if self.refuse_above is not None and sid > self.refuse_above:
            return  # above a GOAWAY's last stream: never processed
        pseudo = {n: v for n, v in st["headers"] if n.startswith(":")}
        hdrs = [(n, v) for n, v in st["headers"] if not n.startswith(":")]
        self.info.requests += 1
        nreq = self.info.requests
        if st["too_big"]:
            self.respond(sid, Response.json(413, {"reason": "PayloadTooLarge"}))
            return
        k = STATE.knobs[self.gw]
        ga = k.get("goaway_after")
        goaway_now = False
        if ga and nreq == int(ga) and not self.info.goaway_sent:
            times = k.get("goaway_times")
            if times is None or times > 0:
                if times is not None:
                    k["goaway_times"] = times - 1
                goaway_now = True
        if goaway_now and not k.get("goaway_answer_last", True):
            # Request N is not processed: the client must send it again. It is recorded as
            # `unprocessed` (no answer, nothing decrypted or counted as used: the client may send
            # the very same bytes again on a new connection).
            STATE.record(self.gw, _unprocessed_record(self.gw, self.info, pseudo, hdrs, bytes(st["body"]), sid))
            self.goaway(int(k.get("goaway_error_code") or 0), k.get("goaway_reason"), last_stream_id=sid - 2 if sid > 2 else 0)
            return
        req = Request(self.gw, self.info, pseudo.get(":method", ""), pseudo.get(":path", ""),
                      pseudo.get(":authority") or dict(hdrs).get("host", ""), hdrs, bytes(st["body"]), sid, "h2")
        try:
            resp = HANDLERS[self.gw](req)
        except Exception as e:  # noqa: BLE001
            resp = Response.json(500, {"reason": "InternalServerError", "gateway_exception": repr(e)})
        delay = (resp.delay_ms or 0) + int(k.get("delay_ms") or 0)
        if resp.record is not None:
            self.records[sid] = resp.record
        t = asyncio.get_running_loop().create_task(self.answer(sid, resp, delay, goaway_now))
        self.tasks.add(t)
        self.task_sids[t] = sid
        t.add_done_callback(self._task_done)

    def _task_done(self, t):
        self.tasks.discard(t)
        self.task_sids.pop(t, None)

    async def answer(self, sid, resp, delay, goaway_now):
        if delay:
            await asyncio.sleep(delay / 1000)
        if resp.hang:
            if goaway_now:
                self.after_answer(sid, goaway_now, resp)
            return
        if self.writer.is_closing():
            return
        try:
            if resp.reset is not None:
                self.conn.reset_stream(sid, resp.reset)
                self.answered.add(sid)
                self.info.open_streams = max(0, self.info.open_streams - 1)
                self._mark_answered(sid)
            else:
                self.respond(sid, resp)
            self.after_answer(sid, goaway_now, resp)
            self.flush()
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass

    def after_answer(self, sid, goaway_now, resp):
        k = STATE.knobs[self.gw]
        if self.gw in H2_ONLY_GATEWAYS and not self.info.raised and self.info.valid_auth_seen \
                and k.get("raised_max_streams") and not self.info.goaway_sent:
            self.info.raised = True
            v = int(k["raised_max_streams"])
            self.conn.update_settings({MCS: v})
            self.conn.local_settings._settings[MCS] = collections.deque([BIG_STREAMS])
            self.pending_limits.append(v)
            self.info.settings_history.append({"time": time.time(), "value": v, "acked": None})
        elif self.gw not in H2_ONLY_GATEWAYS and not self.info.raised and k.get("raised_max_streams"):
            self.info.raised = True
            v = int(k["raised_max_streams"])
            self.conn.update_settings({MCS: v})
            self.conn.local_settings._settings[MCS] = collections.deque([BIG_STREAMS])
            self.pending_limits.append(v)
            self.info.settings_history.append({"time": time.time(), "value": v, "acked": None})
        if resp.goaway is not None:
            self.goaway(0, resp.goaway if isinstance(resp.goaway, str) else None, last_stream_id=sid)
        elif goaway_now:
            self.goaway(int(k.get("goaway_error_code") or 0), k.get("goaway_reason"), last_stream_id=sid)
        elif resp.close:
            self.goaway(0, None, last_stream_id=sid)

    def respond(self, sid, resp: Response):
        headers = [(":status", str(resp.status))] + [(n, v) for n, v in resp.headers]
        if resp.body:
            headers.append(("content-length", str(len(resp.body))))
        self.conn.send_headers(sid, headers, end_stream=not resp.body)
        if resp.body:
            self.pending[sid] = [resp.body, True]
            self.push_data(sid)
        else:
            self.stream_done(sid)
        self.flush()

    def push_data(self, sid):
        p = self.pending.get(sid)
        if p is None:
            return
        try:
            while p[0]:
                window = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
                if window <= 0:
                    return
                chunk, p[0] = p[0][:window], p[0][window:]
                self.conn.send_data(sid, chunk, end_stream=not p[0])
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass
        self.pending.pop(sid, None)
        self.stream_done(sid)

    def stream_done(self, sid):
        if sid not in self.answered:
            self.answered.add(sid)
            self.info.open_streams = max(0, self.info.open_streams - 1)
            self._mark_answered(sid)

    def _mark_answered(self, sid):
        # The record of a request whose answer was never written (hang, the client closed the stream
        # or the connection first) keeps no "answered_at": the client cannot have had that answer.
        rec = self.records.pop(sid, None)
        if rec is not None:
            rec["answered_at"] = time.time()

    def goaway(self, code, reason, last_stream_id=None):
        """GOAWAY with last_stream_id: streams up to it are processed and answered (the
        frame goes out once their answers are written, at most 1 s later); streams above
        it are not processed."""
        if self.info.goaway_sent:
            return
        self.info.goaway_sent = {"time": time.time(), "error_code": int(code), "reason": reason,
                                 "last_stream_id": last_stream_id}
        STATE.counters[f"{self.gw}_goaways"] += 1
        last = last_stream_id if last_stream_id is not None else self.conn.highest_inbound_stream_id
        self.refuse_above = last
        current = asyncio.current_task()
        waiting = [t for t, sid in self.task_sids.items() if sid <= last and t is not current]
        t = asyncio.get_running_loop().create_task(self._send_goaway(code, reason, last, waiting))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def _send_goaway(self, code, reason, last_stream_id, waiting):
        if waiting:
            await asyncio.wait(waiting, timeout=1.0)
        data = json.dumps({"reason": reason}).encode() if reason else None
        try:
            self.conn.close_connection(error_code=code, additional_data=data, last_stream_id=last_stream_id)
        except h2.exceptions.ProtocolError:
            pass
        self.flush()
        flood = int(STATE.knobs[self.gw].get("goaway_flood") or 0)
        if flood > 0 and not self.writer.is_closing():
            # The h2 library sends one GOAWAY; these are raw frames (type 7 on stream 0, the same
            # last stream, NO_ERROR), as a hostile server would keep sending them.
            frame = struct.pack(">I", 8)[1:] + bytes([7, 0]) + struct.pack(">III", 0, last_stream_id, 0)
            self.writer.write(frame * flood)
            self.info.goaway_flood_sent = flood
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, self._hard_close)

    def _hard_close(self):
        self.closing = True
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------- HTTP/1.1 server (TLS gateways and control)

async def read_http1_request(reader, max_body=MAX_BODY):
    """Returns (method, target, version, headers[list], body) or None on EOF. Raises ValueError on bad input."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise ValueError("truncated request head")
    except asyncio.LimitOverrunError:
        raise ValueError("request head too large")
    if len(head) > MAX_HEADER_BYTES:
        raise ValueError("request head too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise ValueError("bad request line")
    method, target, version = parts
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        if ":" not in line:
            raise ValueError("bad header line")
        n, v = line.split(":", 1)
        headers.append((n.strip().lower(), v.strip()))
    hd = dict(headers)
    body = b""
    if "chunked" in hd.get("transfer-encoding", "").lower():
        chunks = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if len(chunks) + size > max_body:
                raise OverflowError("body too large")
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            chunks += await reader.readexactly(size)
            await reader.readexactly(2)
        body = bytes(chunks)
    elif "content-length" in hd:
        n = int(hd["content-length"])
        if n < 0:
            raise ValueError("bad content-length")
        if n > max_body:
            raise OverflowError("body too large")
        body = await reader.readexactly(n)
    return method, target, version, headers, body


def http1_response_bytes(status, headers, body, close=False):
    reasons = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
               403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 410: "Gone",
               413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
               503: "Service Unavailable"}
    out = [f"HTTP/1.1 {status} {reasons.get(status, 'Status')}"]
    for n, v in headers:
        if n.lower() not in ("content-length", "connection"):
            out.append(f"{n}: {v}")
    out.append(f"content-length: {len(body)}")
    if close:
        out.append("connection: close")
    return ("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body


async def serve_http1_gateway(gw, reader, writer, info):
    try:
        while True:
            try:
                r = await read_http1_request(reader)
            except OverflowError:
                writer.write(http1_response_bytes(413, [], b'{"error":"body too large"}', close=True))
                await writer.drain()
                return
            except ValueError:
                writer.write(http1_response_bytes(400, [], b'{"error":"bad request"}', close=True))
                await writer.drain()
                return
            if r is None:
                return
            method, target, version, headers, body = r
            info.requests += 1
            host = dict(headers).get("host", "")
            req = Request(gw, info, method, target, host, headers, body, None, "http/1.1")
            try:
                resp = HANDLERS[gw](req)
            except Exception as e:  # noqa: BLE001
                resp = Response.json(500, {"error": repr(e)})
            delay = (resp.delay_ms or 0) + int(STATE.knobs[gw].get("delay_ms") or 0)
            if delay:
                await asyncio.sleep(delay / 1000)
            if resp.hang:
                await asyncio.sleep(3600)
                return
            if resp.reset is not None:
                return  # close the connection without an answer
            close = resp.close or resp.goaway is not None or \
                dict(headers).get("connection", "").lower() == "close"
            writer.write(http1_response_bytes(resp.status, resp.headers, resp.body, close=close))
            await writer.drain()
            if resp.record is not None:
                resp.record["answered_at"] = time.time()
            if close:
                return
    except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        info.closed = time.time()
        try:
            writer.close()
        except Exception:  # noqa: BLE001
            pass


def make_gateway_handler(gw, listener=None):
    async def handler(reader, writer):
        task = asyncio.current_task()
        CONNS.add(task)
        try:
            sslobj = writer.get_extra_info("ssl_object")
            alpn = sslobj.selected_alpn_protocol() if sslobj else None
            peer = writer.get_extra_info("peername")
            info = ConnInfo(gw, f"{peer[0]}:{peer[1]}" if peer else None, alpn, listener)
            STATE.connections[gw].append(info)
            if len(STATE.connections[gw]) > 10000:
                del STATE.connections[gw][:1000]
            if alpn == "h2":
                await H2Server(gw, reader, writer, info).run()
            elif gw in H2_ONLY_GATEWAYS:
                info.closed = time.time()
                info.error = "APNs requires ALPN h2"
                writer.close()
            else:
                await serve_http1_gateway(gw, reader, writer, info)
        finally:
            CONNS.discard(task)
    return handler


# ---------------------------------------------------------------- control API

class ControlError(Exception):
    def __init__(self, status, msg):
        super().__init__(msg)
        self.status = status


def _gw(body_or_q, required=True):
    g = body_or_q.get("gateway")
    if g is None and not required:
        return None
    if g not in GATEWAYS:
        raise ControlError(400, f"gateway must be one of {GATEWAYS}")
    return g


def _gw_view(q):
    """(gateway, listener or None) for read-only views: a gateway, or an extra listener's name
    (its gateway's records or connections that came through that listener)."""
    g = q.get("gateway")
    if g in EXTRA_LISTENERS:
        return EXTRA_LISTENERS[g], g
    if g not in GATEWAYS:
        raise ControlError(400, f"gateway must be one of {GATEWAYS + tuple(EXTRA_LISTENERS)}")
    return g, None


def ctl_program(b):
    g = b.get("gateway")
    if g not in GATEWAYS + ("fcm-token",):
        raise ControlError(400, "gateway must be apns, apns_dev, apns_manage, apns_manage_dev, fcm, fcm-token "
                                "or webpush")
    token = b.get("token", "*")
    responses = b.get("responses")
    if responses is None and "response" in b:
        responses = [b["response"]]
    if not isinstance(responses, list) or not all(isinstance(r, dict) for r in responses):
        raise ControlError(400, "responses must be a list of objects")
    key = (g, token)
    if b.get("append"):
        STATE.programs.setdefault(key, []).extend(responses)
    elif responses:
        STATE.programs[key] = list(responses)
    else:
        STATE.programs.pop(key, None)
    return {"ok": True, "queued": len(STATE.programs.get(key, []))}


def ctl_apns_key(b):
    try:
        pub = load_public_key(b["public_key_pem"])
    except Exception as e:  # noqa: BLE001
        raise ControlError(400, f"bad public_key_pem: {e}")
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        raise ControlError(400, "APNs key must be EC P-256")
    topics = b.get("topics")
    if not isinstance(topics, list) or not topics or not all(isinstance(t, str) and t for t in topics):
        # APNs knows which topics (bundle ids, and <bundle id>.voip) a team's key may push to.
        raise ControlError(400, "topics: the non-empty list of apns-topic values this key serves "
                                "(the bundle id, and <bundle id>.voip for VoIP)")
    STATE.apns_keys[b["key_id"]] = {"team_id": b["team_id"], "pub": pub, "topics": list(topics)}
    return {"ok": True}


def ctl_apns_devices(b):
    """Device tokens issued by one APNs environment: sent to the other one, they get 400
    BadDeviceToken, as at Apple. Tokens never registered are accepted by both.
    With "kind" (alert, voip, liveactivity, widgets, location, pushtotalk), the tokens take only
    that kind of push (alert and background are both "alert"); another gets 400
    DeviceTokenNotForTopic. "kind": null forgets the kind. "gateway" may be left out when "kind"
    is given: then the tokens' environment is left as it was."""
    g = b.get("gateway")
    has_kind = "kind" in b
    if g is None and not has_kind or g is not None and g not in APNS_GATEWAYS:
        raise ControlError(400, f"gateway must be one of {APNS_GATEWAYS}")
    kind = b.get("kind")
    if kind is not None and kind not in APNS_TOKEN_KINDS:
        raise ControlError(400, f"kind must be one of {APNS_TOKEN_KINDS} or null")
    tokens = b.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
        raise ControlError(400, "tokens must be a list of device tokens")
    for t in tokens:
        if g is not None:
            STATE.apns_device_env[t.lower()] = g
        if has_kind:
            if kind is None:
                STATE.apns_device_kind.pop(t.lower(), None)
            else:
                STATE.apns_device_kind[t.lower()] = kind
    return {"ok": True, "registered": len(tokens)}


def _manage_gw(body_or_q):
    """The channel-management gateway named (apns and apns_dev name their environment's)."""
    g = body_or_q.get("gateway")
    g = MANAGE_OF.get(g, g)
    if g not in MANAGE_GATEWAYS:
        raise ControlError(400, f"gateway must be one of {MANAGE_GATEWAYS + APNS_GATEWAYS}")
    return g


def _channel_json(ch):
    return {"channel_id": ch["channel_id"], "bundle": ch["bundle"], "policy": ch["policy"],
            "push_type": ch["push_type"], "created": ch["created"]}


def ctl_channels(q):
    g = _manage_gw(q)
    bundle = q.get("bundle")
    return {"gateway": g, "channels": [_channel_json(c) for c in STATE.channels[g].values()
                                       if bundle is None or c["bundle"] == bundle]}


def ctl_channels_post(b):
    """Creates a channel directly (no limit, no key needed): {"gateway", "bundle", "policy"?: 0|1
    (default 0), "channel_id"?: base64 (default: a new one)}. Without "bundle": lists, as GET."""
    g = _manage_gw(b)
    if "bundle" not in b:
        return ctl_channels(b)
    bundle, policy, cid = b["bundle"], b.get("policy", 0), b.get("channel_id")
    if not isinstance(bundle, str) or not bundle:
        raise ControlError(400, "bundle must be a bundle id")
    if not _is_int(policy) or policy not in (0, 1):
        raise ControlError(400, "policy must be 0 or 1")
    if cid is not None and (not _is_b64(cid) or len(cid) > 64 or any(cid in STATE.channels[x] for x in MANAGE_GATEWAYS)):
        raise ControlError(400, "channel_id must be a new base64 string of at most 64 characters")
    return {"ok": True, "gateway": g, "channel": _channel_json(add_channel(g, bundle, policy, cid))}


def ctl_fcm_key(b):
    try:
        pub = load_public_key(b["public_key_pem"])
    except Exception as e:  # noqa: BLE001
        raise ControlError(400, f"bad public_key_pem: {e}")
    if not isinstance(pub, rsa.RSAPublicKey):
        raise ControlError(400, "FCM service-account key must be RSA")
    STATE.fcm_keys[b["client_email"]] = {"pub": pub, "project_id": b.get("project_id")}
    return {"ok": True, "token_uri": f"https://127.0.0.1:{STATE.ports['fcm']}/token"}


def ctl_fcm_revoke(b):
    if b.get("key"):
        # The service account's key itself (deleted in the console): its access tokens stop
        # working and every later exchange is refused, until the key is registered again.
        email = b.get("client_email")
        if email not in STATE.fcm_keys:
            raise ControlError(404, f"no FCM key registered for {email!r}")
        STATE.fcm_keys[email]["revoked"] = True
    n = 0
    for tok, info in STATE.fcm_tokens.items():
        if b.get("all") or b.get("access_token") == tok or b.get("client_email") == info["client_email"]:
            info["revoked"] = True
            n += 1
    return {"ok": True, "revoked": n}


def ctl_webpush_subscription(b):
    ids = b.get("ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or len(ids) > 100_000:
            raise ControlError(400, "ids must be a list of 1 to 100000 subscription ids")
        for sid in ids:
            if not isinstance(sid, str) or not WEBPUSH_PATH_RE.match("/push/" + sid):
                raise ControlError(400, "id must be 1-200 chars of [A-Za-z0-9_-.~]")
    sid = (ids or [None])[0] or b.get("id") or secrets.token_urlsafe(16)
    if not WEBPUSH_PATH_RE.match("/push/" + sid):
        raise ControlError(400, "id must be 1-200 chars of [A-Za-z0-9_-.~]")
    if b.get("private_key_pem"):
        priv = serialization.load_pem_private_key(b["private_key_pem"].encode(), password=None)
    elif b.get("d"):
        priv = ec.derive_private_key(int.from_bytes(b64u_decode(b["d"]), "big"), ec.SECP256R1())
    else:
        priv = ec.generate_private_key(ec.SECP256R1())
    if not isinstance(priv, ec.EllipticCurvePrivateKey):
        raise ControlError(400, "subscription key must be EC P-256")
    auth = b64u_decode(b["auth"]) if b.get("auth") else secrets.token_bytes(16)
    if len(auth) != 16:
        raise ControlError(400, "auth must be 16 bytes")
    vk = b.get("vapid_public_key")
    vapid_keys = None
    listener = b.get("listener", "webpush")
    if listener != "webpush" and EXTRA_LISTENERS.get(listener) != "webpush":
        raise ControlError(400, "listener must be webpush or webpush_h1")
    if vk:
        vapid_keys = {b64u(_vapid_raw(x)) for x in (vk if isinstance(vk, list) else [vk])}
    p256dh = priv.public_key().public_bytes(serialization.Encoding.X962,
                                            serialization.PublicFormat.UncompressedPoint)
    out = {"ok": True, "id": sid, "endpoint": f"https://127.0.0.1:{STATE.ports[listener]}/push/{sid}",
           "p256dh": b64u(p256dh), "auth": b64u(auth)}
    for one in ids or [sid]:
        STATE.webpush_subs[one] = {"priv": priv, "auth": auth, "vapid_keys": vapid_keys}
    if ids:
        out["endpoints"] = [f"https://127.0.0.1:{STATE.ports[listener]}/push/{one}" for one in ids]
    return out


def _vapid_raw(x):
    if isinstance(x, str) and "BEGIN" in x:
        pub = load_public_key(x)
        return pub.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return b64u_decode(x)


def ctl_webpush_vapid_key(b):
    keys = b.get("public_key") or b.get("public_key_pem")
    if b.get("clear"):
        STATE.webpush_vapid_keys.clear()
    if keys:
        for x in keys if isinstance(keys, list) else [keys]:
            raw = _vapid_raw(x)
            if len(raw) != 65 or raw[0] != 4:
                raise ControlError(400, "VAPID public key must be a 65-byte uncompressed P-256 point")
            STATE.webpush_vapid_keys.add(b64u(raw))
    return {"ok": True, "keys": sorted(STATE.webpush_vapid_keys)}


def ctl_knobs(b):
    g = _gw(b)
    upd = b.get("knobs", {k: v for k, v in b.items() if k != "gateway"})
    unknown = [k for k in upd if k not in DEFAULT_KNOBS[g]]
    if unknown:
        raise ControlError(400, f"unknown knobs for {g}: {unknown}")
    STATE.knobs[g].update(upd)
    return {"ok": True, "knobs": STATE.knobs[g]}


def ctl_goaway(b):
    g = _gw(b)
    n = 0
    for c in STATE.connections[g]:
        if c.closed is None and c.h2 is not None and not c.goaway_sent:
            c.h2.goaway(int(b.get("error_code", 0)), b.get("reason"))
            n += 1
    return {"ok": True, "connections": n}


def ctl_received(q):
    g, listener = _gw_view(q)
    recs = STATE.received[g]
    since = int(q.get("since", 0))
    token = q.get("token")
    channel = q.get("channel")
    kind = q.get("kind")
    probes = q.get("probes", "exclude")
    if probes not in ("exclude", "include", "only"):
        raise ControlError(400, "probes must be exclude, include or only")
    out = [r for r in recs if r["seq"] > since and (token is None or r.get("token") == token)
           and (channel is None or r.get("channel_id") == channel)
           and (kind is None or r.get("kind", "send") == kind)
           and (listener is None or r.get("listener") == listener)
           and (probes == "include" or bool(r.get("probe")) == (probes == "only"))]
    return {"gateway": q.get("gateway"), "count": len(out), "requests": out}


def ctl_connections(q):
    g, listener = _gw_view(q)
    return {"gateway": q.get("gateway"), "connections": [c.to_json() for c in STATE.connections[g]
                                                         if listener is None or c.listener == listener]}


def ctl_stats(q):
    return {"counters": dict(STATE.counters),
            "received": {g: len(STATE.received[g]) for g in GATEWAYS},
            "connections": {g: len(STATE.connections[g]) for g in GATEWAYS},
            "open_connections": {g: sum(1 for c in STATE.connections[g] if c.closed is None) for g in GATEWAYS},
            "fcm_token_requests": STATE.counters.get("fcm_token_requests", 0),
            "fcm_tokens_issued": STATE.counters.get("fcm_tokens_issued", 0)}


def ctl_reset(b):
    if b.get("all"):
        STATE.reset_all()
    else:
        STATE.reset(b.get("gateway"))
    return {"ok": True}


CONTROL_POST = {
    "/control/program": ctl_program,
    "/control/apns-key": ctl_apns_key,
    "/control/apns-devices": ctl_apns_devices,
    "/control/fcm-key": ctl_fcm_key,
    "/control/fcm-revoke": ctl_fcm_revoke,
    "/control/webpush-subscription": ctl_webpush_subscription,
    "/control/webpush-vapid-key": ctl_webpush_vapid_key,
    "/control/knobs": ctl_knobs,
    "/control/goaway": ctl_goaway,
    "/control/reset": ctl_reset,
    "/control/channels": ctl_channels_post,
}
CONTROL_GET = {
    "/control/received": ctl_received,
    "/control/channels": ctl_channels,
    "/control/connections": ctl_connections,
    "/control/stats": ctl_stats,
    "/control/knobs": lambda q: {"knobs": STATE.knobs} if not q.get("gateway") else {"knobs": STATE.knobs[_gw(q)]},
    "/control/health": lambda q: {"ok": True, "ports": STATE.ports},
    "/control/programs": lambda q: {"programs": [{"gateway": k[0], "token": k[1], "responses": v}
                                                 for k, v in STATE.programs.items()]},
}


def _json_default(o):
    if isinstance(o, (bytes, bytearray)):
        return b64u(o)
    if isinstance(o, set):
        return sorted(o)
    return repr(o)


async def control_handler(reader, writer):
    task = asyncio.current_task()
    CONNS.add(task)
    try:
        while True:
            try:
                r = await read_http1_request(reader, max_body=1024 * 1024)
            except (ValueError, OverflowError) as e:
                writer.write(http1_response_bytes(400, [], json.dumps({"error": str(e)}).encode(), close=True))
                await writer.drain()
                return
            if r is None:
                return
            method, target, version, headers, body = r
            u = urllib.parse.urlsplit(target)
            q = dict(urllib.parse.parse_qsl(u.query))
            try:
                if method == "GET" and u.path in CONTROL_GET:
                    out = CONTROL_GET[u.path](q)
                elif method == "POST" and u.path in CONTROL_POST:
                    try:
                        b = json.loads(body or b"{}")
                    except ValueError:
                        raise ControlError(400, "body is not JSON")
                    if not isinstance(b, dict):
                        raise ControlError(400, "body must be a JSON object")
                    out = CONTROL_POST[u.path](b)
                else:
                    raise ControlError(404, f"no such control endpoint {method} {u.path}")
                status = 200
            except ControlError as e:
                status, out = e.status, {"error": str(e)}
            except KeyError as e:
                status, out = 400, {"error": f"missing field {e}"}
            except Exception as e:  # noqa: BLE001
                status, out = 500, {"error": repr(e)}
            data = json.dumps(out, default=_json_default).encode()
            close = dict(headers).get("connection", "").lower() == "close"
            writer.write(http1_response_bytes(status, [("content-type", "application/json")], data, close=close))
            await writer.drain()
            if close:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        CONNS.discard(task)
        try:
            writer.close()
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------- main

async def watch_parent(parent, stop):
    """Sets stop once the process that started us is gone (we are re-parented)."""
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            return
        await asyncio.sleep(0.5)


async def main_async(state_dir, exit_with_parent=False):
    parent = os.getppid()
    os.makedirs(state_dir, exist_ok=True)
    paths = make_certs(state_dir)
    servers = {}
    alpn = {"apns": ["h2"], "apns_dev": ["h2"], "fcm": ["h2", "http/1.1"], "webpush": ["h2", "http/1.1"],
            "webpush_h1": ["http/1.1"], "fcm_h1": ["http/1.1"], "apns_manage": ["h2"], "apns_manage_dev": ["h2"]}
    for name in GATEWAYS + tuple(EXTRA_LISTENERS):
        gw = EXTRA_LISTENERS.get(name, name)
        srv = await asyncio.start_server(make_gateway_handler(gw, name), HOST, 0, ssl=tls_context(paths, alpn[name]),
                                         limit=MAX_HEADER_BYTES * 2, ssl_handshake_timeout=10)
        servers[name] = srv
        STATE.ports[name] = srv.sockets[0].getsockname()[1]
    srv = await asyncio.start_server(control_handler, HOST, 0, limit=MAX_HEADER_BYTES * 2)
    servers["control"] = srv
    STATE.ports["control"] = srv.sockets[0].getsockname()[1]
    info = {
        "host": HOST, "pid": os.getpid(), "ca": paths["ca"],
        "apns": STATE.ports["apns"], "apns_dev": STATE.ports["apns_dev"], "fcm": STATE.ports["fcm"],
        "webpush": STATE.ports["webpush"],
        "webpush_h1": STATE.ports["webpush_h1"], "fcm_h1": STATE.ports["fcm_h1"], "control": STATE.ports["control"],
        "apns_manage": STATE.ports["apns_manage"], "apns_manage_dev": STATE.ports["apns_manage_dev"],
        "urls": {
            "apns": f"https://127.0.0.1:{STATE.ports['apns']}",
            "apns_dev": f"https://127.0.0.1:{STATE.ports['apns_dev']}",
            "fcm": f"https://127.0.0.1:{STATE.ports['fcm']}",
            "fcm_token": f"https://127.0.0.1:{STATE.ports['fcm']}/token",
            "fcm_h1": f"https://127.0.0.1:{STATE.ports['fcm_h1']}",
            "webpush": f"https://127.0.0.1:{STATE.ports['webpush']}/push/",
            "webpush_h1": f"https://127.0.0.1:{STATE.ports['webpush_h1']}/push/",
            "control": f"http://127.0.0.1:{STATE.ports['control']}",
            "apns_manage": f"https://127.0.0.1:{STATE.ports['apns_manage']}",
            "apns_manage_dev": f"https://127.0.0.1:{STATE.ports['apns_manage_dev']}",
        },
    }
    tmp = os.path.join(state_dir, "gateways.json.tmp")
    with open(tmp, "w") as f:
        json.dump(info, f, indent=2)
    os.replace(tmp, os.path.join(state_dir, "gateways.json"))
    print(json.dumps(info), flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = loop.create_task(watch_parent(parent, stop)) if exit_with_parent else None
    await stop.wait()
    if watcher:
        watcher.cancel()
    for s in servers.values():
        s.close()
    for gw in GATEWAYS:
        for c in STATE.connections[gw]:
            if c.closed is None and c.h2 is not None:
                try:
                    c.h2.goaway(0, "Shutdown")
                except Exception:  # noqa: BLE001
                    pass
    await asyncio.sleep(0.05)
    for t in list(CONNS):
        t.cancel()
    await asyncio.gather(*CONNS, return_exceptions=True)
    try:
        os.unlink(os.path.join(state_dir, "gateways.json"))
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="state directory (ca.pem, gateways.json)")
    ap.add_argument("--exit-with-parent", action="store_true",
                    help="stop as if by SIGTERM when the process that started us exits")
    args = ap.parse_args()
    asyncio.run(main_async(args.dir, args.exit_with_parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
