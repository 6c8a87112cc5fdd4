"""``python -m unimatmul.cli``: the ``unimatmul`` command."""

import sys

from unimatmul.cli import main

sys.exit(main())
