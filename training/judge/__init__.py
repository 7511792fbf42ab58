"""Judging trained players after training, the body of `python -m gpusim.league` (cli): cross-play, ratings, transitivity, best responses, mixtures."""
