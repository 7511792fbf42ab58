"""simple_world_comm's oracle is mpe2's own simple_world_comm_v3, stepped from gpusim's
states."""
from .._mpe.mpe2_reference import Mpe2Reference
from .env import SimpleWorldComm


def check_env_reference(config):
    """mpe2 in `gpusim.check.check_env`'s reference protocol."""
    return Mpe2Reference(SimpleWorldComm, config)
