"""No lost registration in a race across two instances (issue 26, item 4).

Two daemons on one PostgreSQL database (test_multi_instance.py's ``Cluster``). In every pair, user A
moves her installation (a registration_id, version 1 -> 2) from token T1 to token T2 through
host-a, while at the same moment user B registers T1 through host-b: by token alone in even pairs,
by moving his own installation onto T1 in odd pairs (the registration_id path's reclaim). Each
round sends its pairs' moves pipelined on one connection to host-a and their claims pipelined on
one connection to host-b, both released together, so the two daemons' group commits run into each
other pair after pair. (Both streams go in pair order, so the two batches take their row locks in
one order and cannot deadlock each other: the test is about lost rows, not lock cycles.)

The judge is ``device.list``: as soon as A's move is acknowledged, A has the device with T2's
token_hash; when B's claim is acknowledged after A's move was, A still has it; when the round is
over, asked through both instances, A has T2 and B has T1. Before the fix B's reclaim deleted A's
row by device_id alone: having read A's old row (T1), it waited for A's row lock and, once A's
move committed, deleted the row that now held T2. Every call must be acknowledged.
"""

from __future__ import annotations

import threading
import time

from herald_fixtures import record_counts, reset_counts, token_hash
from test_multi_instance import Cluster, gw, pg  # noqa: F401 - pg and gw are this module's fixtures too

SUITE = "registration_race"
PAIRS = 30
ROUNDS = 5
CALL_TIMEOUT_S = 30


def _round(c: Cluster, r: int) -> list[str]:
    """One round of PAIRS pairs; the problems found."""
    pairs = []
    for i in range(PAIRS):
        a, b = f"ra{r}-{i}", f"rb{r}-{i}"
        pairs.append({"a": a, "b": b, "t1": f"fcm-race-{r}-{i}-one", "t2": f"fcm-race-{r}-{i}-two",
                      "rid": f"inst-{a}", "brid": f"inst-{b}" if i % 2 else None})
    # A's installation on T1 (version 1); in odd pairs B's own installation on a token of its own.
    c.a.register_many([{"user": p["a"], "platform": "fcm", "token": p["t1"], "registration_id": p["rid"],
                        "version": 1} for p in pairs])
    c.b.register_many([{"user": p["b"], "platform": "fcm", "token": f"fcm-race-{p['b']}-own",
                        "registration_id": p["brid"], "version": 1} for p in pairs if p["brid"]])
    moves = [{"user": p["a"], "platform": "fcm", "token": p["t2"], "registration_id": p["rid"], "version": 2}
             for p in pairs]
    claims = [{"user": p["b"], "platform": "fcm", "token": p["t1"],
               **({"registration_id": p["brid"], "version": 2} if p["brid"] else {})} for p in pairs]

    problems: list[str] = []
    lock = threading.Lock()
    moved = [threading.Event() for _ in pairs]
    barrier = threading.Barrier(2, timeout=CALL_TIMEOUT_S)

    def problem(text):
        with lock:
            problems.append(text)

    def has(d, user, token) -> bool:
        return token_hash(token) in {x["token_hash"] for x in d.devices(user)}

    def after_move(i, p, answer):
        moved[i].set()
        if not has(c.a, p["a"], p["t2"]):
            problem(f"pair {i}: A's move acknowledged ({answer['result']}), then A has no device with T2: "
                    f"{c.a.devices(p['a'])}")

    def after_claim(i, p, answer):
        if moved[i].is_set() and not has(c.b, p["a"], p["t2"]):
            problem(f"pair {i}: B's registration of T1 acknowledged after A's move, then A has no device "
                    f"with T2: {c.b.devices(p['a'])}")

    def stream(d, what, params_list, check):
        try:
            with d.connect(CALL_TIMEOUT_S) as rpc:
                barrier.wait()
                ids = rpc.send_many("device.register", params_list)
                index = {rid: i for i, rid in enumerate(ids)}
                for _ in ids:
                    answer = rpc.read(timeout=CALL_TIMEOUT_S)
                    i = index[answer["id"]]
                    if "result" not in answer:
                        problem(f"pair {i}: {what} not acknowledged: {answer}")
                    else:
                        check(i, pairs[i], answer)
        except Exception as e:  # noqa: BLE001 - a stream that broke or timed out is a problem of the round
            problem(f"{what}: {e!r}")

    threads = [threading.Thread(target=stream, args=(c.a, "A's move", moves, after_move)),
               threading.Thread(target=stream, args=(c.b, "B's registration of T1", claims, after_claim))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for i, p in enumerate(pairs):
        for d in (c.a, c.b):
            if not has(d, p["a"], p["t2"]):
                problem(f"pair {i}: after the round A has no device with T2 (asked of {d.dir}): "
                        f"{d.devices(p['a'])}")
        if not has(c.a, p["b"], p["t1"]):
            problem(f"pair {i}: after the round B has no device with T1: {c.a.devices(p['b'])}")
    return problems


def test_moves_against_claims_across_instances(pg, gw):  # noqa: F811 - the imported fixtures
    reset_counts(SUITE)
    t0 = time.monotonic()
    with Cluster(pg, gw) as c:
        problems = []
        for r in range(ROUNDS):
            problems += [f"round {r}, {x}" for x in _round(c, r)]
        assert not problems, f"{len(problems)} problems in {ROUNDS} rounds of {PAIRS} pairs:\n" + \
            "\n".join(problems[:20])
        c.a.shutdown()
        c.b.shutdown()
    record_counts(SUITE, race_pairs=ROUNDS * PAIRS)
    print(f"{ROUNDS} rounds of {PAIRS} pairs in {time.monotonic() - t0:.1f} s")
