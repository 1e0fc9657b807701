"""`python -m tflfuse.cli ...`: the same command as `tflfuse ...`."""

import sys

from tflfuse.cli import main

sys.exit(main())
