"""The benchmarks a maintainer reruns (not installed): run each script from the repository root, or import
it as ``benchmarks.<...>`` with the root on ``sys.path``."""
