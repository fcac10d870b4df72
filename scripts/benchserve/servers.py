"""Launching kvzap serve / llama-server on loopback, waiting for /health, their peak RSS, and locating the
model (`kvzap pull`) and llama.cpp's binaries (scripts/build_llamacpp.sh)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def log(msg: str) -> None:
    """stderr, prefixed with the running script's name (bench_server:, bench_batched:)."""
    print(f"{Path(sys.argv[0]).stem}: {msg}", file=sys.stderr, flush=True)


def check_loopback(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.hostname is None:
        sys.exit(f"error: not an http URL: {url}")
    if parts.hostname.lower() not in LOOPBACK:
        sys.exit(f"error: refusing host {parts.hostname!r}: only 127.0.0.1, localhost and ::1 are allowed")
    return url.rstrip("/")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_line_of(cmd: list[str], what: str, timeout: float, capture_stderr: bool = True) -> Path:
    """The last non-empty stdout line of `cmd` as a path; exits with `what` failed otherwise."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE if capture_stderr else None,
                          text=True, timeout=timeout)
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or "").strip()[-500:]
        sys.exit(f"error: {what} failed (rc {proc.returncode})" + (f": {tail}" if tail else ""))
    return Path(lines[-1])


def default_model(kvzap: Path) -> Path:
    """The output of `kvzap pull` (its last line): the default model, downloaded once."""
    if not (kvzap.is_file() and os.access(kvzap, os.X_OK)):
        sys.exit(f"error: no -m given and {kvzap} is not an executable to run `pull` with")
    return last_line_of([str(kvzap), "pull"], f"`{kvzap} pull`", timeout=900)


def llama_bin_dir(explicit: str | None) -> Path:
    """Folder holding llama.cpp's tools: --llama-bin, else scripts/build_llamacpp.sh (cached after one build)."""
    if explicit:
        return Path(explicit)
    log("locating llama.cpp tools with scripts/build_llamacpp.sh (builds them the first time)")
    return last_line_of(["bash", str(REPO / "scripts" / "build_llamacpp.sh")], "scripts/build_llamacpp.sh",
                        timeout=7200, capture_stderr=False)


def proc_status(pid: int) -> dict:
    """VmHWM (peak) / VmRSS of a process in MB from /proc/PID/status (None when unreadable)."""
    out = {"vm_hwm_mb": None, "vm_rss_mb": None}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out["vm_hwm_mb" if key == "VmHWM" else "vm_rss_mb"] = int(rest.split()[0]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return out


class Server:
    """One server process in its own session, its output in log_path; start() returns once /health is 200."""

    def __init__(self, kind: str, cmd: list[str], port: int, log_path: Path):
        self.kind, self.cmd, self.port, self.log_path = kind, cmd, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.t_ready = None

    def start(self, startup_timeout: float) -> None:
        import httpx  # here: the scripts that only locate the model and llama.cpp (bench_batched.py) need no httpx

        log(f"starting {self.kind}: {shlex.join(self.cmd)}")
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        t0 = time.monotonic()
        last = ""
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while time.monotonic() < t0 + startup_timeout:  # bounded by --startup-timeout
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.kind} exited with rc {self.proc.returncode} before /health was ok; "
                                       f"log {self.log_path}:\n{self.log_tail()}")
                try:
                    r = client.get(self.url + "/health")
                    if r.status_code == 200:
                        self.t_ready = time.monotonic() - t0
                        log(f"{self.kind} ready on port {self.port} after {self.t_ready:.1f} s (pid {self.proc.pid})")
                        return
                    last = f"HTTP {r.status_code}"
                except httpx.HTTPError as e:
                    last = type(e).__name__
                time.sleep(0.25)
        raise RuntimeError(f"{self.kind}: /health not ok after {startup_timeout:.0f} s ({last}); log {self.log_path}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def memory(self) -> dict:
        return proc_status(self.proc.pid) if self.alive() else {"vm_hwm_mb": None, "vm_rss_mb": None}

    def stop(self) -> None:
        if not self.alive():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)


def server_command(kind: str, args, model: Path, port: int) -> list[str]:
    """llama-server with -np N -c N*CTX_SLOT -cb --metrics, or kvzap serve --parallel N (see bench_server.py)."""
    n = args.parallel
    ctx_slot = args.ctx_per_slot or (args.prompt_tokens + args.max_tokens + 64)
    if kind == "llama":
        cmd = [str(args.llama_bin_dir / "llama-server"), "-m", str(model), "-t", str(args.threads),
               "--host", "127.0.0.1", "--port", str(port), "-np", str(n), "-c", str(n * ctx_slot), "-cb",
               "--metrics", "--no-webui"]
        if args.llama_cache_ram is not None:
            cmd += ["--cache-ram", str(args.llama_cache_ram)]
        return cmd + args.llama_arg
    cmd = [str(args.kvzap), "serve", "-m", str(model), "-t", str(args.threads), "--host", "127.0.0.1",
           "--port", str(port), "--parallel", str(n)]
    if args.kv_budget:
        cmd += ["--kv-budget", args.kv_budget]
    if args.press:
        cmd += ["--press", args.press] + (["--decode-press"] if args.decode_press else [])
    return cmd + args.kvzap_arg
