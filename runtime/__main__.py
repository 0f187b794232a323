import sys

from sluice.runtime.cli import main

sys.exit(main())
