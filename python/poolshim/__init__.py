"""poolshim for Python environments.

The wheel carries the library (``_lib/libpoolshim.so``), the CUPTI library
where CUPTI was installed (``_lib/libpoolshim_cupti.so``) and the CLI
(``_bin/poolshim``), all built from source with the project's Makefile
(setup.py). This module finds them and reads the statistics the library
writes (``POOLSHIM_STATS=json``, ``poolshim run --stats=json`` or
``--stats-file``).

    >>> import poolshim
    >>> poolshim.library_path()           # for LD_PRELOAD
    >>> poolshim.read_stats("stats_0.json")["devices"][0]["calls"]["cudaMalloc"]
    >>> poolshim.sum_stats(["stats_rank0.json", "stats_rank1.json"])["calls"]
    >>> poolshim.stats_now()              # this process's figures, while it runs
"""
import ctypes
import json
import numbers
import os

__all__ = ["library_path", "cupti_library_path", "binary_path", "version", "read_stats", "sum_stats", "stats_now"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB_DIR = os.path.join(_HERE, "_lib")
_BIN_DIR = os.path.join(_HERE, "_bin")


def _installed(directory, name, what):
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            "poolshim: %s not found at %s (this copy of the module was not installed "
            "from a wheel: run `pip install .` in the poolshim source tree)" % (what, path))
    return os.path.abspath(path)


def library_path():
    """The absolute path of the bundled libpoolshim.so (for LD_PRELOAD).

    Raises FileNotFoundError when the package has no built library (the module
    imported from the source tree rather than installed)."""
    return _installed(_LIB_DIR, "libpoolshim.so", "libpoolshim.so")


def cupti_library_path():
    """The absolute path of the bundled libpoolshim_cupti.so, or None: the wheel
    carries it where the CUDA toolkit's CUPTI was installed when it was built
    (`poolshim ab` times the baseline's allocation calls with it)."""
    path = os.path.join(_LIB_DIR, "libpoolshim_cupti.so")
    return os.path.abspath(path) if os.path.isfile(path) else None


def binary_path():
    """The absolute path of the bundled ``poolshim`` CLI binary."""
    return _installed(_BIN_DIR, "poolshim", "the poolshim CLI")


def version():
    """poolshim's version: the top-level VERSION file, as read when the wheel was built."""
    try:
        from ._version import __version__
        return __version__
    except ImportError:
        pass
    # The module imported from the source tree: python/poolshim -> VERSION.
    path = os.path.join(_HERE, os.pardir, os.pardir, "VERSION")
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        text = ""
    if not text:
        raise RuntimeError("poolshim: no version: the package was not built and %s is missing"
                           % os.path.normpath(path))
    return text


def read_stats(path):
    """Parses one statistics file the library wrote (POOLSHIM_STATS=json).

    Returns the document as a dict: {"poolshim": 1, "pid": P, "rank": R (when a
    launcher set one), "passthrough": N, "invalid_frees": N, "ipc": {...},
    "devices": [{"device": D, "stack": NAME, "calls": {...}, "bytes": {...}, ...}]}
    (shim/stats.c writes it; older reports keep passthrough and invalid_frees per
    device). Raises ValueError when the file is not JSON or not poolshim's
    statistics, OSError when it cannot be read."""
    with open(path) as f:
        try:
            stats = json.load(f)
        except ValueError as e:
            raise ValueError("%s: not valid JSON: %s" % (path, e)) from None
    if not isinstance(stats, dict) or "poolshim" not in stats or not isinstance(stats.get("devices"), list):
        raise ValueError("%s: not poolshim statistics (no \"poolshim\" member or \"devices\" list)" % path)
    return stats


# Members that name or describe something rather than count it: not summed.
_PROCESS_LABELS = ("poolshim", "pid", "rank", "devices")
_DEVICE_LABELS = ("device", "stack", "expandable", "enabled")


def _add(total, part, skip):
    for key, value in part.items():
        if key in skip or isinstance(value, bool):
            continue
        if isinstance(value, dict):
            _add(total.setdefault(key, {}), value, _DEVICE_LABELS)
        elif isinstance(value, numbers.Number):
            total[key] = total.get(key, 0) + value


def sum_stats(reports):
    """Sums the figures of several processes' statistics (e.g. one file per rank).

    `reports` is a list of paths or of dicts from read_stats. Returns one dict:
    "processes" (how many), "ranks" (each report's rank, None where it had none),
    "devices" (how many devices in all), then every numeric figure of the reports
    and of their devices added up under the same names ("calls", "bytes",
    "time_ns", "passthrough", "failures", "host", ...). Peaks add up too: the sum
    is what the job held at most, exact when the processes peaked together (as
    `poolshim stats` totals them)."""
    total = {"processes": 0, "ranks": [], "devices": 0}
    for report in reports:
        if not isinstance(report, dict):
            report = read_stats(report)
        total["processes"] += 1
        total["ranks"].append(report.get("rank"))
        _add(total, report, _PROCESS_LABELS)
        for device in report.get("devices", []):
            total["devices"] += 1
            _add(total, device, _DEVICE_LABELS)
    return total


def stats_now():
    """This process's statistics as of now, while it runs under the library.

    The same document as the exit report (read_stats), from the loaded
    library's ``poolshim_stats_json`` (shim/poolshim.h): call it between steps
    to see what a phase of the program cost (calls, pieces mapped, barriers).
    As there, "cuda_time", requested bytes and call times need statistics on
    (POOLSHIM_STATS).
    Returns None when libpoolshim.so is not loaded in this process (no
    LD_PRELOAD). Raises MemoryError when the library could not write it."""
    try:
        get = ctypes.CDLL(None).poolshim_stats_json
    except AttributeError:
        return None
    get.restype = ctypes.c_long
    get.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        length = get(buf, size)
        if length < 0:
            raise MemoryError("poolshim_stats_json returned %d" % length)
        if length < size:
            return json.loads(buf.value.decode("utf-8", "replace"))
        size = length + 1 + 4096  # grown in between: room for a little more
