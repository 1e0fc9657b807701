"""Build hook: ship the top-level data folders inside the package (all metadata is in pyproject).

`converters/`, `delegates/` and `device_scripts/` stay at the top of the checkout, where they are
edited and reviewed; they are the source of truth. setuptools' `package-data` cannot reach files
outside the package, so `build_py` copies every file of those folders into
`<build>/tflfuse/data/<folder>/`, and the wheel (and an sdist-built wheel: MANIFEST.in grafts the
folders) holds them there. `tflfuse.resources` finds them with `importlib.resources`.

An editable install (`pip install -e .`) builds nothing: the package is imported from the
checkout, so there is no `tflfuse/data/` and `tflfuse.resources` reads the top-level folders
directly (it knows the checkout by the `pyproject.toml` beside the package). Nothing is ever
copied into the source tree, so the two cannot drift apart.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_FOLDERS = ("converters", "delegates", "device_scripts")
HERE = Path(__file__).resolve().parent


class BuildPyWithData(build_py):
    """build_py, plus a copy of DATA_FOLDERS into the built package's `data/` folder."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # served from the checkout (see the module docstring)
        for folder in DATA_FOLDERS:
            source = HERE / folder
            target = Path(self.build_lib) / "tflfuse" / "data" / folder
            if target.exists():
                shutil.rmtree(target)  # a stale build must not keep removed files
            target.mkdir(parents=True)
            for path in sorted(source.iterdir()):
                if path.is_file() and not path.name.startswith("."):
                    shutil.copy2(path, target / path.name)


setup(cmdclass={"build_py": BuildPyWithData})
