"""What the pinned-memory workloads share (tools/bench/pinned).

1. skip(reason): print "SKIP <workload>: reason" and exit 77, the driver's
   code for "not measurable here" (module missing, no GPU).
2. PinSampler: a thread that reads VmLck and VmPin from /proc/self/status
   every few milliseconds and keeps their maxima. Whether CUDA's pinned
   pages show there depends on the driver (cudaHostAlloc memory is often
   counted in neither): 0 means "not visible there", not "nothing pinned".
3. result(**fields): the one line the driver reads, "RESULT k=v k=v ...".
"""
import os
import sys
import threading
import time

SKIP_CODE = 77


def skip(workload, reason):
    print(f"SKIP {workload}: {reason}", flush=True)
    sys.exit(SKIP_CODE)


def _status_kib(fields):
    out = dict.fromkeys(fields, 0)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in out:
                    out[key] = int(line.split()[1])
    except OSError:
        pass
    return out


class PinSampler:
    """Maxima of VmLck and VmPin (bytes) while running."""

    FIELDS = ("VmLck", "VmPin")

    def __init__(self, period_s=0.005):
        self.period_s = period_s
        self.peak = dict.fromkeys(self.FIELDS, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        now = _status_kib(self.FIELDS)
        for k, v in now.items():
            self.peak[k] = max(self.peak[k], v * 1024)

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.period_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        return False


def result(**fields):
    """Prints RESULT k=v ... (values without blanks)."""
    parts = []
    for k, v in fields.items():
        text = f"{v:.6f}" if isinstance(v, float) else str(v)
        parts.append(f"{k}={text.replace(' ', '_')}")
    print("RESULT " + " ".join(parts), flush=True)


def env_flag(name):
    return os.environ.get(name, "") not in ("", "0")
