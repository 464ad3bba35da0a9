# Client libraries and the interface's example programs (clients/, docs/interface.md): the Python
# package clients/python (herald-client) against a real daemon and the provider test gateways, its
# pip install into a fresh venv with no package index, and the programs of docs/interface.md
# ("Calling it from a program") and the README's Python examples, each run against a real daemon
# with its toolchain: python3 always, node and go where installed (pytest reports the others as
# skipped, with the reason; the project installs neither).

.PHONY: test-clients

## test-clients: clients/python against a real daemon, its offline pip install, the docs' example programs
test-clients: python-deps build
	HERALD_BIN=$(HERALD) PYTHONDONTWRITEBYTECODE=1 $(VENV)/bin/python -m pytest -q -rs -p no:cacheprovider \
		clients/python/tests Tests/clients
