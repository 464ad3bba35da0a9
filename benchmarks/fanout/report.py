#!/usr/bin/env python3
"""The fan-out benchmark's table, target verdicts, REPORT.md and PNG plots,
from the results the driver collected (fanout-details.json).

    .venv/bin/python benchmarks/fanout/report.py [benchmarks/results/fanout-details.json [OUT_DIR]]

rewrites REPORT.md and the plots from a details file without measuring again.
benchmarks/fanout/findings.md, when present, goes into the report as it is
(the analysis of misses, profiles and before/after figures, kept by hand).
"""
import json
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
LATENCY = ["web500", "apns500", "fcm500", "mixed500"]
SUSTAINED = ["web_sustained", "apns_sustained", "fcm_sustained"]
SUSTAINED_4C = ["web_sustained_4c", "apns_sustained_4c"]  # 4 client connections to one Herald (SQLite)
SIZES = ["size_100", "size_500", "size_2000", "size_10000"]  # one APNs message to that many devices
FIRST_PUSH_TARGET_MS = 2.0
HELD_IDLE_LIMIT_MS = 1.0  # held_million: idle CPU with the held deliveries over none's, ms per s
ORDER = ["herald", "herald_pg", "herald_pg_x2", "pywebpush_seq", "pywebpush_threads", "aioapns", "h2load"]
HERALDS = ["herald", "herald_pg", "herald_pg_x2"]  # SQLite, PostgreSQL with 1 and with 2 instances
BACKEND_LABEL = {"herald": "SQLite", "herald_pg": "PostgreSQL, 1 instance",
                 "herald_pg_x2": "PostgreSQL, 2 instances"}
COLORS = {"herald": "#1f77b4", "herald_pg": "#17becf", "herald_pg_x2": "#8c564b", "pywebpush_seq": "#d62728",
          "pywebpush_threads": "#ff7f0e", "aioapns": "#2ca02c", "h2load": "#7f7f7f"}
FINDINGS = HERE / "findings.md"


def held_rows(results):
    """held_million's rows, one per store (SQLite first)."""
    return [r for r in results["rows"] if r["scenario"] == "held_million"]


def rows_by(results):
    return {(r["scenario"], r["sender"]): r for r in results["rows"]}


def size_rows(results):
    """The size curve's rows (sender herald), smallest first."""
    by = rows_by(results)
    return sorted((by[(s, "herald")] for s in SIZES if by.get((s, "herald"))), key=lambda r: r.get("devices") or 0)


def herald_ratio(results, r):
    """Herald / sender: in a 500-device scenario sender p50 / Herald p50 (how many
    times faster Herald is); in a sustained one Herald pushes/s / sender pushes/s.
    Herald is Herald on SQLite: on a herald_pg row the ratio is how many times
    faster Herald is on SQLite than on PostgreSQL."""
    by = rows_by(results)
    h = by.get((r["scenario"], "herald"))
    if not h or r["sender"] == "herald":
        return None
    if r["scenario"] in LATENCY:
        if h.get("p50_ms") and r.get("p50_ms"):
            return r["p50_ms"] / h["p50_ms"]
        return None
    if h.get("pushes_per_s") and r.get("pushes_per_s"):
        return h["pushes_per_s"] / r["pushes_per_s"]
    return None


def seal_allowance(results):
    """Pushes/s the measured seal cost allows on this machine's cores:
    (all-core figure, cores / one-core figure)."""
    c = results.get("crypto_json") or {}
    allcore = 1e6 / c["seal_all_cores_us"] if c.get("seal_all_cores_us") else None
    cores = c.get("cores") or results["machine"]["cores"]
    onecore = cores * 1e6 / c["seal_us"] if c.get("seal_us") else None
    return allcore, onecore


