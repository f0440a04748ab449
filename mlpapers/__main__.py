import sys

from mlpapers.cli import main

sys.exit(main())
