# Several instances on one PostgreSQL database (SPEC.md Revision 2, "Beyond one host";
# docs/reliability.md). Each target starts its own private PostgreSQL server
# (scripts/pg-test-server.sh: initdb in a temporary directory, a Unix socket only, run as the
# unprivileged `postgres` user) and removes it afterwards.
#
#   make test-multi-instance         two daemons on one database (pytest, ~10 min on 2 cores)
#   make test-crash-postgres         the crash harness on PostgreSQL: 3 rounds of 5,000 and one burst
#   make test-hostile-postgres       the hostile-input suite with its daemons on PostgreSQL
#
# Fewer crash rounds than `make test-crash` (10 on SQLite) keep `make test` within its time on two
# cores: the kill/restart paths are the same; what PostgreSQL adds is covered by the 3 rounds.

CRASH_PG_ARGS ?=

.PHONY: test-multi-instance test-crash-postgres test-hostile-postgres test-postgres-reliability

## test-postgres-reliability: test-multi-instance, test-crash-postgres and test-hostile-postgres
test-postgres-reliability: test-multi-instance test-crash-postgres test-hostile-postgres

## test-multi-instance: two daemons on one PostgreSQL database: cross-instance delivery, a 5,000-device
## fan-out through both, kill -9 of one (lease 3 s), a database restart mid-send, idempotency and shared
## rate limits; and what issue 26 asked of several hosts (test_multi_host*.py): work stranded under a live
## owner, clocks 60 s apart, identities, a kill -9 taken over within seconds, SIGTERM handing back, a psql
## session sitting on the store's locks, a read-only database, work left to the instance that can send it;
## registration races (test_registration_race.py) and the previous release beside this one
## (test_rolling_upgrade.py, which builds it from git once); judged by the gateways' records
test-multi-instance: python-deps build
	@mkdir -p $(RELIABILITY_DIR)
	HERALD_BIN=$(HERALD) PYTHONDONTWRITEBYTECODE=1 $(VENV)/bin/python -m pytest -q -p no:cacheprovider \
		Tests/reliability/test_multi_instance.py Tests/reliability/test_multi_host.py \
		Tests/reliability/test_multi_host_store.py Tests/reliability/test_registration_race.py \
		Tests/reliability/test_rolling_upgrade.py

## test-crash-postgres: the crash harness on a private PostgreSQL server (3 rounds of 5,000 devices, one
## register burst); summary in build/reliability/crash-postgres/crash.json
test-crash-postgres: python-deps build
	@mkdir -p $(RELIABILITY_DIR)/crash-postgres
	HERALD_BIN=$(HERALD) $(VENV)/bin/python Tests/reliability/crash_harness.py --backend postgres --rounds 3 \
		--devices 5000 --bursts 1 --out $(RELIABILITY_DIR)/crash-postgres/crash.json $(CRASH_PG_ARGS)

## test-hostile-postgres: the hostile-input and SSRF suite (test_hostile.py), the event stream's
## checks (test_events.py), each device's own rules (test_device_rules.py) and the Live Activities and other
## APNs surfaces (test_live_activities.py, test_channels.py) with their daemons on PostgreSQL
test-hostile-postgres: python-deps build
	HERALD_BIN=$(HERALD) HERALD_STORE_BACKEND=postgres PYTHONDONTWRITEBYTECODE=1 $(VENV)/bin/python -m pytest \
		-q -p no:cacheprovider Tests/reliability/test_hostile.py Tests/reliability/test_events.py \
		Tests/reliability/test_device_rules.py Tests/reliability/test_live_activities.py \
		Tests/reliability/test_channels.py
