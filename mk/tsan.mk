# ThreadSanitizer: every Swift suite (and every daemon the suites start, built
# the same way) under -sanitize=thread, in a build of its own. Each process
# writes what TSan finds to build/tsan/report.PID; the target fails on any
# report, and on any failing test. Not part of `make test` (a TSan build and
# run take about 10 minutes on two cores); run it before a release and after
# touching threads, locks or queues.
TSAN_SCRATCH := .build/tsan
TSAN_REPORTS := $(BUILD_DIR)/tsan

.PHONY: test-tsan
## test-tsan: the Swift suites and the daemons they start under ThreadSanitizer; fails on any race report
test-tsan: debian-deps python-deps
	$(SWIFT) build --build-tests --scratch-path $(TSAN_SCRATCH) --sanitize=thread
	@rm -rf $(TSAN_REPORTS) && mkdir -p $(TSAN_REPORTS)
	@set -o pipefail; status=0; \
	TSAN_OPTIONS="log_path=$(CURDIR)/$(TSAN_REPORTS)/report halt_on_error=0 second_deadlock_stack=1" \
		$(SWIFT) test --skip-build --scratch-path $(TSAN_SCRATCH) --sanitize=thread --no-parallel \
		2>&1 | tee $(TSAN_REPORTS)/test.log | grep -E '^(✘|✔ Test run|✘ Test run|━ Test run)' || status=$$?; \
	reports=$$(ls $(TSAN_REPORTS)/report.* 2>/dev/null | wc -l); \
	races=$$(cat $(TSAN_REPORTS)/report.* 2>/dev/null | grep -c '^WARNING: ThreadSanitizer' || true); \
	tests=$$(sed -n 's/.*Test run with \([0-9]*\) tests.*/\1/p' $(TSAN_REPORTS)/test.log | tail -1); \
	echo "test-tsan: $${tests:-?} tests, $$reports processes with reports, $$races ThreadSanitizer warnings"; \
	printf '{"tests": %s, "report_files": %s, "warnings": %s, "test_status": %s}\n' \
		"$${tests:-null}" "$$reports" "$$races" "$$status" > $(TSAN_REPORTS)/summary.json; \
	if [ "$$reports" -gt 0 ]; then cat $(TSAN_REPORTS)/report.* | head -200; exit 1; fi; \
	exit $$status
