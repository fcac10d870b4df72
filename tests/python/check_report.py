"""The tally the peer checks (check_hf.py, check_kvpress_parity.py) print: "ok" / "FAIL" / "SKIPPED"
lines, then "N passed, M failed, K skipped".

Missing peers (torch, transformers, tokenizers, kvpress) are a SKIPPED line, except under
KVZAP_REQUIRE_PEERS=1 (scripts/test.sh sets it when it made the peers' venv for CI), where they are a
failure: a green run that compared nothing must not pass for one that did.
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
results = {"passed": 0, "failed": 0, "skipped": 0}


def report(ok, line):
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + line, flush=True)


def skip(line):
    results["skipped"] += 1
    print("SKIPPED: " + line, flush=True)


def peers_missing(line):
    """The check cannot run without its Python peers: SKIPPED, or FAIL under KVZAP_REQUIRE_PEERS=1."""
    if os.environ.get("KVZAP_REQUIRE_PEERS") == "1":
        report(False, line + " (KVZAP_REQUIRE_PEERS=1)")
    else:
        skip(line)


def summary():
    print("%d passed, %d failed, %d skipped" % (results["passed"], results["failed"], results["skipped"]), flush=True)
    return 1 if results["failed"] else 0


def kvzap_bin():
    return os.environ.get("KVZAP_BIN", os.path.join(ROOT, "build", "kvzap"))
