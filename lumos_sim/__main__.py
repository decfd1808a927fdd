import sys

from lumos_sim.cli import main

sys.exit(main())