def summarise(results):
    by = rows_by(results)
    targets = []

    def add(name, target, measured, met, detail):
        targets.append({"target": name, "wanted": target, "measured": measured, "met": met, "detail": detail})

    def f(x, spec=".1f"):
        return "-" if x is None else format(x, spec)

    for scen, limit, peer, factor in (("web500", 40, "pywebpush_threads", 10), ("apns500", 25, "aioapns", 3)):
        h = by.get((scen, "herald"))
        p = by.get((scen, peer))
        if h and h.get("p50_ms") is not None:
            p50 = h["p50_ms"]
            add(f"{scen} p50", f"<= {limit} ms", f"{p50:.1f} ms", p50 <= limit,
                "met" if p50 <= limit else f"{p50 - limit:.1f} ms over ({p50 / limit:.2f}x the target)")
        if h and p and h.get("p50_ms") and p.get("p50_ms"):
            ratio = p["p50_ms"] / h["p50_ms"]
            add(f"{scen} vs {peer}", f">= {factor}x faster (p50)", f"{ratio:.2f}x", ratio >= factor,
                "met" if ratio >= factor else
                f"{factor / ratio:.2f}x short: Herald p50 would need to be <= {p['p50_ms'] / factor:.1f} ms")
    h, c = by.get(("apns_sustained", "herald")), by.get(("apns_sustained", "h2load"))
    if h and c and h.get("pushes_per_s") and c.get("pushes_per_s"):
        share = h["pushes_per_s"] / c["pushes_per_s"]
        add("apns_sustained vs h2load", ">= 0.5 of h2load's rate",
            f"{share:.3f} ({h['pushes_per_s']:,.0f} vs {c['pushes_per_s']:,.0f} /s)", share >= 0.5,
            "met" if share >= 0.5 else f"{0.5 / share:.1f}x short: needs {0.5 * c['pushes_per_s']:,.0f} pushes/s")
    h = by.get(("web_sustained", "herald"))
    allcore, onecore = seal_allowance(results)
    if h and h.get("pushes_per_s") and allcore:
        share = h["pushes_per_s"] / allcore
        add("web_sustained vs seal cost", ">= 0.7 of what the seal cost allows on all cores",
            f"{share:.3f} ({h['pushes_per_s']:,.0f} vs {allcore:,.0f} /s; "
            f"{f(onecore, ',.0f')} /s from cores / one-core seal)", share >= 0.7,
            "met" if share >= 0.7 else f"{0.7 / share:.1f}x short: needs {0.7 * allcore:,.0f} pushes/s")
    h, c = by.get(("apns_sustained_4c", "herald")), by.get(("apns_sustained_4c", "h2load"))
    if h and c and h.get("pushes_per_s") and c.get("pushes_per_s"):
        share = h["pushes_per_s"] / c["pushes_per_s"]
        add("apns_sustained_4c vs h2load", ">= 0.6 of h2load's rate",
            f"{share:.3f} ({h['pushes_per_s']:,.0f} vs {c['pushes_per_s']:,.0f} /s)", share >= 0.6,
            "met" if share >= 0.6 else f"{0.6 / share:.1f}x short: needs {0.6 * c['pushes_per_s']:,.0f} pushes/s")
    h = by.get(("web_sustained_4c", "herald"))
    if h and h.get("pushes_per_s") and allcore:
        share = h["pushes_per_s"] / allcore
        add("web_sustained_4c vs seal cost", ">= 0.7 of what the seal cost allows on all cores",
            f"{share:.3f} ({h['pushes_per_s']:,.0f} vs {allcore:,.0f} /s)", share >= 0.7,
            "met" if share >= 0.7 else f"{0.7 / share:.1f}x short: needs {0.7 * allcore:,.0f} pushes/s")
    # Latency against the floor measured in the same run: h2load's time for the same 500 requests, and for
    # Web Push the seal work spread over the cores on top of it.
    def vs_h2load(scen, key, name, wanted, limit, fmt, unit):
        """Herald's `key` over h2load's in the same scenario, at most `limit` times."""
        h, c = by.get((scen, "herald")), by.get((scen, "h2load"))
        if h and c and h.get(key) and c.get(key):
            ratio = h[key] / c[key]
            add(name, wanted, f"{ratio:.2f}x ({h[key]:{fmt}} vs {c[key]:{fmt}} {unit})", ratio <= limit,
                "met" if ratio <= limit else f"needs <= {limit * c[key]:{fmt}} {unit}")

    for scen in ("apns500", "fcm500"):
        vs_h2load(scen, "p50_ms", f"{scen} p50 vs h2load", "<= 1.6x h2load's time for the same 500 requests",
                  1.6, ".1f", "ms")
    h, w = by.get(("web500", "herald")), by.get(("web500", "h2load"))
    crypto = results.get("crypto_json") or {}
    cores = crypto.get("cores") or results["machine"]["cores"]
    if h and w and h.get("p50_ms") and w.get("p50_ms") and crypto.get("floor_us"):
        ideal = 500 * crypto["floor_us"] / cores / 1000 + w["p50_ms"]
        ratio = h["p50_ms"] / ideal
        add("web500 p50 vs the ideal", "<= 1.3x (500 x seal floor / cores + h2load's 500 requests)",
            f"{ratio:.2f}x ({h['p50_ms']:.1f} vs {ideal:.1f} ms)", ratio <= 1.3,
            "met" if ratio <= 1.3 else f"needs <= {1.3 * ideal:.1f} ms")
    if crypto.get("core_scaling"):
        add("seal scaling on all cores", ">= 1.8x", f"{crypto['core_scaling']:.2f}x ({cores} cores)",
            crypto["core_scaling"] >= 1.8, "met" if crypto["core_scaling"] >= 1.8 else "short")
    if crypto.get("ratio"):
        add("one-core seal vs the floor", "<= 1.1x", f"{crypto['ratio']:.3f}x ({crypto.get('seal_us', 0):.1f} vs "
            f"{crypto['floor_us']:.1f} us)", crypto["ratio"] <= 1.1, "met" if crypto["ratio"] <= 1.1 else "short")
    # CPU per push against h2load's CPU per request in the same sustained phase (its steady state:
    # process start-up and handshakes are a small part of a phase of seconds).
    for scen in ("apns_sustained", "fcm_sustained"):
        vs_h2load(scen, "cpu_s_per_1000", f"{scen} CPU per push vs h2load",
                  "<= 2x h2load's CPU per request in the same phase", 2, ".3f", "s per 1,000")
    h, c = by.get(("web_sustained", "herald")), by.get(("web_sustained", "h2load"))
    if h and c and h.get("cpu_s_per_1000") and c.get("cpu_s_per_1000") and crypto.get("floor_us"):
        # The seal floor in s per 1,000 seals: floor_us µs each.
        allowed = crypto["floor_us"] / 1000 + 2 * c["cpu_s_per_1000"]
        ratio = h["cpu_s_per_1000"] / allowed
        add("web_sustained CPU per push vs seal floor + 2x h2load",
            "<= the seal floor + 2x h2load's CPU per request",
            f"{ratio:.2f}x ({h['cpu_s_per_1000']:.3f} vs {allowed:.3f} s per 1,000)", ratio <= 1,
            "met" if ratio <= 1 else f"{ratio:.2f}x the allowance")
    small, large = by.get(("size_500", "herald")), by.get(("size_10000", "herald"))
    if small and large and small.get("us_per_device") and large.get("us_per_device"):
        ratio = large["us_per_device"] / small["us_per_device"]
        add("size curve: µs per device at 10,000 vs size_500's", "<= 1.1x",
            f"{ratio:.2f}x ({large['us_per_device']:.1f} vs {small['us_per_device']:.1f} µs)", ratio <= 1.1,
            "met" if ratio <= 1.1 else f"{ratio / 1.1:.2f}x over")
    st = by.get(("stalled_subscriber", "herald"))
    if st and st.get("vs_unstalled") is not None:
        ratio = st["vs_unstalled"]
        ok = ratio <= 1.1 and st.get("gap_events") == 1 and st.get("event_deliveries_missing") == 0
        add(f"{st.get('devices', 0):,}-device send with an event subscriber not reading for {st.get('stall_s', 0):g} s",
            "<= 1.1x the p50 without it; one gap event; nothing missed after the replay",
            f"{ratio:.2f}x ({st['p50_ms']:.1f} vs {st['base_p50_ms']:.1f} ms), {st.get('gap_events')} gap, "
            f"{st.get('event_deliveries_missing')} missed, peak RSS {st.get('peak_rss_mb')} MB", ok,
            "met" if ok else "see the row")
    for h in held_rows(results):
        n, store = h.get("held") or 0, BACKEND_LABEL.get(h["sender"], h["sender"])
        if h.get("idle_cpu_ms_per_s_diff") is not None:
            # On PostgreSQL Herald's work while idle is its database connections' too (their backends).
            pool = (h["idle_db_pool_cpu_ms_per_s_held"] - h["idle_db_pool_cpu_ms_per_s_none"]
                    if h.get("idle_db_pool_cpu_ms_per_s_held") is not None else None)
            diff = h["idle_cpu_ms_per_s_diff"] + (pool or 0)
            db = (f"; its database connections {h['idle_db_pool_cpu_ms_per_s_held']:.1f} vs "
                  f"{h['idle_db_pool_cpu_ms_per_s_none']:.1f}, the whole server {h['idle_db_cpu_ms_per_s_held']:.1f} "
                  f"vs {h['idle_db_cpu_ms_per_s_none']:.1f}" if pool is not None else "")
            add(f"idle CPU with {n:,} deliveries held ({store})",
                f"<= {HELD_IDLE_LIMIT_MS:g} ms/s over none held's (claims read only what is due)"
                + ("; Herald + its database connections" if pool is not None else ""),
                f"{diff:+.1f} ms/s (Herald {h['idle_cpu_ms_per_s_held']:.1f} vs {h['idle_cpu_ms_per_s_none']:.1f} "
                f"ms/s{db})", diff <= HELD_IDLE_LIMIT_MS,
                "met" if diff <= HELD_IDLE_LIMIT_MS else f"{diff:.1f} ms/s more")
        if h.get("vs_unheld") is not None:
            ratio = h["vs_unheld"]
            add(f"{h.get('fanout_devices', 500)}-device send beside {n:,} held ({store})",
                "<= 1.1x its p50 without them",
                f"{ratio:.2f}x ({h['p50_ms']:.1f} vs {h['base_p50_ms']:.1f} ms; CPU per push "
                f"{_f(h.get('cpu_vs_unheld'), '.2f')}x)", ratio <= 1.1,
                "met" if ratio <= 1.1 else f"{ratio / 1.1:.2f}x over")
    a = by.get(("accept_under_load", "herald"))
    if a and a.get("p99_vs_idle") is not None:
        ratio = a["p99_vs_idle"]
        add(f"push.send p99 during a {a.get('big_devices', 0):,}-device send vs idle", "<= 2x its idle p99",
            f"{ratio:.2f}x ({a['p99_ms']:.2f} vs {a['idle_p99_ms']:.2f} ms; {a['probes_loaded']} calls)",
            ratio <= 2, "met" if ratio <= 2 else f"needs <= {2 * a['idle_p99_ms']:.2f} ms")
    for scen in LATENCY:
        h = by.get((scen, "herald"))
        if h and h.get("first_push_p50_ms") is not None:
            v = h["first_push_p50_ms"]
            add(f"{scen} time to first push", f"<= {FIRST_PUSH_TARGET_MS:g} ms p50 (at the sink, 1 ms resolution)",
                f"{v:.1f} ms", v <= FIRST_PUSH_TARGET_MS,
                "met" if v <= FIRST_PUSH_TARGET_MS else f"{v - FIRST_PUSH_TARGET_MS:.1f} ms over")
    # What one database carries: its statements and CPU per push, and the two stores side by side.
    pg = by.get(("apns500", "herald_pg"))
    if pg and pg.get("statements_per_message") is not None:
        n = pg["statements_per_message"]
        add("apns500 statements per message (PostgreSQL)", "<= 20 (pg_stat_statements, BEGIN/COMMIT included)",
            f"{n:.1f}", n <= 20, "met" if n <= 20 else f"{n / 20:.1f}x over")
    for scen in ("apns500", "apns_sustained"):
        r = by.get((scen, "herald_pg"))
        if r and r.get("db_cpu_s_per_1000") is not None:
            v = r["db_cpu_s_per_1000"]
            add(f"{scen} database CPU", "<= 0.03 s per 1,000 pushes", f"{v:.3f} s", v <= 0.03,
                "met" if v <= 0.03 else f"{v / 0.03:.1f}x over")
    for scen, lower_is_better in (("apns500", True), ("apns_sustained", False)):
        s, p = by.get((scen, "herald")), by.get((scen, "herald_pg"))
        fs, fp = (s or {}).get("p50_ms" if lower_is_better else "pushes_per_s"), \
            (p or {}).get("p50_ms" if lower_is_better else "pushes_per_s")
        if fs and fp:
            ratio = fp / fs if lower_is_better else fs / fp
            add(f"{scen} PostgreSQL vs SQLite (one instance)", "<= 1.3x SQLite's cost",
                f"{ratio:.2f}x", ratio <= 1.3, "met" if ratio <= 1.3 else f"{ratio / 1.3:.2f}x over the target")
    one, two = by.get(("apns_sustained", "herald_pg")), by.get(("apns_sustained", "herald_pg_x2"))
    if one and two and one.get("pushes_per_s") and two.get("pushes_per_s"):
        share = two["pushes_per_s"] / one["pushes_per_s"]
        add("apns_sustained two instances vs one (PostgreSQL)", ">= 1.0x one instance's rate",
            f"{share:.2f}x ({two['pushes_per_s']:,.0f} vs {one['pushes_per_s']:,.0f} /s)", share >= 1.0,
            "met" if share >= 1.0 else f"{1 / share:.2f}x slower")
    # Hot-table health: the queue's own table (the live partition) and its indexes stay the size of
    # the live work, while the history grows in the other partition.
    for label, v in ((results.get("postgres") or {}).get("variants") or {}).items():
        sizes = v.get("table_sizes") or {}
        if "deliveries_live" not in sizes:
            continue
        live = sum(b for n, b in sizes.items() if n == "deliveries_live" or n in LIVE_INDEXES
                   or n.startswith("deliveries_live_"))
        history = sum(b for n, b in sizes.items() if n.startswith("deliveries_done"))
        add(f"queue table and indexes ({label})", f"<= {LIVE_LIMIT_MB} MB after the run (the live work's size)",
            f"{live / 1e6:.1f} MB (history {history / 1e6:.0f} MB)", live <= LIVE_LIMIT_MB * 1e6,
            "met" if live <= LIVE_LIMIT_MB * 1e6 else f"{live / 1e6 / LIVE_LIMIT_MB:.1f}x over")
    return {"targets": targets}


