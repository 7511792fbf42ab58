"""Self-play on the device while training: the league and its matchups (self_play), one policy's opponents (opponents), how a policy acts in a league (acting), who won its games (wins)."""
