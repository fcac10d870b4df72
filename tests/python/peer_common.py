"""Shared pieces of the llama.cpp peer checks.

Nothing here imports llama_cpp: check_golden.py (what CI runs) must work without it. The comparison
functions take plain dicts in the golden-file layout, so the same code compares kvzap against the
golden files or against a live llama.cpp run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
ENGLISH_TEXT = GOLDEN_DIR / "texts" / "english.txt"
GOLDEN_LOGPROBS = GOLDEN_DIR / "peer_logprobs.json"
GOLDEN_GREEDY = GOLDEN_DIR / "peer_greedy.json"

MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Windowing of the teacher-forced scoring; must match `kvzap perplexity --ctx`.
SCORING_CTX = 2048
GREEDY_MAX_TOKENS = 64
EOS_IDS = (0, 2)  # <|endoftext|>, <|im_end|>

# Pass thresholds. The engine-core issue asked for top-1 >= 99 % and >= 8/10 identical greedy runs.
# This Q4_1 135M model is chaotic under 1-ulp perturbations: llama.cpp against itself with flash
# attention on, or with an F32 K/V cache, reaches only 95.5-95.9 % top-1 and 1-4/10 identical greedy runs
# (measured, stored as reference_noise in the golden file). Matching that bar would need ggml's float
# summation order and exp approximations bit for bit. So the pass thresholds are llama.cpp's own noise
# floor, and the issue's targets are reported beside them (docs/FIDELITY.md).
ISSUE_TOP1_AGREEMENT = 0.99
ISSUE_GREEDY_IDENTICAL = 8
MIN_TOP1_AGREEMENT = 0.94
MAX_ABS_MEAN_LOGPROB_DIFF = 0.01  # nats
MAX_PPL_REL_DIFF = 0.01
MIN_GREEDY_IDENTICAL = 1
# Every greedy divergence must happen where llama.cpp itself is nearly undecided.
MAX_DIVERGENCE_MARGIN = 1.0  # nats between llama.cpp's top-1 and top-2
# A reported perplexity must be exp(-mean logprob) of the reported tokens (both are kvzap's own).
MAX_SUMMARY_REL_DIFF = 1e-4
NEAR_TIE_NATS = 0.1

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

GREEDY_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers greater than 20.",
    "Translate 'Good morning, how are you?' into Spanish.",
    "Write a Python function that reverses a string.",
    "What is 17 multiplied by 23?",
    "Begin a short story about a lighthouse keeper who finds a message in a bottle.",
    "Qu'est-ce que la gravité ? Réponds en une phrase.",
    "Give me three tips for staying focused while studying:\n1.",
]


def render_chat(prompt: str) -> str:
    """SmolLM2 ChatML rendering of one user turn with the default system prompt."""
    return (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\n{prompt}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def window_starts(n_tokens: int, ctx: int) -> list[int]:
    """Start index of each consecutive non-overlapping window (the last may be shorter)."""
    return list(range(0, n_tokens, ctx))


def scored_positions(n_tokens: int, ctx: int) -> list[int]:
    """Every token of a window except its first is predicted from the tokens before it."""
    out = []
    for start in window_starts(n_tokens, ctx):
        out.extend(range(start + 1, min(start + ctx, n_tokens)))
    return out


def find_model() -> Path:
    if os.environ.get("KVZAP_MODEL"):
        return Path(os.environ["KVZAP_MODEL"])
    if os.environ.get("KVZAP_MODELS"):
        return Path(os.environ["KVZAP_MODELS"]) / MODEL_NAME
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kvzap" / "models" / MODEL_NAME


def find_kvzap_bin() -> Path:
    if os.environ.get("KVZAP_BIN"):
        return Path(os.environ["KVZAP_BIN"])
    return REPO_ROOT / "build" / "kvzap"


def require_file(path: Path, what: str) -> None:
    if not path.is_file():
        print(f"error: {what} not found: {path}", file=sys.stderr)
        sys.exit(2)  # 2 = could not run, 1 = a check failed


def sha256_file(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_json(path: Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


# ----------------------------------------------------------------------------------------------
# Running kvzap


class KvzapError(RuntimeError):
    pass


class Kvzap:
    """Thin wrapper over the kvzap CLI contract."""

    def __init__(self, binary: Path, model: Path, threads: int):
        self.binary = Path(binary)
        self.model = Path(model)
        self.threads = threads

    def _run(self, args: list[str], timeout: float = 600) -> str:
        cmd = [str(self.binary), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise KvzapError(
                f"`{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr.strip()[-2000:]}"
            )
        return proc.stdout

    def tokenize_file(self, text_file: Path) -> list[int]:
        out = self._run(["tokenize", "-m", str(self.model), "--text-file", str(text_file), "--json"])
        return [int(t) for t in json.loads(out)]

    def perplexity(self, text_file: Path, ctx: int, jsonl_out: Path) -> dict:
        """Returns {"records": [...jsonl rows...], "summary_ppl": float or None, "stdout": str}."""
        out = self._run(
            ["perplexity", "-m", str(self.model), "-f", str(text_file), "--jsonl", str(jsonl_out),
             "--ctx", str(ctx), "--window", str(ctx), "-t", str(self.threads), "--json"]
        )
        records = []
        with open(jsonl_out, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    records.append(json.loads(line))
        return {"records": records, "summary_ppl": parse_reported_ppl(out), "stdout": out}

    def generate_chat(self, prompt: str, n: int) -> dict:
        out = self._run(
            ["generate", "-m", str(self.model), "-p", prompt, "--chat", "-n", str(n), "--temp", "0",
             "-t", str(self.threads), "--json"]
        )
        return parse_last_json_object(out)

    def bench(self, prefill: int, decode: int, reps: int) -> dict:
        out = self._run(
            ["bench", "-m", str(self.model), "-t", str(self.threads), "--prefill", str(prefill),
             "--decode", str(decode), "--reps", str(reps), "--json"],
            timeout=1800,
        )
        return parse_last_json_object(out)


def parse_last_json_object(stdout: str) -> dict:
    """The CLI prints one JSON object; tolerate extra human lines before it."""
    text = stdout.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise KvzapError(f"no JSON object in kvzap output: {text[-500:]!r}")


def parse_reported_ppl(stdout: str):
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
                if "perplexity" in obj:
                    return float(obj["perplexity"])
            except (json.JSONDecodeError, TypeError, ValueError):
                pass
        if line.startswith("perplexity:"):
            try:
                return float(line.split(":", 1)[1].split()[0])
            except (IndexError, ValueError):
                pass
    try:
        obj = json.loads(stdout)
        return float(obj["perplexity"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def kvzap_scoring_as_golden(records: list[dict], ctx: int) -> dict:
    """Reshape kvzap perplexity JSONL rows into the golden layout (sorted by pos)."""
    records = sorted(records, key=lambda r: int(r["pos"]))
    return {
        "ctx": ctx,
        "pos": [int(r["pos"]) for r in records],
        "token": [int(r["token"]) for r in records],
        "logprob": [float(r["logprob"]) for r in records],
        "top1": [int(r["top1"]) for r in records],
    }


# ----------------------------------------------------------------------------------------------
# Check bookkeeping


class Checks:
    def __init__(self):
        self.results: list[tuple[str, bool, str]] = []

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.results.append((name, ok, detail))
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
        return ok

    @property
    def n_failed(self) -> int:
        return sum(1 for _, ok, _ in self.results if not ok)

    def finish(self) -> int:
        n_pass = len(self.results) - self.n_failed
        print(f"{n_pass} passed, {self.n_failed} failed", flush=True)
        return 0 if self.n_failed == 0 else 1


def info(msg: str) -> None:
    print(f"       {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# Comparisons


def perplexity_of(logprobs: list[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))


def check_token_ids(checks: Checks, name: str, ref: list[int], got: list[int]) -> bool:
    if ref == got:
        return checks.add(name, True, f"{len(ref)} token ids identical")
    first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    return checks.add(
        name, False,
        f"differ: ref {len(ref)} ids, kvzap {len(got)} ids, first difference at index {first} "
        f"(ref {ref[first:first + 5]} vs kvzap {got[first:first + 5]})",
    )


def compare_scoring(checks: Checks, ref: dict, got: dict, got_summary_ppl) -> None:
    """ref: golden layout {tokens, ctx, pos, logprob, top1[, margin]}; got: kvzap_scoring_as_golden."""
    tokens = ref["tokens"]
    expected_pos = scored_positions(len(tokens), ref["ctx"])
    if expected_pos != ref["pos"]:
        raise ValueError("reference positions do not follow the windowing rule; regenerate golden")

    same_pos = got["pos"] == expected_pos
    same_tok = same_pos and got["token"] == [tokens[p] for p in expected_pos]
    checks.add(
        "scoring positions/tokens",
        same_pos and same_tok,
        f"kvzap scored {len(got['pos'])} positions (expected {len(expected_pos)}, windows of "
        f"{ref['ctx']} over {len(tokens)} tokens); token ids {'match' if same_tok else 'DIFFER'}",
    )

    # Compare on the positions both scored with the same target token.
    ref_by_pos = {p: i for i, p in enumerate(ref["pos"])}
    pairs = [
        (ref_by_pos[p], j)
        for j, p in enumerate(got["pos"])
        if p in ref_by_pos and got["token"][j] == tokens[p]
    ]
    if not pairs:
        checks.add("top-1 agreement", False, "no comparable positions")
        checks.add("mean logprob difference", False, "no comparable positions")
        checks.add("perplexity", False, "no comparable positions")
        return

    n = len(pairs)
    agree = sum(1 for i, j in pairs if ref["top1"][i] == got["top1"][j])
    diffs = [got["logprob"][j] - ref["logprob"][i] for i, j in pairs]
    mean_diff = sum(diffs) / n
    mean_abs = sum(abs(d) for d in diffs) / n
    max_abs = max(abs(d) for d in diffs)
    top1 = agree / n
    checks.add(
        "top-1 agreement", top1 >= MIN_TOP1_AGREEMENT,
        f"{100 * top1:.2f}% ({agree}/{n}; need >= {100 * MIN_TOP1_AGREEMENT:.0f}%, llama.cpp's noise floor; "
        f"issue target {100 * ISSUE_TOP1_AGREEMENT:.0f}%: {'met' if top1 >= ISSUE_TOP1_AGREEMENT else 'NOT met'})",
    )
    margins = ref.get("margin")
    if margins is not None and agree < n:
        near = sum(1 for i, j in pairs if ref["top1"][i] != got["top1"][j] and margins[i] < NEAR_TIE_NATS)
        info(f"{near}/{n - agree} top-1 disagreements are llama.cpp near-ties (top1-top2 < {NEAR_TIE_NATS} nats)")
    checks.add(
        "mean logprob difference", abs(mean_diff) <= MAX_ABS_MEAN_LOGPROB_DIFF,
        f"kvzap - llama.cpp = {mean_diff:+.5f} nats (|.| <= {MAX_ABS_MEAN_LOGPROB_DIFF}); "
        f"mean |diff| {mean_abs:.5f}, max |diff| {max_abs:.4f}",
    )
    ppl_ref = perplexity_of([ref["logprob"][i] for i, _ in pairs])
    ppl_got = perplexity_of([got["logprob"][j] for _, j in pairs])
    rel = ppl_got / ppl_ref - 1.0
    checks.add(
        "perplexity", abs(rel) <= MAX_PPL_REL_DIFF,
        f"llama.cpp {ppl_ref:.4f}, kvzap {ppl_got:.4f}, relative difference {100 * rel:+.3f}% "
        f"(|.| <= {100 * MAX_PPL_REL_DIFF:.0f}%)",
    )
    if got_summary_ppl is None:
        checks.add("kvzap perplexity summary", False, "no 'perplexity' value found on kvzap stdout")
    else:
        own = perplexity_of(got["logprob"])
        srel = got_summary_ppl / own - 1.0
        checks.add(
            "kvzap perplexity summary", abs(srel) <= MAX_SUMMARY_REL_DIFF,
            f"printed {got_summary_ppl:.4f} vs exp(-mean logprob) of its JSONL {own:.4f}",
        )


def _kvzap_step_margin(gen: dict, step: int):
    """kvzap's top1-top2 logprob margin at a step, if its generate JSON carries per-step data.

    Not part of the CLI contract; recognised shapes: "margins": [..] or
    "top_logprobs": [[{"id"|"token": .., "logprob": ..}, ..], ..] / [[[id, lp], ..], ..].
    """
    if isinstance(gen.get("margins"), list) and step < len(gen["margins"]):
        return float(gen["margins"][step])
    tops = gen.get("top_logprobs")
    if isinstance(tops, list) and step < len(tops):
        cand = tops[step]
        try:
            lps = sorted(
                (float(c["logprob"]) if isinstance(c, dict) else float(c[1]) for c in cand), reverse=True
            )
            if len(lps) >= 2:
                return lps[0] - lps[1]
        except (KeyError, TypeError, ValueError, IndexError):
            return None
    return None


def compare_greedy(checks: Checks, ref_runs: list[dict], got_runs: list[dict]) -> None:
    """ref_runs: golden greedy entries; got_runs: kvzap generate JSON objects (same order)."""
    prompt_ok = 0
    identical = 0
    lines = []
    divergence_margins = []
    for k, (ref, got) in enumerate(zip(ref_runs, got_runs)):
        same_prompt = [int(t) for t in got.get("prompt_tokens", [])] == ref["prompt_tokens"]
        prompt_ok += same_prompt
        a = ref["tokens"]
        b = [int(t) for t in got.get("tokens", [])]
        if a == b:
            identical += 1
            lines.append(f"#{k}: identical ({len(a)} tokens, llama.cpp stop: {ref['stop_reason']})")
            continue
        step = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        msg = f"#{k}: first divergence at step {step}"
        if step >= len(a) or step >= len(b):
            msg += f" (one side stopped: llama.cpp {len(a)} tokens, kvzap {len(b)})"
        divergence_margins.append(ref["margins"][step] if step < len(ref["margins"]) else None)
        if step < len(ref["margins"]):
            msg += f"; llama.cpp margin top1-top2 {ref['margins'][step]:.4f} nats"
            alt = {int(t): lp for t, lp in ref["top5"][step]}
            best_id, best_lp = int(ref["top5"][step][0][0]), ref["top5"][step][0][1]
            # kvzap's choice at this step: its token, or an end-of-sequence id when it stopped here.
            kv_choices = [b[step]] if step < len(b) else list(EOS_IDS)
            kv_lps = [alt[t] for t in kv_choices if t in alt]
            if kv_lps:
                msg += (f", llama.cpp prefers {best_id} over kvzap's "
                        f"{kv_choices[0] if len(kv_choices) == 1 else 'EOS'} by {best_lp - max(kv_lps):.4f}")
            else:
                msg += ", kvzap's choice not in llama.cpp top-5"
        kv_margin = _kvzap_step_margin(got, step)
        msg += f"; kvzap margin {kv_margin:.4f} nats" if kv_margin is not None else "; kvzap margin n/a"
        if not same_prompt:
            msg += "; PROMPT TOKENS DIFFER"
        lines.append(msg)
    n = len(ref_runs)
    checks.add("chat prompt token ids", prompt_ok == n, f"{prompt_ok}/{n} prompts tokenized identically")
    checks.add(
        "greedy generations identical", identical >= MIN_GREEDY_IDENTICAL,
        f"{identical}/{n} identical over {GREEDY_MAX_TOKENS} tokens (need >= {MIN_GREEDY_IDENTICAL}; issue target "
        f"{ISSUE_GREEDY_IDENTICAL}: {'met' if identical >= ISSUE_GREEDY_IDENTICAL else 'NOT met'})",
    )
    for line in lines:
        info(line)
    div_margins = [m for m in divergence_margins if m is not None]
    checks.add(
        "greedy divergences only at llama.cpp near-ties",
        len(div_margins) == n - identical and all(m < MAX_DIVERGENCE_MARGIN for m in div_margins),
        f"{len(div_margins)} divergences, llama.cpp's top1-top2 margin there at most "
        f"{max(div_margins) if div_margins else 0:.4f} nats (need < {MAX_DIVERGENCE_MARGIN})",
    )
    if div_margins:
        info(f"{len(div_margins)} divergences; llama.cpp top1-top2 margin there: max {max(div_margins):.4f}, "
             f"{sum(m < NEAR_TIE_NATS for m in div_margins)} below {NEAR_TIE_NATS} nats")


def run_kvzap_suite(kv: Kvzap, ref_scoring: dict, ref_greedy: list[dict], workdir: Path, checks: Checks) -> None:
    """Everything both check scripts do on the kvzap side, compared against the given reference."""
    import time

    t0 = time.time()
    try:
        ids = kv.tokenize_file(ENGLISH_TEXT)
        check_token_ids(checks, "tokenize english.txt", ref_scoring["tokens"], ids)
    except KvzapError as e:
        checks.add("tokenize english.txt", False, str(e))

    t1 = time.time()
    try:
        ppl = kv.perplexity(ENGLISH_TEXT, ref_scoring["ctx"], workdir / "kvzap_scoring.jsonl")
        got = kvzap_scoring_as_golden(ppl["records"], ref_scoring["ctx"])
        compare_scoring(checks, ref_scoring, got, ppl["summary_ppl"])
    except (KvzapError, KeyError, ValueError) as e:
        checks.add("kvzap perplexity", False, str(e))
    info(f"kvzap perplexity took {time.time() - t1:.1f} s")

    t2 = time.time()
    got_runs = []
    try:
        for ref in ref_greedy:
            got_runs.append(kv.generate_chat(ref["prompt"], GREEDY_MAX_TOKENS))
        compare_greedy(checks, ref_greedy, got_runs)
    except (KvzapError, KeyError, ValueError) as e:
        checks.add("kvzap generate", False, str(e))
    info(f"kvzap generate x{len(ref_greedy)} took {time.time() - t2:.1f} s (total {time.time() - t0:.1f} s)")
