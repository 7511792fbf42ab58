"""Learning experiments: what training reaches, and how fast, under one change at a time."""
