"""The hostile-user sweep's harness, references and sweeps (``benchmarks/bench_hostile.py`` runs them)."""
