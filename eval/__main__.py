"""`python -m eval humaneval|repo ...`, `python -m eval bench ...`"""

import sys

from eval.cli import main

sys.exit(main())
