#!/usr/bin/env bash
# Sums the fuzz ledger (fuzz/ledger.tsv: one row per harness per run, appended by scripts/fuzz.sh when
# KVZAP_FUZZ_LEDGER is set) per harness: runs, CPU seconds measured, CPU seconds at most (counting the
# early runs whose CPU time was not measured at their wall-clock bound), executions, and how far the
# measured CPU time is from the 1 CPU-hour per harness of docs/RELIABILITY.md.
#
#   scripts/fuzz_totals.sh [LEDGER]
set -euo pipefail
ledger="${1:-$(dirname "$0")/../fuzz/ledger.tsv}"
[ -f "$ledger" ] || { echo "no fuzz ledger at $ledger" >&2; exit 2; }
awk -F'\t' '
  NR == 1 {
    for (i = 1; i <= NF; i++) col[$i] = i
    need = "harness cpu_seconds cpu_seconds_at_most executions result"
    n = split(need, names, " ")
    for (i = 1; i <= n; i++) if (!(names[i] in col)) { print "ledger lacks column " names[i] > "/dev/stderr"; bad = 1; exit 2 }
    next
  }
  {
    h = $col["harness"]
    if (!(h in runs)) order[++nh] = h
    runs[h]++; measured[h] += $col["cpu_seconds"]; most[h] += $col["cpu_seconds_at_most"]; execs[h] += $col["executions"]
    if ($col["result"] !~ /^clean/) findings[h]++
  }
  END {
    if (bad) exit 2
    printf "%-14s %5s %13s %12s %14s %10s %9s\n", "harness", "runs", "cpu_measured", "cpu_at_most", "executions", "to_1_hour", "findings"
    for (i = 1; i <= nh; i++) {
      h = order[i]; left = 3600 - measured[h]; if (left < 0) left = 0
      printf "%-14s %5d %11.1f m %10.1f m %14d %8.1f m %9d\n", h, runs[h], measured[h] / 60, most[h] / 60, execs[h], left / 60, findings[h]
    }
  }' "$ledger"
