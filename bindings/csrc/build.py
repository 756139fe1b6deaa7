"""Builds the C++ PrivateUse1 layer (`bindings/csrc/*.cpp`) into
`bindings/python/deferfuse/libdeferfuse_tpu.so`, against the headers and libraries of
the torch installed in the running interpreter, with one direct compiler
call (no ninja, no setuptools: one translation unit compiles in about 15 s).

Run by `.ci/setup_torch`; skips the compile when the library is newer than
its sources and was built for the same torch. Writes the torch version the
library was built for beside it (`libdeferfuse_tpu.torch_version`), so that the
package can refuse a stale build with a clear error before loading it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

# Building must not import deferfuse (torch's backend autoload would, and
# warn that the library being built is missing).
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

CSRC = Path(__file__).resolve().parent
PACKAGE = CSRC.parent / "python" / "deferfuse"
LIBRARY = PACKAGE / "libdeferfuse_tpu.so"
VERSION_FILE = PACKAGE / "libdeferfuse_tpu.torch_version"


def _up_to_date(sources: list[Path]) -> bool:
    if not LIBRARY.exists() or not VERSION_FILE.exists():
        return False
    if VERSION_FILE.read_text().strip() != torch.__version__:
        return False
    built = LIBRARY.stat().st_mtime
    return all(s.stat().st_mtime <= built for s in sources + [Path(__file__)])


def command(sources: list[Path], output: Path) -> list[str]:
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [os.environ.get("CXX", "g++"), "-std=c++20", "-O2", "-fPIC", "-shared", "-fvisibility=hidden"]
    cmd += [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-Wall", "-Wno-unused-parameter"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [f"-I{sysconfig.get_paths()['include']}"]
    cmd += [str(s) for s in sources if s.suffix == ".cpp"]
    for lib_dir in cpp_extension.library_paths():
        cmd += [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}"]
    # libtorch_python for THPVariable_Wrap (bridge.cpp); libpython stays unlinked, as in any extension.
    cmd += ["-lc10", "-ltorch_cpu", "-ltorch_python", "-o", str(output)]
    return cmd


def main() -> int:
    sources = sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))
    force = "--force" in sys.argv
    if not force and _up_to_date(sources):
        print(f"build_native: {LIBRARY.name} is up to date (torch {torch.__version__})")
        return 0
    tmp = LIBRARY.with_suffix(".so.tmp")
    cmd = command(sources, tmp)
    if "--verbose" in sys.argv:
        print(shlex.join(cmd))
    result = subprocess.run(cmd)
    if result.returncode != 0:
        print("build_native: the compile failed (command above with --verbose)", file=sys.stderr)
        return result.returncode
    # Renamed into place: a process that has the old library loaded keeps it.
    tmp.replace(LIBRARY)
    VERSION_FILE.write_text(torch.__version__ + "\n")
    print(f"build_native: built {LIBRARY.relative_to(CSRC.parent.parent)} for torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
