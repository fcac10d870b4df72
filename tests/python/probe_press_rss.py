"""RSS of `kvzap serve` over N completions, each with its own kvzap-mlp threshold (issue 34's press cache).

python3 tests/python/probe_press_rss.py N [serve options...], e.g. 1000 --prefix-cache 8MiB"""
import sys
import time

import httpx

from server_harness import Server


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main():
    n = int(sys.argv[1])
    s = Server("-c", "512", *sys.argv[2:])
    try:
        def once(i):
            body = {"prompt": [1, 2, 3, 4], "max_tokens": 1,
                    "kv_compression": {"press": "kvzap-mlp", "threshold": -4 - i / 1000.0}}
            r = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text

        once(0)
        first = rss_mib(s.proc.pid)
        t = time.time()
        for i in range(1, n + 1):
            once(i)
        m = s.metrics()
        print(f"{n} distinct settings in {time.time() - t:.1f} s: RSS {first:.1f} -> {rss_mib(s.proc.pid):.1f} MiB, "
              f"prefix_cache_bytes {m.get('kvzap:prefix_cache_bytes', 0) / 1e6:.1f} MB")
    finally:
        s.stop()


if __name__ == "__main__":
    main()
