"""Benchmarks against a running OpenAI-compatible server (the seed's decode and prefill benches)."""
