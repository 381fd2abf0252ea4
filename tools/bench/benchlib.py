"""What the Python benchmark scripts of tools/bench share, with no package needed
(the scripts below this folder import it by path):
  stats_now(library)  the loaded poolshim's statistics, read while the program runs
  log_lines(path)     the lines of a log, none when it cannot be read
"""
import ctypes
import json


def stats_now(library=None):
    """The statistics document (poolshim_stats_json, shim/poolshim.h) of the poolshim in
    this process: the preloaded one, else the one at LIBRARY (a path) when given. None
    without the library, or when it could not write the document."""
    try:
        get = ctypes.CDLL(None).poolshim_stats_json
    except AttributeError:
        if not library:
            return None
        try:
            get = ctypes.CDLL(library).poolshim_stats_json
        except (OSError, AttributeError):
            return None
    get.restype, get.argtypes = ctypes.c_long, [ctypes.c_char_p, ctypes.c_size_t]
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    length = get(buf, size)
    if length >= size:
        buf = ctypes.create_string_buffer(length + 4096)
        length = get(buf, length + 4096)
    if length < 0:
        return None
    return json.loads(buf.value.decode("utf-8", "replace"))


def log_lines(path):
    """The lines of the log at PATH (undecodable bytes replaced); none past a read error."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            yield from handle
    except OSError:
        pass
