"""Benchmarks: workloads, runners and plots."""
