# Herald: set-up, build, run, test and benchmark targets.
# `make run` and `make test` work on a fresh Debian 12 machine as root: they
# install what is missing first.

SHELL := /bin/bash
.DEFAULT_GOAL := build

SWIFT ?= swift
CC ?= cc
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# C libraries from Debian, plus what the tests and benchmarks drive.
# nginx and nghttp2-client (h2load) are the fan-out benchmark's sink and ceiling; the
# benchmark runs its own nginx on its own ports and never uses the system one.
# systemd: systemd-analyze, systemd-sysusers and systemd-tmpfiles for test-units; iproute2: the
# reliability checks set up loopback addresses in network namespaces they create. postgresql and
# libpq-dev: the Postgres module links libpq; its tests start throw-away servers of their own
# (scripts/pg-test-server.sh) and never use the system one. prometheus (for promtool) and python3-yaml:
# the dashboard and alert checks (Tests/reliability/test_dashboards.py) check and unit-test
# deploy/prometheus/herald-alerts.yml; they never start the Prometheus server. tzdata: HeraldTime reads its
# zone files (/usr/share/zoneinfo); a slim container image may leave it out.
DEBIAN_PACKAGES := libssl-dev libsodium-dev libnghttp2-dev libjansson-dev \
	libcurl4-openssl-dev libsqlite3-dev libinih-dev libmicrohttpd-dev openssl pkg-config python3 python3-venv \
	nginx nghttp2-client systemd iproute2 postgresql libpq-dev libc-ares-dev publicsuffix python3-yaml tzdata
# Installed without what they recommend: promtool needs nothing of prometheus-node-exporter.
DEBIAN_PACKAGES_LEAN := prometheus

VENV := .venv
VENV_STAMP := $(VENV)/.requirements-installed
BENCH_STAMP := $(VENV)/.bench-requirements-installed
BUILD_DIR := build
HERALD := .build/debug/herald

