"""Benchmarks behind ``agent-gravity bench ...``: each prints a table, writes JSON and a PNG plot."""