# The queue's partial indexes, on its live partition (PostgresSchema, migration 5).
LIVE_INDEXES = {"deliveries_due", "deliveries_next_due", "deliveries_leased", "deliveries_pending_by_device",
                "deliveries_one_queued_per_collapse"}
# Hot-table target: the live partition and its indexes hold at most a few thousand rows in these
# scenarios (max_inflight plus a message or two), far below this, whatever the history.
LIVE_LIMIT_MB = 16


def table_sizes_markdown(results):
    """The queue's tables and indexes after the run, per PostgreSQL variant."""
    variants = (results.get("postgres") or {}).get("variants") or {}
    names = sorted({n for v in variants.values() for n in (v.get("table_sizes") or {})})
    if not names:
        return []
    labels = [k for k in variants if variants[k].get("table_sizes")]
    L = ["## The queue's tables after the run", "",
         "Sizes (MB, `pg_relation_size`) of the queue's tables and their indexes on each PostgreSQL "
         "variant's database once every scenario ran. `deliveries` is partitioned by state: "
         "`deliveries_live` (and its indexes, the partial ones of the queue included) holds only the live "
         "work, `deliveries_done` the history of finished deliveries until it is purged (after the "
         "retention).", "",
         "| relation | " + " | ".join(BACKEND_LABEL.get(k, k) for k in labels) + " |",
         "|---|" + "---:|" * len(labels)]
    for n in names:
        L.append(f"| `{n}` | " + " | ".join(
            f"{variants[k]['table_sizes'].get(n, 0) / 1e6:.2f}" for k in labels) + " |")
    L.append("")
    return L


def _fmt(v, spec, width):
    return f"{format(v, spec) if isinstance(v, (int, float)) else '-':>{width}}"


def table(results):
    m = results["machine"]
    cfg = results["config"]
    out = []
    out.append(f"Herald fan-out, {cfg['devices_per_message']} devices per message, against nginx on loopback "
               f"(TLS, HTTP/2) - {m['processor']}, {m['cores']} cores"
               + ("  [QUICK: smoke run, figures not meaningful]" if results.get("quick") else ""))
    out.append(f"500-device scenarios: {cfg['messages']} messages after {cfg['warmup']} warm-up (peers: "
               f"{cfg['peer_messages']}); sustained: back to back for {cfg['sustained_seconds']:g} s")
    out.append("")
    head = (f"{'scenario':17} {'sender':18} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'1st ms':>7} "
            f"{'pushes/s':>10} {'CPU s/1k':>9} {'DB s/1k':>8} {'RSS MB':>7} {'Herald/x':>9} {'x/h2load':>9}")
    out.append(head)
    out.append("-" * len(head))
    by = rows_by(results)
    for scen in LATENCY + SUSTAINED + SUSTAINED_4C:
        first = True
        for sender in ORDER:
            r = by.get((scen, sender))
            if not r:
                continue
            ratio = herald_ratio(results, r)
            ceiling = by.get((scen, "h2load"))
            share = (r["pushes_per_s"] / ceiling["pushes_per_s"]
                     if sender != "h2load" and ceiling and ceiling.get("pushes_per_s") and r.get("pushes_per_s")
                     else None)
            out.append(f"{scen if first else '':17} {sender:18} {_fmt(r.get('p50_ms'), '.1f', 9)} "
                       f"{_fmt(r.get('p90_ms'), '.1f', 9)} {_fmt(r.get('p99_ms'), '.1f', 9)} "
                       f"{_fmt(r.get('first_push_p50_ms'), '.1f', 7)} "
                       f"{_fmt(r.get('pushes_per_s'), ',.0f', 10)} {_fmt(r.get('cpu_s_per_1000'), '.3f', 9)} "
                       f"{_fmt(r.get('db_cpu_s_per_1000'), '.3f', 8)} {_fmt(r.get('peak_rss_mb'), '.1f', 7)} "
                       f"{(format(ratio, '.2f') + 'x') if ratio else '-':>9} "
                       f"{(format(share, '.3f')) if share else '-':>9}"
                       + ("" if r.get("delivered_all") else f"  NOT ALL DELIVERED ({r['delivered']}/{r['expected']})"))
            first = False
    sizes = size_rows(results)
    if sizes:
        out.append("")
        out.append(f"{'size curve':17} {'devices':>8} {'p50 ms':>9} {'us/device':>10} {'1st ms':>7} {'pushes/s':>10} "
                   f"{'CPU s/1k':>9} {'RSS MB':>7}   (one APNs message, herald on SQLite)")
        for r in sizes:
            out.append(f"{r['scenario']:17} {r.get('devices'):>8,} {_fmt(r.get('p50_ms'), '.1f', 9)} "
                       f"{_fmt(r.get('us_per_device'), '.1f', 10)} {_fmt(r.get('first_push_p50_ms'), '.1f', 7)} "
                       f"{_fmt(r.get('pushes_per_s'), ',.0f', 10)} {_fmt(r.get('cpu_s_per_1000'), '.3f', 9)} "
                       f"{_fmt(r.get('peak_rss_mb'), '.1f', 7)}")
    held = held_rows(results)
    if held:
        out.append("")
        out.append(f"{'held_million':17} {'held':>9} {'accept/s':>9} {'idle CPU ms/s':>21} {'RSS MB':>13} "
                   f"{'fan-out p50 ms':>15} {'x':>6} {'CPU x':>6}  checked")
        out.append(f"{'':17} {'':>9} {'':>9} {'none':>6} {'held':>6} {'diff':>7} {'none':>6} {'held':>6} "
                   f"{'none':>7} {'held':>7}")
        for r in held:
            db = (f"  DB idle ms/s {r['idle_db_cpu_ms_per_s_none']:.1f}/{r['idle_db_cpu_ms_per_s_held']:.1f}, "
                  f"statements/s {r['idle_statements_per_s_none']:.1f}/{r['idle_statements_per_s_held']:.1f}"
                  if r.get("idle_db_cpu_ms_per_s_none") is not None else "")
            cells = [("held", ",", 9), ("accept_per_s", ",.0f", 9), ("idle_cpu_ms_per_s_none", ".1f", 6),
                     ("idle_cpu_ms_per_s_held", ".1f", 6), ("idle_cpu_ms_per_s_diff", "+.1f", 7),
                     ("rss_mb_none", ".1f", 6), ("rss_mb_held", ".1f", 6), ("base_p50_ms", ".1f", 7),
                     ("p50_ms", ".1f", 7), ("vs_unheld", ".2f", 6), ("cpu_vs_unheld", ".2f", 6)]
            out.append(f"{r['sender']:17} " + " ".join(_fmt(r.get(k), spec, w) for k, spec, w in cells) + "  "
                       + ("ok" if r.get("held_ok") else f"NOT HELD ({r.get('held_at_sink')} at the sink)") + db)
    if results.get("crypto"):
        out.append("")
        out.append(f"{'crypto':15} {'sender':18} {'us/seal':>9} {'seals/s':>10}  source")
        for c in results["crypto"]:
            out.append(f"{'':15} {c['sender']:18} {_fmt(c.get('us_per_seal'), '.1f', 9)} "
                       f"{_fmt(c.get('seals_per_s'), ',.0f', 10)}  {c['source']}"
                       + (f"; CPU {c['cpu_s_per_1000']:.3f} s/1k" if c.get("cpu_s_per_1000") else ""))
    out.append("")
    out.append("Herald/x: in a 500-device scenario p50 of x / p50 of Herald (how many times faster Herald is);")
    out.append("          sustained: Herald pushes/s / pushes/s of x. x/h2load: pushes/s of x / h2load's.")
    out.append("1st ms: time to first push, p50: from the push.send write to the message's first request at the")
    out.append("          sink (nginx's clock, whole ms, +0.5 ms; see REPORT.md). *_4c: 4 client connections to one")
    out.append("          Herald (SQLite) sending at once, each to its own 500 devices.")
    out.append("          Herald is Herald on SQLite; herald_pg: on PostgreSQL, herald_pg_x2: two instances on")
    out.append("          one database, each message split across both (sustained: one client per instance).")
    out.append("pushes/s of a 500-device row: delivered / the sum of its message times. CPU s/1k: utime+stime")
    out.append("of the sender's process(es) over the measured messages per 1,000 pushes; RSS: its peak (VmHWM,")
    out.append("summed over instances). DB s/1k: the PostgreSQL server's processes over the same span (SQLite")
    out.append("runs inside Herald: its CPU is in Herald's column).")
    pg = results.get("postgres") or {}
    if pg.get("settings"):
        st = pg["settings"]
        out.append(f"PostgreSQL {st.get('server_version')}: fsync {st.get('fsync')}, synchronous_commit "
                   f"{st.get('synchronous_commit')}, full_page_writes {st.get('full_page_writes')}; "
                   f"SQLite: synchronous = full.")
    side = side_by_side_text(results)
    if side:
        out.append("")
        out += side
    t = results.get("targets") or summarise(results)["targets"]
    if t:
        out.append("")
        out.append("targets:" + ("  (quick run: no verdict, the figures are a smoke run's)" if results.get("quick") else ""))
        for x in t:
            out.append(f"  {'MET    ' if x['met'] else 'NOT MET'} {x['target']}: wanted {x['wanted']}, "
                       f"measured {x['measured']}" + ("" if x["met"] else f" - {x['detail']}"))
    if results.get("problems"):
        out.append("")
        out.append(f"problems ({len(results['problems'])}):")
        for p in results["problems"][:10]:
            out.append("  " + json.dumps(p)[:300])
    return "\n".join(out)