CORE_SOURCES := $(wildcard CSources/CHeraldCrypto/*.c)
CORE_TEST_SOURCES := $(wildcard Tests/CCore/*.c)
CORE_FLAGS := -std=c11 -Wall -Wextra -Werror -DOPENSSL_API_COMPAT=30000 -DOPENSSL_NO_DEPRECATED \
	-ICSources/CHeraldCrypto/include
CORE_LIBS := -lcrypto -lsodium -ljansson -lpthread
SANITIZE := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# The Swift suites that drive the C layers (the HTTP/2 client over nghttp2, libcurl and HTTP/1.1,
# SQLite, libpq) run again under ASan (with LeakSanitizer) and, for the C code, UBSan, in a build of their
# own; the metrics tests run the sanitized daemon itself with its libmicrohttpd listener (a
# sanitizer report makes the daemon exit non-zero at SIGTERM, which fails the test).
SWIFT_SANITIZE := --scratch-path .build/sanitize --sanitize=address -Xcc -fsanitize=undefined \
	-Xcc -fno-sanitize-recover=all
SANITIZE_SUITES := APNsTests|HTTP2Tests|HeraldSchedulerTests|HeraldStoreTests|HTTPClientTests|SenderTests|PostgresTests|OperationsTests/metrics|EventLoopShutdownTests|HeraldTimeTests

.PHONY: deps debian-deps python-deps bench-deps build run demo openrpc test test-c test-swift test-sanitize \
	test-interop bench bench-crypto bench-rpc bench-delivery bench-fanout bench-quick clean \
	install install-files test-units lint

## deps: install missing Debian packages and the Python test peers (local venv)
deps: debian-deps python-deps

debian-deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	lean=""; for p in $(DEBIAN_PACKAGES_LEAN); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || lean="$$lean $$p"; \
	done; \
	if [ -n "$$missing$$lean" ]; then \
		echo "installing Debian packages:$$missing$$lean"; \
		$(SUDO) apt-get update -qq; \
	fi; \
	if [ -n "$$missing" ]; then \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing || exit 1; \
	fi; \
	if [ -n "$$lean" ]; then \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$lean || exit 1; \
	fi

python-deps: $(VENV_STAMP)

$(VENV_STAMP): Tests/interop/requirements.txt | debian-deps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r Tests/interop/requirements.txt
	touch $@

## bench-deps: the benchmark-only Python packages (fan-out peers, plots) into the venv
bench-deps: $(BENCH_STAMP)

$(BENCH_STAMP): benchmarks/requirements.txt $(VENV_STAMP)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r benchmarks/requirements.txt
	touch $@

## build: the herald executable (debug)
build: debian-deps
	$(SWIFT) build --product herald

## run: start the daemon on the embedded development set-up under ./.herald/
run: build
	@HERALD=$(HERALD) scripts/dev-setup.sh $(CURDIR)/.herald
	exec $(HERALD) serve --config $(CURDIR)/.herald/herald.conf

## demo: herald against the benchmark sink: 500 devices, one message, live progress, final counts
demo: deps bench-deps build
	$(VENV)/bin/python benchmarks/fanout/demo.py --herald $(HERALD)

## openrpc: embed docs/openrpc.json into the daemon (rpc.discover)
openrpc:
	$(PYTHON) scripts/embed-openrpc.py

## test: the unit-file lint (test-units), every suite: C core under ASan+UBSan, a short run of every fuzz target
## (fuzz-smoke), Swift suites (some again under sanitizers), interop with Python peers, the client library and the
## docs' example programs (test-clients), the reliability checks
## (faults, hostile input, access; kill -9 rounds; load), the same on PostgreSQL with two instances
## (test-postgres-reliability), then the fan-out benchmark harness as a smoke check
## (bench-quick: no timing is asserted). test-tsan and a long `make fuzz` are separate.
test: deps
	$(MAKE) --no-print-directory lint test-units test-c fuzz-smoke test-swift test-sanitize test-interop \
		test-clients test-reliability-checks test-crash test-load test-postgres-reliability bench-quick

## lint: swift format lint --strict over every Swift file (the style is .swift-format; `swift format
## format -i -r Sources Tests benchmarks Package.swift` fixes what it can), and the module graph:
## every import within its module's row of docs/architecture.md "Module imports"
LINT_PATHS := Package.swift Sources Tests benchmarks
lint:
	$(SWIFT) format lint --strict --recursive $(LINT_PATHS)
	python3 scripts/check-imports.py --self-test

test-c: debian-deps
	@mkdir -p $(BUILD_DIR)/ctest
	$(CC) $(CORE_FLAGS) $(SANITIZE) $(CORE_SOURCES) $(CORE_TEST_SOURCES) $(CORE_LIBS) \
		-o $(BUILD_DIR)/ctest/hc_tests
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
		$(BUILD_DIR)/ctest/hc_tests Tests/Fixtures

# One test at a time: many suites run real daemons and gateways, and on a 2-core
# machine running them side by side starves the ones with deadlines.
test-swift: debian-deps python-deps
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build --no-parallel

test-sanitize: python-deps
	$(SWIFT) build --build-tests $(SWIFT_SANITIZE)
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/Tests/sanitizers/lsan.supp \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(SWIFT) test $(SWIFT_SANITIZE) --skip-build --no-parallel --filter '$(SANITIZE_SUITES)'

test-interop: python-deps
	$(SWIFT) build --product herald
	HERALD_BIN=$(HERALD) $(VENV)/bin/python -m pytest -q Tests/interop Tests/gateways

## test-units: stage the systemd units, sysusers and tmpfiles files into a temporary tree (install-files) and
## check them: systemd-analyze verify must print nothing, security --offline must score at most UNIT_EXPOSURE_MAX.
## Hermetic: no running systemd needed, no generators, no man pages, no drop-ins from /etc or /run
## (SYSTEMD_UNIT_PATH is the staged units plus the distribution's own). The staged ExecStart= binary is the debug
## herald when built, else /bin/true: verify checks that the path exists and is executable, nothing more.
UNIT_EXPOSURE_MAX := 1.5
UNIT_TEST_BIN ?= $(if $(wildcard $(HERALD)),$(HERALD),/bin/true)
DISTRO_UNITDIR := /lib/systemd/system
test-units: debian-deps
	MAKE="$(MAKE)" scripts/test-units.sh $(UNIT_TEST_BIN) $(UNIT_EXPOSURE_MAX) $(DISTRO_UNITDIR)

## bench: the crypto figures, then the fan-out benchmark against nginx and the other senders (REPORT.md)
bench: bench-crypto bench-fanout

## bench-crypto: seal and ES256 figures against the floor, openssl speed and http_ece
bench-crypto: deps
	$(SWIFT) build -c release --product herald-bench-crypto
	$(VENV)/bin/python benchmarks/crypto/run.py --bench-bin .build/release/herald-bench-crypto \
		--out benchmarks/results/crypto.json

## bench-rpc: health round trips, pipelined calls, durable registrations per second
bench-rpc: debian-deps
	$(SWIFT) build -c release --product herald
	$(PYTHON) benchmarks/rpc/bench_rpc.py .build/release/herald

## bench-delivery: push.send to 500 devices per platform and mixed, against the test gateways: p50/p99, pushes/s
bench-delivery: deps
	$(SWIFT) build -c release --product herald
	$(VENV)/bin/python benchmarks/delivery/bench_delivery.py .build/release/herald \
		--out benchmarks/results/delivery.json

## bench-fanout: one message to 500 devices (with the time to first push) and sustained rates, herald next to
## pywebpush, aioapns and h2load against an nginx sink, then herald on PostgreSQL (one instance, two on one
## database; a private durable server, its CPU counted); on SQLite also sustained from 4 client connections
## (apns_sustained_4c, web_sustained_4c), the size curve (one APNs message to 100 ... 10,000 devices,
## size_100 ... size_10000) and accept_under_load (push.send's p99 while the 10,000-device message is sent,
## against an idle daemon's): table, benchmarks/results/fanout.json, REPORT.md and plots
## (FANOUT_ARGS=--perf profiles, FANOUT_ARGS=--postgres=none SQLite only)
FANOUT_ARGS ?=
bench-fanout: deps bench-deps
	$(SWIFT) build -c release --product herald
	$(VENV)/bin/python benchmarks/fanout/bench_fanout.py --herald .build/release/herald \
		--out-dir benchmarks/results $(FANOUT_ARGS)

## bench-quick: the fan-out harness with few iterations and the debug herald, into build/bench-quick/, on
## SQLite and on PostgreSQL (one and two instances; a private server with the tests' fsync off);
## fails when the harness breaks or a push is not delivered exactly once by the sink's access log, never on a timing
bench-quick: deps bench-deps build
	$(VENV)/bin/python benchmarks/fanout/bench_fanout.py --quick --check --herald $(HERALD) \
		--out-dir $(BUILD_DIR)/bench-quick

## install: a release build, then install-files: the binary, the units (@BINDIR@ and @DOCDIR@ filled in),
## sysusers.d/tmpfiles.d, herald.conf.example and the docs. PREFIX=/usr/local, DESTDIR= to stage a package tree.
## It never writes herald.conf or a key, and creates /etc/herald and its credentials/ only when absent.
PREFIX ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
BINDIR ?= $(PREFIX)/bin
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
DOCDIR ?= $(PREFIX)/share/doc/herald
INSTALL ?= install
INSTALL_BIN ?= .build/release/herald
install: debian-deps
	$(SWIFT) build -c release --product herald
	$(MAKE) --no-print-directory install-files INSTALL_BIN=.build/release/herald

## install-files: install without building, from INSTALL_BIN (tests stage it into a temporary DESTDIR)
install-files:
	$(INSTALL) -d -m 0755 $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
		$(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(DOCDIR)
	$(INSTALL) -m 0755 $(INSTALL_BIN) $(DESTDIR)$(BINDIR)/herald
	for unit in herald.service herald.socket; do \
		sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' systemd/$$unit >$(DESTDIR)$(UNITDIR)/$$unit.tmp && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$unit.tmp && mv -f $(DESTDIR)$(UNITDIR)/$$unit.tmp $(DESTDIR)$(UNITDIR)/$$unit \
		|| exit 1; \
	done
	$(INSTALL) -m 0644 systemd/herald.sysusers $(DESTDIR)$(SYSUSERSDIR)/herald.conf
	$(INSTALL) -m 0644 systemd/herald.tmpfiles $(DESTDIR)$(TMPFILESDIR)/herald.conf
	[ -d $(DESTDIR)$(SYSCONFDIR)/herald ] || $(INSTALL) -d -m 0755 $(DESTDIR)$(SYSCONFDIR)/herald
	[ -d $(DESTDIR)$(SYSCONFDIR)/herald/credentials ] || $(INSTALL) -d -m 0700 $(DESTDIR)$(SYSCONFDIR)/herald/credentials
	$(INSTALL) -m 0644 systemd/herald.conf.example $(DESTDIR)$(SYSCONFDIR)/herald/herald.conf.example
	$(INSTALL) -m 0644 README.md docs/*.md docs/openrpc.json $(DESTDIR)$(DOCDIR)/

clean:
	rm -rf .build $(BUILD_DIR)

# Further targets, one file per area (fuzzing, reliability harnesses).
include $(wildcard mk/*.mk)
