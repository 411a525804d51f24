"""``python -m m2mwire``: the console command."""

import sys

from m2mwire.cli import main

sys.exit(main())
