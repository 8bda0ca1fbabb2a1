"""Parts of tests/bench/bench_scale.py: the fleet of fake nodes (fleet.py), the pods of each path (workload.py),
what is measured (measure.py) and the per-card checks at the end (audit.py)."""
