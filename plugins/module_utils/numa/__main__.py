"""``python3 -m numa`` (installed helper) runs the numa-pin CLI."""
import sys

from .cli import main

sys.exit(main())