# ---------------------------------------------------------------- SQLite and PostgreSQL


def backend_rows(results):
    """[(scenario, {herald sender: row})] for every scenario with a PostgreSQL row."""
    by = rows_by(results)
    out = []
    for scen in LATENCY + SUSTAINED:
        got = {s: by[(scen, s)] for s in HERALDS if by.get((scen, s))}
        if len(got) > 1:
            out.append((scen, got))
    return out


def _total_cpu(r):
    if r.get("cpu_s_per_1000") is None:
        return None
    return r["cpu_s_per_1000"] + (r.get("db_cpu_s_per_1000") or 0)


def _figure(scen, r):
    """The figure that matters per scenario: p50 ms of a 500-device message, or sustained pushes/s."""
    return r.get("p50_ms") if scen in LATENCY else r.get("pushes_per_s")


def side_by_side_text(results):
    rows = backend_rows(results)
    if not rows:
        return []
    present = [s for s in HERALDS if any(s in got for _, got in rows)]
    out = ["Herald by store: p50 ms (500-device scenarios) or pushes/s (sustained); CPU s per 1,000 pushes,",
           "Herald + database = total (SQLite's is inside Herald's)."]
    head = f"{'scenario':15} " + " ".join(f"{s:>14}" for s in present) + "   CPU s/1k " + " / ".join(present)
    out.append(head)
    for scen, got in rows:
        figs = " ".join(f"{_fmt(_figure(scen, got[s]) if s in got else None, ',.1f' if scen in LATENCY else ',.0f', 14)}"
                        for s in present)
        cpus = " / ".join(
            (f"{got[s]['cpu_s_per_1000']:.3f}" + (f"+{got[s]['db_cpu_s_per_1000']:.3f}"
                                                  if got[s].get("db_cpu_s_per_1000") is not None else ""))
            if s in got and got[s].get("cpu_s_per_1000") is not None else "-" for s in present)
        out.append(f"{scen:15} {figs}   {cpus}")
    return out


def side_by_side_markdown(results):
    rows = backend_rows(results)
    if not rows:
        return []
    present = [s for s in HERALDS if any(s in got for _, got in rows)]
    L = ["| scenario | figure | " + " | ".join(BACKEND_LABEL[s] for s in present) + " |",
         "|---|---|" + "---:|" * len(present)]

    def f(v, spec):
        return format(v, spec) if isinstance(v, (int, float)) else ""
    for scen, got in rows:
        lat = scen in LATENCY
        lines = [("p50 ms" if lat else "pushes/s", lambda r: f(_figure(scen, r), ",.1f" if lat else ",.0f"))]
        if lat:
            lines.append(("p99 ms", lambda r: f(r.get("p99_ms"), ",.1f")))
        lines += [("Herald CPU s / 1k pushes", lambda r: f(r.get("cpu_s_per_1000"), ".3f")),
                  ("database CPU s / 1k pushes", lambda r: f(r.get("db_cpu_s_per_1000"), ".3f")
                   if r.get("backend") == "postgres" else "in Herald's"),
                  ("Herald + database CPU s / 1k", lambda r: f(_total_cpu(r), ".3f")),
                  ("database statements / message", lambda r: f(r.get("statements_per_message"), ".1f")
                   if r.get("backend") == "postgres" else ""),
                  ("peak RSS MB (Herald)", lambda r: f(r.get("peak_rss_mb"), ".1f"))]
        for i, (what, fn) in enumerate(lines):
            L.append(f"| {'`' + scen + '`' if i == 0 else ''} | {what} | "
                     + " | ".join(fn(got[s]) if s in got else "" for s in present) + " |")
    return L


# ---------------------------------------------------------------- first push, 4 connections, size curve


