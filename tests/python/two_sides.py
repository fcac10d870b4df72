"""What the two-environment parity checks (check_dms_decoding.py, check_decoding_press.py) share: kvpress runs
in the peers' venv (torch, transformers, kvpress), the kvzap half in a second python that has the kvzap package
(KVZAP_PY), and the two exchange JSON files.

run(script, name, kvpress_side, kvzap_side) is a check's whole entry point: with --kvzap-side it is the kvzap
half (reads the reference, writes its own); otherwise it runs kvpress_side(tmp), then the script again under
KVZAP_PY, and returns (ref, got). Without the peers or KVZAP_PY it prints SKIPPED and returns None, or fails
under KVZAP_REQUIRE_PEERS=1 (scripts/test.sh sets it in CI), so a check that cannot run never passes silently.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def parity_module():
    """check_kvpress_parity.py as a module (its tiny models, contexts and tie rule), without its argv parsing."""
    sys.path.insert(0, HERE)
    saved, sys.argv = sys.argv, [sys.argv[0]]
    try:
        import check_kvpress_parity
    finally:
        sys.argv = saved
    return check_kvpress_parity


def peer_imports():
    """torch, kvpress and transformers' model classes, quiet and on 2 threads."""
    import torch
    import kvpress
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(2)
    return torch, kvpress, transformers


def _unavailable(line):
    if os.environ.get("KVZAP_REQUIRE_PEERS") == "1":
        print("FAIL " + line + " (KVZAP_REQUIRE_PEERS=1)")
        sys.exit(1)
    print("SKIPPED: " + line)


def run(script, name, kvpress_side, kvzap_side):
    if "--kvzap-side" in sys.argv:
        json.dump(kvzap_side(json.load(open(sys.argv[-2]))), open(sys.argv[-1], "w"))
        sys.exit(0)
    py = os.path.abspath(os.environ["KVZAP_PY"]) if os.environ.get("KVZAP_PY") else None
    try:
        import torch  # noqa: F401
        import kvpress  # noqa: F401
    except Exception as e:  # noqa: BLE001
        _unavailable("%s needs torch and kvpress (%s)" % (name, e))
        return None
    if not py or not os.path.exists(py):
        _unavailable("%s needs KVZAP_PY, a python with the kvzap package" % name)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        ref = kvpress_side(tmp)
        a, b = os.path.join(tmp, "ref.json"), os.path.join(tmp, "kvzap.json")
        json.dump(ref, open(a, "w"))
        subprocess.run([py, os.path.abspath(script), "--kvzap-side", a, b], check=True, cwd=tmp)
        return ref, json.load(open(b))
