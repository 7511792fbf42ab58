"""Self-play on the device while training: opponent pools (pools), how a policy acts in a league (acting), who won its games (outcome)."""
