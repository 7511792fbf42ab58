"""The particle base of the MPE scenarios (not an env itself: `gpusim.envs` lists only
folders whose name does not start with an underscore).

mpe2's `_mpe_utils/core.py` world, written once as portable phases that every
scenario folder (`simple`, `simple_spread`, ...) composes: `physics` (actions to
forces, contact forces, damping, integration, speed limits, spawning, the clock),
`observe` (helpers that write observation entries), `world` (the `ParticleEnv`
base class: agents by role, landmarks, spaces, names, arrays), `mpe2_reference`
(steps mpe2 itself from a gpusim state: the tests' oracle) and `render`.
"""
