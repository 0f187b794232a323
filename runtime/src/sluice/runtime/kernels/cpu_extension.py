"""Build (once) and load the CPU kernels, `torch.ops.sluice_cpu.*`.

`csrc/paged_attention.cpp` (the `cpu` attention backend), `csrc/fused_ops.cpp` (RMSNorm,
rotary embedding, SiLU-and-multiply in one pass each) and `csrc/linear.cpp` (row-invariant
bf16 linear layers: AMX, AVX512-BF16 or AVX2) are compiled by `torch.utils.cpp_extension` with
`-O3 -march=native -fopenmp` into a folder keyed by the source, the torch version and the
CPU's flags, under the model cache dir (`$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`).
The first process builds it (an flock makes concurrent processes build once, ~15-30 s);
later ones load the cached library. `make setup` builds it ahead of time
(`python -m sluice.runtime.kernels.cpu_extension`). Without a C++ compiler, or when the
build fails, `load()` returns None and says why; the caller falls back to torch code.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from sluice.runtime.cache_dir import default_cache_dir

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / name for name in ("paged_attention.cpp", "fused_ops.cpp", "linear.cpp")]
HEADERS = sorted(CSRC.glob("*.h"))  # their text keys the build folder too
NAME = "sluice_cpu_kernels"
# reassociation lets the compiler vectorise sums as trees (dot products, softmax sums);
# infinities and NaNs keep their meaning (no -ffinite-math-only)
CFLAGS = [
    "-O3", "-march=native", "-fopenmp", "-std=c++17",
    "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math",
]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def build_directory(root: Path | None = None) -> Path:
    """One folder per (source, torch, compiler flags, CPU): -march=native code is per CPU."""
    texts = [source.read_text() for source in (*SOURCES, *HEADERS)]
    key = "\0".join([*texts, torch.__version__, " ".join(CFLAGS), _cpu_flags()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return (root or default_cache_dir()) / "kernels" / f"{NAME}-{digest}"


def compiler_available() -> bool:
    return shutil.which(os.environ.get("CXX", "c++")) is not None


BUILD_LOCK = ".sluice-build.flock"


@contextlib.contextmanager
def _exclusive_build(folder: Path) -> Iterator[None]:
    """One builder per folder across processes, by flock: the kernel releases it when its holder
    dies, which cpp_extension's own lock (a plain file, waited on forever) does not. Under it
    nobody else is building, so a leftover cpp_extension lock file is an orphan and goes."""
    with open(folder / BUILD_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            orphan = folder / "lock"
            if orphan.exists():
                logger.warning("removing an orphaned kernel build lock %s", orphan)
                orphan.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@functools.cache
def load() -> str | None:
    """Load the kernels; None when they are loaded, else the reason they are not."""
    if hasattr(torch.ops.sluice_cpu, "paged_attention") and hasattr(torch.ops.sluice_cpu, "linear"):
        return None
    if not compiler_available():
        return "no C++ compiler on PATH"
    from torch.utils import cpp_extension

    folder = build_directory()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with _exclusive_build(folder):
            cpp_extension.load(
                name=NAME,
                sources=[str(source) for source in SOURCES],
                extra_cflags=CFLAGS,
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                is_python_module=False,
                verbose=False,
            )
    except Exception as err:  # a broken toolchain must not take the server down
        logger.warning("building the CPU kernels failed: %s", err)
        return f"build failed: {err}"
    return None


def available() -> bool:
    return load() is None


def main() -> int:
    logging.basicConfig(level=logging.INFO)
    reason = load()
    if reason is not None:
        print(f"CPU kernels not built: {reason}", file=sys.stderr)
        return 1
    print(f"CPU kernels ready in {build_directory()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
