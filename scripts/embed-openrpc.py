#!/usr/bin/env python3
"""Writes Sources/HeraldDaemon/OpenRPC.swift from docs/openrpc.json, so that
rpc.discover serves the document kept in docs/. Run by `make openrpc`; a test
checks the two agree."""
import json
import pathlib

root = pathlib.Path(__file__).resolve().parent.parent
doc = json.loads((root / "docs/openrpc.json").read_text())
compact = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
assert '"""#' not in compact
(root / "Sources/HeraldDaemon/OpenRPC.swift").write_text(
    "// Generated from docs/openrpc.json by `make openrpc`; do not edit by hand.\n"
    "// swift-format-ignore-file\n\n"
    "/// The OpenRPC document that `rpc.discover` returns.\n"
    "enum OpenRPC {\n"
    '    static let document = #"""\n'
    f"{compact}\n"
    '"""#\n'
    "}\n"
)
