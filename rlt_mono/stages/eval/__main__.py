"""``python -m rlt_mono.stages.eval compare|rescore`` (``rlt_mono.stages.eval.main``). A package's ``__main__``: the
registry imports ``rlt_mono.stages.eval`` with its package, which ``python -m`` would warn about for a plain module."""

import sys

from rlt_mono.stages.eval import main

sys.exit(main())
