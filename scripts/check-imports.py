#!/usr/bin/env python3
"""Checks the module graph against docs/architecture.md ("Module imports").

Every Swift file under Sources/<Module>/ (folders included) may import only
the modules its row of that table names, plus the system modules below; a
folder under Sources/ with no row fails, and so does a row for a folder
that is gone. Package.swift's `dependencies:` of each Herald target must be
within its row too (SwiftPM lets a target import what it reaches only
through another one, so the imports alone would not hold the graph). An
import listed under "Imports limited to files" may appear in those files of
its module only.

Run by `make lint`. `--self-test` checks that the check fails where it must
(a forbidden import, a module with no row, a forbidden dependency, an
import outside the one file allowed it) on a
copy of the tree made in a temporary folder.
"""

import os
import re
import shutil
import sys
import tempfile

SYSTEM = {"Foundation", "Glibc", "Dispatch", "Synchronization"}
IMPORT = re.compile(
    r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|package|internal|fileprivate|private)\s+)?import\s+"
    r"(?:(?:class|struct|enum|func|var|let|protocol|typealias)\s+)?([A-Za-z0-9_]+)"
)
ROW = re.compile(r"^\|\s*`([A-Za-z0-9_]+)`\s*\|(.*)\|\s*$")


def allowed_table(doc_path):
    """Module -> the modules it may import, from the doc's "Module imports" table."""
    with open(doc_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "### Module imports")
    except StopIteration:
        raise SystemExit(f"{doc_path}: no '### Module imports' section")
    table = {}
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        m = ROW.match(line)
        if m:
            table[m.group(1)] = set(re.findall(r"`([A-Za-z0-9_]+)`", m.group(2)))
    if not table:
        raise SystemExit(f"{doc_path}: the 'Module imports' section has no rows")
    return table


def file_limits(doc_path):
    """(module, import) -> the file names it may appear in, from "Imports limited to files"."""
    with open(doc_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    limits = {}
    start = next((i for i, line in enumerate(lines) if line.strip() == "### Imports limited to files"), None)
    if start is None:
        return limits
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = [re.findall(r"`([A-Za-z0-9_.]+)`", c) for c in cells]
        if len(names) == 3 and len(names[0]) == 1 and len(names[1]) == 1 and names[2]:
            limits[(names[0][0], names[1][0])] = set(names[2])
    return limits


def imports_of(folder):
    """(file, line number, module) for every import under folder."""
    found = []
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            if not name.endswith(".swift"):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    m = IMPORT.match(line)
                    if m:
                        found.append((path, n, m.group(1)))
    return found


def package_dependencies(package_path):
    """Target name -> the names in its dependencies: [...] (Swift targets of Sources/ only)."""
    with open(package_path, encoding="utf-8") as f:
        text = f.read()
    deps = {}
    # Each target call: from `.target(` or `.executableTarget(` to the next one.
    starts = [m.start() for m in re.finditer(r"\.(?:target|executableTarget|testTarget|systemLibrary)\(", text)]
    for i, s in enumerate(starts):
        chunk = text[s:starts[i + 1] if i + 1 < len(starts) else len(text)]
        m = re.match(r"\.(target|executableTarget)\(\s*name:\s*\"([A-Za-z0-9_]+)\"", chunk)
        if not m:
            continue
        d = re.search(r"dependencies:\s*\[(.*?)\]", chunk, re.S)
        deps[m.group(2)] = set(re.findall(r"\"([A-Za-z0-9_]+)\"", d.group(1))) if d else set()
    return deps


def check(root):
    """The problems found in the tree at root (empty when the graph holds)."""
    table = allowed_table(os.path.join(root, "docs", "architecture.md"))
    limits = file_limits(os.path.join(root, "docs", "architecture.md"))
    sources = os.path.join(root, "Sources")
    modules = sorted(d for d in os.listdir(sources) if os.path.isdir(os.path.join(sources, d)))
    problems = []
    for module in modules:
        if module not in table:
            problems.append(f"Sources/{module}: no row in docs/architecture.md 'Module imports'")
            continue
        for path, n, imported in imports_of(os.path.join(sources, module)):
            rel = os.path.relpath(path, root)
            if imported != module and imported not in SYSTEM and imported not in table[module]:
                problems.append(f"{rel}:{n}: {module} may not import {imported} (docs/architecture.md, 'Module imports')")
            elif (module, imported) in limits and os.path.basename(path) not in limits[(module, imported)]:
                problems.append(f"{rel}:{n}: {module} imports {imported} only in "
                                f"{', '.join(sorted(limits[(module, imported)]))} (docs/architecture.md)")
    for module in sorted(set(table) - set(modules)):
        problems.append(f"docs/architecture.md 'Module imports': row for {module}, which Sources/ does not have")
    for target, deps in sorted(package_dependencies(os.path.join(root, "Package.swift")).items()):
        if target in table:
            for dep in sorted(deps - table[target]):
                problems.append(f"Package.swift: {target} depends on {dep}, outside its row in docs/architecture.md")
    return problems


def self_test(root):
    """The check passes on the tree and fails on three broken copies of it."""
    with tempfile.TemporaryDirectory(prefix="herald-imports-") as tmp:
        def copy():
            dest = os.path.join(tmp, f"t{len(os.listdir(tmp))}")
            os.makedirs(os.path.join(dest, "docs"))
            shutil.copytree(os.path.join(root, "Sources"), os.path.join(dest, "Sources"))
            shutil.copy(os.path.join(root, "docs", "architecture.md"), os.path.join(dest, "docs"))
            shutil.copy(os.path.join(root, "Package.swift"), dest)
            return dest

        broken = copy()
        with open(os.path.join(broken, "Sources", "HeraldCore", "ZZForbidden.swift"), "w") as f:
            f.write("import HeraldDaemon\n")
        assert any("HeraldCore may not import HeraldDaemon" in p for p in check(broken)), "forbidden import passed"

        broken = copy()
        os.makedirs(os.path.join(broken, "Sources", "ZZUnlisted"))
        assert any("ZZUnlisted: no row" in p for p in check(broken)), "a module with no row passed"

        broken = copy()
        path = os.path.join(broken, "Package.swift")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        text = text.replace('.target(name: "HeraldCore", swiftSettings', '.target(name: "HeraldCore", dependencies: ["HeraldStore"], swiftSettings', 1)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        assert any("HeraldCore depends on HeraldStore" in p for p in check(broken)), "a forbidden dependency passed"

        broken = copy()
        with open(os.path.join(broken, "Sources", "herald", "ZZOther.swift"), "w") as f:
            f.write("import HeraldDaemon\n")
        assert any("herald imports HeraldDaemon only in" in p for p in check(broken)), "a file-limited import passed"
    print("check-imports self-test: a forbidden import, an unlisted module, a forbidden dependency and an import "
          "outside its file each fail")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--self-test" in sys.argv[1:]:
        self_test(root)
    problems = check(root)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print("check-imports: every import of Sources/ within docs/architecture.md 'Module imports'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
