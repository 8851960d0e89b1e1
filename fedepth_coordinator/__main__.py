"""``python -m fedepth_coordinator``: the same as the ``fedepth-coordinator`` command."""

import sys

from fedepth_coordinator.cli import main

sys.exit(main())
