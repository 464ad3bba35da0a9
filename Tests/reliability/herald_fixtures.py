"""Shared helpers for the reliability checks (test_faults.py, test_hostile.py, test_access.py)
and the harnesses (crash_harness.py, load_test.py).

Everything runs on loopback (or inside network namespaces these helpers create):
  * ``Gateways``: Tests/gateways/gateways.py in a process of its own, with its control API and
    the provider keys (``Keys``) registered;
  * ``Daemon``: a real ``herald serve`` (binary from $HERALD_BIN, or as given) in a scratch
    directory (or one given, which outlives it: kill -9, restart), configured against the
    gateways, optionally inside a ``Namespace`` (its own mount namespace with a hosts file,
    nsswitch.conf and resolv.conf the test controls, and optionally its own network namespace);
  * ``RPC``: a JSON-RPC connection on the daemon's Unix socket: raw bytes in and out, or
    pipelined requests whose every response is checked (``ProtocolViolation``);
  * fault listeners (``FaultServer``, ``SlowAcceptProxy``) for what the gateways cannot do.

This file is imported by the test modules (no conftest.py: the directory is shared). Run as a
script, ``python herald_fixtures.py summary`` prints and writes build/reliability/checks.json
from the counts the suites recorded.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime
import hashlib
import http.client
import json
import os
import re
import resource
import select
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERALD_BIN = os.environ.get("HERALD_BIN", "/tmp/herald-bin/herald")
if not os.path.isabs(HERALD_BIN):
    HERALD_BIN = str((REPO / HERALD_BIN).resolve())
GATEWAYS_PY = REPO / "Tests" / "gateways" / "gateways.py"
OUT_DIR = REPO / "build" / "reliability"
COUNTS_DIR = OUT_DIR / "counts"
GATEWAY_NAMES = ("apns", "apns_dev", "fcm", "webpush")

KEY_ID = "ABC123DEFG"
TEAM_ID = "TEAM123456"
TOPIC = "com.example.app"
PROJECT_ID = "herald-test"
CLIENT_EMAIL = "herald@herald-test.iam.gserviceaccount.com"

# Retries fast enough for a test, slow enough to be seen.
FAST_DELIVERY = {"max_retries": 2, "backoff_base_ms": 50, "backoff_max_ms": 200}


def _shutdown_budget() -> float:
    """Seconds a daemon has from SIGTERM to its exit: the unit's ``TimeoutStopSec=`` (after it
    systemd sends SIGKILL). SPEC.md "Operations": SIGTERM lets in-flight sends finish for up to
    10 s and exits 0; docs/operations.md "Stop": ``TimeoutStopSec=`` leaves room for those 10 s."""
    unit = (REPO / "systemd" / "herald.service").read_text()
    m = re.search(r"^TimeoutStopSec=(\d+)s?\s*$", unit, re.M)
    if not m:
        raise RuntimeError("systemd/herald.service has no TimeoutStopSec=<seconds>: the shutdown budget")
    return float(m.group(1))


SHUTDOWN_BUDGET_S = _shutdown_budget()

_CLEANUPS: list = []


def _cleanup_all():
    while _CLEANUPS:
        fn = _CLEANUPS.pop()
        with contextlib.suppress(Exception):
            fn()


atexit.register(_cleanup_all)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hex_token(i: int, prefix: int = 0) -> str:
    """A 64-digit APNs token, distinct per (prefix, i)."""
    return f"{prefix:08x}{i + 1:056x}"


def wait_until(pred, timeout=10.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class HarnessFailure(RuntimeError):
    """A broken promise of the daemon (not a harness problem)."""


class ProtocolViolation(HarnessFailure):
    """A response that is not valid JSON-RPC 2.0, or not for the request it answers."""


class DaemonExitFailure(HarnessFailure, AssertionError):
    """The daemon did not end cleanly: it hung at SIGTERM past the shutdown budget, exited with a
    status other than 0, or died before the test ended it."""


# HERALD_STORE_BACKEND=postgres runs the suites that ask for ``backend_store()`` (test_hostile.py)
# on PostgreSQL: a private server for the process (pg_server.py), a fresh database per daemon.
STORE_BACKEND = os.environ.get("HERALD_STORE_BACKEND", "sqlite") or "sqlite"


def backend_store(**extra) -> dict:
    """The ``[store]`` keys (besides ``key``) of a daemon on the backend HERALD_STORE_BACKEND names:
    ``extra`` alone for sqlite; for postgres, a new database on the process's test server."""
    if STORE_BACKEND == "sqlite":
        return dict(extra)
    if STORE_BACKEND != "postgres":
        raise ValueError(f"HERALD_STORE_BACKEND={STORE_BACKEND!r}: expected sqlite or postgres")
    import pg_server
    pg = pg_server.shared()
    return pg.store_config(pg.create_database(), **extra)


