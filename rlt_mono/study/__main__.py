"""``python -m rlt_mono.study aggregate ...``: the study over seeds (``rlt_mono.study.aggregate``)."""

import sys

from rlt_mono.study.aggregate import main

sys.exit(main())
