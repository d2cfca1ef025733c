"""Packaging hook: the wheel carries the repository's ``cfgs/`` inside the package, as ``rlt_mono/cfgs``.

The configs live at the repository's top (``cfgs/``, beside ``rlt_mono/``) so that a checkout reads them in place;
an installed copy has no checkout, so ``build_py`` copies them in and ``rlt_mono.config.CONFIG_DIR`` finds them there.
Everything else about the package is in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONFIGS = Path(__file__).resolve().parent / "cfgs"


class BuildWithConfigs(build_py):
    """``build_py`` that also copies every YAML file of ``cfgs/`` to ``<build>/rlt_mono/cfgs``."""

    def run(self) -> None:
        if not self.editable_mode:
            # A module moved or deleted since the last build in this checkout (a build/ folder left over) must not
            # ship beside the current ones, nor a config deleted since: the wheel holds this build alone.
            shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()
        if self.editable_mode:  # an editable install reads the checkout's cfgs/ in place
            return
        target = Path(self.build_lib) / "rlt_mono" / "cfgs"
        sources = sorted(CONFIGS.rglob("*.yaml"))
        if not sources:  # a package without its configs runs nothing: stop the build, not the first run
            raise FileNotFoundError(f"no configs in {CONFIGS}: the wheel would carry none (a source distribution "
                                    "built without MANIFEST.in's `graft cfgs`?)")
        for source in sources:
            destination = target / source.relative_to(CONFIGS)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)


setup(cmdclass={"build_py": BuildWithConfigs})
