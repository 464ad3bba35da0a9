#!/usr/bin/env python3
"""Delivery benchmark: a real release `herald serve` on a temporary directory,
pointed at the provider test gateways (Tests/gateways/gateways.py: APNs, FCM
and Web Push over HTTP/2 on loopback), driven over its Unix socket.

  1. one message to 500 devices, per platform (web500, apns500, fcm500) and
     mixed (mixed500: 200 Web Push, 200 APNs, 100 FCM): time from writing
     `push.send {"wait": true}` to its answer (every delivery final), p50 /
     p90 / p99 over 20 messages after 3 warm-up messages
  2. sustained pushes/s per platform: 500-device messages sent back to back
     with wait: true for about 10 s, delivered / elapsed
  3. CPU time of herald and of the gateway process (utime + stime from
     /proc/PID/stat) per 1,000 pushes in each phase, so the reader can see
     which side is saturated: the gateways are Python (h2 in Python, and the
     Web Push gateway decrypts every record), and are likely the bottleneck

Prints a table and writes benchmarks/results/delivery.json. Figures only:
nothing here fails on a timing. Undelivered pushes are reported, not hidden.
Needs the venv of `make deps` (cryptography, h2, http_ece for the gateways).

    .venv/bin/python benchmarks/delivery/bench_delivery.py [.build/release/herald]
"""
import argparse
import base64
import datetime
import http.client
import json
import os
import pathlib
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import machine  # noqa: E402  (benchmarks/machine.py)
from herald_proc import (  # noqa: E402  (benchmarks/herald_proc.py)
    Client, HeraldProcess, proc_cpu_seconds, stop_process, tail)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GATEWAYS_PY = os.path.join(REPO, "Tests/gateways/gateways.py")

KEY_ID = "ABC123DEFG"
TEAM_ID = "TEAM123456"
TOPIC = "com.example.app"
PROJECT_ID = "herald-bench"
CLIENT_EMAIL = "herald@herald-bench.iam.gserviceaccount.com"

PER_USER = 5  # devices per user: registrations are limited to 20/min per (app, user), device_cap 20
DEVICES = 500
# Devices per user in each scenario: (web, apns, fcm); 100 users each.
SCENARIOS = {
    "web500": (5, 0, 0),
    "apns500": (0, 5, 0),
    "fcm500": (0, 0, 5),
    "mixed500": (2, 2, 1),
}
SUSTAINED = {"web_sustained": "web500", "apns_sustained": "apns500", "fcm_sustained": "fcm500"}
RECORDS_RESET_AT = 60_000  # the gateway keeps 100,000 records per gateway; reset well before


def self_cpu_seconds():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


# ---------------------------------------------------------------- gateways


