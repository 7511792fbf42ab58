"""simple_speaker_listener: mpe2's simple_speaker_listener_v4, a speaker guides a listener."""
from .config import SimpleSpeakerListenerConfig
from .env import SimpleSpeakerListener

ENV = SimpleSpeakerListener

__all__ = ["ENV", "SimpleSpeakerListener", "SimpleSpeakerListenerConfig"]
