"""Benchmarks for mega's performance targets: standalone scripts, not tests.

    .venv/bin/python -m bench.run_all                  # every benchmark; rewrites bench/RESULTS.md
    .venv/bin/python -m bench.bench_worker_pool --help # one benchmark, its own options

Every module named `bench_*.py` with a `run()` function is a benchmark: `run()` (called with
its defaults) starts whatever servers it needs, prints a table, stops them, and returns a
`bench.report.Result` dict, whose rows `run_all` writes to RESULTS.md.
"""
