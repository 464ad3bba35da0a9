#!/usr/bin/env python3
"""The other senders of the fan-out benchmark, each run in a process of its own
(so its CPU and peak RSS are its own), against the same sink as Herald:

  pywebpush_seq      pywebpush.webpush() for each of the devices, one after the other
  pywebpush_threads  the same calls in a 32-thread pool (concurrent.futures)
  aioapns            aioapns.APNs.send_notification() for every device at once
                     (asyncio.gather) on its connection pool
  http_ece           seal-only: a fresh ephemeral key and http_ece.encrypt() per
                     device, as pywebpush does, without any HTTP

Each peer is pointed at the sink as its users would configure it:

  pywebpush  the subscription endpoints are the sink's URLs (as a browser's
             subscription names its push service), the VAPID key is loaded once
             with py_vapid, and a requests.Session whose `verify` is the sink's
             CA is passed as `requests_session` (one per thread in the pool,
             since a Session is not documented as thread-safe). No patch.
  aioapns    it dials Apple's host names on port 443, with no option to change
             them, so two class attributes are patched:
             `APNsProductionClientProtocol.APNS_SERVER = "127.0.0.1"` and
             `APNS_PORT = <sink port>`; the CA goes in through its public
             `ssl_context` parameter (`ssl.create_default_context(cafile=CA)`).

    python peers.py JOB.json OUT.json

JOB: {"peer", "devices": [{"token", "keys"?}], "messages", "warmup",
      "seconds" (sustained: messages back to back for that long instead),
      "payload", "ca", "vapid_key", "vapid_subject", "apns": {...}, "threads"}
OUT: {"samples": [s per message], "delivered", "failed", "errors",
      "cpu_s", "wall_s", "peak_rss_kb", "versions"}
"""
import json
import os
import sys
import threading
import time


def cpu_seconds():
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def version(dist):
    try:
        from importlib.metadata import version as v
        return v(dist)
    except Exception:  # noqa: BLE001
        return None


class Runner:
    """Warm-up messages, then measured ones (a count, or back to back for
    `seconds`): one message = a send to every device, timed as a whole."""

    def __init__(self, job, send_message):
        self.job = job
        self.send_message = send_message  # (tag) -> (delivered, failed, [errors])

    def run(self):
        errors = []
        for i in range(self.job.get("warmup", 0)):
            _, _, e = self.send_message(f"w{i}")
            errors += [f"warm-up: {x}" for x in e[:3]]
        samples, delivered, failed = [], 0, 0
        c0, t0 = cpu_seconds(), time.perf_counter()
        seconds = self.job.get("seconds")
        i = 0
        while True:
            if seconds is not None:
                if time.perf_counter() - t0 >= seconds:
                    break
            elif i >= self.job["messages"]:
                break
            s0 = time.perf_counter()
            d, f, e = self.send_message(f"m{i}")
            samples.append(time.perf_counter() - s0)
            delivered += d
            failed += f
            errors += e[:3]
            i += 1
        wall = time.perf_counter() - t0
        return {"samples": samples, "delivered": delivered, "failed": failed, "errors": errors[:10],
                "cpu_s": cpu_seconds() - c0, "wall_s": wall}


# ---------------------------------------------------------------- pywebpush


def pywebpush_peer(job, threads):
    import requests
    from concurrent.futures import ThreadPoolExecutor
    from py_vapid import Vapid
    from pywebpush import WebPushException, webpush

    vapid = Vapid.from_file(private_key_file=job["vapid_key"])
    subs = [{"endpoint": d["token"], "keys": d["keys"]} for d in job["devices"]]
    local = threading.local()

    def session():
        s = getattr(local, "session", None)
        if s is None:
            s = local.session = requests.Session()
            s.verify = job["ca"]
        return s

    def one(sub, data):
        try:
            r = webpush(subscription_info=sub, data=data, vapid_private_key=vapid,
                        vapid_claims={"sub": job["vapid_subject"]}, ttl=86400,
                        headers={"Urgency": "high"}, requests_session=session())
            return r.status_code, None
        except WebPushException as e:
            return getattr(e.response, "status_code", None), str(e).splitlines()[0]
        except Exception as e:  # noqa: BLE001 - counted as failed
            return None, repr(e)

    pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None

    def send_message(tag):
        data = job["payload"].replace("TAG", tag)
        if pool is None:
            results = [one(s, data) for s in subs]
        else:
            results = list(pool.map(lambda s: one(s, data), subs))
        ok = sum(1 for status, _ in results if status is not None and 200 <= status < 300)
        return ok, len(results) - ok, [e for _, e in results if e]

    try:
        out = Runner(job, send_message).run()
    finally:
        if pool is not None:
            pool.shutdown()
    out["versions"] = {"pywebpush": version("pywebpush"), "py-vapid": version("py-vapid"),
                       "requests": version("requests"), "http_ece": version("http_ece")}
    out["threads"] = threads
    return out


