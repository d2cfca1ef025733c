"""``python -m rlt_mono`` and the ``rlt-mono`` command (``launch_mono.sh`` runs it): ``rlt_mono.cli``'s main, with
the libraries' progress bars switched off before any of them loads when stderr is no terminal (a log file, a pipe).
tqdm reads its switches once, as it loads, and ``rlt_mono.cli``'s imports load it, so ``python -m rlt_mono.cli``
switches them off only for the processes it starts: a GGUF model converted in its own process draws its bar."""

import sys

from rlt_mono import runtime

runtime.quiet_progress_bars()

from rlt_mono.cli import main  # noqa: E402  (after the switches: rlt_mono.cli's imports load tqdm)

if __name__ == "__main__":
    sys.exit(main())
