"""Scale curves: how each cost grows with the work, for every bus driver where it applies.

    make bench-scale                          # every curve; ~20 minutes on 2 cores
    .venv/bin/python -m bench.scale dlq       # one curve (its module's name after curve_)

A curve is a module `bench/scale/curve_<name>.py` with `run(servers)`, `servers` the URLs of
the embedded servers the run started once for all curves (nats, redis, postgres). It returns a
bench.report Result with a `charts` list: each chart's series of (x, y) points, drawn to
`bench/scale/<chart>.svg` by bench/svg.py, and the table rows that hold each point to its
target. The runner writes the "Scale curves" part of bench/RESULTS.md (which `make bench` keeps
as it is), with the machine's cores and memory.
"""
