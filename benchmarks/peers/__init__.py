"""Comparisons with peers: gpusim beside other libraries on the same work."""
