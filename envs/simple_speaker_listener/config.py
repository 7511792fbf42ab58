"""Configuration of simple_speaker_listener (README.md in this folder gives the rules):
mpe2's arguments (mpe2 fixes the counts: a speaker, a listener, three landmarks)."""
from __future__ import annotations

from dataclasses import dataclass

from .._mpe.config import MAX_CYCLES, MpeConfig


@dataclass(frozen=True)
class SimpleSpeakerListenerConfig(MpeConfig):
    max_cycles: int = MAX_CYCLES            # steps until the episode is truncated
    continuous_actions: bool = False        # Box(0, 1) actions instead of one Discrete
