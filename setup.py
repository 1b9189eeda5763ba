"""Puts the top-level ``templates/`` and ``static/`` into the wheel, inside ``recovery``.

The repository keeps them at the top, where this site's settings find them
(``TEMPLATES["DIRS"]``, ``STATICFILES_DIRS``). A site that installs the wheel finds
them the way it finds any reusable app's: ``recovery/templates/`` through
``APP_DIRS`` and ``recovery/static/`` through the staticfiles app-directories
finder. Everything else is declared in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
TREES = ("templates", "static")  # copied to recovery/<tree>/ in the built package


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install serves them from the checkout (the site's DIRS)
        for tree in TREES:
            shutil.copytree(
                HERE / tree,
                Path(self.build_lib) / "recovery" / tree,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns(".*", "__pycache__"),
            )


setup(cmdclass={"build_py": BuildPy})
