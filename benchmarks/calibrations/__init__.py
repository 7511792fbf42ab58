"""Calibrations: the measurements behind constants and design choices in the code."""
