import sys

from pyworker.cli.main import main

sys.exit(main())