def _f(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else ""


def first_push_markdown(results):
    by = rows_by(results)
    got = [by[(scen, s)] for scen in LATENCY for s in HERALDS if by.get((scen, s))
           and "first_push_p50_ms" in by[(scen, s)]]
    if not got:
        return []
    L = ["## Time to first push", "",
         "From the `push.send` write to the first request of that message at the sink, per message of the "
         "500-device scenarios (the measured ones, not the warm-up). The driver takes the wall clock "
         "(`time.time()`) right before `sendall`; the sink's time is nginx's: `$msec - $request_time` of the "
         "request, i.e. the time nginx cached at the event-loop wake-up that read the request's HEADERS, in "
         "whole milliseconds (nginx offers nothing finer; it truncates, so each figure adds 0.5 ms, the middle "
         "of the millisecond: every sample is good to ±0.5 ms). Both are the same machine's CLOCK_REALTIME. "
         "The messages go one at a time, so sorted by that time the phase's access-log records are the "
         "messages' own in turn; this holds only when the phase logged exactly the pushes its messages "
         "carried (the exactly-once check), and each message's records must lie between its write and its "
         f"answer, or the row shows none. Target: ≤ {FIRST_PUSH_TARGET_MS:g} ms p50 on every platform.",
         "",
         "The last push column is the same measure to the end of the message's last request at the sink "
         "(its `$msec`): the rest of the message's time, up to the answer, is Herald recording the outcomes "
         "and answering `wait: true`.",
         "",
         "| scenario | sender | first push p50 ms | first push p90 ms | last push p50 ms | message p50 ms "
         "| first push / message p50 |",
         "|---|---|---:|---:|---:|---:|---:|"]
    for r in got:
        fp, p50 = r.get("first_push_p50_ms"), r.get("p50_ms")
        L.append(f"| `{r['scenario']}` | {r['sender']} | {_f(fp, '.1f')} | {_f(r.get('first_push_p90_ms'), '.1f')} | "
                 f"{_f(r.get('last_push_p50_ms'), '.1f')} | "
                 f"{_f(p50, '.1f')} | {_f(fp / p50 if fp is not None and p50 else None, '.2f')} |"
                 + (f" {r['first_push_problem']}" if r.get("first_push_problem") else ""))
    L.append("")
    return L


def sustained_4c_markdown(results):
    by = rows_by(results)
    present = [s for s in SUSTAINED_4C if by.get((s, "herald"))]
    if not present:
        return []
    allcore, _ = seal_allowance(results)
    cfg = (results.get("config") or {}).get("sustained_4c") or {}
    n = cfg.get("connections", 4)
    L = ["## Sustained with four client connections", "",
         f"{n} client connections to one Herald (SQLite), one thread each, each sending 500-device messages "
         "(`wait: true`) to its own 100 users back to back, all at once, for the sustained duration (as an "
         "application server's pool would; the one-connection rows above are unchanged). pushes/s is every "
         "connection's delivered pushes over the wall time; p50 is per message over all connections. "
         "h2load is the same ceiling as for the one-connection rows, measured right after. Targets: APNs ≥ 0.6 "
         "of h2load's rate, Web Push ≥ 0.7 of what the seal cost allows on all cores.", "",
         "| scenario | Herald pushes/s | p50 ms per message | h2load req/s | Herald / h2load | Herald / seal allowance "
         "| one connection (same run) | 4 / 1 connections |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for scen in present:
        h = by[(scen, "herald")]
        c = by.get((scen, "h2load")) or {}
        one = by.get((scen[:-3], "herald")) or {}
        hp, cp, op = h.get("pushes_per_s"), c.get("pushes_per_s"), one.get("pushes_per_s")
        seal = hp / allcore if scen.startswith("web") and hp and allcore else None
        L.append(f"| `{scen}` | {_f(hp, ',.0f')} | {_f(h.get('p50_ms'), '.1f')} | {_f(cp, ',.0f')} | "
                 f"{_f(hp / cp if hp and cp else None, '.3f')} | {_f(seal, '.3f')} | {_f(op, ',.0f')} | "
                 f"{_f(hp / op if hp and op else None, '.2f')} |")
    L.append("")
    return L


def size_markdown(results):
    sizes = size_rows(results)
    if not sizes:
        return []
    cfg = (results.get("config") or {}).get("sizes") or {}
    ref = next((r for r in sizes if r.get("devices") == 500), None)
    L = ["## Cost as the work grows", "",
         "One APNs message to 100, 500, 2,000 and 10,000 devices (sender `herald`, SQLite; the sizes this run "
         "measured are below), "
         f"{cfg.get('messages', '?')} messages per size after {cfg.get('warmup', '?')} warm-up; users with "
         f"{cfg.get('devices_per_user', 20)} devices each (the app's `device_cap`), the smaller messages to the "
         "first users of the larger. Their devices (and the four-connection scenarios') are registered after "
         "the one-connection sustained scenarios, so every scenario of the table above ran on the store as before. µs per device is p50 / devices; peak RSS is Herald's VmHWM over "
         "the size's messages (reset before each size, so it starts from what the phases before it left "
         "resident: compare the sizes with each other). Time per device should not grow with the message's "
         "size.", "",
         "| scenario | devices | p50 ms | p90 ms | µs per device | µs per device / size_500's | pushes/s "
         "| CPU s / 1,000 pushes | peak RSS MB | first push p50 ms |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sizes:
        rel = (r["us_per_device"] / ref["us_per_device"]
               if ref and r.get("us_per_device") and ref.get("us_per_device") else None)
        L.append(f"| `{r['scenario']}` | {r['devices']:,} | {_f(r.get('p50_ms'), ',.1f')} | "
                 f"{_f(r.get('p90_ms'), ',.1f')} | {_f(r.get('us_per_device'), ',.1f')} | {_f(rel, '.2f')} | "
                 f"{_f(r.get('pushes_per_s'), ',.0f')} | {_f(r.get('cpu_s_per_1000'), '.3f')} | "
                 f"{_f(r.get('peak_rss_mb'), '.1f')} | {_f(r.get('first_push_p50_ms'), ',.1f')} |"
                 + ("" if r.get("delivered_all") else f" **not all delivered: {r['delivered']}/{r['expected']}**"))
    L.append("")
    return L


def held_markdown(results):
    held = held_rows(results)
    if not held:
        return []
    cfg = (results.get("config") or {}).get("held_million") or {}
    L = ["## Deliveries held for their time", "",
         f"A Herald of its own per store (`[delivery] max_queued` {cfg.get('max_queued', 0):,}, else the same "
         f"configuration) accepts {cfg.get('held_messages', '?')} `push.send` calls to "
         f"{cfg.get('devices_per_message', 0):,} APNs devices each with `not_before` {cfg.get('days_ahead', 7)} days "
         f"ahead and a TTL covering the wait, one at a time, each answered at its commit (accept/s: held deliveries "
         "per second over them). A held delivery is a queued row due at its time, and the claims read only what is "
         "due, so the deliveries should cost nothing while they wait: Herald's CPU (utime + stime from "
         f"`/proc/PID/stat`, 10 ms ticks) over an idle window of {cfg.get('idle_s', '?'):g} s with them, next to "
         "the same window before they were accepted (each after "
         f"{cfg.get('settle_s', '?'):g} s of quiet), and a {cfg.get('fanout_devices', 500)}-device APNs message "
         "(apns500's shape, on users of its own) beside them next to the same message before them. Checked, not "
         "timed: `push.status` of the first and last held message says every delivery `held`, the first's detail "
         "has `due_at` at `not_before`, and the sink logged no request for a held device. On PostgreSQL (one "
         "instance on a database of its own) the server's CPU over the same windows includes the other variants' "
         "idle instances and autovacuum; its pool's is Herald's connections to its own database only.", "",
         "| store | held | accept/s | push.send p50 ms | idle CPU ms/s, none | held | difference "
         "| RSS MB, none / held | fan-out p50 ms, none / held | p50 ratio | CPU per push ratio | store MB | checked |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in held:
        checked = ("held, due_at " + str(r.get("status_due_at")) + ", nothing at the sink" if r.get("held_ok") else
                   f"**not held: {r.get('held_at_sink')} request(s) at the sink**")
        def pair(a, b, spec):
            return f"{_f(r.get(a), spec)} / {_f(r.get(b), spec)}"
        cells = [BACKEND_LABEL.get(r["sender"], r["sender"]), _f(r.get("held"), ","), _f(r.get("accept_per_s"), ",.0f"),
                 _f(r.get("accept_p50_ms"), ".1f"), _f(r.get("idle_cpu_ms_per_s_none"), ".1f"),
                 _f(r.get("idle_cpu_ms_per_s_held"), ".1f"), _f(r.get("idle_cpu_ms_per_s_diff"), "+.1f"),
                 pair("rss_mb_none", "rss_mb_held", ".1f"), pair("base_p50_ms", "p50_ms", ".1f"),
                 _f(r.get("vs_unheld"), ".2f"), _f(r.get("cpu_vs_unheld"), ".2f"), _f(r.get("store_mb"), ".1f"),
                 checked]
        L.append("| " + " | ".join(cells) + " |")
    pgs = [r for r in held if r.get("idle_db_cpu_ms_per_s_none") is not None]
    if pgs:
        L += ["", "| store | database CPU ms/s idle, none / held | its pool's ms/s, none / held "
              "| statements/s idle, none / held | database CPU s / 1k pushes, none / held "
              "| statements / message, none / held |", "|---|---:|---:|---:|---:|---:|"]
        for r in pgs:
            cells = [BACKEND_LABEL.get(r["sender"], r["sender"])] + [
                f"{_f(r.get(a), spec)} / {_f(r.get(b), spec)}" for a, b, spec in (
                    ("idle_db_cpu_ms_per_s_none", "idle_db_cpu_ms_per_s_held", ".1f"),
                    ("idle_db_pool_cpu_ms_per_s_none", "idle_db_pool_cpu_ms_per_s_held", ".1f"),
                    ("idle_statements_per_s_none", "idle_statements_per_s_held", ".1f"),
                    ("base_db_cpu_s_per_1000", "db_cpu_s_per_1000", ".3f"),
                    ("base_statements_per_message", "statements_per_message", ".1f"))]
            L.append("| " + " | ".join(cells) + " |")
        L += ["", "What took the database's time over the idle window with them held (pg_stat_statements on "
              "Herald's database, the window's difference):", ""]
        for r in pgs:
            for t in (r.get("idle_held") or {}).get("top_statements") or []:
                L.append(f"- {BACKEND_LABEL.get(r['sender'], r['sender'])}: {t['calls']} call(s), {t['ms']:,.1f} ms: "
                         f"`{t['statement']}`")
    L.append("")
    return L


# ---------------------------------------------------------------- plots


def plots(results, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = rows_by(results)
    paths = []
    for scen in LATENCY:
        senders = [s for s in ORDER if by.get((scen, s)) and by[(scen, s)].get("samples_ms")]
        if not senders:
            continue
        fig, ax = plt.subplots(figsize=(max(7.5, 1.3 * len(senders)), 4.2), dpi=110)
        data = [by[(scen, s)]["samples_ms"] for s in senders]
        bp = ax.boxplot(data, patch_artist=True, widths=0.5, showfliers=False)
        for patch, s in zip(bp["boxes"], senders):
            patch.set_facecolor(COLORS[s])
            patch.set_alpha(0.35)
        for i, (s, d) in enumerate(zip(senders, data), start=1):
            xs = [i + (k % 7 - 3) * 0.035 for k in range(len(d))]
            ax.scatter(xs, d, s=12, color=COLORS[s], zorder=3)
            p50 = by[(scen, s)]["p50_ms"]
            ax.annotate(f"p50 {p50:.1f}", (i + 0.28, p50), fontsize=8, va="center")
        ax.set_xticks(range(1, len(senders) + 1), senders, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms per 500-device message (log)")
        ax.set_title(f"{scen}: time for one message to reach 500 devices")
        ax.grid(axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        p = os.path.join(out_dir, f"fanout-latency-{scen}.png")
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)

    scen_present = [s for s in SUSTAINED + SUSTAINED_4C if any(by.get((s, x)) for x in ORDER)]
    if scen_present:
        fig, ax = plt.subplots(figsize=(8, 5.2), dpi=110)
        width = 0.2
        allcore, _ = seal_allowance(results)
        for gi, scen in enumerate(scen_present):
            senders = [s for s in ORDER if s != "h2load" and by.get((scen, s)) and by[(scen, s)].get("pushes_per_s")]
            for k, s in enumerate(senders):
                x = gi + (k - (len(senders) - 1) / 2) * width
                v = by[(scen, s)]["pushes_per_s"]
                ax.bar(x, v, width * 0.9, color=COLORS[s], label=s if gi == [g for g, sc in enumerate(scen_present)
                                                                            if by.get((sc, s))][0] else None)
                ax.annotate(f"{v:,.0f}", (x, v), ha="center", va="bottom", fontsize=7)
            c = by.get((scen, "h2load"))
            if c and c.get("pushes_per_s"):
                ax.hlines(c["pushes_per_s"], gi - 0.42, gi + 0.42, colors=COLORS["h2load"], linestyles="--",
                          label="h2load ceiling" if gi == 0 else None)
                ax.annotate(f"h2load {c['pushes_per_s']:,.0f}", (gi, c["pushes_per_s"]), ha="center",
                            va="bottom", fontsize=7, color="#444")
            if scen in ("web_sustained", "web_sustained_4c") and allcore:
                ax.hlines(allcore, gi - 0.42, gi + 0.42, colors="#9467bd", linestyles=":",
                          label="seal cost allows (all cores)" if scen == [x for x in scen_present
                                                                            if x.startswith("web_")][0] else None)
        ax.set_xticks(range(len(scen_present)), scen_present, fontsize=8 if len(scen_present) > 3 else None)
        ax.set_yscale("log")
        ax.set_ylabel("pushes/s (log)")
        ax.set_title("Sustained throughput: 500-device messages back to back"
                     + (" (*_4c: 4 client connections)" if any(x in SUSTAINED_4C for x in scen_present) else ""))
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
        fig.tight_layout()
        p = os.path.join(out_dir, "fanout-sustained.png")
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)

    # The size curve: p50 and time per device against the message's devices.
    sizes = size_rows(results)
    if sizes:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110)
        xs = [r["devices"] for r in sizes]
        p50 = [r.get("p50_ms") for r in sizes]
        a1.plot(xs, p50, "o-", color=COLORS["herald"], label="p50 per message")
        first = [r.get("first_push_p50_ms") for r in sizes]
        if any(v is not None for v in first):
            a1.plot([x for x, v in zip(xs, first) if v is not None], [v for v in first if v is not None],
                    "s--", color="#ff7f0e", label="time to first push, p50")
        for x, v in zip(xs, p50):
            if v is not None:
                a1.annotate(f"{v:,.1f}", (x, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        a1.set_xscale("log")
        a1.set_yscale("log")
        a1.set_xlabel("devices in the message (log)")
        a1.set_ylabel("ms (log)")
        a1.set_title("One APNs message: time", fontsize=10)
        a1.grid(which="both", alpha=0.3)
        a1.legend(fontsize=8)
        us = [r.get("us_per_device") for r in sizes]
        a2.plot(xs, us, "o-", color=COLORS["herald"])
        for x, v in zip(xs, us):
            if v is not None:
                a2.annotate(f"{v:,.1f}", (x, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        a2.set_xscale("log")
        a2.set_ylim(bottom=0)
        a2.set_xlabel("devices in the message (log)")
        a2.set_ylabel("µs per device (p50 / devices)")
        a2.set_title("Time per device", fontsize=10)
        a2.grid(which="both", alpha=0.3)
        fig.suptitle("Cost as the work grows (herald on SQLite)", fontsize=11)
        fig.tight_layout()
        p = os.path.join(out_dir, "fanout-size-curve.png")
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)

    # CPU per push by store: Herald's own and, stacked on it, the PostgreSQL server's.
    side = backend_rows(results)
    if side:
        present = [s for s in HERALDS if any(s in got for _, got in side)]
        fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(side)), 4.6), dpi=110)
        width = 0.8 / len(present)
        for k, s in enumerate(present):
            xs = [gi + (k - (len(present) - 1) / 2) * width for gi in range(len(side))]
            own = [got[s].get("cpu_s_per_1000") or 0 if s in got else 0 for _, got in side]
            db = [got[s].get("db_cpu_s_per_1000") or 0 if s in got else 0 for _, got in side]
            ax.bar(xs, own, width * 0.9, color=COLORS[s], label=f"{s}: Herald")
            if any(db):
                ax.bar(xs, db, width * 0.9, bottom=own, color=COLORS[s], alpha=0.4, hatch="//",
                       label=f"{s}: PostgreSQL server")
            for x, a, b in zip(xs, own, db):
                if a or b:
                    ax.annotate(f"{a + b:.3f}", (x, a + b), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(side)), [scen for scen, _ in side], fontsize=8)
        ax.set_ylabel("CPU s per 1,000 pushes")
        ax.set_title("CPU per push by store (SQLite runs inside Herald)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
        fig.tight_layout()
        p = os.path.join(out_dir, "fanout-cpu-by-store.png")
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    return paths


# ---------------------------------------------------------------- REPORT.md


def markdown_table(results):
    by = rows_by(results)
    lines = ["| scenario | sender | p50 ms | p90 ms | p99 ms | first push p50 ms | pushes/s | CPU s / 1,000 pushes "
             "| database CPU s / 1,000 pushes | peak RSS MB | Herald/sender | sender/h2load |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for scen in LATENCY + SUSTAINED + SUSTAINED_4C:
        for sender in ORDER:
            r = by.get((scen, sender))
            if not r:
                continue
            ratio = herald_ratio(results, r)
            c = by.get((scen, "h2load"))
            share = (r["pushes_per_s"] / c["pushes_per_s"] if sender != "h2load" and c and c.get("pushes_per_s")
                     and r.get("pushes_per_s") else None)

            def f(v, spec):
                return format(v, spec) if isinstance(v, (int, float)) else ""
            lines.append(f"| `{scen}` | {sender} | {f(r.get('p50_ms'), ',.1f')} | {f(r.get('p90_ms'), ',.1f')} | "
                         f"{f(r.get('p99_ms'), ',.1f')} | {f(r.get('first_push_p50_ms'), ',.1f')} | "
                         f"{f(r.get('pushes_per_s'), ',.0f')} | "
                         f"{f(r.get('cpu_s_per_1000'), '.3f')} | {f(r.get('db_cpu_s_per_1000'), '.3f')} | "
                         f"{f(r.get('peak_rss_mb'), '.1f')} | "
                         f"{(f(ratio, '.2f') + '×') if ratio else ''} | {f(share, '.3f')} |"
                         + ("" if r.get("delivered_all") else f" **not all delivered: {r['delivered']}/{r['expected']}**"))
    return "\n".join(lines)


def write(results, out_dir, table_text=None):
    os.makedirs(out_dir, exist_ok=True)
    paths = plots(results, out_dir)
    m = results["machine"]
    v = m["versions"]
    cfg = results["config"]
    t = results.get("targets") or summarise(results)["targets"]
    allcore, onecore = seal_allowance(results)
    L = []
    L.append("# Fan-out benchmark report")
    L.append("")
    if results.get("quick"):
        L.append("**Quick run (`make bench-quick`): a smoke check of the harness with few iterations; "
                 "the figures are not meaningful.**")
        L.append("")
    L.append(f"Measured {results['date']} by `make bench` (`benchmarks/fanout/bench_fanout.py`), everything in one run "
             "on one machine against the same sink. No figure is a test; the machine is shared and noisy.")
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append(f"- {m['processor']}, {m['cores']} cores, {m.get('memory_gib')} GiB; Linux {v.get('kernel')}")
    for k in ("herald", "swift", "openssl", "nginx", "h2load", "postgresql", "python", "pywebpush", "py-vapid", "requests",
              "http_ece", "aioapns", "h2", "pyjwt", "cryptography", "matplotlib"):
        if v.get(k):
            L.append(f"- {k}: {v[k]}")
    la = results.get("load_average") or {}
    L.append(f"- load average before / after: {la.get('before')} / {la.get('after')}")
    L.append("")
    L.append("## Results")
    L.append("")
    L.append(f"500-device scenarios: {cfg['messages']} messages each after {cfg['warmup']} warm-up "
             f"(peers: {cfg['peer_messages']} after 1); sustained: 500-device messages back to back for "
             f"{cfg['sustained_seconds']:g} s per platform and sender. `mixed500` is {cfg['mixed500']}.")
    L.append("")
    L.append(markdown_table(results))
    L.append("")
    L.append("- **Herald/sender**: in a 500-device scenario the sender's p50 over Herald's (how many times "
             "faster Herald is); in a sustained one Herald's pushes/s over the sender's. On the h2load row it "
             "is Herald/h2load. Herald is Herald on SQLite: on the `herald_pg` and `herald_pg_x2` rows (Herald "
             "on PostgreSQL with one and two instances) it says how many times faster Herald is on SQLite.")
    L.append("- **sender/h2load**: the sender's pushes/s over h2load's in the same scenario.")
    L.append("- **pushes/s** of a 500-device row: delivered / the sum of its message times; of a sustained "
             "row: delivered / wall time.")
    L.append("- **CPU** (utime + stime) and **peak RSS** (VmHWM) are the sender's own process over the measured "
             "messages: Herald's from `/proc/PID/stat` and `/proc/PID/status` (VmHWM reset through "
             "`/proc/PID/clear_refs` before each phase), each peer's in a process of its own from its own "
             "`/proc/self`, h2load's from `wait4()`. The driver (the application server's side, writing "
             "`push.send`) is not in Herald's figure; nginx's CPU per phase is in `fanout-details.json`.")
    L.append("- **database CPU** (`herald_pg` rows): utime + stime of the PostgreSQL server over the same "
             "messages: the postmaster, every live child (connection backends, WAL writer, checkpointer, "
             "autovacuum) and the children it reaped meanwhile (its cutime + cstime), from `/proc`. On the "
             "SQLite rows the database runs inside Herald's process, so its CPU is in Herald's column.")
    L.append("- **first push p50 ms** (Herald's rows of the 500-device scenarios): time to first push, see "
             "below.")
    L.append("")
    L += first_push_markdown(results)
    L += sustained_4c_markdown(results)
    L += size_markdown(results)
    L += held_markdown(results)
    L += table_sizes_markdown(results)
    pg = results.get("postgres") or {}
    side = side_by_side_markdown(results)
    if side:
        st = pg.get("settings") or {}
        L.append("## SQLite and PostgreSQL side by side")
        L.append("")
        L.append("The Herald scenarios above, each run on SQLite and right after it on PostgreSQL "
                 f"{st.get('server_version', '')} on this machine (a private server on a Unix socket), "
                 "against the same sink with the same devices: "
                 "`herald_pg` is one instance, `herald_pg_x2` two instances on one database, each with its "
                 "own socket, the 500-device message split across both (50 users through each, written at "
                 "once, timed to the last answer) and, in the sustained phases, one client per instance "
                 "sending 500-device messages back to back. Devices are registered through the first "
                 "instance only, so the second sends to devices it learnt from the shared database.")
        L.append("")
        L.append(f"Durability: PostgreSQL with fsync {st.get('fsync')}, synchronous_commit "
                 f"{st.get('synchronous_commit')}, full_page_writes {st.get('full_page_writes')} "
                 f"(shared_buffers {st.get('shared_buffers')}, {pg.get('pool_size')} connections per instance, "
                 f"lease {pg.get('lease_s')} s); SQLite with `synchronous = full`. "
                 + ("Both wait for the disk at each commit." if st.get("fsync") == "on" and
                    st.get("synchronous_commit") == "on" else
                    "PostgreSQL does NOT wait for the disk here (the tests' setting): its figures are not "
                    "comparable with SQLite's durable ones."))
        L.append("")
        L += side
        L.append("")
        loads = [r["load_1min"] for r in results["rows"] if r["sender"] in HERALDS and r.get("load_1min") is not None]
        if loads:
            L.append(f"The machine's 1-minute load average as these phases ended: {min(loads):.2f} to "
                     f"{max(loads):.2f} ({results['machine']['cores']} cores; `load_1min` of each row in "
                     "`fanout-details.json`). Absolute times move by 20-40 % between runs on this machine, more "
                     "when it is loaded; compare the stores within one run.")
            L.append("")
        L.append("The database server's CPU is counted apart from Herald's; add them for what a push costs "
                 "the machine. Everything (Herald, PostgreSQL, nginx, the driver) shares this machine's cores, "
                 "so two instances here show the cost of sharing work through the database, not the gain of "
                 "a second host.")
        L.append("")
    if results.get("crypto"):
        L.append("Crypto share (one Web Push record per device):")
        L.append("")
        L.append("| sender | µs per seal | seals/s | source |")
        L.append("|---|---:|---:|---|")
        for c in results["crypto"]:
            L.append(f"| {c['sender']} | {c.get('us_per_seal') or ''} | "
                     f"{format(c['seals_per_s'], ',.0f') if c.get('seals_per_s') else ''} | {c['source']} |")
        L.append("")
        if allcore:
            L.append(f"What the measured seal cost allows: {allcore:,.0f} pushes/s on all "
                     f"{(results.get('crypto_json') or {}).get('cores', m['cores'])} cores (the all-core figure), "
                     f"{onecore:,.0f} /s as cores / one-core seal time.")
            L.append("")
    L.append("## Targets")
    L.append("")
    L.append("| target | wanted | measured | verdict |")
    L.append("|---|---|---|---|")
    for x in t:
        L.append(f"| {x['target']} | {x['wanted']} | {x['measured']} | "
                 f"{'met' if x['met'] else 'NOT MET: ' + x['detail']} |")
    L.append("")
    L.append("## Plots")
    L.append("")
    for p in paths:
        name = os.path.basename(p)
        L.append(f"![{name}]({name})")
        L.append("")
    L.append("## How it was measured")
    L.append("")
    L.append(f"- **Sink**: Debian's nginx ({v.get('nginx')}), its own process with a configuration written "
             "for the run (`benchmarks/fanout/sink.py`; pid, logs and temp files in a temporary directory, "
             f"{cfg.get('nginx_workers', 2)} workers; a buffered access log of the push requests, the receiver's "
             "record every push of Herald is checked against), TLS with a CA generated for the run, HTTP/2 "
             "(ALPN h2, no GOAWAY after nginx's default 1000 requests per connection). Streams per connection are "
             "capped at 200, not APNs' 1000: with more than about 255 streams closing at a time nginx 1.22 stops "
             "reusing closed-stream nodes, leaks one per request into its stream index and slows down without "
             "bound (h2load -c 1 -m 300 fell from 16,000 to 9,000 req/s within 12 s, a worker at 100% CPU; "
             "-m 200 held about 50,000 req/s), so Herald spreads a 500-device APNs message over its 2 lane "
             "connections here instead of one. It answers APNs `POST /3/device/…` with 200 and the request's `apns-id` echoed (a "
             "generated UUID when there is none: Herald sends none), FCM `messages:send` with 200 and a message "
             "`name`, the service account's `token_uri` (`POST /token`) with an access token, and Web Push "
             "`POST /push/…` with 201. nginx reads every request body before it answers (a `mirror` subrequest "
             "with `mirror_request_body on`): answering with `return` alone ends each HTTP/2 stream with "
             "RST_STREAM(NO_ERROR) before the body is read, which libcurl reports as an error.")
    L.append(f"- **Web Push origins**: {cfg['web_origins']} origins on loopback addresses 127.0.0.2 to "
             f"127.0.0.{1 + cfg['web_origins']} (one port), standing in for several push services; the "
             "certificate has IP SANs for them. Host names would need /etc/hosts, which the benchmark does not "
             "touch. Subscriptions are spread round robin over them and carry real P-256 keys and 16-byte auth "
             "secrets; the sink does not decrypt.")
    L.append(f"- **Herald** ({v.get('herald')}, release build): `herald serve` on a temporary directory with "
             f"`synchronous = full`, `max_inflight = 2000`, `[delivery]` defaults, `[endpoints]` at the sink with "
             "its CA as `ca_file` and `webpush_allow_private = true`. Each scenario has its own 100 users with "
             "5 devices each (registrations are limited to 20 per minute per user). A message is "
             "`push.send {\"to\": {\"users\": [100 users]}, \"wait\": true}` on one Unix-socket connection, timed "
             "from the write to the answer: the RPC, the store commit of 500 deliveries, sealing, HTTP, and the "
             "500 outcomes recorded.")
    L.append("- **pywebpush**: `pywebpush.webpush(subscription_info, data, vapid_private_key=<py_vapid.Vapid "
             "loaded once>, vapid_claims={\"sub\": …}, ttl=86400, headers={\"Urgency\": \"high\"}, "
             "requests_session=<requests.Session with verify = the sink CA>)` per device, as its README shows; "
             "`pywebpush_seq` one after the other on one Session, `pywebpush_threads` in a 32-thread "
             "`ThreadPoolExecutor` with a Session per thread. No patch. The endpoints are the sink's URLs, as "
             "a browser's subscription names its push service. The peer's environment has no "
             "`REQUESTS_CA_BUNDLE`/`CURL_CA_BUNDLE`: requests lets those override a Session's `verify`. It "
             "sends the plaintext without padding (Herald pads every record to 2,816 bytes).")
    L.append("- **aioapns**: `APNs(key=…, key_id, team_id, topic, use_sandbox=False, ssl_context=…)` and "
             "`asyncio.gather` of 500 `send_notification` calls per message on its pool (default "
             "`max_connections=10`). Redirect to loopback: aioapns always dials `api.push.apple.com:443`, so two "
             "class attributes are patched, `aioapns.connection.APNsProductionClientProtocol.APNS_SERVER = "
             "\"127.0.0.1\"` and `.APNS_PORT = <sink port>`; the sink's CA goes in through the public "
             "`ssl_context` parameter (`ssl.create_default_context(cafile=CA)`), on which the benchmark also "
             "sets ALPN `h2`: aioapns offers no ALPN (Apple's servers speak HTTP/2 over TLS without it), and "
             "nginx 1.22 falls back to HTTP/1.1 without it.")
    L.append("- **h2load**: requests shaped like the providers' (path, headers of about Herald's size, the "
             "same bodies, a 2,816-byte record for Web Push). A 500-device message is one h2load process per "
             "origin, all started together, each `-n N -m N` (all streams at once, 200 per connection); "
             "its time is the longest process's span from its first request's start to its last response's "
             "end (`--log-file`), so process start-up and TLS handshakes are left out. Sustained: "
             "`h2load -c 2 -m 100 -t 1 -D <seconds>` against one origin of the platform.")
    L.append("- **http_ece**: seal-only, as pywebpush does it: a fresh P-256 key "
             "(`cryptography`) and `http_ece.encrypt(…, version=\"aes128gcm\")` per subscription, no HTTP. "
             "Herald's seal figures come from `benchmarks/results/crypto.json` (`make bench-crypto`, which "
             "`make bench` runs first).")
    L.append("")
    if results.get("profiles"):
        L.append("## Profiles (this run)")
        L.append("")
        for scen, p in results["profiles"].items():
            L.append(f"`perf record -g -p <herald>` over {p['messages']} more `{scen}` messages after the measured "
                     f"ones (p50 under perf {p['p50_ms_under_perf']} ms); the 30 hottest symbols of "
                     f"`perf report --no-children --stdio -g none --sort dso,symbol` (all of herald's threads together):")
            L.append("")
            L.append("```")
            L += p["top"]
            L.append("```")
            L.append("")
            if p.get("by_dso") or p.get("by_thread"):
                L.append("By library (`--sort dso`) and by thread (`--sort comm`):")
                L.append("")
                L.append("```")
                L += p.get("by_dso", []) + [""] + p.get("by_thread", [])
                L.append("```")
                L.append("")
    if FINDINGS.exists():
        L.append(FINDINGS.read_text().rstrip())
        L.append("")
    L.append("## Problems in this run")
    L.append("")
    if results.get("problems"):
        for p in results["problems"][:20]:
            L.append(f"- `{json.dumps(p)[:400]}`")
    else:
        L.append("None: every push of every sender was delivered.")
    L.append("")
    if results.get("herald_stderr_tail", "").strip():
        L.append("Herald's stderr (log_level warning), last lines:")
        L.append("")
        L.append("```")
        L += results["herald_stderr_tail"].splitlines()[-15:]
        L.append("```")
        L.append("")
    if table_text:
        L.append("## The table as printed")
        L.append("")
        L.append("```")
        L.append(table_text)
        L.append("```")
        L.append("")
    path = os.path.join(out_dir, "REPORT.md")
    with open(path, "w") as f:
        f.write("\n".join(L))
    return [path] + paths


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else str(REPO / "benchmarks/results/fanout-details.json")
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(src))
    with open(src) as f:
        results = json.load(f)
    text = table(results)
    print(text)
    for p in write(results, out_dir, text):
        print("written", p)


if __name__ == "__main__":
    main()
