"""How fast the learner runs, wrapped around plain functions: one Adam and its minibatch steps (descent), captured graphs (graphs), compile and precision (acceleration)."""
