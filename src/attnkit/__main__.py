"""``python -m attnkit``: the ``attnkit`` command."""

import sys

from attnkit.cli import main

sys.exit(main())
