"""Builds the shim, the mock driver and the linked test program with gcc (shared by the shim's
and the agent's tests). Returns None, with the reason, when no C compiler is available."""

import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_DIR = os.path.dirname(HERE)
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden"]


class Built:
    def __init__(self, out):
        self.dir = out
        self.shim = os.path.join(out, "libhearth_cuda_shim.so")
        self.mock_dir = os.path.join(out, "mock")
        self.mock = os.path.join(self.mock_dir, "libcuda.so.1")
        self.prog = os.path.join(out, "linked_prog")
        self.runtime_prog = os.path.join(out, "runtime_prog")
        # The mock under a name that is not libcuda's: what it exports is not the driver's.
        self.other = os.path.join(out, "other", "libnotcuda.so")
        self.probes = [os.path.join(out, "libprobe_%d.so" % v) for v in (1, 2)]


def build(out):
    """(Built, None) or (None, why)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None, "gcc is not installed: the CUDA shim tests need a C compiler"
    b = Built(out)
    os.makedirs(b.mock_dir, exist_ok=True)
    os.makedirs(os.path.dirname(b.other), exist_ok=True)
    mock_src = os.path.join(HERE, "mock_cuda.c")
    steps = [
        [gcc, *CFLAGS, "-shared", "-o", b.shim, os.path.join(SHIM_DIR, "hearth_cuda_shim.c"),
         "-ldl", "-lpthread"],
        [gcc, *CFLAGS, "-shared", "-Wl,-soname,libcuda.so.1", "-o", b.mock, mock_src, "-ldl",
         "-lpthread"],
        [gcc, *CFLAGS, "-shared", "-Wl,-soname,libnotcuda.so", "-o", b.other, mock_src, "-ldl",
         "-lpthread"],
        # Linked by path with the soname recorded, found at run time through the rpath.
        [gcc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", b.prog, os.path.join(HERE, "linked_prog.c"),
         b.mock, "-Wl,-rpath," + b.mock_dir, "-ldl"],
        # Not linked against the driver: it dlopen()s libcuda.so.1, found through the rpath.
        [gcc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", b.runtime_prog,
         os.path.join(HERE, "runtime_prog.c"), "-Wl,-rpath," + b.mock_dir, "-ldl"],
    ] + [
        [gcc, *CFLAGS, "-shared", "-DPROBE_VALUE=%d" % v, "-o", path,
         os.path.join(HERE, "next_probe.c"), "-ldl"]
        for v, path in zip((1, 2), b.probes)
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError("build failed: %s\n%s" % (" ".join(cmd), proc.stderr))
    return b, None