def write_store_key(path) -> bytes:
    """A new 32-byte store key at ``path`` (mode 0600, refused if it exists); its bytes. Instances
    sharing one database each get a copy (``copy_store_key``)."""
    key = os.urandom(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def copy_store_key(key: bytes, path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)


def token_hash(token):
    return hashlib.sha256(("push:" + token).encode()).hexdigest()


def herald_binary(arg=None):
    path = arg or os.environ.get("HERALD_BIN") or os.path.join(REPO, ".build/debug/herald")
    path = os.path.abspath(path)
    if not os.access(path, os.X_OK):
        raise SystemExit(f"{path} is not an executable herald (set HERALD_BIN or pass --herald)")
    return path


def tail(path, n=40):
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
    except OSError:
        return ""


def proc_memory_kb(pid):
    """{VmHWM, VmRSS, RssAnon, RssFile, RssShmem} of a live process, KiB."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:", "RssAnon:", "RssFile:", "RssShmem:")):
                    out[line.split(":")[0]] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return out


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), from /proc; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def log(msg):
    print(msg, flush=True)


def splice(a, b, stopped):
    """Copies bytes both ways between two sockets until either closes or `stopped()`; closes both."""
    socks = [a, b]
    try:
        while not stopped():
            r, _, _ = select.select(socks, [], [], 0.5)
            for s in r:
                data = s.recv(65536)
                if not data:
                    return
                (b if s is a else a).sendall(data)
    except OSError:
        pass
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()


def terminate(proc, timeout):
    """SIGTERM, then wait (SIGKILL after ``timeout`` s); the exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


# ----------------------------------------------------------------------------- counts

def record_counts(suite: str, **counts):
    """Adds to this suite's counters (written to build/reliability/counts/<suite>.json)."""
    COUNTS_DIR.mkdir(parents=True, exist_ok=True)
    path = COUNTS_DIR / f"{suite}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    for k, v in counts.items():
        data[k] = data.get(k, 0) + v
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def reset_counts(suite: str):
    with contextlib.suppress(OSError):
        (COUNTS_DIR / f"{suite}.json").unlink()


def summary(elapsed_s: float | None = None, status: str | None = None) -> dict:
    merged: dict = {}
    suites = {}
    for p in sorted(COUNTS_DIR.glob("*.json")) if COUNTS_DIR.exists() else []:
        try:
            d = json.loads(p.read_text())
        except ValueError:
            continue
        suites[p.stem] = d
        for k, v in d.items():
            merged[k] = merged.get(k, 0) + v
    out = {
        "faults_injected": merged.get("faults_injected", 0),
        "fault_cases": merged.get("fault_cases", 0),
        "hostile_inputs": merged.get("hostile_inputs", 0),
        "ssrf_registration_cases": merged.get("ssrf_registration_cases", 0),
        "ssrf_send_time_cases": merged.get("ssrf_send_time_cases", 0),
        "access_checks": merged.get("access_checks", 0),
        "suites": suites,
    }
    if elapsed_s is not None:
        out["elapsed_s"] = round(elapsed_s, 1)
    if status is not None:
        out["pytest_status"] = status
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "checks.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return out


# ----------------------------------------------------------------------------- keys

class Keys:
    """Provider keys made once per process."""

    _shared = None

    def __init__(self):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa

        self.apns = ec.generate_private_key(ec.SECP256R1())
        self.vapid = ec.generate_private_key(ec.SECP256R1())
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pkcs8 = serialization.PrivateFormat.PKCS8
        pem = serialization.Encoding.PEM
        nope = serialization.NoEncryption()
        spki = serialization.PublicFormat.SubjectPublicKeyInfo
        self.apns_pem = self.apns.private_bytes(pem, pkcs8, nope).decode()
        self.apns_pub_pem = self.apns.public_key().public_bytes(pem, spki).decode()
        self.vapid_pem = self.vapid.private_bytes(pem, pkcs8, nope).decode()
        self.vapid_public = b64url(self.vapid.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint))
        self.rsa_pem = self.rsa.private_bytes(pem, pkcs8, nope).decode()
        self.rsa_pub_pem = self.rsa.public_key().public_bytes(pem, spki).decode()

    @classmethod
    def shared(cls) -> "Keys":
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared


def web_keys() -> dict:
    """A valid (p256dh, auth) pair nobody holds the private key of."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    k = ec.generate_private_key(ec.SECP256R1())
    point = k.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return {"p256dh": b64url(point), "auth": b64url(os.urandom(16))}


# ----------------------------------------------------------------------------- gateways

class Gateways:
    """gateways.py in a child process, with the provider keys (``Keys.shared()``) registered.

    Without ``directory``: in a scratch directory removed by ``stop``; one for the whole pytest
    process through ``shared``. With ``directory``: in directory/gateways, its output in
    directory/gateways.log (kept). ``timeout`` is that of a control request."""

    _shared = None

    def __init__(self, directory=None, timeout=30):
        if directory is None:
            self.dir = tempfile.mkdtemp(prefix="herald-rel-gw-")
            self.log_path = os.path.join(self.dir, "gateways.log")
        else:
            self.dir = os.path.join(directory, "gateways")
            os.makedirs(self.dir, exist_ok=True)
            self.log_path = os.path.join(directory, "gateways.log")
        self._owned = directory is None
        self.timeout = timeout
        self._local = threading.local()
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(GATEWAYS_PY), "--dir", self.dir, "--exit-with-parent"],
            stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL)
        self.pid = self.proc.pid
        info_path = os.path.join(self.dir, "gateways.json")
        deadline = time.monotonic() + 60
        while not os.path.exists(info_path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the gateways did not start:\n" + tail(self.log_path))
            time.sleep(0.05)
        self.info = json.loads(Path(info_path).read_text())
        self.ca = self.info["ca"]
        self.ports = {k: self.info[k] for k in ("apns", "apns_dev", "fcm", "fcm_h1", "webpush", "webpush_h1",
                                                "control", "apns_manage", "apns_manage_dev")}
        keys = Keys.shared()
        self.post("/control/apns-key", {"key_id": KEY_ID, "team_id": TEAM_ID, "public_key_pem": keys.apns_pub_pem,
                                        "topics": [TOPIC, TOPIC + ".voip"]})
        self.post("/control/fcm-key", {"client_email": CLIENT_EMAIL, "public_key_pem": keys.rsa_pub_pem,
                                       "project_id": PROJECT_ID})
        self.post("/control/webpush-vapid-key", {"public_key": keys.vapid_public})

    @classmethod
    def shared(cls) -> "Gateways":
        if cls._shared is None or cls._shared.proc.poll() is not None:
            cls._shared = cls()
            _CLEANUPS.append(cls._shared.stop)
        return cls._shared

    def stop(self, timeout=10):
        """SIGTERM, then wait; the exit status."""
        status = terminate(self.proc, timeout)
        self._log.close()
        if self._owned:
            shutil.rmtree(self.dir, ignore_errors=True)
        return status

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            c = http.client.HTTPConnection("127.0.0.1", self.info["control"], timeout=self.timeout)
            self._local.conn = c
        return c

    def request(self, method, path, body=None):
        """One control request on this thread's connection (once more on a new one if it broke)."""
        for attempt in (0, 1):
            c = self._conn()
            try:
                data = json.dumps(body).encode() if body is not None else None
                headers = {"content-type": "application/json"} if data is not None else {}
                c.request(method, path, body=data, headers=headers)
                resp = c.getresponse()
                raw = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"control {method} {path}: {resp.status} {raw[:300]!r}")
                return json.loads(raw or b"{}")
            except (http.client.HTTPException, ConnectionError, OSError):
                c.close()
                self._local.conn = None
                if attempt:
                    raise

    def post(self, path, body):
        return self.request("POST", path, body)

    def get(self, path, **query):
        if query:
            path += "?" + urllib.parse.urlencode(query)
        return self.request("GET", path)

    def reset(self):
        self.post("/control/reset", {})

    def program(self, gateway, responses, token="*"):
        self.post("/control/program", {"gateway": gateway, "token": token, "responses": responses})

    def knobs(self, gateway, **values):
        return self.post("/control/knobs", {"gateway": gateway, **values})

    def set_delay(self, ms):
        for g in GATEWAY_NAMES:
            self.knobs(g, delay_ms=int(ms))

    def received(self, gateway, **query):
        """The requests recorded (query: since, kind, token; a None value is left out)."""
        q = {k: v for k, v in query.items() if v is not None}
        return self.get("/control/received", gateway=gateway, **q)["requests"]

    def connections(self, gateway):
        return self.get("/control/connections", gateway=gateway)

    def subscription(self, **body):
        return self.post("/control/webpush-subscription", body)

    def subscriptions(self, ids, **body):
        """Registers subscriptions ``ids`` sharing one key pair and auth secret (the gateway can
        decrypt what is sent to each); the answer's ``endpoints`` are in the order of ``ids``."""
        return self.post("/control/webpush-subscription", dict(body, ids=list(ids)))

    def channels(self, gateway="apns_manage", bundle=None):
        """The broadcast channels of one environment (gateway apns_manage or apns_manage_dev; apns
        and apns_dev name theirs): [{channel_id, bundle, policy, push_type, created}]."""
        q = {"bundle": bundle} if bundle is not None else {}
        return self.get("/control/channels", gateway=gateway, **q)["channels"]

    def add_channel(self, gateway="apns_manage", bundle=TOPIC, policy=0, channel_id=None):
        """Makes a channel without the management API (no limit); returns its entry."""
        body = {"gateway": gateway, "bundle": bundle, "policy": policy}
        if channel_id is not None:
            body["channel_id"] = channel_id
        return self.post("/control/channels", body)["channel"]

    def apns_devices(self, tokens, gateway=None, kind=None):
        """Registers APNs device tokens as issued by ``gateway`` (apns or apns_dev) and/or as of
        ``kind`` (alert, voip, liveactivity, widgets, location, pushtotalk)."""
        body = {"tokens": list(tokens)}
        if gateway is not None:
            body["gateway"] = gateway
        if kind is not None:
            body["kind"] = kind
        return self.post("/control/apns-devices", body)

    def web_keys(self, sub) -> dict:
        """The ``keys`` of device.register for a subscription the gateway made."""
        return {"p256dh": sub["p256dh"], "auth": sub["auth"]}

    def stats(self):
        return self.get("/control/stats")

    def open_connections(self):
        return sum(self.stats()["open_connections"].values())


