#!/usr/bin/env python3
"""Fan-out benchmark: how fast does one message reach 500 devices, next to the
senders people use today, all against the same sink in the same run.

The sink is Debian's nginx on loopback (benchmarks/fanout/sink.py: TLS with a
CA made for the run, HTTP/2, answering like APNs, FCM and Web Push on several
Web Push origins). Against it, one after the other:

  herald             a release `herald serve` on a temporary directory, driven
                     over its Unix socket: `push.send {"to": {"users": [100
                     users]}, "wait": true}` timed from the write to the answer,
                     so each figure holds the RPC, the store commit, sealing
                     and HTTP until every delivery is final
  pywebpush_seq      pywebpush.webpush() 500 times in sequence
  pywebpush_threads  the same in a 32-thread pool
  aioapns            500 APNs sends at once on its connection pool
  h2load             the raw HTTP/2 request rate to the sink: the ceiling
  http_ece           seal-only, for the crypto share (next to Herald's seal
                     figures from benchmarks/results/crypto.json)

Scenarios: web500, apns500, fcm500, mixed500 (200 web, 200 APNs, 100 FCM):
`--messages` messages after `--warmup`; then web_sustained, apns_sustained,
fcm_sustained: 500-device messages back to back for `--sustained-seconds`.
Peers run each in a process of their own (benchmarks/fanout/peers.py); CPU
(utime + stime) and peak RSS (VmHWM) of every sender come from /proc, of
h2load from wait4().

Prints the table, writes OUT_DIR/fanout.json (one object per scenario and
sender), OUT_DIR/fanout-details.json (everything), OUT_DIR/REPORT.md and its
PNG plots. Figures only: no timing fails anything. With --check the exit
status is 1 when any push of any sender was not delivered, or when the sink's
access log (the receiver's own record, see Receipts) does not show every push
Herald accepted reaching each of its devices exactly once.

    .venv/bin/python benchmarks/fanout/bench_fanout.py [--quick] [--check] [--perf] \
        [--herald .build/release/herald] [--out-dir benchmarks/results]
"""
import argparse
import bisect
import collections
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import fixture  # noqa: E402
import machine  # noqa: E402  (benchmarks/machine.py)
import report  # noqa: E402
from h2load import H2Load, version as h2load_version  # noqa: E402
from herald_proc import (  # noqa: E402  (benchmarks/herald_proc.py)
    HeraldProcess, proc_cpu_seconds, proc_peak_rss_kb, reset_peak_rss, tail)
from sink import NGINX, Sink  # noqa: E402

REPO = HERE.parent.parent
DEVICES = 500
USERS = 100
SCENARIOS = {  # devices per user: (web, apns, fcm)
    "web500": (5, 0, 0),
    "apns500": (0, 5, 0),
    "fcm500": (0, 0, 5),
    "mixed500": (2, 2, 1),
}
PEERS = {"web500": ["pywebpush_seq", "pywebpush_threads"], "apns500": ["aioapns"], "fcm500": [], "mixed500": []}
SUSTAINED = {
    "web_sustained": ("web500", "web", ["pywebpush_seq", "pywebpush_threads"]),
    "apns_sustained": ("apns500", "apns", ["aioapns"]),
    "fcm_sustained": ("fcm500", "fcm", []),
}
SENDERS = ["herald", "pywebpush_seq", "pywebpush_threads", "aioapns", "h2load"]
PAYLOAD = '{"kind":"notification","data":{"msg":"TAG"}}'
WEB_ORIGINS = 5


