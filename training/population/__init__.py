"""Populations: N members of one run trained side by side (members), their networks stacked on a member dim (stacked)."""
