"""``python -m fedepth_cli``: the ``fedepth`` command."""

from fedepth_cli.main import main

raise SystemExit(main())
