"""What the reliability harnesses share (standard library plus `cryptography`, from the
venv of `make python-deps`):

- `Gateways`: Tests/gateways/gateways.py in its own process, driven over its control API;
- `provider_keys`: the APNs, FCM and VAPID keys, registered at the gateways and written
  where Herald reads them;
- `herald_config`: a config with all three transports pointed at the gateways;
- `Daemon`: `herald serve` on a state directory that outlives it (kill -9, restart),
  its stderr appended to one log file across restarts;
- `RPC`: a newline-framed JSON-RPC 2.0 client that checks every response it reads
  (`ProtocolViolation` on anything that is not a valid response to a request it sent).
"""
import base64
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GATEWAYS_PY = os.path.join(REPO, "Tests/gateways/gateways.py")

KEY_ID = "ABC123DEFG"
TEAM_ID = "TEAM123456"
TOPIC = "com.example.app"
PROJECT_ID = "herald-reliability"
CLIENT_EMAIL = "herald@herald-reliability.iam.gserviceaccount.com"

GATEWAY_NAMES = ("apns", "fcm", "webpush")


class HarnessFailure(Exception):
    """A broken promise of the daemon (not a harness problem)."""


class ProtocolViolation(HarnessFailure):
    """A response that is not valid JSON-RPC 2.0, or not for the request it answers."""


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


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


def peak_rss_kb(pid):
    """VmHWM (peak resident set, KiB) and VmRSS of a live process."""
    out = proc_memory_kb(pid)
    return out.get("VmHWM"), out.get("VmRSS")


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


# ---------------------------------------------------------------- gateways