# ----------------------------------------------------------------------------- namespaces

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
CLONE_NEWNET = 0x40000000


class Namespace:
    """A mount namespace (and optionally a network namespace) held by a ``sleep`` process.

    /etc/hosts, /etc/nsswitch.conf and /etc/resolv.conf inside it are bind mounts of files in
    a scratch directory: ``set_hosts`` rewrites the hosts file in place, and glibc reads it
    again at every lookup. By default ``hosts: files`` only, so nothing is ever asked of a DNS
    server. With ``net=True`` the namespace has only its own loopback, with the extra
    ``addresses`` on it (for "public" addresses that exist nowhere else).
    """

    def __init__(self, *, net=False, hosts="", dns=False, addresses=()):
        self.net = net
        self.dir = tempfile.mkdtemp(prefix="herald-rel-ns-")
        os.chmod(self.dir, 0o755)
        self.hosts_path = os.path.join(self.dir, "hosts")
        self.set_hosts(hosts)
        Path(self.dir, "nsswitch.conf").write_text(
            "passwd: files\ngroup: files\nshadow: files\nhosts: files" + (" dns" if dns else "") + "\n")
        # Nothing listens on 127.0.0.1:53: a DNS lookup fails at once ("temporary failure").
        Path(self.dir, "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        flags = ["--mount", "--propagation", "private"] + (["--net"] if net else [])
        self.holder = subprocess.Popen(["unshare", *flags, "sleep", "infinity"])
        _CLEANUPS.append(self.close)
        mine = os.readlink("/proc/self/ns/mnt")
        wait_until(lambda: self._ns("mnt") not in (None, mine), 10, what="the namespace")
        for name in ("hosts", "nsswitch.conf", "resolv.conf"):
            self.run(["mount", "--bind", os.path.join(self.dir, name), "/etc/" + name])
        if net:
            self.run(["ip", "link", "set", "lo", "up"])
            for a in addresses:
                self.run(["ip", "addr", "add", a + ("/128" if ":" in a else "/32"), "dev", "lo"])

    def _ns(self, kind):
        try:
            return os.readlink(f"/proc/{self.holder.pid}/ns/{kind}")
        except OSError:
            return None

    @property
    def prefix(self):
        return ["nsenter", "-t", str(self.holder.pid), "--mount"] + (["--net"] if self.net else []) + ["--"]

    def run(self, cmd, check=True):
        return subprocess.run(self.prefix + cmd, check=check, capture_output=True, text=True)

    def set_hosts(self, text: str):
        # In place (same inode): the bind mount keeps pointing at this file.
        with open(self.hosts_path, "r+" if os.path.exists(self.hosts_path) else "w") as f:
            f.seek(0)
            f.truncate()
            f.write("127.0.0.1 localhost\n::1 localhost\n" + text)

    def resolve(self, name):
        r = self.run(["getent", "ahosts", name], check=False)
        return sorted({line.split()[0] for line in r.stdout.splitlines() if line.strip()})

    def in_net(self, fn):
        """Runs fn() on a thread that joined this network namespace (sockets it makes stay in it)."""
        assert self.net
        out = {}

        def body():
            fd = os.open(f"/proc/{self.holder.pid}/ns/net", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            out["v"] = fn()

        t = threading.Thread(target=body)
        t.start()
        t.join()
        if "v" not in out:
            raise RuntimeError("in_net failed")
        return out["v"]

    def close(self):
        if self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# ----------------------------------------------------------------------------- JSON-RPC

class RPCError(Exception):
    def __init__(self, response):
        super().__init__(json.dumps(response)[:500])
        self.response = response
        self.error = response.get("error") or {}
        self.code = self.error.get("code")
        self.data = self.error.get("data")


APP_ERROR_REASONS = {1001: "not_publicly_routable", 1002: "rate_limited", 1003: "not_found",
                     1004: "unknown_app", 1005: "payload_too_large", 1006: "forbidden",
                     1007: "overloaded", 1008: "conflict"}


def check_response(obj, expected_ids):
    """Raises ProtocolViolation unless `obj` is a valid JSON-RPC 2.0 response whose id
    is one of `expected_ids` (a set of ids in flight; the id is removed)."""
    if not isinstance(obj, dict):
        raise ProtocolViolation(f"response is not an object: {obj!r:.300}")
    if obj.get("jsonrpc") != "2.0":
        raise ProtocolViolation(f"response without jsonrpc 2.0: {obj!r:.300}")
    extra = set(obj) - {"jsonrpc", "id", "result", "error"}
    if extra:
        raise ProtocolViolation(f"response with unknown members {sorted(extra)}: {obj!r:.300}")
    if ("result" in obj) == ("error" in obj):
        raise ProtocolViolation(f"response must have exactly one of result/error: {obj!r:.300}")
    rid = obj.get("id", "<missing>")
    if rid not in expected_ids:
        raise ProtocolViolation(f"response id {rid!r} answers no request in flight: {obj!r:.300}")
    expected_ids.discard(rid)
    if "error" in obj:
        e = obj["error"]
        if not isinstance(e, dict) or not isinstance(e.get("code"), int) or isinstance(e.get("code"), bool) \
                or not isinstance(e.get("message"), str):
            raise ProtocolViolation(f"malformed error object: {obj!r:.300}")
        if e["code"] in APP_ERROR_REASONS:
            d = e.get("data")
            if not isinstance(d, dict) or d.get("reason") != APP_ERROR_REASONS[e["code"]]:
                raise ProtocolViolation(f"error {e['code']} without data.reason "
                                        f"{APP_ERROR_REASONS[e['code']]!r}: {obj!r:.300}")
            if e["code"] in (1002, 1007):
                ra = d.get("retry_after_ms")
                if not isinstance(ra, int) or isinstance(ra, bool) or ra < 0:
                    raise ProtocolViolation(f"error {e['code']} without an integer data.retry_after_ms: {obj!r:.300}")
    return obj


class RPC:
    """One connection to the daemon's socket (``timeout``: of the socket, and of ``read``).

    Raw use (the checks): ``send`` bytes, ``read_line``/``read_json``/``eof``; ``request`` sends one
    request and returns its response (checked to carry its id only), ``call`` its result
    (``RPCError`` on an error).

    Checked pipelining (the harnesses): ``request_bytes``/``send_many`` put the request ids in
    ``pending``; ``read`` returns the next response once ``check_response`` passed it
    (``ProtocolViolation`` if not); ``ok`` is one such request's result (``HarnessFailure`` on an
    error); ``pipelined`` answers many, in request order. These send ``params`` as {} when None.
    """

    def __init__(self, path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.timeout = timeout
        self.buf = b""
        self.next_id = 1
        self.pending = set()

    def close(self):
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def send(self, data: bytes):
        self.sock.sendall(data)

    def read_line(self, timeout=10.0) -> bytes | None:
        """One response line, or None at EOF. Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no response")
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                continue
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def read_json(self, timeout=10.0):
        line = self.read_line(timeout)
        if line is None:
            raise EOFError("connection closed by the daemon")
        return json.loads(line)

    def eof(self, timeout=2.0) -> bool:
        try:
            return self.read_line(timeout) is None
        except TimeoutError:
            return False

    def _encode(self, method, params=None, raw_params: bytes | None = None, rid=None):
        """(id, one request line); a new id unless given."""
        if rid is None:
            rid = self.next_id
            self.next_id += 1
        head = b'{"jsonrpc":"2.0","id":%d,"method":%s' % (rid, json.dumps(method).encode())
        if raw_params is not None:
            return rid, head + b',"params":' + raw_params + b"}\n"
        if params is not None:
            return rid, head + b',"params":' + json.dumps(params, separators=(",", ":")).encode() + b"}\n"
        return rid, head + b"}\n"

    def request(self, method, params=None, *, raw_params: bytes | None = None, timeout=10.0,
                allow_null_id=False):
        """Sends one request; returns the whole response object (checked to carry our id, or with
        ``allow_null_id`` an id of null, as a parse error that could not read the id has)."""
        rid, body = self._encode(method, params, raw_params)
        self.send(body)
        resp = self.read_json(timeout)
        if resp.get("id") != rid and not (allow_null_id and resp.get("id") is None and "error" in resp):
            raise AssertionError(f"response for another id (expected {rid}): {str(resp)[:300]}")
        return resp

    def call(self, method, params=None, timeout=10.0):
        resp = self.request(method, params, timeout=timeout)
        if "error" in resp:
            raise RPCError(resp)
        return resp["result"]

    # checked pipelining

    def request_bytes(self, method, params, rid=None):
        """(id, bytes) of one request whose answer ``read`` will expect."""
        rid, data = self._encode(method, params or {}, rid=rid)
        self.pending.add(rid)
        return rid, data

    def send_many(self, method, params_list):
        ids, chunks = [], []
        for p in params_list:
            rid, data = self.request_bytes(method, p)
            ids.append(rid)
            chunks.append(data)
        self.send(b"".join(chunks))
        return ids

    def read(self, timeout=None):
        """The next response (checked against ``pending``); ConnectionError at EOF."""
        while True:
            try:
                line = self.read_line(self.timeout if timeout is None else timeout)
            except ValueError:  # select() on a socket another thread closed
                raise ConnectionError("the connection was closed") from None
            if line is None:
                raise ConnectionError("herald closed the connection")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ProtocolViolation(f"response is not JSON ({e}): {line[:300]!r}")
            return check_response(obj, self.pending)

    def ok(self, method, params=None):
        """One checked request's result; HarnessFailure on an error."""
        rid, data = self.request_bytes(method, params)
        self.send(data)
        obj = self.read()
        if obj["id"] != rid:
            raise ProtocolViolation(f"answer to {rid} came back as {obj['id']}")
        if "result" not in obj:
            raise HarnessFailure(f"{method} {json.dumps(params)[:200]} failed: {obj['error']}")
        return obj["result"]

    def pipelined(self, method, params_list, chunk=200):
        """Answers in request order, ``chunk`` requests written at a time."""
        out = []
        for start in range(0, len(params_list), chunk):
            ids = self.send_many(method, params_list[start:start + chunk])
            by_id = {}
            for _ in ids:
                obj = self.read()
                by_id[obj["id"]] = obj
            out += [by_id[i] for i in ids]
        return out


class MetricsMissing(AssertionError):
    """A metric family, label or sample a check reads is not in the daemon's /metrics output
    (a rename must fail the check that reads it, never read as 0)."""


class Metrics(dict):
    """Parsed Prometheus text: {(sample name, frozenset(labels)): value}, and ``families``
    {family name: type} from its ``# TYPE`` lines."""

    def __init__(self, samples=(), families=None):
        super().__init__(samples)
        self.families: dict[str, str] = dict(families or {})

    def family_of(self, name: str) -> str | None:
        """The family a sample name belongs to (``x_bucket``/``_sum``/``_count`` of a histogram
        or summary ``x``), or None when /metrics declares none."""
        if name in self.families:
            return name
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[: -len(suffix)] if name.endswith(suffix) else None
            if base and self.families.get(base) in ("histogram", "summary"):
                return base
        return None

    def samples(self, name: str, labels: dict) -> list[float]:
        """The values of ``name`` whose labels include ``labels``, after checking that the family is
        declared and that every label name asked for is one of its samples' (MetricsMissing if not)."""
        if self.family_of(name) is None:
            raise MetricsMissing(f"metric family {name!r} is not in /metrics (renamed or removed?); "
                                 f"families there: {sorted(self.families)}")
        rows = [(dict(ls), v) for (n, ls), v in self.items() if n == name]
        known = set().union(*(r[0].keys() for r in rows)) if rows else set()
        unknown = set(labels) - known
        if rows and unknown:
            raise MetricsMissing(f"{name} has no label {sorted(unknown)} (its labels: {sorted(known)})")
        return [v for ls, v in rows if all(ls.get(k) == str(val) for k, val in labels.items())]


def parse_metrics(text: str) -> Metrics:
    """Prometheus text → ``Metrics`` ({(name, frozenset(labels)): value} and the declared families)."""
    out, families = {}, {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            m = re.match(r"^#\s*TYPE\s+([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\S+)", line)
            if m:
                families[m.group(1)] = m.group(2)
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)', line)
        if not m:
            continue
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        v = m.group(4)
        out[(m.group(1), labels)] = float("inf") if v == "+Inf" else float(v)
    return Metrics(out, families)


def _as_metrics(m) -> Metrics:
    if isinstance(m, Metrics):
        return m
    raise TypeError("metric() reads what parse_metrics() (Daemon.metrics()) returned")


def metric(m: Metrics, name: str, **labels) -> float:
    """The sum of the samples of `name` whose labels include `labels`. Strict: the family must be
    declared in /metrics, each label name must be one of its samples', and at least one sample must
    match (MetricsMissing otherwise): a renamed family, label or label value fails the check that
    reads it instead of reading as 0. Herald exports every label set it knows at start (counters at
    0), so a sample that may legitimately be absent is rare: read it with ``metric_or_zero``."""
    values = _as_metrics(m).samples(name, labels)
    if not values:
        have = [dict(ls) for (n, ls), _ in m.items() if n == name][:12]
        raise MetricsMissing(f"no sample of {name} with labels {labels} in /metrics (samples: {have})")
    return sum(values)


def metric_or_zero(m: Metrics, name: str, **labels) -> float:
    """Like ``metric``, for a labelled sample that may legitimately be absent (a label set the
    daemon creates on first use): 0 when no sample matches, but the family must still be declared
    and the label names known (MetricsMissing otherwise)."""
    return sum(_as_metrics(m).samples(name, labels))


def check_metric_families(m: Metrics, expected: dict):
    """Every family of ``expected`` ({name: type}) is declared in /metrics with that type."""
    missing = {n: t for n, t in expected.items() if m.families.get(n) != t}
    if missing:
        raise MetricsMissing(f"families missing from /metrics or of another type: "
                             f"{ {n: m.families.get(n) for n in missing} } (expected {missing})")


# ----------------------------------------------------------------------------- the daemon

class Daemon:
    """A ``herald serve`` configured against the gateways (if given).

    In a scratch directory removed at ``cleanup``, or in ``directory`` (kept: the state outlives
    the daemon, and ``start()`` may be called again after ``kill9()``). Every start appends to
    ``log_path`` after a marker line; ``binary``: $HERALD_BIN when None."""

    def __init__(self, *, gateways: Gateways | None = None, transports=("apns", "fcm", "web"),
                 delivery: dict | None = None, endpoints: dict | None = None, server: dict | None = None,
                 store: dict | None = None, apps: str = "", app_default_extra: str = "", allow_private=True,
                 log_level="debug", metrics_listen: str = "", ns: Namespace | None = None, socket_mode="0600",
                 token_uri: str | None = None, start=True, umask=None, dir_mode=0o700, run_gid=None,
                 store_key: str | None = None, binary: str | None = None, directory: str | None = None,
                 env: dict | None = None, nofile: tuple[int, int] | None = None):
        self.gateways = gateways
        # RLIMIT_NOFILE (soft, hard) the daemon starts with, when given.
        self.nofile = nofile
        # Added to (or, with a None value, removed from) the daemon's environment at each start.
        self.env = dict(env or {})
        self.ns = ns
        self.binary = binary or HERALD_BIN
        self._owned = directory is None
        if directory is None:
            self.dir = tempfile.mkdtemp(prefix="herald-rel-d-")
            os.chmod(self.dir, dir_mode)
        else:
            self.dir = directory
            os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "herald.sock")
        self.config = os.path.join(self.dir, "herald.conf")
        self.log_path = os.path.join(self.dir, "stderr.log")
        self.keys_dir = os.path.join(self.dir, "keys")
        self.umask = umask
        self.run_gid = run_gid
        self.starts = 0
        self.kills = 0
        os.makedirs(self.keys_dir)
        keys = Keys.shared()
        Path(self.keys_dir, "apns.p8").write_text(keys.apns_pem)
        Path(self.keys_dir, "vapid.pem").write_text(keys.vapid_pem)
        if token_uri is None:
            token_uri = f"https://127.0.0.1:{gateways.ports['fcm']}/token" if gateways else "https://127.0.0.1:9/token"
        account = {"type": "service_account", "project_id": PROJECT_ID, "private_key_id": "k1",
                   "private_key": keys.rsa_pem, "client_email": CLIENT_EMAIL, "token_uri": token_uri}
        Path(self.keys_dir, "fcm.json").write_text(json.dumps(account))
        for f in os.listdir(self.keys_dir):
            os.chmod(os.path.join(self.keys_dir, f), 0o600)

        ep = {}
        if gateways:
            ep = {"apns_production": f"https://127.0.0.1:{gateways.ports['apns']}",
                  "apns_development": f"https://127.0.0.1:{gateways.ports['apns_dev']}",
                  "fcm": f"https://127.0.0.1:{gateways.ports['fcm']}",
                  "ca_file": gateways.ca}
        ep["webpush_allow_private"] = "true" if allow_private else "false"
        ep.update(endpoints or {})
        srv = {"socket": self.socket, "socket_mode": socket_mode, "state_dir": self.dir, "log_level": log_level}
        srv.update(server or {})
        deliv = dict(FAST_DELIVERY)
        deliv.update(delivery or {})

        def section(name, d):
            return f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in d.items() if v is not None) + "\n"

        self.store_key = os.path.join(self.dir, store_key or "store.key")
        text = section("server", srv) + section("store", {"key": store_key or self.store_key, **(store or {})})
        text += section("delivery", deliv) + section("endpoints", ep)
        if metrics_listen:
            text += section("metrics", {"listen": metrics_listen})
        text += "[app.default]\ndevice_cap = 20\n" + self.credentials(transports) + app_default_extra + "\n\n" + apps
        Path(self.config).write_text(text)
        self.proc = None
        self._ended = False
        _CLEANUPS.append(self.cleanup)
        if start:
            self.start()

    def credentials(self, transports) -> str:
        lines = []
        if "apns" in transports:
            lines += [f"apns_key = {self.keys_dir}/apns.p8", f"apns_key_id = {KEY_ID}", f"apns_team_id = {TEAM_ID}",
                      f"apns_topic = {TOPIC}"]
        if "fcm" in transports:
            lines.append(f"fcm_credentials = {self.keys_dir}/fcm.json")
        if "web" in transports:
            lines += [f"vapid_key = {self.keys_dir}/vapid.pem", "vapid_subject = mailto:ops@example.com"]
        return "".join(line + "\n" for line in lines)

    def _mark(self, what):
        with open(self.log_path, "ab") as f:
            f.write(f"==== harness: {what} at {time.time():.3f}\n".encode())

    def start(self, timeout=20, probe_timeout=2):
        """Starts it and waits for system.health (each try given ``probe_timeout``); the seconds
        that took. HarnessFailure (a RuntimeError) if it exits or does not answer in ``timeout``."""
        assert not self.running
        cmd = [self.binary, "serve", "--config", self.config]
        if self.ns:
            cmd = self.ns.prefix + cmd
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "WATCHDOG_USEC", "WATCHDOG_PID",
                            "CREDENTIALS_DIRECTORY", "HERALD_CONFIG", "HERALD_SOCKET")}
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
        umask, gid, nofile = self.umask, self.run_gid, self.nofile

        def preexec():
            if umask is not None:
                os.umask(umask)
            if gid is not None:
                os.setgroups([])
                os.setgid(gid)
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        self.starts += 1
        self._ended = False
        self._mark(f"start #{self.starts}")
        out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, stdin=subprocess.DEVNULL,
                                     preexec_fn=preexec if (umask is not None or gid is not None
                                                            or nofile is not None) else None)
        out.close()
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                self._ended = True   # reported here; cleanup() need not report it again
                raise HarnessFailure(f"herald exited with {self.proc.returncode}:\n{self.log(60)}")
            try:
                with RPC(self.socket, timeout=probe_timeout) as c:
                    if "result" in c.request("system.health", timeout=probe_timeout):
                        return time.monotonic() - t0
            except (OSError, TimeoutError, EOFError, ValueError):
                pass
            time.sleep(0.03)
        raise HarnessFailure("herald did not start:\n" + self.log(60))

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def stop(self, timeout=SHUTDOWN_BUDGET_S) -> int | None:
        """SIGTERM, then wait (SIGKILL after ``timeout``); the exit status, unchecked (the
        harnesses report it themselves). Tests use ``shutdown``, which fails on anything but 0."""
        if self.proc is None:
            return None
        self._ended = True
        status = terminate(self.proc, timeout)
        self._mark(f"stopped (status {status})")
        return status

    def shutdown(self, budget=SHUTDOWN_BUDGET_S) -> float:
        """Ends the daemon as systemd does: SIGTERM, and it must exit with status 0 within
        ``budget`` seconds (the unit's TimeoutStopSec=). Returns the seconds it took.
        DaemonExitFailure (with the tail of its stderr) if it had already died, hangs (then it is
        killed), or exits with anything but 0."""
        if self.proc is None:
            raise DaemonExitFailure("shutdown() of a daemon that was never started")
        pid = self.proc.pid
        if self.proc.poll() is not None:
            self._ended = True
            raise DaemonExitFailure(f"herald (pid {pid}) had already exited with status {self.proc.returncode} "
                                    f"before the test ended it:\n{self.log(40)}")
        self._ended = True
        self._mark("SIGTERM")
        t0 = time.monotonic()
        self.proc.terminate()
        try:
            status = self.proc.wait(budget)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._mark("SIGKILL after a hang at SIGTERM")
            raise DaemonExitFailure(f"herald (pid {pid}) was still running {budget:.0f} s after SIGTERM (the "
                                    f"shutdown budget, TimeoutStopSec=); killed. stderr tail:\n{self.log(40)}") from None
        took = time.monotonic() - t0
        self._mark(f"exited {status} {took:.2f} s after SIGTERM")
        if status != 0:
            how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
            raise DaemonExitFailure(f"herald (pid {pid}) {how} {took:.2f} s after SIGTERM (expected 0). "
                                    f"stderr tail:\n{self.log(40)}")
        return took

    def kill9(self):
        """SIGKILL (if still running) and reap; the exit status (-9, or its own if it had exited)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
        status = self.proc.wait()
        self._ended = True
        self.kills += 1
        self._mark(f"kill -9 #{self.kills}")
        return status

    def cleanup(self):
        """The end of a test's daemon: ``shutdown`` (SIGTERM, exit 0 within the budget) unless the
        test already ended it itself (``stop``, ``shutdown``, ``kill9``), then its scratch
        directory is removed. A daemon that died by itself, hangs or exits non-zero fails here."""
        try:
            if self.proc is not None and not self._ended:
                self.shutdown()
        finally:
            if self._owned:
                shutil.rmtree(self.dir, ignore_errors=True)

    def log(self, tail=None) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        if tail:
            return "\n".join(text.splitlines()[-tail:])
        return text

    def log_events(self):
        """{priority: {event: count}} over the whole log (every start)."""
        out = {}
        try:
            with open(self.log_path, "rb") as f:
                for raw in f:
                    m = re.match(rb"<(\d)>(\S+)", raw)
                    if m:
                        pr, ev = int(m.group(1)), m.group(2).decode("utf-8", "replace")
                        out.setdefault(pr, {}).setdefault(ev, 0)
                        out[pr][ev] += 1
        except OSError:
            pass
        return out

    def log_lines(self, event, current_start_only=False):
        """The log lines of `event` (of the current start only, if asked)."""
        out = []
        try:
            with open(self.log_path, "rb") as f:
                for line in f:
                    if current_start_only and line.startswith(b"==== harness: start"):
                        out = []
                    elif re.match(rb"<\d>" + re.escape(event.encode()) + rb"(\s|$)", line):
                        out.append(line.decode("utf-8", "replace").rstrip())
        except OSError:
            pass
        return out

    def store_files(self):
        """Sizes in bytes of herald.db and its WAL (0 when absent)."""
        out = {}
        for suffix in ("", "-wal"):
            try:
                out["herald.db" + suffix] = os.path.getsize(os.path.join(self.dir, "herald.db" + suffix))
            except OSError:
                out["herald.db" + suffix] = 0
        return out

    def peak_rss_kb(self):
        """VmHWM (peak resident set, KiB) while it runs, else None."""
        return proc_memory_kb(self.pid).get("VmHWM") if self.running else None

    def connect(self, timeout=10.0) -> RPC:
        return RPC(self.socket, timeout)

    def call(self, method, params=None, timeout=10.0):
        with self.connect(timeout) as c:
            return c.call(method, params, timeout=timeout)

    def request(self, method, params=None, timeout=10.0):
        with self.connect(timeout) as c:
            return c.request(method, params, timeout=timeout)

    def metrics(self) -> dict:
        return parse_metrics(self.call("system.metrics")["text"])

    def status(self, message_id):
        return self.call("push.status", {"message_id": message_id, "detail": True})

    def wait_complete(self, message_id, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            s = self.status(message_id)
            if s["state"] == "complete" or time.monotonic() > deadline:
                return s
            time.sleep(0.05)

    def send_wait(self, params, timeout_ms=30000):
        p = dict(params, wait=True, timeout_ms=timeout_ms)
        return self.call("push.send", p, timeout=timeout_ms / 1000 + 20)

    def devices(self, user):
        return self.call("device.list", {"user": user})["devices"]

    def register(self, user, platform, token, **extra):
        return self.call("device.register", {"user": user, "platform": platform, "token": token, **extra})

    def register_many(self, params_list, chunk=200):
        """Pipelined registrations on one connection; returns the device ids in order."""
        with self.connect(60) as c:
            answers = c.pipelined("device.register", params_list, chunk)
        for r in answers:
            if "result" not in r:
                raise RPCError(r)
        return [r["result"]["device_id"] for r in answers]


# ----------------------------------------------------------------------------- certificates

class CertAuthority:
    """A throw-away CA that signs leaf certificates for any names."""

    def __init__(self, name="herald-reliability-ca"):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))

    def pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def leaf(self, dns_names=(), ips=(), directory=None) -> tuple[str, str]:
        """Writes (cert.pem, key.pem) for these names; returns their paths."""
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        cn = (list(dns_names) + list(ips) + ["leaf"])[0]
        sans = [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(self.key, hashes.SHA256()))
        directory = directory or tempfile.mkdtemp(prefix="herald-rel-cert-")
        tag = f"{cn}-{os.urandom(4).hex()}"
        cp = os.path.join(directory, f"leaf-{tag}.pem")
        kp = os.path.join(directory, f"leaf-{tag}-key.pem")
        Path(cp).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        Path(kp).write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cp, kp


# ----------------------------------------------------------------------------- fault listeners

class _Listener:
    """A listening socket with a thread serving it until ``close`` (closed at exit too)."""

    def _serve_in_background(self):
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()
        _CLEANUPS.append(self.close)

    def close(self):
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.close()

    def _serve(self):
        """Accepts until closed; each connection to ``_accepted``."""
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self._accepted(conn)

    def _accepted(self, conn):
        threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        raise NotImplementedError


class FaultServer(_Listener):
    """A loopback TLS (or plain TCP) listener that misbehaves on purpose.

    modes:
      * ``reset``: TLS + HTTP/2 server preface; once a request's headers arrive (or for HTTP/1.1,
        once a request line arrives) the TCP connection is aborted with RST (SO_LINGER 0):
        a connection reset in the middle of a stream;
      * ``tls`` : a TLS server with the given certificate that answers every request 200/201
        (used with a certificate for another host name, or one from an untrusted CA, so that
        the client's check is what fails);
      * ``garbage``: not TLS at all: answers the ClientHello with plain text and closes;
      * ``blackhole``: accepts and never says anything (a TLS handshake that never completes).
    Records ``connections`` and ``requests`` seen.
    """

    def __init__(self, mode, cert=None, key=None, host="127.0.0.1", port=0, sock_factory=None):
        self.mode = mode
        self.cert, self.key = cert, key
        self.connections = 0
        self.requests = 0
        self.handshakes = 0
        self.errors: list[str] = []
        self._stop = False
        make = sock_factory or (lambda: self._listen(host, port))
        self.sock = make()
        self.port = self.sock.getsockname()[1]
        self.ctx = None
        if mode in ("reset", "tls"):
            self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ctx.load_cert_chain(cert, key)
            self.ctx.set_alpn_protocols(["h2", "http/1.1"])
        self._serve_in_background()

    @staticmethod
    def _listen(host, port):
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(64)
        return s

    def _accepted(self, conn):
        self.connections += 1
        super()._accepted(conn)

    @staticmethod
    def _abort(sock):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.close()

    def _handle(self, raw):
        raw.settimeout(20)
        try:
            if self.mode == "blackhole":
                while not self._stop:
                    r, _, _ = select.select([raw], [], [], 0.2)
                    if r and not raw.recv(65536):
                        break
                return
            if self.mode == "garbage":
                raw.recv(65536)
                raw.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                raw.close()
                return
            try:
                tls = self.ctx.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError) as e:
                self.errors.append(repr(e))
                raw.close()
                return
            self.handshakes += 1
            if tls.selected_alpn_protocol() == "h2":
                self._h2(tls)
            else:
                self._h1(tls)
        except Exception as e:  # noqa: BLE001
            self.errors.append(repr(e))
            with contextlib.suppress(OSError):
                raw.close()

    def _h1(self, tls):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = tls.recv(65536)
            if not chunk:
                return
            data += chunk
        self.requests += 1
        if self.mode == "reset":
            self._abort(tls)
            return
        head, _, rest = data.partition(b"\r\n\r\n")
        m = re.search(rb"(?i)content-length:\s*(\d+)", head)
        need = int(m.group(1)) if m else 0
        while len(rest) < need:
            chunk = tls.recv(65536)
            if not chunk:
                break
            rest += chunk
        tls.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        tls.close()

    def _h2(self, tls):
        import h2.config
        import h2.connection
        import h2.events

        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        tls.sendall(conn.data_to_send())
        while not self._stop:
            data = tls.recv(65536)
            if not data:
                return
            try:
                events = conn.receive_data(data)
            except Exception:  # noqa: BLE001
                return
            for ev in events:
                if isinstance(ev, h2.events.RequestReceived):
                    self.requests += 1
                    if self.mode == "reset":
                        self._abort(tls)
                        return
                if isinstance(ev, h2.events.StreamEnded) and self.mode == "tls":
                    conn.send_headers(ev.stream_id, [(":status", "200")], end_stream=True)
            out = conn.data_to_send()
            if out:
                tls.sendall(out)


class RecordingTLSProxy(_Listener):
    """An HTTPS (HTTP/1.1) listener that records each request's body and forwards the request to
    ``target`` (an HTTPS host:port trusting ``target_ca``), answering with its answer. Used for
    the FCM token endpoint, so that the OAuth assertion JWT Herald sends can be checked for."""

    def __init__(self, cert, key, target, target_ca):
        self.target, self.target_ca = target, target_ca
        self.bodies: list[bytes] = []
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.ctx.set_alpn_protocols(["http/1.1"])
        self.sock = FaultServer._listen("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self._serve_in_background()

    def _handle(self, raw):
        import http.client
        try:
            c = self.ctx.wrap_socket(raw, server_side=True)
            c.settimeout(10)
            while True:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = c.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
                need = int(headers.get("content-length", "0"))
                while len(body) < need:
                    body += c.recv(65536)
                self.bodies.append(body)
                ctx = ssl.create_default_context(cafile=self.target_ca)
                up = http.client.HTTPSConnection(self.target[0], self.target[1], context=ctx, timeout=10)
                fwd = {k: v for k, v in headers.items() if k in ("content-type", "accept")}
                up.request(method, path, body=body, headers=fwd)
                r = up.getresponse()
                out = r.read()
                up.close()
                c.sendall(f"HTTP/1.1 {r.status} {r.reason}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(out)}\r\n\r\n".encode() + out)
        except Exception:  # noqa: BLE001
            pass
        finally:
            with contextlib.suppress(OSError):
                raw.close()


class SlowAcceptProxy(_Listener):
    """A TCP listener that accepts each connection only after ``delay_s`` (None: never), then
    pipes it to ``target`` (host, port). The kernel finishes the TCP handshake at once, so the
    client sees a connection whose TLS handshake stalls until the accept."""

    def __init__(self, target, delay_s):
        self.target = target
        self.delay_s = delay_s
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._serve_in_background()

    def _serve(self):
        while not self._stop:
            if self.delay_s is None:
                time.sleep(0.2)
                continue
            # Wait for a connection to be queued, then hold it for the delay before accepting.
            r, _, _ = select.select([self.sock], [], [], 0.2)
            if not r:
                continue
            time.sleep(self.delay_s)
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._pipe, args=(c,), daemon=True).start()

    def _pipe(self, c):
        try:
            u = socket.create_connection(self.target)
        except OSError:
            c.close()
            return
        splice(c, u, lambda: self._stop)


class CanaryListener(_Listener):
    """Counts connections to (host, port); for proving that nothing was dialled."""

    def __init__(self, host, port, sock=None):
        self.sock = sock or FaultServer._listen(host, port)
        self.host, self.port = host, port
        self.hits = 0
        self._serve_in_background()

    def _accepted(self, conn):
        self.hits += 1
        conn.close()


# ----------------------------------------------------------------------------- DNS inside a namespace

class StubNameServer:
    """A DNS server on 127.0.0.1:53 (UDP) inside ``ns`` (a ``Namespace(net=True)``), for the
    daemon's getaddrinfo. Each name is answered by the first rule whose key is the name or a
    suffix of it (``"*"`` matches every name): a list of IPv4 addresses (A; AAAA gets an empty
    answer), ``"hang"`` (never answered), ``"servfail"`` or ``"nxdomain"``. Every query is
    recorded (``queries``: (monotonic time, name, qtype)); ``rules`` may change at any time.

    ``resolv`` rewrites the namespace's resolv.conf (glibc: ``timeout`` seconds per try, one
    try), and ``dns_only`` its nsswitch.conf to ``hosts: dns`` (no hosts file)."""

    QTYPES = {1: "A", 28: "AAAA"}

    def __init__(self, ns, rules=None, *, timeout=5, dns_only=False):
        assert ns.net, "the name server lives in a network namespace of its own"
        self.rules = dict(rules or {})
        self.queries: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        Path(ns.dir, "resolv.conf").write_text(f"nameserver 127.0.0.1\noptions timeout:{timeout} attempts:1\n")
        if dns_only:
            Path(ns.dir, "nsswitch.conf").write_text("passwd: files\ngroup: files\nshadow: files\nhosts: dns\n")

        def bind():
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 53))
            return sock

        self.sock = ns.in_net(bind)
        self.sock.settimeout(0.2)
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()
        _CLEANUPS.append(self.close)

    def close(self):
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.close()

    def count(self, name, qtype="A"):
        with self._lock:
            return sum(1 for _, n, t in self.queries if n == name.lower() and t == qtype)

    def names(self):
        with self._lock:
            return {n for _, n, _ in self.queries}

    def rule(self, name):
        for key in (name, *[name.split(".", i)[-1] for i in range(1, name.count(".") + 1)], "*"):
            if key in self.rules:
                return self.rules[key]
        return "nxdomain"

    def _serve(self):
        while not self._stop:
            try:
                data, peer = self.sock.recvfrom(4096)
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            try:
                reply = self._answer(data)
            except (IndexError, struct.error, UnicodeDecodeError):
                continue
            if reply is not None:
                with contextlib.suppress(OSError):
                    self.sock.sendto(reply, peer)

    def _answer(self, data):
        qid, _flags, qdcount = struct.unpack("!HHH", data[:6])
        if qdcount != 1:
            return None
        i, labels = 12, []
        while data[i]:
            labels.append(data[i + 1:i + 1 + data[i]].decode("ascii"))
            i += 1 + data[i]
        question_end = i + 5
        qtype = struct.unpack("!H", data[i + 1:i + 3])[0]
        name = ".".join(labels).lower()
        with self._lock:
            self.queries.append((time.monotonic(), name, self.QTYPES.get(qtype, str(qtype))))
        action = self.rule(name)
        if action == "hang":
            return None
        rcode = {"servfail": 2, "nxdomain": 3}.get(action, 0) if isinstance(action, str) else 0
        answers = b""
        count = 0
        if rcode == 0 and qtype == 1:
            for address in action:
                answers += struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(address)
                count += 1
        header = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, count, 0, 0)
        return header + data[12:question_end] + answers


class NamespaceRelay(_Listener):
    """Makes ``target`` (host, port) on this host's network reachable from inside ``ns`` (a
    ``Namespace(net=True)``) at 127.0.0.1:``port`` (default: the target's port): the listening
    socket is made in the namespace, the onward connections out of it. Bytes are piped as they
    are (TLS goes end to end)."""

    def __init__(self, ns, target, port=None):
        self.target = target
        self.port = port or target[1]

        def listen():
            return FaultServer._listen("127.0.0.1", self.port)

        self.sock = ns.in_net(listen)
        self.sock.settimeout(0.2)
        # Started from this (host namespace) thread: its connections go out of the namespace.
        self._serve_in_background()

    def _serve(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            try:
                u = socket.create_connection(self.target, timeout=10)
            except OSError:
                c.close()
                continue
            threading.Thread(target=self._pipe, args=(c, u), daemon=True).start()

    def _pipe(self, c, u):
        for s in (c, u):
            s.settimeout(None)
        splice(c, u, lambda: self._stop)


# ----------------------------------------------------------------------------- peers

def as_peer(uid, gid, fn, groups=()):
    """Runs fn() in a forked child with this uid/gid (and supplementary groups); returns its
    JSON-serialisable result (or raises what it raised, as RuntimeError)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            try:
                out = {"ok": fn()}
            except BaseException as e:  # noqa: BLE001
                out = {"err": f"{type(e).__name__}: {e}", "errno": getattr(e, "errno", None)}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 1 << 20)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data) if data else {"err": "child produced nothing"}


def sha256_hex(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "summary":
        # summary [START_EPOCH_SECONDS [STATUS]]
        elapsed = time.time() - float(sys.argv[2]) if len(sys.argv) > 2 else None
        status = sys.argv[3] if len(sys.argv) > 3 else None
        s = summary(elapsed, status)
        print("reliability checks: faults injected={faults_injected} (fault cases={fault_cases}), "
              "hostile inputs tried={hostile_inputs}, SSRF cases={ssrf} (registration {r}, send time {t}), "
              "access checks={access_checks}{el}{st} -> build/reliability/checks.json".format(
                  ssrf=s["ssrf_registration_cases"] + s["ssrf_send_time_cases"], r=s["ssrf_registration_cases"],
                  t=s["ssrf_send_time_cases"], el=f", {s['elapsed_s']} s" if "elapsed_s" in s else "",
                  st=f", pytest {status}" if status else "", **s))
    elif len(sys.argv) >= 2 and sys.argv[1] == "reset":
        shutil.rmtree(COUNTS_DIR, ignore_errors=True)
    else:
        print(__doc__)
