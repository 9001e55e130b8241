import sys

from kernellab.cli import main

sys.exit(main())
