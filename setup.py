"""The compiled record core (mqstore/formats/_core.pyx): everything else is in pyproject.toml.

pip (and `make setup`) run this through pyproject's build backend, with the Cython it pins;
`python setup.py build_ext --inplace` builds the module in the source tree. A machine without
a C compiler, Python's headers or zlib's gets one error naming what to install, before any
compiler output.
"""

from __future__ import annotations

import shutil
import sysconfig
import tempfile
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, PlatformError

INSTALL_HINT = (
    "mqstore's record core (mqstore/formats/_core.pyx) is compiled C and needs a C compiler, "
    "Python's headers and zlib's. On Debian or Ubuntu: apt-get install gcc python3-dev "
    "zlib1g-dev (Fedora: dnf install gcc python3-devel zlib-devel; macOS: xcode-select --install)"
)


class BuildExt(build_ext):
    """build_ext that first checks the tool chain and says what is missing."""

    def build_extensions(self) -> None:
        compiler = getattr(self.compiler, "compiler_so", None)
        if compiler and shutil.which(compiler[0]) is None:
            raise PlatformError(f"no C compiler ({compiler[0]}) found. {INSTALL_HINT}")
        with tempfile.TemporaryDirectory() as tmp:
            probe = Path(tmp, "probe.c")
            probe.write_text("#include <Python.h>\n#include <zlib.h>\nint main(void){return 0;}\n")
            include = sysconfig.get_paths()["include"]
            try:
                self.compiler.compile([str(probe)], output_dir=tmp, include_dirs=[include])
            except CompileError as e:
                raise PlatformError(
                    f"the C tool chain cannot build it ({e}). {INSTALL_HINT}"
                ) from e
        super().build_extensions()


setup(
    ext_modules=cythonize(
        [
            Extension(
                "mqstore.formats._core",
                ["mqstore/formats/_core.pyx"],
                depends=[
                    "mqstore/formats/_core_support.h",
                    *sorted(str(f) for f in Path("mqstore/formats").glob("_core_*.pxi")),
                ],
                libraries=["z"],
                extra_compile_args=["-O3"],
            )
        ],
        compiler_directives={"language_level": "3"},
    ),
    cmdclass={"build_ext": BuildExt},
)
