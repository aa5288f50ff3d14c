import sys

from trainguard.cli.main import main

sys.exit(main())
