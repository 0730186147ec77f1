"""Build this environment's C++ kernels now, rather than on first use.

    python -m picasso.kernels.build

builds (or, when already built, confirms) the C++ CPU kernels of cpu.py in the folder where
the cpu backend looks for them ($PICASSO_KERNEL_CACHE, default ~/.cache/picasso/kernels, in
the folder of this environment, torch, CPU, flags and sources: cpu.build_directory), and
prints that folder. Exit status: 0 built or already built; 2 (CANNOT_BUILD) this environment
cannot build them, with the reason: torch, a C++ compiler (c++, or $CXX) or ninja missing;
1 the build itself failed. Once built, PICASSO_KERNELS_PREBUILT=1 loads them without ever
compiling (see cpu.py).

setup.py runs this file at install (see its BuildPyWithKernels), from the source tree being
installed and before picasso is importable: run as a script, it loads that tree's kernels/
as picasso.kernels. The folder is then the one the installed package computes, because the
same cpu.py computes it, from the same interpreter (sys.prefix), torch and C++ sources.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if not __package__ and sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    # Run as a script, Python put kernels/ first on the path, where cpu.py, reference.py and
    # the others would pass for top-level modules.
    del sys.path[0]

import importlib.util  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import sysconfig  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

CANNOT_BUILD = 2
PREBUILT = "PICASSO_KERNELS_PREBUILT"


def main() -> int:
    os.environ.pop(PREBUILT, None)  # this is the build: it may compile
    problem = _cannot_build()
    if problem:
        print(f"picasso: cannot build the C++ kernels in this environment ({sys.executable}): {problem}",
              file=sys.stderr)
        return CANNOT_BUILD
    started = time.time()
    cpu = _cpu_module()
    directory = cpu.build_directory()
    libraries = sorted(directory.glob("*.so"))
    fresh = any(library.stat().st_mtime >= started for library in libraries)
    print(f"picasso C++ kernels {'built' if fresh else 'already built'} in {directory}: "
          f"{', '.join(library.name for library in libraries)}")
    return 0


def _cannot_build() -> str | None:
    """Why this environment cannot build the kernels, or None."""
    try:
        import torch  # noqa: F401
    except ImportError as err:
        return f"torch is not importable ({err}); install it first: pip install torch==2.13.0"
    # torch runs `ninja` from PATH: put this environment's own scripts folder there, where
    # `pip install ninja` puts it, for an interpreter run without its environment activated.
    scripts = sysconfig.get_path("scripts")
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, [scripts, os.environ.get("PATH")]))
    compiler = os.environ.get("CXX", "c++")  # what torch.utils.cpp_extension compiles with
    if not shutil.which(shlex.split(compiler)[0] if compiler.strip() else "c++"):
        return (f"no C++ compiler: {compiler!r} (from $CXX, default c++) is not on PATH; "
                "install one (g++, e.g. apt-get install g++) or set CXX")
    if not shutil.which("ninja"):
        return "ninja is not on PATH; install it: pip install ninja"
    return None


def _cpu_module() -> types.ModuleType:
    """picasso.kernels.cpu, imported (which builds it): the installed package's, or, run as
    a script, this source tree's."""
    if not __package__:
        _load_source_tree_as_package()
    import picasso.kernels.cpu

    return picasso.kernels.cpu


def _load_source_tree_as_package() -> None:
    """Make this folder picasso.kernels, whatever else is installed: at install, an older
    picasso may be installed, whose sources (another build folder) must not be built."""
    picasso = types.ModuleType("picasso")
    picasso.__path__ = []  # a package holding only the kernels
    sys.modules["picasso"] = picasso
    spec = importlib.util.spec_from_file_location("picasso.kernels", HERE / "__init__.py",
                                                  submodule_search_locations=[str(HERE)])
    kernels = importlib.util.module_from_spec(spec)
    sys.modules["picasso.kernels"] = picasso.kernels = kernels
    spec.loader.exec_module(kernels)


if __name__ == "__main__":
    sys.exit(main())
