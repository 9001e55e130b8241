"""The user-model comparison lives in the library (kernellab.models.user_models, also
`kernellab train hf --compare`); this keeps the old command working."""

import sys

from kernellab.models.user_models import main

if __name__ == "__main__":
    sys.exit(main())
