"""``python -m unimatmul``: the ``unimatmul`` command (also under ``torchrun``)."""

import sys

from unimatmul.cli import main

sys.exit(main())
