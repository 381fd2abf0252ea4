"""A stand-in for the `filecheck` package (a test dependency of numba-cuda that
GPU machines without network access lack and cannot install).

numba-cuda's numba/cuda/testing.py imports it at module level, so without it
not one of numba-cuda's tests loads. It is used only by the FileCheck
assertions of compiler-output tests; every name here raises when used, so such
a test fails in both runs of tests/gpu/numba_suite.py (natively and under the
shim) and the comparison stays fair. tests/gpu/numba_suite.py puts this
directory on sys.path only when `import filecheck` fails.
"""


class StandInUsed(RuntimeError):
    """Raised by every name of the stand-in."""


class _StandIn:
    def __init__(self, *args, **kwargs):
        raise StandInUsed("filecheck is not installed (tests/gpu/numba_stub stands in for it)")

    @classmethod
    def from_opts(cls, *args, **kwargs):
        raise StandInUsed("filecheck is not installed (tests/gpu/numba_stub stands in for it)")


def _stand_in_function(*args, **kwargs):
    raise StandInUsed("filecheck is not installed (tests/gpu/numba_stub stands in for it)")
