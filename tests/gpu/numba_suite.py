"""numba-cuda's driver tests (numba.cuda.tests.cudadrv), natively and under the shim.

numba allocates through the driver API (cuMemAlloc, cuMemFree, cuMemGetInfo,
pointer attributes, contexts it pushes and resets), so its own driver tests are
an unmodified program's check of those doors. tests/gpu/run.sh runs the suite
twice and compares:

  numba_suite.py run OUT.json [NAME...]
      runs every test module of each NAME, a package (all its test_ modules)
      or a module (default numba.cuda.tests.cudadrv), in this process and
      writes each test's outcome (pass, fail, error, skip, xfail, xpass; a
      module that does not load: load_error) to OUT.json; prints one summary
      line. Exit 0 once the suite ran, whatever its tests did.
  numba_suite.py compare NATIVE.json SHIM.json [MIN_PASSED]
      exit 0 when both runs hold the same tests, every test that passed
      natively passed under the shim, and at least MIN_PASSED (default 50)
      passed natively (so that a suite that did not load cannot agree with
      itself); prints what differs.
  numba_suite.py selftest
      the comparison's own checks on made-up runs (make test-gpu-scripts).

GPU machines without network access may lack `filecheck`, a test dependency numba-cuda imports at
load time; without it not one test loads (2026-11-28, H200: "No module named
'filecheck'"). `run` then puts tests/gpu/numba_stub on sys.path, whose names
raise when used: the FileCheck tests fail alike in both runs.
"""
import importlib
import json
import os
import pkgutil
import sys
import time
import unittest

PASSED = "pass"


class _Recorder(unittest.TestResult):
    """Each test's outcome by its id."""

    def __init__(self):
        super().__init__()
        self.outcomes = {}

    def addSuccess(self, test):
        self.outcomes[test.id()] = PASSED

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[test.id()] = "fail"

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[test.id()] = "error"

    def addSkip(self, test, reason):
        self.outcomes[test.id()] = "skip"

    def addExpectedFailure(self, test, err):
        self.outcomes[test.id()] = "xfail"

    def addUnexpectedSuccess(self, test):
        self.outcomes[test.id()] = "xpass"

    def addSubTest(self, test, subtest, err):
        if err is not None:  # a failing subtest fails its test
            super().addSubTest(test, subtest, err)
            self.outcomes[test.id()] = "fail"


def _filecheck_or_stand_in():
    try:
        import filecheck  # noqa: F401
        return "installed"
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "numba_stub"))
        return "stand-in (tests/gpu/numba_stub)"


def _test_modules(names):
    """The test modules of each name: a package's test_ modules, or the module itself."""
    modules = []
    for name in names:
        package = importlib.import_module(name)
        if hasattr(package, "__path__"):
            modules += sorted(f"{name}.{m.name}" for m in pkgutil.iter_modules(package.__path__)
                              if m.name.startswith("test_"))
        else:
            modules.append(name)
    return modules


