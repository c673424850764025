"""Benchmarks: `make bench` (python -m bench). Each prints figures and ratios
to its goal; none passes or fails. Speed goals live here, never in unit tests."""
