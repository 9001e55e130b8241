import sys

from kernellab.cli import main

if __name__ == "__main__":  # (not when a check worker process imports it)
    sys.exit(main())
