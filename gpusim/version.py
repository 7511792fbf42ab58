"""gpusim's version: what run directories record of their writer (training.records.migrations)."""
__version__ = "0.2.0"