class Gateways:
    """Tests/gateways/gateways.py in its own process; its output goes to a log file."""

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "gateways")
        os.makedirs(self.dir)
        self.log_path = os.path.join(tmp, "gateways.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, GATEWAYS_PY, "--dir", self.dir],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL,
        )
        info_path = os.path.join(self.dir, "gateways.json")
        deadline = time.monotonic() + 60
        while not os.path.exists(info_path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                stop_process(self.proc, timeout=15)
                self.log.close()
                raise RuntimeError("the gateways did not start:\n" + tail(self.log_path))
            time.sleep(0.05)
        with open(info_path) as f:
            self.info = json.load(f)
        self.pid = self.proc.pid
        self._ctl = None
        self._lock = threading.Lock()

    def _request(self, method, path, body=None):
        with self._lock:
            for attempt in (0, 1):
                if self._ctl is None:
                    self._ctl = http.client.HTTPConnection("127.0.0.1", self.info["control"], timeout=60)
                try:
                    data = json.dumps(body).encode() if body is not None else None
                    headers = {"content-type": "application/json"} if data is not None else {}
                    self._ctl.request(method, path, body=data, headers=headers)
                    resp = self._ctl.getresponse()
                    out = json.loads(resp.read() or b"{}")
                    if resp.status != 200:
                        raise RuntimeError(f"gateway control {method} {path}: {resp.status} {out}")
                    return out
                except (http.client.HTTPException, ConnectionError, OSError):
                    self._ctl.close()
                    self._ctl = None
                    if attempt:
                        raise

    def post(self, path, body):
        return self._request("POST", path, body)

    def get(self, path):
        return self._request("GET", path)

    def cpu_seconds(self):
        return proc_cpu_seconds(self.pid)

    def stop(self):
        if self._ctl is not None:
            self._ctl.close()
        status = stop_process(self.proc, timeout=15)
        self.log.close()
        return status


def provider_keys(tmp, gw):
    """Makes the three provider keys, registers their public halves at the
    gateways, and writes the private files Herald reads."""
    apns = ec.generate_private_key(ec.SECP256R1())
    with open(os.path.join(tmp, "apns.p8"), "wb") as f:
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
    with open(os.path.join(tmp, "fcm.json"), "w") as f:
        json.dump(account, f)

    vapid = ec.generate_private_key(ec.SECP256R1())
    with open(os.path.join(tmp, "vapid.pem"), "wb") as f:
        f.write(vapid.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    # Herald refuses a key file that group or others can read.
    for name in ("apns.p8", "fcm.json", "vapid.pem"):
        os.chmod(os.path.join(tmp, name), 0o600)
    point = vapid.public_key().public_bytes(serialization.Encoding.X962,
                                            serialization.PublicFormat.UncompressedPoint)
    gw.post("/control/webpush-vapid-key", {"public_key": b64u(point)})


# ---------------------------------------------------------------- daemon


class Daemon(HeraldProcess):
    def __init__(self, binary, tmp, gw):
        apns_url = f"https://127.0.0.1:{gw.info['apns']}"
        super().__init__(binary, tmp, f"""[server]
socket = {tmp}/herald.sock
socket_mode = 0600
state_dir = {tmp}
log_level = warning
max_inflight = 2000

[store]
key = {tmp}/store.key
synchronous = full

[delivery]

[endpoints]
apns_production = {apns_url}
apns_development = https://127.0.0.1:{gw.info['apns_dev']}
fcm = https://127.0.0.1:{gw.info['fcm']}
ca_file = {gw.info['ca']}
webpush_allow_private = true

[app.default]
device_cap = 20
apns_key = {tmp}/apns.p8
apns_key_id = {KEY_ID}
apns_team_id = {TEAM_ID}
apns_topic = {TOPIC}
fcm_credentials = {tmp}/fcm.json
vapid_key = {tmp}/vapid.pem
vapid_subject = mailto:ops@example.com
""")


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


# ---------------------------------------------------------------- set-up


def register_scenarios(client, gw):
    """Registers every scenario's devices under its own users; returns
    {scenario: [users]}. Web Push subscriptions are created at the gateway."""
    users = {}
    for si, (name, (n_web, n_apns, n_fcm)) in enumerate(SCENARIOS.items()):
        per_user = n_web + n_apns + n_fcm
        assert per_user == PER_USER and DEVICES % per_user == 0
        params = []
        names = []
        for u in range(DEVICES // per_user):
            user = f"{name}-u{u:03d}"
            names.append(user)
            for k in range(n_web):
                s = gw.post("/control/webpush-subscription", {})
                params.append({"user": user, "platform": "web", "token": s["endpoint"],
                               "keys": {"p256dh": s["p256dh"], "auth": s["auth"]}})
            for k in range(n_apns):
                params.append({"user": user, "platform": "apns",
                               "token": f"{si + 1:08x}{u * n_apns + k + 1:056x}"})
            for k in range(n_fcm):
                params.append({"user": user, "platform": "fcm", "token": f"bench-{name}-{u}-{k}"})
        answers = client.pipelined("device.register", params)
        bad = [a for a in answers if not a or "result" not in a]
        if bad:
            raise RuntimeError(f"{name}: {len(bad)} of {len(params)} registrations failed, first: {bad[0]}")
        users[name] = names
    return users


# ---------------------------------------------------------------- measuring


class Meter:
    """Wall clock and the CPU of herald, the gateways and this driver over one phase."""

    def __init__(self, daemon, gw):
        self.daemon, self.gw = daemon, gw

    def __enter__(self):
        self.h0, self.g0, self.c0 = self.daemon.cpu_seconds(), self.gw.cpu_seconds(), self_cpu_seconds()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.herald = self.daemon.cpu_seconds() - self.h0
        self.gateway = self.gw.cpu_seconds() - self.g0
        self.driver = self_cpu_seconds() - self.c0

    def summary(self, pushes):
        k = 1000 / pushes if pushes else float("nan")
        w = self.wall if self.wall > 0 else float("nan")
        return {
            "wall_s": round(self.wall, 3),
            "pushes": pushes,
            "herald_cpu_s": round(self.herald, 3),
            "gateway_cpu_s": round(self.gateway, 3),
            "driver_cpu_s": round(self.driver, 3),
            "herald_cpu_ms_per_1000": round(self.herald * 1000 * k, 1),
            "gateway_cpu_ms_per_1000": round(self.gateway * 1000 * k, 1),
            "herald_core_share": round(self.herald / w, 3),
            "gateway_core_share": round(self.gateway / w, 3),
            "driver_core_share": round(self.driver / w, 3),
            "total_core_share": round((self.herald + self.gateway + self.driver) / w, 3),
        }


def send_wait(client, users, tag, timeout_ms):
    """One push.send with wait; (seconds, answer)."""
    params = {"to": {"users": users}, "data": {"msg": tag}, "wait": True, "timeout_ms": timeout_ms}
    t0 = time.perf_counter()
    answer = client.call("push.send", params)
    return time.perf_counter() - t0, answer


def outcome(answer):
    """(delivered, problem or None) of a push.send answer."""
    result = answer.get("result")
    if result is None:
        return 0, {"error": answer.get("error")}
    counts = result.get("counts") or {}
    delivered = counts.get("delivered", 0)
    if result.get("state") != "complete" or delivered != DEVICES or result.get("devices") != DEVICES:
        return delivered, {"state": result.get("state"), "devices": result.get("devices"),
                           "skipped": result.get("skipped"),
                           "counts": {k: v for k, v in counts.items() if v}}
    return delivered, None


def latency(daemon, gw, users, name, warmup, messages, timeout_ms):
    client = Client(daemon.socket_path, timeout=timeout_ms / 1000 + 60)
    problems = []
    try:
        for i in range(warmup):
            _, answer = send_wait(client, users, f"{name}-w{i}", timeout_ms)
            _, problem = outcome(answer)
            if problem:
                problems.append({"message": f"warm-up {i}"} | problem)
        samples = []
        delivered = 0
        with Meter(daemon, gw) as m:
            for i in range(messages):
                seconds, answer = send_wait(client, users, f"{name}-m{i}", timeout_ms)
                samples.append(seconds)
                d, problem = outcome(answer)
                delivered += d
                if problem:
                    problems.append({"message": i} | problem)
    finally:
        client.close()
    s = sorted(samples)
    measured_problems = [p for p in problems if not str(p["message"]).startswith("warm-up")]
    return {
        "scenario": name,
        "p50_ms": round(percentile(s, 0.50) * 1000, 1),
        "p90_ms": round(percentile(s, 0.90) * 1000, 1),
        "p99_ms": round(percentile(s, 0.99) * 1000, 1),
        "min_ms": round(s[0] * 1000, 1),
        "max_ms": round(s[-1] * 1000, 1),
        "mean_ms": round(statistics.fmean(s) * 1000, 1),
        "messages": messages,
        "warmup": warmup,
        "devices_per_message": DEVICES,
        "delivered": delivered,
        "delivered_all": not measured_problems and delivered == DEVICES * messages,
        "pushes_per_s": round(delivered / sum(s), 1) if sum(s) > 0 else None,
        "problems": problems,
    }, m.summary(delivered)


def sustained(daemon, gw, users, name, seconds, window, timeout_ms):
    """500-device messages back to back with wait, `window` at a time (one
    connection each), for about `seconds`."""
    deadline = [0.0]
    results = [None] * window
    barrier = threading.Barrier(window + 1)

    def worker(w):
        client = Client(daemon.socket_path, timeout=timeout_ms / 1000 + 60)
        sent = delivered = 0
        problems = []
        try:
            barrier.wait()
            while time.perf_counter() < deadline[0]:
                _, answer = send_wait(client, users, f"{name}-{w}-{sent}", timeout_ms)
                sent += 1
                d, problem = outcome(answer)
                delivered += d
                if problem:
                    problems.append({"message": f"{w}-{sent - 1}"} | problem)
        except Exception as e:  # noqa: BLE001 - reported below
            problems.append({"message": f"{w}-{sent}", "exception": repr(e)})
        finally:
            client.close()
            results[w] = {"sent": sent, "delivered": delivered, "problems": problems,
                          "done": time.perf_counter()}

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(window)]
    for t in threads:
        t.start()
    with Meter(daemon, gw) as m:
        deadline[0] = time.perf_counter() + seconds
        barrier.wait()
        for t in threads:
            t.join()
    sent = sum(r["sent"] for r in results)
    delivered = sum(r["delivered"] for r in results)
    problems = [p for r in results for p in r["problems"]]
    return {
        "scenario": name,
        "pushes_per_s": round(delivered / m.wall, 1) if m.wall > 0 else None,
        "seconds": round(m.wall, 3),
        "messages": sent,
        "delivered": delivered,
        "delivered_all": not problems and delivered == DEVICES * sent,
        "window": window,
        "problems": problems,
    }, m.summary(delivered)


class GatewayCounters:
    """The gateway's record lists are capped at 100,000 per gateway (and trimming
    a full list costs per request), so a gateway with many records is reset
    between phases; its counters are added up here first."""

    def __init__(self, gw):
        self.gw = gw
        self.counters = {}
        self.resets = []

    def _add(self, counters):
        for k, v in counters.items():
            if isinstance(v, int):
                self.counters[k] = self.counters.get(k, 0) + v

    def maybe_reset(self):
        stats = self.gw.get("/control/stats")
        for g, n in stats["received"].items():
            # FCM keeps its issued access tokens through a reset only with no reset
            # at all, so it is left alone (it is never near the cap at its rate).
            if n >= RECORDS_RESET_AT and g != "fcm":
                self._add({k: v for k, v in stats["counters"].items() if k.startswith(g)})
                self.gw.post("/control/reset", {"gateway": g})
                self.resets.append({"gateway": g, "records": n})

    def final(self):
        stats = self.gw.get("/control/stats")
        self._add(stats["counters"])
        conns = {}
        for g in ("apns", "fcm", "webpush"):
            cs = self.gw.get(f"/control/connections?gateway={g}").get("connections", [])
            conns[g] = {
                "connections": len(cs),
                "closed": sum(1 for c in cs if c.get("closed") is not None),
                "requests": sum(c.get("requests", 0) for c in cs),
                "peak_open_streams": max((c.get("peak_open_streams", 0) for c in cs), default=0),
                "stream_violations": sum(c.get("stream_violations", 0) for c in cs),
                "distinct_jwts_max": max((c.get("distinct_jwts", 0) for c in cs), default=0),
                "alpn": sorted({str(c.get("alpn")) for c in cs}),
            }
        return {"counters": self.counters, "connections_seen_since_last_reset": conns,
                "resets": self.resets}


# ---------------------------------------------------------------- report


def machine_info():
    return {
        "processor": machine.cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def fmt(v, width, spec):
    """`v` in `spec`, right-aligned in `width`; a dash when there is no figure."""
    return f"{format(v, spec) if isinstance(v, (int, float)) else '-':>{width}}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="?", default=os.path.join(REPO, ".build/release/herald"))
    ap.add_argument("--messages", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sustained-seconds", type=float, default=10.0)
    ap.add_argument("--sustained-window", type=int, default=1,
                    help="messages in flight at once in the sustained phase (default 1: back to back)")
    ap.add_argument("--timeout-ms", type=int, default=60_000)
    ap.add_argument("--only", default="",
                    help="comma-separated phases to run (e.g. web500,web_sustained); default all")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks/results/delivery.json"))
    args = ap.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - set(SCENARIOS) - set(SUSTAINED)
    if unknown:
        raise SystemExit(f"--only: unknown phase(s) {', '.join(sorted(unknown))}")
    if not os.access(args.binary, os.X_OK):
        raise SystemExit(f"{args.binary} is not an executable (swift build -c release --product herald)")

    load_before = machine.load_average()
    tmp = tempfile.mkdtemp(prefix="herald-bench-delivery-")
    gw = daemon = None
    herald_status = gateway_status = None
    herald_log = gateways_log = ""
    try:
        gw = Gateways(tmp)
        provider_keys(tmp, gw)
        daemon = Daemon(os.path.abspath(args.binary), tmp, gw)
        print(f"herald serve on {tmp}, gateways pid {gw.pid}", file=sys.stderr)
        setup = Client(daemon.socket_path)
        t0 = time.perf_counter()
        users = register_scenarios(setup, gw)
        print(f"  registered {DEVICES * len(SCENARIOS)} devices in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
        counters = GatewayCounters(gw)
        scenarios, sustained_rows, cpu = [], [], {}
        for name in SCENARIOS:
            if only and name not in only:
                continue
            counters.maybe_reset()
            row, c = latency(daemon, gw, users[name], name, args.warmup, args.messages, args.timeout_ms)
            scenarios.append(row)
            cpu[name] = c
            print(f"  {name}: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, "
                  f"delivered {row['delivered']}/{DEVICES * args.messages}", file=sys.stderr)
            if not daemon.alive():
                raise RuntimeError("herald exited during " + name)
        for name, base in SUSTAINED.items():
            if only and name not in only:
                continue
            counters.maybe_reset()
            row, c = sustained(daemon, gw, users[base], name, args.sustained_seconds,
                               args.sustained_window, args.timeout_ms)
            sustained_rows.append(row)
            cpu[name] = c
            print(f"  {name}: {row['pushes_per_s']:.0f} pushes/s over {row['seconds']:.1f} s",
                  file=sys.stderr)
            if not daemon.alive():
                raise RuntimeError("herald exited during " + name)
        stats_answer = setup.call("system.stats")
        setup.close()
        gateway_stats = counters.final()
    except BaseException:
        if daemon is not None:
            print("herald stderr (tail):\n" + tail(daemon.log_path), file=sys.stderr)
        if gw is not None:
            print("gateways output (tail):\n" + tail(gw.log_path), file=sys.stderr)
        raise
    finally:
        if daemon is not None:
            herald_status = daemon.stop()
            herald_log = tail(daemon.log_path, 40)
        if gw is not None:
            gateway_status = gw.stop()
            gateways_log = tail(gw.log_path, 40)
        shutil.rmtree(tmp, ignore_errors=True)

    load_after = machine.load_average()
    stats_result = stats_answer.get("result") or {}
    stats = {
        "transports": stats_result.get("transports"),
        "apns": stats_result.get("apns"),
        "queue": stats_result.get("queue"),
        "requests": stats_result.get("requests"),
        "connections": stats_result.get("connections"),
        "devices": stats_result.get("devices"),
        "error": stats_answer.get("error"),
    }

    notes = []
    for row in scenarios + sustained_rows:
        if not row["delivered_all"] or row["problems"]:
            first = row["problems"][0] if row["problems"] else {}
            notes.append(f"{row['scenario']}: {len(row['problems'])} message(s) not fully delivered "
                         f"(delivered {row['delivered']}); first: {json.dumps(first)}")
    notes.append(
        "the gateways are one single-threaded Python process (asyncio, h2 in Python; the Web Push gateway "
        "checks the VAPID JWT and decrypts every 2816-byte record with cryptography, and every request is "
        "recorded), so they are likely the bottleneck: a gateway near 100% of a core caps a figure, which is "
        "then a lower bound for Herald"
    )
    more_herald = [n for n, c in cpu.items() if c["herald_cpu_s"] > c["gateway_cpu_s"]]
    more_gateway = [n for n in cpu if n not in more_herald]
    if more_gateway:
        notes.append("the gateways used more CPU per push than herald in " + ", ".join(
            f"{n} ({cpu[n]['gateway_cpu_ms_per_1000'] / 1000:.2f} vs {cpu[n]['herald_cpu_ms_per_1000'] / 1000:.2f} ms, "
            f"gateway at {cpu[n]['gateway_core_share']:.0%} of a core)" for n in more_gateway))
    if more_herald:
        notes.append("herald used more CPU per push than the gateways in " + ", ".join(
            f"{n} ({cpu[n]['herald_cpu_ms_per_1000'] / 1000:.2f} vs {cpu[n]['gateway_cpu_ms_per_1000'] / 1000:.2f} ms, "
            f"herald at {cpu[n]['herald_core_share']:.0%} of a core)" for n in more_herald))
    busy = [n for n, c in cpu.items() if c["total_core_share"] >= 0.85 * (os.cpu_count() or 1)]
    if busy:
        notes.append(f"herald + gateways + driver used >= 85% of all {os.cpu_count()} cores in "
                     f"{', '.join(busy)}: the machine, not one side, is saturated there")
    notes.append(f"{os.cpu_count()} cores shared by herald, the gateways and this driver")
    if herald_status not in (0, None):
        notes.append(f"herald exited with status {herald_status} after SIGTERM")
    if herald_log.strip():
        notes.append("herald stderr (log_level warning), last lines:\n" + herald_log)
    if gateway_status not in (0, None):
        notes.append(f"the gateways exited with status {gateway_status}:\n{gateways_log}")

    result = {
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "herald_version": stats_result.get("version"),
        "config": {"max_inflight": 2000, "synchronous": "full", "delivery": "defaults",
                   "devices_per_message": DEVICES, "devices_per_user": PER_USER,
                   "mixed500": "200 web, 200 apns, 100 fcm",
                   "sustained_window": args.sustained_window, "timeout_ms": args.timeout_ms},
        "scenarios": scenarios,
        "sustained": sustained_rows,
        "cpu": cpu,
        "stats": stats,
        "gateway_stats": gateway_stats,
        "herald_exit_status": herald_status,
        # Other work on the machine shows here (the CPU shares are of a shared machine).
        "load_average": {"before": load_before, "after": load_after},
        "notes": notes,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")

    m = result["machine"]
    print()
    print(f"Herald delivery to the test gateways ({m['processor']}, {m['cores']} cores), "
          f"{DEVICES} devices per message, wait: true")
    print(f"  {'scenario':16} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'pushes/s':>9}   "
          f"{'herald CPU':>10} {'gateway CPU':>11}  (ms per 1,000 pushes; % of a core)")
    for row in scenarios + sustained_rows:
        c = cpu[row["scenario"]]
        lat = [fmt(row.get(k), 8, ".1f") for k in ("p50_ms", "p90_ms", "p99_ms")]
        print(f"  {row['scenario']:16} {lat[0]} {lat[1]} {lat[2]} {fmt(row['pushes_per_s'], 9, ',.0f')}   "
              f"{c['herald_cpu_ms_per_1000']:7.0f} ms {c['gateway_cpu_ms_per_1000']:8.0f} ms  "
              f"({c['herald_core_share']:.0%} / {c['gateway_core_share']:.0%})"
              + ("" if row["delivered_all"] else "  NOT all delivered"))
    print(f"  (pushes/s of a latency row: delivered / the sum of its {args.messages} send-to-answer times; "
          "CPU: utime + stime from /proc over the measured messages)")
    print(f"  load average before / after: {result['load_average']['before']} / {result['load_average']['after']}")
    tr = stats["transports"] or {}
    print("  herald counters: " + ", ".join(
        f"{p} sent {t.get('sent')} delivered {t.get('delivered')} retried {t.get('retried')} "
        f"failed {t.get('failed')}" for p, t in tr.items() if t.get("sent")))
    if stats["apns"]:
        a = stats["apns"]
        print(f"  APNs connections: {a.get('connections')} open, {a.get('connections_opened')} opened, "
              f"{a.get('connect_failures')} connect failures, {a.get('goaways')} GOAWAYs, "
              f"{a.get('timeouts')} timeouts, {a.get('tokens_signed')} tokens signed")
    print("notes:")
    for n in notes:
        print("  - " + n)
    print(f"\nwritten to {os.path.relpath(args.out)}")


if __name__ == "__main__":
    main()
