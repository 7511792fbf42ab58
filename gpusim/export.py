"""`python -m gpusim.export RUN_DIR --format onnx|torchscript --out DIR`: a run's acting
networks as files other runtimes load.

Its body is `gpusim.training.trained.network_export`.
"""
import sys

from gpusim.training.trained.network_export import main

if __name__ == "__main__":
    sys.exit(main())
