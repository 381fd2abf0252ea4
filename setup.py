"""Builds poolshim's wheel: the C library and CLI from source with the
project's own Makefile, bundled into the `poolshim` Python package.

1. The version is the top-level VERSION file (mk/version.mk compiles the
   same file into the library and CLI), read now and written into the package
   (poolshim/_version.py). No VERSION, no build.
2. build_py runs `make BUILD=<dir> <dir>/libpoolshim.so <dir>/poolshim tools`
   into a private build directory (build-pip/, or $POOLSHIM_BUILD_DIR), never
   build/, after checking that the static libraries the link needs (libinih,
   jansson, zlib: `make deps` installs them) are there. `tools` adds the CUPTI
   library libpoolshim_cupti.so where the CUDA toolkit has CUPTI, as
   `make install` does (`poolshim ab` times the baseline's calls with it).
3. It copies the libraries to poolshim/_lib/ and the CLI to poolshim/_bin/ in
   the built package (in the source tree for an editable install).
4. The wheel is platform-specific (the distribution claims extension
   modules, so the files go to platlib) but needs no particular Python:
   py3-none-<platform>.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.path.abspath(os.environ.get("POOLSHIM_BUILD_DIR") or os.path.join(ROOT, "build-pip"))
DEPS_HINT = ("run `make deps` (as root: apt-get installs gcc, make, libinih-dev, libjansson-dev, "
             "zlib1g-dev) in the poolshim source tree, then pip install again")


def fail(message):
    sys.stderr.write("\npoolshim: error: %s\n\n" % message)
    raise SystemExit(1)


def read_version():
    path = os.path.join(ROOT, "VERSION")
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        text = ""
    if not text:
        fail("%s is missing or empty: the package takes its version from it" % path)
    return text


def make_env():
    env = dict(os.environ)
    # A make above us (make check-python) must not hand its flags or variables
    # (BUILD=, SANITIZE=, a jobserver) to this build.
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "BUILD", "SANITIZE"):
        env.pop(name, None)
    return env


def check_static_libs(env):
    """The Makefile's own answer for INIH_LIB, JANSSON_LIB, ZLIB_LIB (mk/python.mk)."""
    try:
        out = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "python-static-libs"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, check=True).stdout
    except FileNotFoundError:
        fail("`make` is not installed; " + DEPS_HINT)
    except subprocess.CalledProcessError as e:
        sys.stderr.write(e.stderr)
        fail("`make python-static-libs` failed; " + DEPS_HINT)
    found = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    packages = {"INIH_LIB": "libinih.a (libinih-dev)", "JANSSON_LIB": "libjansson.a (libjansson-dev)",
                "ZLIB_LIB": "libz.a (zlib1g-dev)"}
    missing = [what for name, what in packages.items() if not found.get(name, "").strip()]
    if missing:
        fail("the static libraries %s are missing; %s (or name them: make's INIH_LIB, "
             "JANSSON_LIB, ZLIB_LIB as environment variables)" % (", ".join(missing), DEPS_HINT))


def build_native():
    env = make_env()
    check_static_libs(env)
    lib = os.path.join(BUILD_DIR, "libpoolshim.so")
    cli = os.path.join(BUILD_DIR, "poolshim")
    jobs = str(os.cpu_count() or 1)
    # WERROR=0: a user's compiler may warn where the project's CI compiler does not.
    command = ["make", "-C", ROOT, "-j" + jobs, "BUILD=" + BUILD_DIR, "SANITIZE=", "WERROR=0", lib, cli, "tools"]
    print("poolshim: " + " ".join(command), flush=True)
    if subprocess.call(command, env=env) != 0:
        fail("building libpoolshim.so and the poolshim CLI failed (output above); "
             "if headers or libraries are missing, " + DEPS_HINT)
    cupti = os.path.join(BUILD_DIR, "libpoolshim_cupti.so")  # only where CUPTI is installed
    return [(lib, "_lib"), (cli, "_bin")] + ([(cupti, "_lib")] if os.path.isfile(cupti) else [])


class BuildPy(build_py):
    def run(self):
        super().run()
        built = build_native()
        package = (os.path.join(ROOT, "python", "poolshim") if getattr(self, "editable_mode", False)
                   else os.path.join(self.build_lib, "poolshim"))
        for source, folder in built:
            os.makedirs(os.path.join(package, folder), exist_ok=True)
            target = os.path.join(package, folder, os.path.basename(source))
            shutil.copyfile(source, target)
            os.chmod(target, 0o755)
        with open(os.path.join(package, "_version.py"), "w") as f:
            f.write("__version__ = %r\n" % VERSION)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # native code inside: a platform wheel, installed to platlib


class BdistWheel(bdist_wheel):
    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform  # the binaries do not use Python's ABI


VERSION = read_version()
os.makedirs(BUILD_DIR, exist_ok=True)
setup(
    version=VERSION,
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel},
    options={
        # setuptools' own build tree and metadata beside the C build, not in build/ or python/.
        "build": {"build_base": os.path.join(BUILD_DIR, "setuptools")},
        "egg_info": {"egg_base": BUILD_DIR},
    },
)
