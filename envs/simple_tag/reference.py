"""simple_tag's oracle is mpe2's own simple_tag_v3, stepped from gpusim's states."""
from .._mpe.mpe2_reference import Mpe2Reference
from .env import SimpleTag


def check_env_reference(config):
    """mpe2 in `gpusim.check.check_env`'s reference protocol."""
    return Mpe2Reference(SimpleTag, config)
