"""``python -m rankscope``: the same command as ``rankscope``."""
import sys

from rankscope.cli import main

sys.exit(main())
