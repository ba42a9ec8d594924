"""``python -m lowp.torch.trainer``: the training command (see lowp.torch.trainer.cli)."""

import sys

from .cli import main

if __name__ == "__main__":  # not when imported (e.g. by a walk over the package)
    sys.exit(main())
