"""A rolling upgrade on PostgreSQL (issue 26, item 9): the previous release and this one on one database.

The previous release is the ``herald`` of commit PREVIOUS_RELEASE (it knows PostgreSQL schema 1..3 and
refuses a database whose ``schema_version`` is above 3). It is built from git here: ``git worktree add``
of that commit into a temporary directory, ``swift build --product herald`` there with a scratch path of
its own, the binary cached under build/rolling-upgrade/<commit>/ so a second run reuses it. A build that
fails fails the test (an upgrade the tests cannot check is not a passed check).

Then, on one new database, the new binary ($HERALD_BIN) starts first and migrates (expand-only: the
compatibility level in ``schema_version`` stays 3, the migrations applied are in ``schema_migrations``),
and the old one starts on the migrated database, as the hosts not yet upgraded would restart. A device
registered through either is delivered through the other (judged by the test gateways' records, as
test_multi_instance.py does), both stay healthy, and the old binary restarted later still starts.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from herald_fixtures import HERALD_BIN, REPO, Daemon, copy_store_key, write_store_key
# pg, gw and fresh_gw are pytest fixtures: imported, they serve this module too.
from test_multi_instance import (DELIVERY, Fleet, Ledger, detail_summary, fresh_gw, gw, message, pg,  # noqa: F401
                                 register_fleet)

SUITE = "rolling_upgrade"
PREVIOUS_RELEASE = "cd04991"          # README: one instance per host, several sharing PostgreSQL (schema 3)
PREVIOUS_SCHEMA = 3                   # the newest schema that release knows
BUILD_TIMEOUT_S = 1800
CACHE = REPO / "build" / "rolling-upgrade"


def _git(*args: str, cwd: Path = REPO, timeout=120) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def build_release(rev: str) -> Path:
    """The ``herald`` binary of commit ``rev``, built once and cached under build/rolling-upgrade/<commit>/.

    Raises (never skips) when the commit is unknown or the build fails: the caller's test fails."""
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    home = CACHE / commit
    binary = home / "herald"
    home.mkdir(parents=True, exist_ok=True)
    # Two runs at once: the second waits for the first's build and reuses it.
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(binary, os.X_OK):
            return binary
        tmp = Path(tempfile.mkdtemp(prefix=f"herald-release-{commit[:8]}-"))
        src = tmp / "src"
        log = home / "build.log"
        try:
            _git("worktree", "add", "--detach", str(src), commit)
            cmd = ["swift", "build", "--product", "herald", "--package-path", str(src),
                   "--scratch-path", str(tmp / "scratch")]
            with open(log, "wb") as out:
                done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      timeout=BUILD_TIMEOUT_S)
            if done.returncode != 0:
                tail = log.read_text(errors="replace").splitlines()[-40:]
                raise RuntimeError(f"building herald at {commit} failed ({done.returncode}); {log}:\n"
                                   + "\n".join(tail))
            bin_path = subprocess.run(cmd + ["--show-bin-path"], capture_output=True, text=True, check=True,
                                      stdin=subprocess.DEVNULL, timeout=120).stdout.strip()
            staged = home / "herald.partial"
            shutil.copy2(Path(bin_path) / "herald", staged)
            os.replace(staged, binary)
            (home / "commit").write_text(commit + "\n")
            return binary
        finally:
            removed = True
            try:
                _git("worktree", "remove", "--force", str(src))
            except RuntimeError:
                removed = False
            shutil.rmtree(tmp, ignore_errors=True)
            if not removed:   # its directory is gone now: forget it
                try:
                    _git("worktree", "prune")
                except RuntimeError:
                    pass


_built: dict[str, Path] = {}


def previous_release() -> str:
    """The previous release's binary (built at the first call of the run, from the cache after)."""
    if PREVIOUS_RELEASE not in _built:
        _built[PREVIOUS_RELEASE] = build_release(PREVIOUS_RELEASE)
    return str(_built[PREVIOUS_RELEASE])


class MixedCluster:
    """Daemons on one new database, each with its own binary (``binaries``: name -> path), sharing one
    store key; like test_multi_instance's Cluster, but started one by one, in the order a test wants."""

    def __init__(self, pg, gw, binaries: dict[str, str], *, lease="30"):
        self.pg = pg
        self.database = pg.create_database()
        self.daemons: dict[str, Daemon] = {}
        key = None
        for name, binary in binaries.items():
            d = Daemon(gateways=gw, start=False, log_level="info", delivery=DELIVERY, binary=binary,
                       server={"instance_id": name, "max_inflight": 200},
                       store=pg.store_config(self.database, lease=lease, pool_size=4))
            if key is None:
                key = write_store_key(d.store_key)
            else:
                copy_store_key(key, d.store_key)
            self.daemons[name] = d

    def __getitem__(self, name) -> Daemon:
        return self.daemons[name]

    def start(self, name, binary: str | None = None) -> Daemon:
        d = self.daemons[name]
        if binary is not None:
            d.binary = binary
        d.start(timeout=60, probe_timeout=5)
        return d

    def schema(self) -> tuple[list[int], list[tuple[int, str]]]:
        """``schema_version``'s rows and ``schema_migrations``' (version, kind), as the database has them."""
        level = [int(r[0]) for r in self.pg.query("SELECT version FROM schema_version", self.database)]
        exists = self.pg.query("SELECT to_regclass('schema_migrations') IS NOT NULL", self.database)[0][0] == "t"
        applied = [(int(v), k) for v, k in self.pg.query(
            "SELECT version, kind FROM schema_migrations ORDER BY version", self.database)] if exists else []
        return level, applied

    def close(self):
        for d in self.daemons.values():
            d.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def healthy(d: Daemon, what: str):
    h = d.call("system.health", timeout=30)
    assert h.get("store") == "ok", f"{what}: system.health {h}"
    assert d.running, f"{what} exited:\n{d.log(40)}"
    return h


