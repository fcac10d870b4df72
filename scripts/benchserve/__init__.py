"""Pieces of scripts/bench_server.py (a load generator for OpenAI-compatible servers), shared with the other
bench scripts: servers (launching kvzap serve / llama-server, /health, RSS), prompts (deterministic texts
fitted to a token length), client (the streamed workload and the /metrics sampler), report (percentiles,
summary, table)."""
