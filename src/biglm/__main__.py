"""`python -m biglm ...` (what torchrun runs: `torchrun --nproc_per_node N -m biglm pretrain RECIPE`)."""

import sys

from .cli import main

sys.exit(main())
