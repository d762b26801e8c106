import sys

from opacus_lastiterate.cli import main

sys.exit(main())