def percentile(values, q):
    s = sorted(values)
    if not s:
        return None
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def row(scenario, sender, samples, delivered, expected, cpu_s, peak_rss_kb, wall_s=None, **extra):
    """One result row. Latency rows: pushes/s = delivered / the sum of the
    message times; sustained rows (wall_s given): delivered / wall time."""
    ms = [x * 1000 for x in samples]
    busy = wall_s if wall_s is not None else sum(samples)
    r = {
        "scenario": scenario, "sender": sender,
        "p50_ms": round(percentile(ms, 0.5), 2) if ms else None,
        "p90_ms": round(percentile(ms, 0.9), 2) if ms else None,
        "p99_ms": round(percentile(ms, 0.99), 2) if ms else None,
        "pushes_per_s": round(delivered / busy, 1) if busy and busy > 0 else None,
        "cpu_s_per_1000": round(cpu_s * 1000 / delivered, 3) if delivered else None,
        "peak_rss_mb": round(peak_rss_kb / 1024, 1) if peak_rss_kb else None,
        "messages": len(samples), "delivered": delivered, "expected": expected,
        "delivered_all": delivered == expected and expected > 0,
        "samples_ms": [round(x, 2) for x in ms],
    }
    r.update(extra)
    return r


# ---------------------------------------------------------------- Herald


class Herald:
    def __init__(self, binary, directory, sink, keys):
        self.proc = HeraldProcess(binary, directory, fixture.herald_config(directory, sink, keys))
        self.pid = self.proc.proc.pid
        self.client = fixture.Client(self.proc.socket_path, timeout=180)
        self.accepted = 0  # push.send calls answered with a result

    def send(self, users, tag, timeout_ms=60_000):
        t0 = time.perf_counter()
        answer = self.client.call("push.send", {"to": {"users": users}, "data": {"msg": tag},
                                                "wait": True, "timeout_ms": timeout_ms})
        seconds = time.perf_counter() - t0
        result = answer.get("result")
        if result is None:
            return seconds, 0, {"error": answer.get("error")}
        self.accepted += 1  # one push to each of the users' devices, which the sink must have received
        counts = result.get("counts") or {}
        delivered = counts.get("delivered", 0)
        problem = None
        if result.get("state") != "complete" or delivered != DEVICES or result.get("devices") != DEVICES:
            problem = {"state": result.get("state"), "devices": result.get("devices"),
                       "skipped": result.get("skipped"), "counts": {k: v for k, v in counts.items() if v}}
        return seconds, delivered, problem

    def messages(self, scenario, users, warmup, messages=None, seconds=None):
        problems = []
        for i in range(warmup):
            _, _, p = self.send(users, f"{scenario}-w{i}")
            if p:
                problems.append({"message": f"warm-up {i}", **p})
        reset_peak_rss(self.pid)
        c0, t0 = proc_cpu_seconds(self.pid), time.perf_counter()
        samples, delivered, i = [], 0, 0
        while (i < messages) if seconds is None else (time.perf_counter() - t0 < seconds):
            s, d, p = self.send(users, f"{scenario}-m{i}")
            samples.append(s)
            delivered += d
            if p:
                problems.append({"message": i, **p})
            i += 1
        wall = time.perf_counter() - t0
        cpu = proc_cpu_seconds(self.pid) - c0
        return samples, delivered, cpu, proc_peak_rss_kb(self.pid), wall, problems

    def stop(self):
        try:
            self.client.close()
        except OSError:
            pass
        return self.proc.stop()


# ---------------------------------------------------------------- the receiver's record


