#!/usr/bin/env python3
"""Runs the libFuzzer targets built by mk/fuzz.mk.

  run.py fuzz  --time 60 [TARGET...]  each target for --time seconds on its working
                                      corpus (build/fuzz/corpus/<target>, seeded from
                                      the committed one); summary in build/fuzz/summary.json
  run.py smoke --time 5  [TARGET...]  every committed corpus file once, then a few
                                      seconds of fuzzing into a scratch directory;
                                      summary in build/fuzz/smoke-summary.json
  run.py merge [TARGET...]            adds to the committed corpus the working-corpus
                                      units that bring new coverage (-merge=1)

--jobs N runs N targets at a time (each fuzzer is single-threaded). Prints one
line per target, in the order given (executions, exec/s, coverage, new corpus units, exit
status) and a last line "<mode>: N passed, N failed". A target fails when
libFuzzer reports a crash, a sanitizer error, a leak, a timeout or an
out-of-memory; the reproducer path is printed, and the run goes on with the
next target. Exits 1 when any target failed.
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DICTS = os.path.join("Tests", "fuzz", "dict")

STAT = re.compile(r"^stat::(\w+):\s*(\d+)", re.M)
PROGRESS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)", re.M)
SEEDS = re.compile(r"seed corpus: files: (\d+)")
ARTIFACT = re.compile(r"Test unit written to (\S+)")
FAILURE = re.compile(
    r"==\d+==ERROR|ERROR: libFuzzer|deadly signal|SUMMARY: (Address|Leak|Undefined)|"
    r"runtime error:|PROPERTY |Fatal error:")


def files_in(directory):
    if not os.path.isdir(directory):
        return []
    return [f for f in os.listdir(directory) if os.path.isfile(os.path.join(directory, f))]


def fuzzer_env():
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    return env


def run_target(args, target):
    binary = os.path.join(args.work, "bin", target)
    committed = os.path.join(args.corpus, target)
    artifacts = os.path.join(args.work, "artifacts", target) + os.sep
    logs = os.path.join(args.work, "logs")
    os.makedirs(artifacts, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    if args.mode == "fuzz":
        # The working copy keeps what earlier runs found; the committed corpus
        # changes only through `make fuzz-merge`.
        work = os.path.join(args.work, "corpus", target)
        os.makedirs(work, exist_ok=True)
        present = set(files_in(work))
        for name in files_in(committed):
            if name not in present:
                shutil.copy2(os.path.join(committed, name), os.path.join(work, name))
        corpora = [work]
    else:
        work = os.path.join(args.work, "smoke", target)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        corpora = [work, committed]
    corpus_before = len(files_in(work))
    command = [binary, f"-max_total_time={args.time}", "-print_final_stats=1",
               f"-timeout={args.timeout}", "-rss_limit_mb=2048", f"-artifact_prefix={artifacts}"]
    dictionary = os.path.join(DICTS, target + ".dict")
    if os.path.exists(dictionary):
        command.append(f"-dict={dictionary}")
    command += corpora
    log_path = os.path.join(logs, f"{args.mode}-{target}.log")
    started = time.monotonic()
    with open(log_path, "w") as log:
        try:
            status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=fuzzer_env(),
                                    timeout=args.time + 300).returncode
        except subprocess.TimeoutExpired:
            status = -1
    seconds = time.monotonic() - started
    with open(log_path, errors="replace") as log:
        text = log.read()

    stats = {k: int(v) for k, v in STAT.findall(text)}
    progress = PROGRESS.findall(text)
    seeds = SEEDS.search(text)
    reproducers = ARTIFACT.findall(text)
    crashed = status != 0 or bool(reproducers) or bool(FAILURE.search(text))
    return {
        "target": target,
        "runs": stats.get("number_of_executed_units", int(progress[-1][0]) if progress else 0),
        "seconds": round(seconds, 1),
        "exec_per_sec": stats.get("average_exec_per_sec", 0),
        "cov": int(progress[-1][1]) if progress else 0,
        "ft": int(progress[-1][2]) if progress else 0,
        "seed_files": int(seeds.group(1)) if seeds else 0,
        "corpus_before": corpus_before,
        "corpus_after": len(files_in(work)),
        "new_units": stats.get("new_units_added", 0),
        "peak_rss_mb": stats.get("peak_rss_mb", 0),
        "exit_status": status,
        "crashes": 1 if crashed else 0,
        "reproducer": reproducers[-1] if reproducers else None,
        "log": log_path,
    }


def report(args, result):
    r = result
    line = (f"{args.mode} {r['target']}: {r['runs']} runs in {r['seconds']} s ({r['exec_per_sec']}/s), "
            f"cov {r['cov']} ft {r['ft']}, ")
    if args.mode == "fuzz":
        line += f"corpus {r['corpus_before']} -> {r['corpus_after']} ({r['new_units']} new units), "
    else:
        line += f"{r['seed_files']} corpus files, {r['new_units']} new units, "
    line += f"exit {r['exit_status']}"
    print(line, flush=True)
    if r["crashes"]:
        print(f"  FAILED: see {r['log']}", flush=True)
        if r["reproducer"]:
            binary = os.path.join(args.work, "bin", r["target"])
            print(f"  reproducer: {r['reproducer']}  (run: {binary} {r['reproducer']})", flush=True)


def merge(args, targets):
    for target in targets:
        binary = os.path.join(args.work, "bin", target)
        committed = os.path.join(args.corpus, target)
        work = os.path.join(args.work, "corpus", target)
        before = len(files_in(committed))
        log_path = os.path.join(args.work, "logs", f"merge-{target}.log")
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "w") as log:
            status = subprocess.run([binary, "-merge=1", committed, work], stdout=log,
                                    stderr=subprocess.STDOUT, env=fuzzer_env()).returncode
        after = len(files_in(committed))
        print(f"merge {target}: {before} -> {after} committed files, exit {status}", flush=True)
        if status != 0:
            return 1
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["fuzz", "smoke", "merge"])
    parser.add_argument("targets", nargs="+")
    parser.add_argument("--time", type=int, default=60, help="seconds per target")
    parser.add_argument("--timeout", type=int, default=25, help="seconds one input may take")
    parser.add_argument("--jobs", type=int, default=1, help="targets run at the same time")
    parser.add_argument("--work", default=os.path.join("build", "fuzz"))
    parser.add_argument("--corpus", default=os.path.join("Tests", "fuzz", "corpus"),
                        help="the committed corpus")
    args = parser.parse_args()
    os.chdir(ROOT)
    if args.mode == "merge":
        return merge(args, args.targets)

    started = datetime.datetime.now(datetime.timezone.utc)
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for result in pool.map(lambda target: run_target(args, target), args.targets):
            report(args, result)
            results.append(result)
    failed = [r for r in results if r["crashes"]]
    summary = {
        "date": started.isoformat(timespec="seconds"),
        "mode": args.mode,
        "seconds_per_target": args.time,
        "total_runs": sum(r["runs"] for r in results),
        "crashes": sum(r["crashes"] for r in results),
        "targets": results,
    }
    name = "summary.json" if args.mode == "fuzz" else "smoke-summary.json"
    with open(os.path.join(args.work, name), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(f"{args.mode}: {len(results) - len(failed)} passed, {len(failed)} failed "
          f"({summary['total_runs']} runs; {os.path.join(args.work, name)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
