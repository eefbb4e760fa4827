"""`python -m stallhound`: the same command as `stallhound`."""

import sys

from stallhound.cli.main import main

sys.exit(main())
