"""Build hook: ship ``kcache.pth`` at the root of site-packages, for wheels and editable installs.

The line it holds costs microseconds when ``KCACHE`` is unset (see kcache/_hook.pth).
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "kcache", "_hook.pth")
PTH = "kcache.pth"


class build_py_with_pth(build_py):
    """Regular wheels: the hook lands next to the package in site-packages."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(SRC, os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class editable_wheel_with_pth(editable_wheel):
    """Editable installs: setuptools builds the wheel from a folder it writes as-is; add the hook."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # type: ignore[override]
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copyfile(SRC, os.path.join(str(unpacked_wheel), PTH))
        return result


setup(cmdclass={"build_py": build_py_with_pth, "editable_wheel": editable_wheel_with_pth})
