"""Starts the real `kvzap serve` binary on a free loopback port for the server tests.

The binary is $KVZAP_BIN, else build/kvzap; the model is the default one (`kvzap pull`), or $KVZAP_MODEL.
"""
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
THREADS = os.environ.get("KVZAP_TEST_THREADS", "2")


def kvzap_bin():
    return os.environ.get("KVZAP_BIN") or str(ROOT / "build" / "kvzap")


def model_args():
    m = os.environ.get("KVZAP_MODEL")
    return ["-m", m] if m else []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args, api_key=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        cmd = [kvzap_bin(), "serve", *model_args(), "-t", THREADS, "--port", str(self.port), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvzap_serve_{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvzap serve exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("kvzap serve did not become healthy:\n" + self.log_text())

    def headers(self):
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kw):
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=kw.pop("timeout", 120), **kw)

    def openai(self):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0, timeout=120)

    def metrics(self):
        text = httpx.get(self.url + "/metrics", headers=self.headers(), timeout=10).text
        out = {}
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
            if m:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out

    def wait_metrics(self, pred, timeout=20):
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if pred(m) or time.time() > deadline:
                return m
            time.sleep(0.1)

    def log_text(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def generate_cli(prompt, n, chat=False):
    """What `kvzap generate --temp 0` answers for the same prompt (the greedy reference)."""
    import json
    cmd = [kvzap_bin(), "generate", *model_args(), "-t", THREADS, "--temp", "0", "-n", str(n), "-p", prompt, "--json"]
    if chat:
        cmd.append("--chat")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout)
