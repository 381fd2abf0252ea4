"""Tests of the poolshim Python module (python/poolshim).

    python3 -m unittest discover -s tests/python      (from the source tree)
    make check-python                                 (against the installed wheel)

An installed poolshim is tested when one is importable, else the source in
python/ (where library_path() has no built library to find).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir))
DATA = os.path.join(ROOT, "tests", "data", "cli")

try:
    import poolshim
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import poolshim

INSTALLED = os.path.isfile(os.path.join(poolshim._LIB_DIR, "libpoolshim.so"))
# Where the wheel was built with CUPTI (mk/tools.mk's test: the toolkit's cupti.h and libcupti.so).
CUDA_HOME = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
HAS_CUPTI = os.path.isfile(os.path.join(CUDA_HOME, "include", "cupti.h")) and any(
    os.path.isfile(os.path.join(CUDA_HOME, d, "libcupti.so")) for d in ("lib64", "extras/CUPTI/lib64"))


class ReadStats(unittest.TestCase):
    def test_single_process_report(self):
        s = poolshim.read_stats(os.path.join(DATA, "shim_stats.json"))
        self.assertEqual(s["poolshim"], 1)
        self.assertEqual(s["pid"], 4242)
        self.assertEqual([d["device"] for d in s["devices"]], [0, 1])
        self.assertEqual([d["stack"] for d in s["devices"]], ["pool", "arena"])
        self.assertEqual(s["devices"][0]["calls"]["cudaMalloc"], 1000)
        self.assertEqual(s["devices"][0]["bytes"]["requested_peak"], 3221225472)
        self.assertNotIn("rank", s)

    def test_rank_reports(self):
        r0 = poolshim.read_stats(os.path.join(DATA, "stats_rank0.json"))
        r1 = poolshim.read_stats(os.path.join(DATA, "stats_rank1.json"))
        self.assertEqual(r0["rank"], 0)
        self.assertNotIn("rank", r1)  # the CLI takes it from the file name
        self.assertEqual(r0["devices"][0]["host"]["requested_peak"], 67108864)
        self.assertEqual(r1["devices"][0]["barriers"], 25)

    def test_not_json(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            f.write("{\"poolshim\": 1, \"devices\": [")
            f.flush()
            with self.assertRaisesRegex(ValueError, "not valid JSON"):
                poolshim.read_stats(f.name)

    def test_other_json(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump({"devices": []}, f)
            f.flush()
            with self.assertRaisesRegex(ValueError, "not poolshim statistics"):
                poolshim.read_stats(f.name)

    def test_malformed_fixture(self):
        with self.assertRaises(ValueError):
            poolshim.read_stats(os.path.join(DATA, "stats_malformed.json"))

    def test_missing_file(self):
        with self.assertRaises(OSError):
            poolshim.read_stats(os.path.join(DATA, "no_such_stats.json"))


class SumStats(unittest.TestCase):
    def test_two_ranks(self):
        files = [os.path.join(DATA, "stats_rank0.json"), os.path.join(DATA, "stats_rank1.json")]
        t = poolshim.sum_stats(files)
        self.assertEqual(t["processes"], 2)
        self.assertEqual(t["ranks"], [0, None])
        self.assertEqual(t["devices"], 2)
        self.assertEqual(t["calls"]["cudaMalloc"], 2200)
        self.assertEqual(t["calls"]["cudaFree"], 2190)
        self.assertEqual(t["calls"]["cuMemAlloc"], 4)
        self.assertEqual(t["calls"]["cudaHostAlloc"], 6)  # only rank 0 reports it
        self.assertEqual(t["failures"], 1)
        self.assertEqual(t["barriers"], 65)  # as `poolshim stats` totals them
        self.assertEqual(t["bytes"]["requested_peak"], 3 << 30)
        self.assertEqual(t["bytes"]["reserved_peak"], 2415919104 + 1610612736)
        self.assertEqual(t["time_ns"], {"allocate": 780000, "free": 220000})
        self.assertEqual(t["upstream"], {"allocs": 5, "frees": 1})
        self.assertEqual(t["host"]["calls"], 12)
        self.assertNotIn("enabled", t["host"])  # a flag, not a figure
        self.assertNotIn("expandable", t)
        self.assertNotIn("pid", t)
        self.assertNotIn("stack", t)
        self.assertEqual(t["passthrough"], 0)

    def test_dicts_and_devices_of_one_process(self):
        s = poolshim.read_stats(os.path.join(DATA, "shim_stats.json"))
        t = poolshim.sum_stats([s])
        self.assertEqual(t["processes"], 1)
        self.assertEqual(t["devices"], 2)
        self.assertEqual(t["calls"]["cudaMalloc"], 1010)
        self.assertEqual(t["doors"], {"runtime": 2059, "driver": 6})
        self.assertEqual(t["passthrough"], 1)  # per device in this older report
        self.assertEqual(t["bytes"]["reserved_current"], 4294967296 + 33554432)

    def test_nothing(self):
        self.assertEqual(poolshim.sum_stats([]), {"processes": 0, "ranks": [], "devices": 0})


class LibraryPath(unittest.TestCase):
    def setUp(self):
        self.saved = poolshim._LIB_DIR, poolshim._BIN_DIR
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        poolshim._LIB_DIR, poolshim._BIN_DIR = self.saved
        shutil.rmtree(self.tmp)

    def test_absent(self):
        poolshim._LIB_DIR = poolshim._BIN_DIR = self.tmp
        with self.assertRaisesRegex(FileNotFoundError, "pip install"):
            poolshim.library_path()
        with self.assertRaises(FileNotFoundError):
            poolshim.binary_path()
        self.assertIsNone(poolshim.cupti_library_path())

    def test_present_is_absolute(self):
        open(os.path.join(self.tmp, "libpoolshim.so"), "w").close()
        poolshim._LIB_DIR = os.path.relpath(self.tmp)
        path = poolshim.library_path()
        self.assertTrue(os.path.isabs(path))
        self.assertEqual(path, os.path.join(self.tmp, "libpoolshim.so"))

    @unittest.skipUnless(INSTALLED, "poolshim is not installed from a wheel")
    def test_installed(self):
        path = poolshim.library_path()
        self.assertTrue(os.path.isabs(path))
        self.assertTrue(os.path.isfile(path))
        self.assertEqual(os.path.basename(path), "libpoolshim.so")
        self.assertEqual(os.path.dirname(os.path.dirname(path)), os.path.dirname(os.path.abspath(poolshim.__file__)))
        with open(path, "rb") as f:
            self.assertEqual(f.read(4), b"\x7fELF")
        self.assertTrue(os.access(poolshim.binary_path(), os.X_OK))

    @unittest.skipUnless(INSTALLED and HAS_CUPTI, "needs a wheel built where CUPTI is installed")
    def test_installed_with_cupti(self):
        path = poolshim.cupti_library_path()
        self.assertIsNotNone(path, "the wheel lacks libpoolshim_cupti.so though %s has CUPTI" % CUDA_HOME)
        self.assertEqual(os.path.dirname(path), os.path.dirname(poolshim.library_path()))
        with open(path, "rb") as f:
            self.assertEqual(f.read(4), b"\x7fELF")


class StatsNow(unittest.TestCase):
    """stats_now() reads the loaded library's poolshim_stats_json."""

    def test_without_the_library(self):
        if "libpoolshim" in os.environ.get("LD_PRELOAD", ""):
            self.skipTest("this process runs under the library")
        self.assertIsNone(poolshim.stats_now())

    def test_under_the_library(self):
        # the library (installed, else the source tree's build) over the fake CUDA
        # runtime of the shim tests (tests/shim), which `make test` builds
        library = poolshim.library_path() if INSTALLED else os.path.join(ROOT, "build", "libpoolshim.so")
        fake = os.path.join(ROOT, "build", "fake")
        if not os.path.isfile(library) or not os.path.isfile(os.path.join(fake, "libcudart.so.13")):
            self.skipTest("needs %s and the fake CUDA runtime in %s (make test builds both)" % (library, fake))
        program = (
            "import ctypes, json, sys\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "import poolshim\n"
            "rt = ctypes.CDLL('libcudart.so.13')\n"
            "p = ctypes.c_void_p()\n"
            "held = []\n"
            "for i in range(3):\n"
            "    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)) == 0\n"
            "    held.append(p.value)\n"
            "before = poolshim.stats_now()\n"
            "for q in held:\n"
            "    assert rt.cudaFree(ctypes.c_void_p(q)) == 0\n"
            "print(json.dumps([before, poolshim.stats_now()]))\n")
        env = dict(os.environ, LD_PRELOAD=library, POOLSHIM_STATS="json", POOLSHIM_STATS_FILE=os.devnull,
                   LD_LIBRARY_PATH=fake)
        module_dir = os.path.dirname(os.path.dirname(os.path.abspath(poolshim.__file__)))
        out = subprocess.run([sys.executable, "-c", program, module_dir], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        before, after = json.loads(out.stdout.strip().splitlines()[-1])
        self.assertEqual(before["poolshim"], 1)
        device = before["devices"][0]
        self.assertEqual((device["calls"]["cudaMalloc"], device["calls"]["cudaFree"]), (3, 0))
        self.assertEqual(device["bytes"]["requested_current"], 3 << 20)
        device = after["devices"][0]
        self.assertEqual((device["calls"]["cudaMalloc"], device["calls"]["cudaFree"]), (3, 3))
        self.assertEqual(device["bytes"]["requested_current"], 0)


class Version(unittest.TestCase):
    def test_matches_version_file(self):
        path = os.path.join(ROOT, "VERSION")
        if not os.path.isfile(path):
            self.skipTest("no VERSION file in the source tree")
        with open(path) as f:
            self.assertEqual(poolshim.version(), f.read().strip())


@unittest.skipUnless(INSTALLED, "poolshim is not installed from a wheel")
class Command(unittest.TestCase):
    def run_cli(self, *args):
        return subprocess.run([sys.executable, "-m", "poolshim"] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True)

    def test_version(self):
        r = self.run_cli("--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(poolshim.version(), r.stdout)

    def test_run_finds_the_bundled_library(self):
        env = dict(os.environ)
        env.pop("POOLSHIM_LIB", None)
        r = subprocess.run([sys.executable, "-m", "poolshim", "run", "--dry-run", "--", "true"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("LD_PRELOAD=" + poolshim.library_path(), r.stdout)

    @unittest.skipUnless(HAS_CUPTI, "needs a wheel built where CUPTI is installed")
    def test_ab_finds_the_bundled_cupti_library(self):
        env = dict(os.environ)
        env.pop("POOLSHIM_CUPTI_LIB", None)
        r = subprocess.run([sys.executable, "-m", "poolshim", "ab", "--runs", "1", "--", "true"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("libpoolshim_cupti.so", r.stderr)

    def test_exit_status_is_the_clis(self):
        r = self.run_cli("no-such-command")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unknown command", r.stderr)


if __name__ == "__main__":
    unittest.main()
