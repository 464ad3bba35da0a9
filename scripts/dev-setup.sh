#!/usr/bin/env bash
# Creates the embedded development set-up that `make run` starts: a config,
# a VAPID key and (on first start) the store key, database and socket, all
# under one directory (default ./.herald). Existing files are kept.
set -euo pipefail
dir="${1:-$PWD/.herald}"
herald="${HERALD:-.build/debug/herald}"
mkdir -p "$dir"
chmod 700 "$dir"
[ -f "$dir/vapid.pem" ] || "$herald" vapid generate --out "$dir/vapid.pem" >/dev/null
if [ ! -f "$dir/herald.conf" ]; then
  cat > "$dir/herald.conf" <<CONF
; Development configuration written by scripts/dev-setup.sh (make run).
[server]
socket = $dir/herald.sock
socket_mode = 0600
state_dir = $dir
log_level = info

[store]
key = $dir/store.key
synchronous = full

[app.default]
vapid_key = $dir/vapid.pem
vapid_subject = mailto:dev@localhost.localdomain
CONF
fi
cat <<MSG
herald: development set-up in $dir
  call it with:  $herald health --socket $dir/herald.sock
                 $herald call system.stats --socket $dir/herald.sock
                 $herald register --socket $dir/herald.sock --user alice --platform fcm --token demo-token
MSG
