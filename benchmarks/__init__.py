"""gpusim's benchmarks: scripts run as modules from the repository root
(`python -m benchmarks.KIND.NAME`), in folders by kind; benchmarks/README.md lists them."""