class Receipts:
    """Herald's pushes judged by what the sink recorded, not by Herald's counts.

    The run is cut into phases, one sender at a time (registration, herald on a
    scenario, a peer, h2load, ...), each starting at a wall-clock time; every
    access-log record (nginx's $msec at the end of the request) belongs to the
    phase it falls in. In a herald phase every device of the scenario must have
    been sent exactly one 2xx-answered request per accepted push.send of the
    phase (Herald is never restarted here: no duplicate is allowed), none to a
    path that is not one of the scenario's devices, none answered otherwise.
    In any phase a request to a path that is no registered device is a problem.
    h2load's requests and the OAuth token requests are not logged (sink.py)."""

    def __init__(self, sink):
        self.sink = sink
        self.devices, self.known = {}, set()
        # [t_start, sender, scenario, accepted pushes (herald) or None, scenario whose devices (herald)]
        self.phases = []

    def set_devices(self, devices):
        """devices: scenario -> the devices fixture.register made for it."""
        self.devices = {name: {self.device_key(d) for d in devs} for name, devs in devices.items()}
        self.known = set().union(*self.devices.values())

    def device_key(self, d):
        if d["platform"] == "apns":
            return ("apns", d["token"])
        if d["platform"] == "fcm":
            return ("fcm", d["token"])
        u = urllib.parse.urlsplit(d["token"])
        return ("web", u.hostname, u.port, u.path)

    def record_key(self, r):
        port, path = r["p"], r["u"]
        if port == self.sink.apns_port and path.startswith("/3/device/"):
            return ("apns", urllib.parse.unquote(path[len("/3/device/"):]))
        if port == self.sink.fcm_port and re.fullmatch(r"/v1/projects/[^/]+/messages:send", path):
            return ("fcm", r["fcm"])
        if port == self.sink.web_port and path.startswith("/push/"):
            return ("web", r["a"], port, path)
        return ("unknown", f"{r['a']}:{port}{path}")

    def phase(self, sender, scenario=None):
        # nginx logs whole milliseconds (its time cached at the event loop's
        # wake-up, never later than the request's end): 2 ms on either side of
        # the boundary keep each request on its own side.
        time.sleep(0.002)
        self.phases.append([time.time(), sender, scenario, None, scenario])
        time.sleep(0.002)

    def herald_phase(self, scenario, herald, devices_of=None):
        """A herald phase sending to the devices of `devices_of` (default: the
        scenario's); `done()` afterwards records how many pushes it accepted."""
        self.phase("herald", scenario)
        entry = self.phases[-1]
        entry[4] = devices_of or scenario
        start = herald.accepted

        def done():
            entry[3] = herald.accepted - start
        return done

    def expected(self):
        return sum(len(self.devices[p[4]]) * (p[3] or 0) for p in self.phases if p[1] == "herald")

    def herald_records(self, recs):
        starts = [p[0] for p in self.phases]
        n = 0
        for r in recs:
            i = bisect.bisect_right(starts, r["t"]) - 1
            if i >= 0 and self.phases[i][1] == "herald":
                n += 1
        return n

    def wait_flushed(self, timeout=30.0):
        """Waits, with a deadline, until the log holds at least the herald records
        expected (nginx flushes its buffer every second); True when it did."""
        want = self.expected()
        _, ok = self.sink.wait_records(lambda recs: self.herald_records(recs) >= want, timeout=timeout)
        return ok

    def check(self, recs):
        """(problems, summary) over every record of the log."""
        starts = [p[0] for p in self.phases]
        per_phase = [collections.Counter() for _ in self.phases]
        bad_status = [collections.Counter() for _ in self.phases]
        problems, early = [], 0
        for r in recs:
            i = bisect.bisect_right(starts, r["t"]) - 1
            if i < 0:
                early += 1
                continue
            key = self.record_key(r)
            if 200 <= r["s"] < 300:
                per_phase[i][key] += 1
            else:
                bad_status[i][(key, r["s"])] += 1
        if early:
            problems.append({"sender": "?", "receiver": f"{early} request(s) logged before the run started"})
        summary = []
        for (t0, sender, scenario, accepted, devset), got, bad in zip(self.phases, per_phase, bad_status):
            unknown = sorted(k for k in got if k not in self.known)
            info = {"sender": sender, "scenario": scenario, "requests_2xx": sum(got.values()),
                    "other_status": sum(bad.values()), "unknown_paths": len(unknown)}
            where = {"scenario": scenario, "sender": sender}
            if unknown:
                problems.append({**where, "receiver": f"{len(unknown)} path(s) that are no registered device "
                                 f"got {sum(got[k] for k in unknown)} request(s), e.g. {unknown[:3]}"})
            if sender == "herald":
                devs = self.devices[devset]
                info["accepted_pushes"] = accepted
                info["expected"] = len(devs) * (accepted or 0)
                missing = sorted(k for k in devs if got.get(k, 0) < (accepted or 0))
                extra = sorted(k for k in devs if got.get(k, 0) > (accepted or 0))
                stray = sorted(k for k in got if k not in devs and k in self.known)
                info.update(missing_devices=len(missing), duplicated_devices=len(extra), other_devices=len(stray))
                if missing:
                    problems.append({**where, "receiver": (
                        f"{len(missing)} of {len(devs)} devices got fewer than the {accepted} accepted push(es) "
                        f"(nginx logged {sum(max(0, accepted - got.get(k, 0)) for k in missing)} fewer requests), "
                        f"e.g. {[(k, got.get(k, 0)) for k in missing[:3]]}")})
                if extra:
                    problems.append({**where, "receiver": (
                        f"{len(extra)} of {len(devs)} devices got more than the {accepted} accepted push(es) "
                        f"(duplicates; none allowed: Herald is not restarted), "
                        f"e.g. {[(k, got[k]) for k in extra[:3]]}")})
                if stray:
                    problems.append({**where, "receiver": (
                        f"{len(stray)} device(s) of other scenarios got requests, e.g. {stray[:3]}")})
                if bad:
                    problems.append({**where, "receiver": (
                        f"{sum(bad.values())} request(s) answered other than 2xx, e.g. "
                        f"{sorted(bad.items())[:3]}")})
            elif sender == "idle" and (got or bad):
                problems.append({**where, "receiver": f"{sum(got.values()) + sum(bad.values())} request(s) "
                                 "after the last phase ended"})
            summary.append(info)
        return problems, summary


