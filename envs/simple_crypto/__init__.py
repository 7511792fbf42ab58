"""simple_crypto: mpe2's simple_crypto_v3, Alice tells Bob a secret that Eve overhears."""
from .config import SimpleCryptoConfig
from .env import SimpleCrypto

ENV = SimpleCrypto

__all__ = ["ENV", "SimpleCrypto", "SimpleCryptoConfig"]
