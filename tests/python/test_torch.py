"""Tests of poolshim.torch (python/poolshim/torch.py) against a stand-in for PyTorch.

The stand-in records what enable() asks of torch.cuda.memory: the library and the
three function names it hands to CUDAPluggableAllocator, the record_stream function
it passes on, and the allocator it installs. The door itself is tested over the fake
CUDA by the shim's tests (torch_door/*), and on a GPU by the benchmark set.
"""
import ctypes
import os
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir))

try:
    import poolshim
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import poolshim


class FakeInner:
    def __init__(self, with_record):
        self.record = None
        if with_record:
            self.set_record_stream_fn = self._set

    def _set(self, fn):
        self.record = fn


class FakeTorch(types.ModuleType):
    """torch with cuda.memory.CUDAPluggableAllocator and change_current_allocator."""

    def __init__(self, with_record=True):
        super().__init__("torch")
        self.__version__ = "0.0-stand-in"
        self.made, self.installed = [], []
        outer = self

        class Pluggable:
            def __init__(self, path, alloc_name, free_name):
                lib = ctypes.CDLL(path)
                getattr(lib, alloc_name)  # as PyTorch: the names must resolve
                getattr(lib, free_name)
                self.args = (path, alloc_name, free_name)
                self._allocator = FakeInner(with_record)
                outer.made.append(self)

        memory = types.SimpleNamespace(CUDAPluggableAllocator=Pluggable,
                                       change_current_allocator=self.installed.append)
        self.cuda = types.SimpleNamespace(memory=memory)


def library():
    """A built libpoolshim.so (the wheel's, or build/ in the source tree), or None."""
    try:
        return poolshim.library_path()
    except FileNotFoundError:
        path = os.path.join(ROOT, "build", "libpoolshim.so")
        return path if os.path.isfile(path) else None


@unittest.skipUnless(library(), "no built libpoolshim.so (make, or pip install .)")
class Enable(unittest.TestCase):
    def setUp(self):
        import poolshim.torch as pt
        self.pt = pt
        pt._state.update(allocator=None, library=None)
        self.saved = sys.modules.get("torch")

    def tearDown(self):
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved
        self.pt._state.update(allocator=None, library=None)

    def test_installs_the_door_with_record_stream(self):
        fake = FakeTorch()
        sys.modules["torch"] = fake
        allocator = self.pt.enable(library())
        self.assertEqual(fake.installed, [allocator])
        self.assertEqual(allocator.args, (os.path.abspath(library()), "poolshim_torch_alloc", "poolshim_torch_free"))
        lib = ctypes.CDLL(library())
        want = ctypes.cast(lib.poolshim_torch_record_stream, ctypes.c_void_p).value
        self.assertEqual(allocator._allocator.record, want)
        self.assertTrue(self.pt.enabled())
        self.assertEqual(self.pt.library(), os.path.abspath(library()))

    def test_second_enable_is_a_no_op_and_another_library_is_refused(self):
        fake = FakeTorch()
        sys.modules["torch"] = fake
        first = self.pt.enable(library())
        self.assertIs(self.pt.enable(library()), first)
        self.assertEqual(len(fake.installed), 1)
        with tempfile.TemporaryDirectory() as d:
            other = os.path.join(d, "libpoolshim.so")
            os.symlink(library(), other)
            with self.assertRaisesRegex(RuntimeError, "already enabled"):
                self.pt.enable(other)

    def test_a_pytorch_without_record_stream_is_refused(self):
        fake = FakeTorch(with_record=False)
        sys.modules["torch"] = fake
        with self.assertRaisesRegex(RuntimeError, "record_stream"):
            self.pt.enable(library())
        self.assertEqual(fake.installed, [])
        self.assertFalse(self.pt.enabled())

    def test_missing_library(self):
        sys.modules["torch"] = FakeTorch()
        with self.assertRaises(FileNotFoundError):
            self.pt.enable("/nonexistent/libpoolshim.so")


if __name__ == "__main__":
    unittest.main()