# ---------------------------------------------------------------- peers


def peer_env():
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a Session's
    # `verify` (trust_env): a machine that sets them would hide the sink's CA.
    return {k: v for k, v in os.environ.items() if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")}


def run_peer(tmp, peer, devices, sink, keys, messages=None, warmup=0, seconds=None):
    job = {"peer": peer, "devices": devices, "messages": messages, "warmup": warmup, "seconds": seconds,
           "payload": PAYLOAD, "ca": sink.ca, "vapid_key": keys["vapid"],
           "vapid_subject": fixture.VAPID_SUBJECT, "threads": 32,
           "apns": {"host": "127.0.0.1", "port": sink.apns_port, "key_path": keys["apns"],
                    "key_id": fixture.KEY_ID, "team_id": fixture.TEAM_ID, "topic": fixture.TOPIC}}
    job_path = os.path.join(tmp, f"peer-{peer}.job.json")
    out_path = os.path.join(tmp, f"peer-{peer}.out.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    if os.path.exists(out_path):
        os.unlink(out_path)
    limit = (seconds or 0) + 600
    proc = subprocess.run([sys.executable, str(HERE / "peers.py"), job_path, out_path], env=peer_env(),
                          capture_output=True, text=True, timeout=limit)
    if proc.returncode != 0 or not os.path.exists(out_path):
        raise RuntimeError(f"peer {peer} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(out_path) as f:
        out = json.load(f)
    out["stderr_tail"] = proc.stderr[-1500:]
    return out


# ---------------------------------------------------------------- measuring helpers


class SinkMeter:
    def __init__(self, sink):
        self.sink = sink

    def __enter__(self):
        self.c0, self.t0 = self.sink.cpu_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.cpu = self.sink.cpu_seconds() - self.c0

    def info(self):
        return {"sink_cpu_s": round(self.cpu, 3),
                "sink_core_share": round(self.cpu / self.wall, 3) if self.wall > 0 else None}


def h2load_targets(sink, per_user):
    """(platform, origin, requests) per h2load process for one 500-device message."""
    n_web, n_apns, n_fcm = (x * USERS for x in per_user)
    out = []
    if n_web:
        per = n_web // WEB_ORIGINS
        out += [("web", sink.web_origin(i), per) for i in range(WEB_ORIGINS)]
    if n_apns:
        out.append(("apns", sink.apns_url, n_apns))
    if n_fcm:
        out.append(("fcm", sink.fcm_url, n_fcm))
    return out


class Perf:
    """perf record -g -p PID while a block runs; the flat top afterwards."""

    def __init__(self, pid, path):
        self.pid, self.path = pid, path
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(["perf", "record", "-g", "-q", "-p", str(self.pid), "-o", self.path],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self.record_stderr = (err or b"").decode("utf-8", "replace")[-1000:]

    def _report(self, *extra):
        r = subprocess.run(["perf", "report", "-i", self.path, "--no-children", "--stdio", "-g", "none",
                            "--percent-limit", "0", *extra], capture_output=True, text=True, timeout=300)
        # perf pads every row to the widest symbol and adds empty columns: trim them.
        lines = [re.sub(r"(\s+-)*\s*$", "", ln) for ln in r.stdout.splitlines()
                 if ln.strip() and not ln.startswith("#")]
        header = [ln for ln in r.stdout.splitlines() if ln.startswith("# Samples") or ln.startswith("# Event count")]
        return header, lines

    def top(self, n=30):
        """The n hottest symbols, every thread of herald together (--sort dso,symbol)."""
        header, lines = self._report("--sort", "dso,symbol")
        return header + lines[:n]

    def by_dso(self, n=12):
        return self._report("--sort", "dso")[1][:n]

    def by_thread(self, n=8):
        return self._report("--sort", "comm")[1][:n]


# ---------------------------------------------------------------- machine


def cmd_out(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (r.stdout + r.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


def machine_info(herald_version, peers):
    versions = {"herald": herald_version, "nginx": cmd_out([NGINX, "-v"]), "h2load": h2load_version(),
                "openssl": cmd_out(["openssl", "version"]), "python": platform.python_version(),
                "swift": cmd_out(["swift", "--version"]), "kernel": platform.release()}
    for out in peers:
        versions.update({k: v for k, v in (out.get("versions") or {}).items() if v})
    try:
        import matplotlib
        versions["matplotlib"] = matplotlib.__version__
    except ImportError:
        pass
    return {"processor": machine.cpu_model(), "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "versions": versions}


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--herald", default=str(REPO / ".build/release/herald"))
    ap.add_argument("--quick", action="store_true",
                    help="few iterations (2 messages, 2 s sustained phases, 1 peer message): a smoke run")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every push of every sender was delivered")
    ap.add_argument("--perf", action="store_true",
                    help="after the measured web500 and apns500 messages, profile herald (perf record -g) "
                         "over as many more")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--peer-messages", type=int)
    ap.add_argument("--sustained-seconds", type=float)
    ap.add_argument("--crypto-json", default=str(REPO / "benchmarks/results/crypto.json"))
    ap.add_argument("--out-dir", default=str(REPO / "benchmarks/results"))
    ap.add_argument("--only", default="", help="comma-separated scenarios (e.g. web500,apns_sustained)")
    args = ap.parse_args()
    messages = args.messages or (2 if args.quick else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    peer_messages = args.peer_messages or (1 if args.quick else messages)
    sustained_s = args.sustained_seconds or (2.0 if args.quick else 30.0)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - set(SCENARIOS) - set(SUSTAINED)
    if unknown:
        raise SystemExit(f"--only: unknown {sorted(unknown)}")
    if not os.access(args.herald, os.X_OK):
        raise SystemExit(f"{args.herald} is not an executable (swift build -c release --product herald)")
    out_dir = os.path.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)

    crypto = None
    try:
        with open(args.crypto_json) as f:
            crypto = json.load(f)
    except (OSError, ValueError):
        print(f"no crypto figures at {args.crypto_json} (make bench-crypto writes them)", file=sys.stderr)

    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = machine.load_average()
    tmp = tempfile.mkdtemp(prefix="herald-bench-fanout-")
    sink = herald = receipts = None
    receiver_problems, receiver_summary, completed = [], [], False
    rows, problems, peer_outs, profiles = [], [], [], {}
    herald_status, herald_log, stats = None, "", {}
    crypto_rows = []
    try:
        sink = Sink(os.path.join(tmp, "sink"), web_origins=WEB_ORIGINS, access_log=True)
        receipts = Receipts(sink)
        receipts.phase("start")  # herald's start and the registrations: no push request
        keys = fixture.provider_keys(tmp, sink)
        herald = Herald(os.path.abspath(args.herald), tmp, sink, keys)
        h2 = H2Load(os.path.join(tmp, "h2load"))
        log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
        log(f"sink: nginx pid {sink.proc.pid} (APNs {sink.apns_url}, FCM {sink.fcm_url}, Web Push "
            f"{', '.join(sink.web_origin(i) for i in range(WEB_ORIGINS))}); herald pid {herald.pid} on {tmp}")

        t0 = time.perf_counter()
        users, devices = {}, {}
        for si, (name, per_user) in enumerate(SCENARIOS.items()):
            users[name], devices[name] = fixture.register(herald.client, sink, name, si, USERS, per_user)
        receipts.set_devices(devices)
        log(f"registered {DEVICES * len(SCENARIOS)} devices in {time.perf_counter() - t0:.1f} s")

        # ---- one message to 500 devices
        for name, per_user in SCENARIOS.items():
            if only and name not in only:
                continue
            done = receipts.herald_phase(name, herald)
            with SinkMeter(sink) as sm:
                samples, delivered, cpu, rss, wall, probs = herald.messages(name, users[name], warmup, messages)
            done()
            rows.append(row(name, "herald", samples, delivered, DEVICES * messages, cpu, rss, **sm.info()))
            problems += [{"scenario": name, "sender": "herald", **p} for p in probs]
            log(f"{name} herald: p50 {rows[-1]['p50_ms']} ms, delivered {delivered}/{DEVICES * messages}")
            if args.perf and name in ("web500", "apns500"):
                data = os.path.join(tmp, f"perf-{name}.data")
                done = receipts.herald_phase(name, herald)
                with Perf(herald.pid, data) as perf:
                    psamples, pdel, _, _, _, _ = herald.messages(name, users[name], 0, messages)
                done()
                profiles[name] = {"top": perf.top(30), "by_dso": perf.by_dso(), "by_thread": perf.by_thread(),
                                  "messages": len(psamples),
                                  "p50_ms_under_perf": round(percentile(psamples, 0.5) * 1000, 2),
                                  "delivered": pdel, "record_stderr": perf.record_stderr}
                log(f"{name} profiled ({len(psamples)} messages under perf)")
            for peer in PEERS[name]:
                receipts.phase(peer, name)
                with SinkMeter(sink) as sm:
                    out = run_peer(tmp, peer, devices[name], sink, keys, messages=peer_messages, warmup=1)
                peer_outs.append(out)
                rows.append(row(name, peer, out["samples"], out["delivered"], DEVICES * peer_messages,
                                out["cpu_s"], out["peak_rss_kb"], **sm.info()))
                if out["failed"] or out["errors"]:
                    problems.append({"scenario": name, "sender": peer, "failed": out["failed"],
                                     "errors": out["errors"][:5]})
                log(f"{name} {peer}: p50 {rows[-1]['p50_ms']} ms, delivered {out['delivered']}")
            # h2load: the same requests, one process per origin
            receipts.phase("h2load", name)
            targets = h2load_targets(sink, per_user)
            for _ in range(max(1, warmup)):
                h2.message(targets)
            spans, ok, cpu, rss = [], 0, 0.0, 0
            with SinkMeter(sink) as sm:
                for _ in range(messages):
                    s, good, c, r, probs = h2.message(targets)
                    spans.append(s)
                    ok += good
                    cpu += c
                    rss = max(rss, r)
                    problems += [{"scenario": name, "sender": "h2load", "problem": p} for p in probs]
            rows.append(row(name, "h2load", spans, ok, DEVICES * messages, cpu, rss,
                            h2load_processes=len(targets), **sm.info()))
            log(f"{name} h2load: p50 {rows[-1]['p50_ms']} ms")
            if not herald.proc.alive():
                raise RuntimeError(f"herald exited during {name}")

        # ---- crypto share: http_ece seal-only next to Herald's seal figures
        if not only or "web500" in only:
            receipts.phase("http_ece")
            out = run_peer(tmp, "http_ece", devices["web500"], sink, keys, messages=peer_messages, warmup=1)
            peer_outs.append(out)
            seals = out["delivered"]
            crypto_rows.append({"sender": "http_ece", "source": "this run (seal-only, 500 subscriptions per pass)",
                                "us_per_seal": round(out["wall_s"] / seals * 1e6, 1) if seals else None,
                                "seals_per_s": round(seals / out["wall_s"], 0) if out["wall_s"] else None,
                                "cpu_s_per_1000": round(out["cpu_s"] * 1000 / seals, 3) if seals else None,
                                "peak_rss_mb": round(out["peak_rss_kb"] / 1024, 1), "cores": 1})
        if crypto:
            crypto_rows.insert(0, {"sender": "herald", "source": f"crypto.json ({crypto.get('measured_at')})",
                                   "us_per_seal": crypto.get("seal_us"),
                                   "seals_per_s": round(1e6 / crypto["seal_us"]) if crypto.get("seal_us") else None,
                                   "cores": 1})
            if crypto.get("seal_all_cores_us"):
                crypto_rows.insert(1, {"sender": "herald", "source": "crypto.json, all cores (wall)",
                                       "us_per_seal": crypto["seal_all_cores_us"],
                                       "seals_per_s": round(1e6 / crypto["seal_all_cores_us"]),
                                       "cores": crypto.get("cores")})

        # ---- sustained
        for name, (base, plat, peers) in SUSTAINED.items():
            if only and name not in only:
                continue
            done = receipts.herald_phase(name, herald, base)
            with SinkMeter(sink) as sm:
                samples, delivered, cpu, rss, wall, probs = herald.messages(name, users[base], 1, seconds=sustained_s)
            done()
            rows.append(row(name, "herald", samples, delivered, DEVICES * len(samples), cpu, rss, wall_s=wall,
                            seconds=round(wall, 2), **sm.info()))
            problems += [{"scenario": name, "sender": "herald", **p} for p in probs]
            log(f"{name} herald: {rows[-1]['pushes_per_s']} pushes/s over {wall:.1f} s")
            for peer in peers:
                receipts.phase(peer, name)
                with SinkMeter(sink) as sm:
                    out = run_peer(tmp, peer, devices[base], sink, keys, warmup=1, seconds=sustained_s)
                peer_outs.append(out)
                rows.append(row(name, peer, out["samples"], out["delivered"], DEVICES * len(out["samples"]),
                                out["cpu_s"], out["peak_rss_kb"], wall_s=out["wall_s"],
                                seconds=round(out["wall_s"], 2), **sm.info()))
                if out["failed"] or out["errors"]:
                    problems.append({"scenario": name, "sender": peer, "failed": out["failed"],
                                     "errors": out["errors"][:5]})
                log(f"{name} {peer}: {rows[-1]['pushes_per_s']} pushes/s")
            receipts.phase("h2load", name)
            origin = sink.web_origin(0) if plat == "web" else sink.apns_url if plat == "apns" else sink.fcm_url
            with SinkMeter(sink) as sm:
                res = h2.sustained(plat, origin, max(1, int(round(sustained_s))))
            rows.append({"scenario": name, "sender": "h2load", "p50_ms": None, "p90_ms": None, "p99_ms": None,
                         "pushes_per_s": round(res["req_per_s"], 1),
                         "cpu_s_per_1000": round(res["cpu_s"] * 1000 / res["succeeded"], 3) if res["succeeded"] else None,
                         "peak_rss_mb": round(res["peak_rss_kb"] / 1024, 1), "messages": None,
                         "delivered": res["succeeded"], "expected": res["requests"],
                         "delivered_all": res["succeeded"] == res["requests"] and res["exit"] == 0,
                         "seconds": round(res["seconds"], 2), "samples_ms": [],
                         "h2load": "-c 2 -m 100 -t 1 -D %d" % max(1, int(round(sustained_s))), **sm.info()})
            log(f"{name} h2load: {rows[-1]['pushes_per_s']} req/s")
            if not herald.proc.alive():
                raise RuntimeError(f"herald exited during {name}")

        stats = (herald.client.call("system.stats").get("result")) or {}
        # Herald's pushes as nginx recorded them: wait (with a deadline) until its
        # buffered log holds at least what was accepted, then, after nginx exits
        # (which writes out the rest), compare every device's count.
        receipts.phase("idle")
        t0 = time.perf_counter()
        flushed = receipts.wait_flushed(timeout=30)
        log(f"access log: {receipts.expected()} herald requests expected, "
            f"{'all' if flushed else 'NOT all'} logged after {time.perf_counter() - t0:.1f} s")
        completed = True
    except BaseException:
        if herald is not None:
            print("herald stderr (tail):\n" + herald.proc.stderr_tail(), file=sys.stderr)
        if sink is not None:
            print("nginx (tail):\n" + sink.error_tail(), file=sys.stderr)
        raise
    finally:
        if herald is not None:
            herald_status = herald.stop()
            herald_log = tail(herald.proc.log_path, 40)
        if sink is not None:
            sink.stop()
            if completed:
                receiver_problems, receiver_summary = receipts.check(sink.records())
        shutil.rmtree(tmp, ignore_errors=True)
    problems += receiver_problems

    for r in rows:
        if not r["delivered_all"] and not any(p.get("scenario") == r["scenario"] and p.get("sender") == r["sender"]
                                              for p in problems):
            problems.append({"scenario": r["scenario"], "sender": r["sender"],
                             "delivered": r["delivered"], "expected": r["expected"]})

    results = {
        "quick": args.quick,
        "date": started.isoformat(timespec="seconds"),
        "machine": machine_info(stats.get("version"), peer_outs),
        "config": {"devices_per_message": DEVICES, "users_per_scenario": USERS, "messages": messages,
                   "warmup": warmup, "peer_messages": peer_messages, "sustained_seconds": sustained_s,
                   "web_origins": WEB_ORIGINS, "herald": "max_inflight 2000, synchronous full, [delivery] defaults",
                   "mixed500": "200 web, 200 apns, 100 fcm per message",
                   "nginx_workers": 2},
        "rows": rows,
        "crypto": crypto_rows,
        "crypto_json": crypto,
        "profiles": profiles,
        "problems": problems,
        "receiver": receiver_summary,
        "herald_stats": {k: stats.get(k) for k in ("transports", "apns", "queue")},
        "herald_exit_status": herald_status,
        "herald_stderr_tail": herald_log,
        "load_average": {"before": load_before, "after": machine.load_average()},
    }
    summary = report.summarise(results)
    results["targets"] = summary["targets"]
    with open(os.path.join(out_dir, "fanout.json"), "w") as f:
        json.dump([{k: r[k] for k in ("scenario", "sender", "p50_ms", "p90_ms", "p99_ms", "pushes_per_s",
                                      "cpu_s_per_1000", "peak_rss_mb", "delivered_all")} for r in rows],
                  f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "fanout-details.json"), "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")
    table = report.table(results)
    print(table)
    paths = report.write(results, out_dir, table)
    print(f"\nwritten: {', '.join(os.path.relpath(p, os.getcwd()) for p in paths)}")
    herald_phases = [x for x in receiver_summary if x["sender"] == "herald"]
    print(f"\nreceiver (nginx access log): {len(herald_phases)} herald phases, "
          f"{sum(x['accepted_pushes'] or 0 for x in herald_phases)} accepted pushes, "
          f"{sum(x['expected'] for x in herald_phases)} requests expected, "
          f"{sum(x['requests_2xx'] for x in herald_phases)} logged with 2xx; "
          + ("every device got each push exactly once" if completed and not receiver_problems else
             f"{len(receiver_problems)} mismatch(es)" if completed else "not checked (the run did not complete)"))
    for p in receiver_problems:
        print(f"  RECEIVER MISMATCH {p.get('scenario')} {p.get('sender')}: {p['receiver']}", file=sys.stderr)
    if args.check and problems:
        print(f"\nNOT every push was delivered exactly once (by the senders' answers or the sink's access log): "
              f"{len(problems)} problem(s), first: {json.dumps(problems[0])}",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
