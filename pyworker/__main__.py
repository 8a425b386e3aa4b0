import sys

from pyworker.cli import main

sys.exit(main())