def run(out_path, *names):
    names = names or ("numba.cuda.tests.cudadrv",)
    filecheck = _filecheck_or_stand_in()
    loader = unittest.TestLoader()
    recorder = _Recorder()
    started = time.time()
    for name in _test_modules(names):
        errors_before = len(loader.errors)
        try:
            suite = loader.loadTestsFromName(name)
        except Exception as exc:  # a module that does not import is a result too
            loader.errors.append(repr(exc))
        if len(loader.errors) > errors_before:
            recorder.outcomes[name] = "load_error"
            last = loader.errors[-1].strip().splitlines()[-1]
            print(f"numba_suite: {name} did not load: {last}", file=sys.stderr)
            continue
        suite.run(recorder)
        # record the first failures' causes in the log (the JSON keeps outcomes only)
        for test, trace in (recorder.failures + recorder.errors)[:50]:
            last = trace.strip().splitlines()[-1] if trace.strip() else ""
            print(f"numba_suite: {test.id()}: {last}", file=sys.stderr)
        recorder.failures.clear()
        recorder.errors.clear()
    counts = {}
    for outcome in recorder.outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    numba = sys.modules.get("numba")
    result = {
        "names": list(names),
        "numba": getattr(numba, "__version__", "?"),
        "filecheck": filecheck,
        "preloaded": os.environ.get("LD_PRELOAD", ""),
        "seconds": round(time.time() - started, 1),
        "counts": counts,
        "tests": recorder.outcomes,
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    summary = ", ".join(f"{counts[k]} {k}" for k in sorted(counts))
    print(f"numba_suite: {' '.join(names)}: {len(recorder.outcomes)} tests ({summary}) in "
          f"{result['seconds']} s; filecheck {filecheck}")
    return 0


def differences(native, shim, min_passed=50):
    """What keeps the shim's run from matching the native one (empty: it matches)."""
    problems = []
    native_tests, shim_tests = native["tests"], shim["tests"]
    passed = sum(1 for outcome in native_tests.values() if outcome == PASSED)
    if passed < min_passed:
        problems.append(f"only {passed} tests passed natively (at least {min_passed} expected)")
    for test in sorted(set(native_tests) - set(shim_tests)):
        problems.append(f"{test}: ran natively ({native_tests[test]}), not under the shim")
    for test in sorted(set(shim_tests) - set(native_tests)):
        problems.append(f"{test}: ran under the shim ({shim_tests[test]}), not natively")
    for test in sorted(set(native_tests) & set(shim_tests)):
        if native_tests[test] == PASSED and shim_tests[test] != PASSED:
            problems.append(f"{test}: passed natively, {shim_tests[test]} under the shim")
    return problems


def compare(native_path, shim_path, min_passed=50):
    with open(native_path) as f:
        native = json.load(f)
    with open(shim_path) as f:
        shim = json.load(f)
    problems = differences(native, shim, min_passed)
    gained = sorted(t for t, o in shim["tests"].items() if o == PASSED and native["tests"].get(t, PASSED) != PASSED)
    for test in gained:  # not a failure, but worth a look: the shim should change nothing
        print(f"numba_suite: note: {test}: {native['tests'][test]} natively, passed under the shim")
    for problem in problems:
        print(f"numba_suite: {problem}")
    passed = sum(1 for o in native["tests"].values() if o == PASSED)
    print(f"numba_suite: {'same results' if not problems else 'DIFFERENT'}: {len(native['tests'])} tests, "
          f"{passed} passed natively, "
          f"{sum(1 for o in shim['tests'].values() if o == PASSED)} under the shim")
    return 1 if problems else 0


def selftest():
    tests = {f"t{i}": PASSED for i in range(60)}
    tests["f"] = "fail"
    native = {"tests": dict(tests)}
    assert differences(native, {"tests": dict(tests)}) == []
    # a native failure that fails the same way under the shim is no difference
    assert differences(native, {"tests": dict(tests, f="error")}) == []
    worse = dict(tests, t3="fail")
    assert differences(native, {"tests": worse}) == ["t3: passed natively, fail under the shim"]
    missing = dict(tests)
    del missing["t5"]
    assert differences(native, {"tests": missing}) == ["t5: ran natively (pass), not under the shim"]
    assert differences(native, {"tests": dict(tests, extra=PASSED)}) == [
        "extra: ran under the shim (pass), not natively"]
    # a suite that did not load agrees with itself, and is refused
    empty = {"tests": {"numba.cuda.tests.cudadrv.test_x": "load_error"}}
    assert differences(empty, empty) == ["only 0 tests passed natively (at least 50 expected)"]
    print("numba_suite selftest: OK")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "run":
        return run(*argv[2:])
    if len(argv) in (4, 5) and argv[1] == "compare":
        return compare(argv[2], argv[3], int(argv[4]) if len(argv) == 5 else 50)
    if len(argv) == 2 and argv[1] == "selftest":
        return selftest()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