def cross_delivery(gw, old: Daemon, new: Daemon, tag: str):
    """Devices registered through each, a message for each group sent through the other: every device
    receives its message once (the gateways' records), each message complete with every device
    delivered when asked of either binary."""
    ledger = Ledger(gw)
    ledger.fetch()            # judge only what this round sends
    ledger.copies.clear()
    ledger.invalid.clear()
    via_old = Fleet(gw, f"{tag}-o", 10)
    via_new = Fleet(gw, f"{tag}-n", 10)
    register_fleet(via_old, [old])
    register_fleet(via_new, [new])
    for fleet, other, name in ((via_old, new, "new"), (via_new, old, "old")):
        listed = other.devices(fleet.users[0])
        assert len(listed) == 10, f"the {name} binary lists {len(listed)} of the 10 devices registered via the other"
    sent_new = new.send_wait(message(f"{tag}-to-old-regs", via_old.users))
    sent_old = old.send_wait(message(f"{tag}-to-new-regs", via_new.users))
    for sent, through in ((sent_new, "new"), (sent_old, "old")):
        assert sent["devices"] == 10 and sent["state"] == "complete", f"sent through the {through} binary: {sent}"
    sent_by = {}
    for sent in (sent_new, sent_old):
        for asked in (old, new):
            states, by = detail_summary(asked.status(sent["message_id"]))
            assert states == {"delivered": 10}, f"{sent['message_id']} asked of {asked.dir}: {states}"
            sent_by[sent["message_id"]] = dict(by)
    expected = via_old.expected(via_old.users, f"{tag}-to-old-regs") | \
        via_new.expected(via_new.users, f"{tag}-to-new-regs")
    result = ledger.judge(expected)
    assert not result["problems"], result["problems"]
    assert result["duplicates"] == 0 and result["copies"] == 20, result
    return sent_by


def test_previous_release_builds():
    """The previous release's binary exists (built from git here, or cached): without it the rolling
    upgrade is unchecked, and that is a failure."""
    t0 = time.monotonic()
    binary = previous_release()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0 and out.stdout.startswith("herald"), out
    print(f"previous release {PREVIOUS_RELEASE}: {binary} ({time.monotonic() - t0:.1f} s)")


def test_new_binary_migrates_and_the_previous_release_runs_beside_it(pg, fresh_gw):
    """The new binary first on an empty database (it migrates), then the previous release on it: both
    start, serve and deliver what the other accepted; a restart of the old one still starts."""
    old_bin = previous_release()
    with MixedCluster(pg, fresh_gw, {"host-new": HERALD_BIN, "host-old": old_bin}) as c:
        new = c.start("host-new")
        old = c.start("host-old")   # refused ("schema version 4 is newer…") before expand-then-contract
        level, applied = c.schema()
        assert level == [PREVIOUS_SCHEMA], f"schema_version {level}: the previous release refuses it"
        assert [v for v, _ in applied][:4] == [1, 2, 3, 4], applied
        assert all(k == "expand" for v, k in applied if v > PREVIOUS_SCHEMA), \
            f"a contract migration above {PREVIOUS_SCHEMA} ends the previous release's support: {applied}"
        healthy(new, "the new binary")
        healthy(old, "the previous release")
        sent_by = cross_delivery(fresh_gw, old, new, "mixed")
        print("sent_by per message:", sent_by)
        # A host not yet upgraded restarts (a crash, a reboot) while the schema is the new one.
        old.shutdown()
        c.start("host-old")
        cross_delivery(fresh_gw, old, new, "mixed-again")
        healthy(new, "the new binary")
        healthy(old, "the previous release, restarted")
        assert c.schema()[0] == [PREVIOUS_SCHEMA]
        new.shutdown()
        old.shutdown()


def test_rolling_upgrade_one_host_at_a_time(pg, fresh_gw):
    """docs/operations.md's procedure: two hosts on the previous release, upgraded one at a time. With
    one upgraded the two deliver each other's registrations; then the second is upgraded too."""
    old_bin = previous_release()
    with MixedCluster(pg, fresh_gw, {"host-a": old_bin, "host-b": old_bin}) as c:
        a, b = c.start("host-a"), c.start("host-b")
        level, applied = c.schema()
        assert level == [PREVIOUS_SCHEMA] and applied == [], (level, applied)
        # Upgrade host-a: stop the old binary, start the new one (it migrates while host-b serves).
        a.shutdown()
        c.start("host-a", HERALD_BIN)
        level, applied = c.schema()
        assert level == [PREVIOUS_SCHEMA], level
        assert [v for v, _ in applied][:4] == [1, 2, 3, 4], applied
        # host-b, still on the previous release, restarts meanwhile (a crash, a reboot): it starts.
        b.shutdown()
        c.start("host-b")
        healthy(a, "host-a upgraded")
        healthy(b, "host-b on the previous release")
        cross_delivery(fresh_gw, b, a, "rolling")
        # Upgrade host-b.
        b.shutdown()
        c.start("host-b", HERALD_BIN)
        healthy(a, "host-a")
        healthy(b, "host-b upgraded")
        cross_delivery(fresh_gw, a, b, "upgraded")
        a.shutdown()
        b.shutdown()
