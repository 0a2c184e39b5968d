"""The course's benchmarks, run from the root of a clone: ``python -m benchmarks NAME --help``
(:mod:`benchmarks.__main__` lists them), their plots for the site and notebooks
(:mod:`benchmarks.plots`) and their results (``benchmarks/results/*.json``)."""
