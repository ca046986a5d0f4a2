"""Benchmarks and baselines (imported only by benchmark code, never by ``gaescan``)."""
