"""`lumos-sim check`: run accuracy-regression suites; exit 1 when any case exceeds its tolerance."""
from __future__ import annotations

import sys

import orjson

from lumos_sim.check import collect_suites, load_suite, print_results, results_json, run_case
from lumos_sim.progress import progress_bar


def register(sub) -> None:
    p = sub.add_parser("check", help="run accuracy-regression suites (TOML); exit 1 on any regression",
                       description="Replay every case of the suites and compare predicted with measured step "
                                   "times. SUITE is a TOML file or a folder of them (see lumos_sim/check.py).")
    p.add_argument("suites", nargs="+", metavar="SUITE", help="suite TOML file(s) or folder(s) of them")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("-v", "--verbose", action="store_true", help="list every step")
    p.set_defaults(func=main)


def main(args) -> int:
    cases = []
    for path in collect_suites(args.suites):
        name, specs = load_suite(path)
        cases.extend((name, c) for c in specs)
    results = []
    with progress_bar("checking") as cb:
        for k, (suite, case) in enumerate(cases):
            results.append(run_case(suite, case))
            cb(k + 1, len(cases))
    doc = results_json(results)
    if args.json:
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
    else:
        print_results(results, verbose=args.verbose)
        print(f"{doc['passed']} passed, {doc['failed']} failed" + (f" ({doc['in_sample']} in-sample, not counted as "
              f"accuracy: {doc['accuracy_passed']} accuracy cases passed)" if doc["in_sample"] else ""))
    return 0 if doc["failed"] == 0 else 1