class Gateways:
    """The provider test gateways in a child process (its output in `log_path`)."""

    def __init__(self, directory):
        self.dir = os.path.join(directory, "gateways")
        os.makedirs(self.dir, exist_ok=True)
        self.log_path = os.path.join(directory, "gateways.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, GATEWAYS_PY, "--dir", self.dir, "--exit-with-parent"],
            stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL)
        info_path = os.path.join(self.dir, "gateways.json")
        deadline = time.monotonic() + 60
        while not os.path.exists(info_path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the gateways did not start:\n" + tail(self.log_path))
            time.sleep(0.05)
        with open(info_path) as f:
            self.info = json.load(f)
        self.pid = self.proc.pid
        self._local = threading.local()

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            c = http.client.HTTPConnection("127.0.0.1", self.info["control"], timeout=120)
            self._local.conn = c
        return c

    def request(self, method, path, body=None):
        for attempt in (0, 1):
            c = self._conn()
            try:
                data = json.dumps(body).encode() if body is not None else None
                headers = {"content-type": "application/json"} if data is not None else {}
                c.request(method, path, body=data, headers=headers)
                resp = c.getresponse()
                raw = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"gateway control {method} {path}: {resp.status} {raw[:300]!r}")
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

    def knobs(self, gateway, **knobs):
        return self.post("/control/knobs", {"gateway": gateway, **knobs})

    def set_delay(self, ms):
        for g in GATEWAY_NAMES:
            self.knobs(g, delay_ms=int(ms))

    def received(self, gateway, since=0, kind=None):
        q = {"gateway": gateway, "since": since}
        if kind:
            q["kind"] = kind
        return self.get("/control/received", **q)["requests"]

    def stats(self):
        return self.get("/control/stats")

    def open_connections(self):
        return sum(self.stats()["open_connections"].values())

    def subscription(self):
        return self.post("/control/webpush-subscription", {})

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def provider_keys(directory, gw):
    """Makes the three provider keys, registers their public halves at the gateways
    and writes the private files Herald reads (apns.p8, fcm.json, vapid.pem)."""
    apns = ec.generate_private_key(ec.SECP256R1())
    with open(os.path.join(directory, "apns.p8"), "wb") as f:
        f.write(apns.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    gw.post("/control/apns-key", {
        "key_id": KEY_ID, "team_id": TEAM_ID, "topics": [TOPIC, TOPIC + ".voip"],
        "public_key_pem": apns.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
    })
    fcm = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    gw.post("/control/fcm-key", {
        "client_email": CLIENT_EMAIL, "project_id": PROJECT_ID,
        "public_key_pem": fcm.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
    })
    account = {
        "type": "service_account", "project_id": PROJECT_ID, "private_key_id": "k1",
        "private_key": fcm.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()).decode(),
        "client_email": CLIENT_EMAIL, "token_uri": f"https://127.0.0.1:{gw.info['fcm']}/token",
    }
    with open(os.path.join(directory, "fcm.json"), "w") as f:
        json.dump(account, f)
    vapid = ec.generate_private_key(ec.SECP256R1())
    with open(os.path.join(directory, "vapid.pem"), "wb") as f:
        f.write(vapid.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    point = vapid.public_key().public_bytes(serialization.Encoding.X962,
                                            serialization.PublicFormat.UncompressedPoint)
    gw.post("/control/webpush-vapid-key", {"public_key": b64u(point)})


def herald_config(directory, gw, delivery="", server="", log_level="info"):
    """A config with every transport configured against the gateways (as
    Tests/PushDeliveryTests/Support.swift does), state in `directory`."""
    apns = f"https://127.0.0.1:{gw.info['apns']}"
    return f"""[server]
socket = {directory}/herald.sock
socket_mode = 0600
state_dir = {directory}
log_level = {log_level}
{server}

[store]
key = {directory}/store.key
synchronous = full

[delivery]
{delivery}

[endpoints]
apns_production = {apns}
apns_development = {apns}
fcm = https://127.0.0.1:{gw.info['fcm']}
ca_file = {gw.info['ca']}
webpush_allow_private = true

[app.default]
device_cap = 20
apns_key = {directory}/apns.p8
apns_key_id = {KEY_ID}
apns_team_id = {TEAM_ID}
apns_topic = {TOPIC}
fcm_credentials = {directory}/fcm.json
vapid_key = {directory}/vapid.pem
vapid_subject = mailto:ops@example.com
"""


# ---------------------------------------------------------------- daemon


class Daemon:
    """`herald serve` on `directory`; `start()` may be called again after `kill9()`
    on the same state. Every start appends to `log_path` after a marker line."""

    def __init__(self, binary, directory, config):
        self.binary = binary
        self.dir = directory
        self.socket_path = os.path.join(directory, "herald.sock")
        self.config_path = os.path.join(directory, "herald.conf")
        with open(self.config_path, "w") as f:
            f.write(config)
        self.log_path = os.path.join(directory, "herald.stderr.log")
        self.proc = None
        self.starts = 0
        self.kills = 0

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout=60):
        assert not self.alive()
        self.starts += 1
        with open(self.log_path, "ab") as f:
            f.write(f"==== harness: start #{self.starts} at {time.time():.3f}\n".encode())
            env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID")}
            self.proc = subprocess.Popen([self.binary, "serve", "--config", self.config_path],
                                         stdout=f, stderr=f, stdin=subprocess.DEVNULL, env=env)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                break
            try:
                with RPC(self.socket_path, timeout=5) as c:
                    if c.call("system.health").get("result") is not None:
                        return time.monotonic() - t0
            except (OSError, ConnectionError, ProtocolViolation, ValueError):
                pass
            time.sleep(0.02)
        status = self.proc.poll()
        raise HarnessFailure(f"herald did not start (exit status {status}):\n" + tail(self.log_path))

    def kill9(self):
        """SIGKILL and reap; returns the exit status (-9)."""
        self.kills += 1
        self.proc.send_signal(signal.SIGKILL)  # no-op when already killed (it is reaped only here)
        status = self.proc.wait()
        with open(self.log_path, "ab") as f:
            f.write(f"==== harness: kill -9 #{self.kills} at {time.time():.3f}\n".encode())
        return status

    def stop(self, timeout=30):
        """SIGTERM, then wait; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

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
        return peak_rss_kb(self.pid)[0] if self.alive() else None

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


# ---------------------------------------------------------------- JSON-RPC


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
    """One connection. `call` is one request and its answer; `send`/`read` pipeline."""

    def __init__(self, path, timeout=120):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 1
        self.pending = set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request_bytes(self, method, params, rid=None):
        if rid is None:
            rid = self.next_id
            self.next_id += 1
        self.pending.add(rid)
        return rid, (json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}},
                                separators=(",", ":")).encode() + b"\n")

    def send(self, method, params=None):
        rid, data = self.request_bytes(method, params)
        self.sock.sendall(data)
        return rid

    def send_many(self, method, params_list):
        ids, chunks = [], []
        for p in params_list:
            rid, data = self.request_bytes(method, p)
            ids.append(rid)
            chunks.append(data)
        self.sock.sendall(b"".join(chunks))
        return ids

    def read(self):
        """The next response (checked), or raises ConnectionError at EOF."""
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line, self.buf = self.buf[:i], self.buf[i + 1:]
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise ProtocolViolation(f"response is not JSON ({e}): {line[:300]!r}")
                return check_response(obj, self.pending)
            chunk = self.sock.recv(1 << 17)
            if not chunk:
                raise ConnectionError("herald closed the connection")
            self.buf += chunk

    def call(self, method, params=None):
        rid = self.send(method, params)
        obj = self.read()
        if obj["id"] != rid:
            raise ProtocolViolation(f"answer to {rid} came back as {obj['id']}")
        return obj

    def ok(self, method, params=None):
        obj = self.call(method, params)
        if "result" not in obj:
            raise HarnessFailure(f"{method} {json.dumps(params)[:200]} failed: {obj['error']}")
        return obj["result"]

    def pipelined(self, method, params_list, chunk=200):
        """Answers in request order."""
        out = []
        for start in range(0, len(params_list), chunk):
            ids = self.send_many(method, params_list[start:start + chunk])
            by_id = {}
            for _ in ids:
                obj = self.read()
                by_id[obj["id"]] = obj
            out += [by_id[i] for i in ids]
        return out

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
