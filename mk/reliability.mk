# Reliability harnesses (Tests/reliability/): kill -9 during fan-outs and registration bursts,
# and concurrent load past the daemon's limits. Both drive the debug herald against the
# provider test gateways and write a JSON summary (figures for the docs) into build/reliability/.
# Each takes about 2-3 minutes on a 2-core machine.
#
#   make test-crash [CRASH_ARGS="--seed N"]      >= 10 rounds of 5,000-device fan-outs, 3 register bursts
#   make test-load  [LOAD_ARGS="--seconds 30"]   64 clients for 60 s, then the overload phase
#
# test-load also fails when herald.db-wal passes 128 MiB after the mixed phase (it once grew
# without bound: a statement left on a row kept every checkpoint from advancing).
#
# A failing run exits non-zero and keeps its work directory (printed); the daemon's stderr of
# every start is copied to build/reliability/*-herald*.log.

RELIABILITY_DIR := $(BUILD_DIR)/reliability
CRASH_ARGS ?=
LOAD_ARGS ?=

.PHONY: test-crash test-load

## test-crash: SIGKILL herald at random moments of >= 10 fan-outs to 5,000 devices (APNs, FCM, Web Push; some
## answering transient errors) and of device.register bursts; every accepted delivery must end delivered/failed,
## every gateway copy must carry what was sent, resends only what the gateways had answered, <= max_inflight a kill
test-crash: python-deps build
	@mkdir -p $(RELIABILITY_DIR)
	HERALD_BIN=$(HERALD) $(VENV)/bin/python Tests/reliability/crash_harness.py --rounds 10 --devices 5000 \
		--out $(RELIABILITY_DIR)/crash.json $(CRASH_ARGS)

## test-load: 64 concurrent clients for 60 s mixing register/send/status/list (no protocol errors, bounded RSS),
## then past the limits: 1007 overloaded with retry_after_ms, the queue never beyond max_queued; every delivery
## checked against the gateways' records (exactly once, nothing to other devices, no refused push sent)
test-load: python-deps build
	@mkdir -p $(RELIABILITY_DIR)
	HERALD_BIN=$(HERALD) $(VENV)/bin/python Tests/reliability/load_test.py --clients 64 --seconds 60 \
		--out $(RELIABILITY_DIR)/load.json $(LOAD_ARGS)
