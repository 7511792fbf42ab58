"""Release checks: the figures the docs state, the GPU proof, results across versions."""
