"""`python -m localinfer` is the `localinfer` command."""

import sys

from localinfer.cli import main

sys.exit(main())
