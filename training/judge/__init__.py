"""Judging trained players after training, the body of `python -m gpusim.league` (league_cli): players, cross-play (crossplay), ratings, transitivity, best responses (best_response), mixtures."""
