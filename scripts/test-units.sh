#!/usr/bin/env bash
# The systemd files as `make install-files` stages them, checked:
#   1. ExecStart= names the staged binary;
#   2. systemd-analyze verify prints nothing;
#   3. systemd-analyze security --offline scores at most EXPOSURE_MAX;
#   4. systemd-sysusers and systemd-tmpfiles --create work in a scratch root
#      (herald-clients created, /etc/herald 0755 and its credentials 0700, root-owned).
# Usage: scripts/test-units.sh BINARY EXPOSURE_MAX DISTRO_UNITDIR (make test-units passes them).
set -euo pipefail

bin=${1:?binary to stage}
exposure_max=${2:?highest exposure score allowed}
distro_units=${3:-/lib/systemd/system}
make=${MAKE:-make}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
units=$tmp/usr/lib/systemd/system

fail() {
    echo "test-units: $*" >&2
    exit 1
}

"$make" --no-print-directory -s install-files DESTDIR= PREFIX="$tmp/usr" SYSCONFDIR="$tmp/etc" \
    BINDIR="$tmp/usr/bin" UNITDIR="$units" SYSUSERSDIR="$tmp/usr/lib/sysusers.d" \
    TMPFILESDIR="$tmp/usr/lib/tmpfiles.d" DOCDIR="$tmp/usr/share/doc/herald" INSTALL_BIN="$bin" >/dev/null

exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$units/herald.service")
[ "$exe" = "$tmp/usr/bin/herald" ] && [ -x "$exe" ] || fail "ExecStart= names '$exe', not the staged binary"

echo "systemd-analyze verify herald.service herald.socket"
if ! SYSTEMD_UNIT_PATH=$units:$distro_units systemd-analyze verify --man=no --generators=no \
    "$units/herald.service" "$units/herald.socket" >"$tmp/verify.log" 2>&1 || [ -s "$tmp/verify.log" ]; then
    cat "$tmp/verify.log"
    fail "systemd-analyze verify is not clean"
fi

SYSTEMD_UNIT_PATH=$units:$distro_units systemd-analyze security --offline=yes --no-pager \
    "$units/herald.service" >"$tmp/security.log" 2>&1 || { cat "$tmp/security.log"; exit 1; }
score=$(sed -n 's/.*Overall exposure level for herald.service: \([0-9.]*\).*/\1/p' "$tmp/security.log")
[ -n "$score" ] || { cat "$tmp/security.log"; fail "no exposure level found"; }
echo "systemd-analyze security herald.service: exposure $score (at most $exposure_max)"
awk -v s="$score" -v m="$exposure_max" 'BEGIN { exit !(s + 0 <= m + 0) }' || {
    grep '✗' "$tmp/security.log" || true
    fail "exposure $score is above $exposure_max"
}

echo "systemd-sysusers and systemd-tmpfiles --create into a scratch root"
mkdir -p "$tmp/root/etc"
systemd-sysusers --root="$tmp/root" "$tmp/usr/lib/sysusers.d/herald.conf" >"$tmp/sysusers.log" 2>&1 ||
    { cat "$tmp/sysusers.log"; exit 1; }
grep -q '^herald-clients:' "$tmp/root/etc/group" ||
    { cat "$tmp/sysusers.log"; fail "sysusers did not create herald-clients"; }
if ! systemd-tmpfiles --root="$tmp/root" --create "$tmp/usr/lib/tmpfiles.d/herald.conf" >"$tmp/tmpfiles.log" 2>&1 ||
    [ -s "$tmp/tmpfiles.log" ]; then
    cat "$tmp/tmpfiles.log"
    fail "tmpfiles is not clean"
fi
modes=$(stat -c '%a %u' "$tmp/root/etc/herald" "$tmp/root/etc/herald/credentials")
[ "$modes" = "$(printf '755 0\n700 0')" ] || {
    stat -c '%a %u %n' "$tmp/root/etc/herald" "$tmp/root/etc/herald/credentials"
    fail "tmpfiles made the wrong modes"
}
echo "test-units: 4 passed, 0 failed"
