# Reliability checks (Tests/reliability): provider faults per transport, hostile input for every
# method and the SSRF corpus, socket/app access and secrets at rest, slow and failing name servers; the
# dashboard and alerting rules of deploy/ against the metrics a daemon exports (promtool). Python pytest suites against a
# real daemon ($(HERALD)) and the test gateways, all on loopback or in namespaces they create (run
# as root: unshare, nsenter, setuid peers). About 2 minutes on 2 cores. The summary line (faults
# injected, hostile inputs tried, SSRF cases) is printed and written to build/reliability/checks.json.

RELIABILITY_OUT := $(BUILD_DIR)/reliability
RELIABILITY_SUITES := Tests/reliability/test_faults.py Tests/reliability/test_hostile.py \
	Tests/reliability/test_access.py Tests/reliability/test_storekey.py Tests/reliability/test_semantics.py \
	Tests/reliability/test_dns.py Tests/reliability/test_provider_rules.py Tests/reliability/test_store_outage.py \
	Tests/reliability/test_pg_server.py Tests/reliability/test_shared_bounds.py \
	Tests/reliability/test_figures.py Tests/reliability/test_process_budgets.py \
	Tests/reliability/test_send_slots.py Tests/reliability/test_dns_starvation.py \
	Tests/reliability/test_dashboards.py Tests/reliability/test_events.py \
	Tests/reliability/test_credential_health.py Tests/reliability/test_device_rules.py \
	Tests/reliability/test_live_activities.py Tests/reliability/test_channels.py

.PHONY: test-reliability-checks

## test-reliability-checks: provider faults × transport, hostile input + SSRF, access and secrets (pytest, ~2 min)
test-reliability-checks: python-deps build
	@mkdir -p $(RELIABILITY_OUT)
	@PYTHONDONTWRITEBYTECODE=1 $(VENV)/bin/python Tests/reliability/herald_fixtures.py reset
	@start=$$(date +%s.%N); status=passed; \
	HERALD_BIN=$(HERALD) PYTHONDONTWRITEBYTECODE=1 $(VENV)/bin/python -m pytest -q -p no:cacheprovider \
		$(RELIABILITY_SUITES) || status=failed; \
	PYTHONDONTWRITEBYTECODE=1 $(VENV)/bin/python Tests/reliability/herald_fixtures.py summary $$start $$status; \
	test $$status = passed
