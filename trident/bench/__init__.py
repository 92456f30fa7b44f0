"""Benchmarks run by ``trident bench NAME``: each prints a table and writes JSON and PNG files."""