# ---------------------------------------------------------------- aioapns


def aioapns_peer(job):
    import asyncio
    import ssl

    from aioapns import APNs, NotificationRequest, PushType
    from aioapns.connection import APNsProductionClientProtocol

    a = job["apns"]
    # The redirect: aioapns has no option for the host or port it dials.
    APNsProductionClientProtocol.APNS_SERVER = a["host"]
    APNsProductionClientProtocol.APNS_PORT = a["port"]
    with open(a["key_path"]) as f:
        key = f.read()
    tokens = [d["token"] for d in job["devices"]]

    async def main():
        ctx = ssl.create_default_context(cafile=job["ca"])
        # aioapns offers no ALPN (Apple's servers speak HTTP/2 over TLS without it);
        # nginx 1.22 falls back to HTTP/1.1 without ALPN h2, so the context asks for it.
        ctx.set_alpn_protocols(["h2"])
        client = APNs(key=key, key_id=a["key_id"], team_id=a["team_id"], topic=a["topic"],
                      use_sandbox=False, ssl_context=ctx)
        loop = asyncio.get_running_loop()

        async def message(tag):
            payload = json.loads(job["payload"].replace("TAG", tag))
            reqs = [NotificationRequest(device_token=t, message={"aps": {"content-available": 1}, **payload},
                                        priority=10, push_type=PushType.BACKGROUND, time_to_live=86400)
                    for t in tokens]
            results = await asyncio.gather(*(client.send_notification(r) for r in reqs),
                                           return_exceptions=True)
            ok = sum(1 for r in results if not isinstance(r, BaseException) and r.is_successful)
            errs = [repr(r) if isinstance(r, BaseException) else f"{r.status} {r.description}"
                    for r in results if isinstance(r, BaseException) or not r.is_successful]
            return ok, len(results) - ok, errs

        # Runner is synchronous; run each message to completion on this loop.
        result = {}

        def send_message(tag):
            fut = asyncio.run_coroutine_threadsafe(message(tag), loop)
            return fut.result()

        def in_thread():
            result.update(Runner(job, send_message).run())

        await loop.run_in_executor(None, in_thread)
        client.pool.close()
        return result

    out = asyncio.run(main())
    out["versions"] = {"aioapns": version("aioapns"), "h2": version("h2"), "pyjwt": version("pyjwt")}
    return out


# ---------------------------------------------------------------- http_ece


def http_ece_peer(job):
    import base64

    import http_ece
    from cryptography.hazmat.primitives.asymmetric import ec

    def unb64(s):
        return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))

    keys = [(unb64(d["keys"]["p256dh"]), unb64(d["keys"]["auth"])) for d in job["devices"]]

    def send_message(tag):
        data = job["payload"].replace("TAG", tag).encode()
        for dh, auth in keys:
            server_key = ec.generate_private_key(ec.SECP256R1())
            http_ece.encrypt(data, private_key=server_key, dh=dh, auth_secret=auth, version="aes128gcm")
        return len(keys), 0, []

    out = Runner(job, send_message).run()
    out["versions"] = {"http_ece": version("http_ece"), "cryptography": version("cryptography")}
    return out


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)
    peer = job["peer"]
    if peer == "pywebpush_seq":
        out = pywebpush_peer(job, 1)
    elif peer == "pywebpush_threads":
        out = pywebpush_peer(job, job.get("threads", 32))
    elif peer == "aioapns":
        out = aioapns_peer(job)
    elif peer == "http_ece":
        out = http_ece_peer(job)
    else:
        raise SystemExit(f"unknown peer {peer}")
    out["peak_rss_kb"] = peak_rss_kb()
    out["peer"] = peer
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
