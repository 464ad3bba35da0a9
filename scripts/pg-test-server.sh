#!/bin/bash
# A throw-away PostgreSQL server for the tests: pg-test-server.sh start|stop|restart|destroy DIR
#
# start:   the first time, initdb into DIR/data (superuser `herald`, a random password in
#          DIR/password, scram-sha-256 for every connection); then pg_ctl start -w. The server
#          listens only on a Unix socket in DIR/run (listen_addresses = ''), with fsync off: a
#          test database, never a durable one. Prints the libpq connection string (no password).
#          With HERALD_PG_DURABLE=1 in the environment at that first start, the server is made
#          durable instead (fsync, synchronous_commit and full_page_writes on: PostgreSQL's
#          defaults), for benchmarks that compare it with SQLite's synchronous = full. The setting
#          is written into DIR/data at initdb and stays with that directory.
# stop:    pg_ctl stop -m fast -w (the data stays: start again to simulate an outage's end).
# restart: stop, then start.
# destroy: stop if running, then remove DIR.
#
# PostgreSQL refuses to run as root: as root, the server runs as the `postgres` user that
# Debian's postgresql package creates (else `nobody`), and DIR/data, DIR/run and the log belong
# to it. The server binaries come from the newest /usr/lib/postgresql/<version>/bin.
set -euo pipefail

usage() { echo "usage: $0 start|stop|restart|destroy DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$2
case "$dir" in /*) ;; *) dir=$PWD/$dir ;; esac

case "${HERALD_PG_DURABLE:-0}" in
1) durability=on ;;
0) durability=off ;;
*) echo "pg-test-server: HERALD_PG_DURABLE must be 0 or 1, not '$HERALD_PG_DURABLE'" >&2; exit 2 ;;
esac

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/pg_ctl" ]; then
	echo "pg-test-server: no PostgreSQL server under /usr/lib/postgresql (Debian package postgresql)" >&2
	exit 1
fi

if [ "$(id -u)" = 0 ]; then
	if id -u postgres >/dev/null 2>&1; then user=postgres; else user=nobody; fi
	as_server() { runuser -u "$user" -- "$@"; }
else
	user=$(id -un)
	as_server() { "$@"; }
fi
# The server user may not be able to enter the caller's working directory.
cd /

data=$dir/data
run=$dir/run
log=$dir/server.log

dsn() { echo "host=$run port=5432 user=herald dbname=postgres"; }

running() { [ -f "$data/postmaster.pid" ] && as_server "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; }

init() {
	mkdir -p "$dir"
	chmod 0755 "$dir"
	install -d -m 0700 -o "$user" "$data"
	install -d -m 0755 -o "$user" "$run"
	install -m 0600 -o "$user" /dev/null "$log"
	local password
	password=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
	(umask 077; printf '%s\n' "$password" >"$dir/password")
	local pwfile=$dir/initdb.pw
	install -m 0600 -o "$user" /dev/null "$pwfile"
	printf '%s\n' "$password" >"$pwfile"
	if ! as_server "$bindir/initdb" -D "$data" -U herald --pwfile="$pwfile" -A scram-sha-256 \
		-E UTF8 --no-locale --no-sync >"$dir/initdb.log" 2>&1; then
		rm -f "$pwfile"
		cat "$dir/initdb.log" >&2
		exit 1
	fi
	rm -f "$pwfile"
	cat >>"$data/postgresql.conf" <<CONF

# pg-test-server.sh: a Unix socket only; durability $durability (HERALD_PG_DURABLE=${HERALD_PG_DURABLE:-0}).
listen_addresses = ''
unix_socket_directories = '$run'
port = 5432
fsync = $durability
synchronous_commit = $durability
full_page_writes = $durability
max_connections = 400
shared_buffers = 32MB
CONF
}

start() {
	[ -f "$data/PG_VERSION" ] || init
	if ! running; then
		if ! as_server "$bindir/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null 2>&1; then
			echo "pg-test-server: the server did not start; its log:" >&2
			tail -n 30 "$log" >&2
			exit 1
		fi
	fi
	dsn
}

stop() {
	if running; then
		as_server "$bindir/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
	fi
}

case "$cmd" in
start) start ;;
stop) stop ;;
restart) stop; start ;;
destroy) [ -d "$data" ] && stop; rm -rf "$dir" ;;
*) usage ;;
esac
