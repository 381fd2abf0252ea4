"""Peak GPU memory of a command, as NVML sees it (what the driver really holds).

Usage: python3 nvml_peak.py --gpu 0 --out result.json [--interval-ms 1] [--timeout S]
                            [--env VAR=VALUE]... [--unset VAR]... [--timeline t.csv] -- CMD ARGS...

1. Reads NVML's used memory of GPU --gpu (nvmlDeviceGetMemoryInfo) for ~0.2 s before
   starting anything: the idle baseline (median of those samples).
2. Starts CMD (its stdout and stderr are the wrapper's: they pass straight through),
   with --env/--unset applied to CMD's environment only (so an LD_PRELOAD given that
   way does not load into this sampler).
3. Samples used memory every --interval-ms (default 1 ms) until CMD exits; every ~50 ms
   also the per-process memory (nvmlDeviceGetComputeRunningProcesses), when the driver
   allows it, summed over the processes that were not on the GPU at the baseline.
4. Writes --out: {baseline_used, peak_used, peak_above_baseline, samples, wall_s, rc, ...}
   in bytes and seconds, and exits with CMD's exit status (124 when --timeout killed it).

NVML's index order is the PCI bus order: run CMD with CUDA_DEVICE_ORDER=PCI_BUS_ID and
CUDA_VISIBLE_DEVICES=<same index> (run.sh does) so that CUDA uses the GPU sampled here.
Needs libnvidia-ml.so.1 (the driver's); no pynvml.
"""
import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7


class MemoryInfo(ctypes.Structure):  # nvmlMemory_t (version 1)
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (the _v2/_v3 calls' layout)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class ProcessInfoV1(ctypes.Structure):  # nvmlProcessInfo_v1_t (the unversioned call)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class NVMLError(RuntimeError):
    pass


class NVML:
    def __init__(self):
        lib = None
        errors = []
        for name in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as exc:
                errors.append(f"{name}: {exc}")
        if lib is None:
            raise NVMLError("cannot load NVML (the NVIDIA driver's libnvidia-ml.so.1): " + "; ".join(errors))
        self.lib = lib
        lib.nvmlErrorString.restype = ctypes.c_char_p
        lib.nvmlErrorString.argtypes = [ctypes.c_int]
        init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
        self.check(init(), "nvmlInit_v2")
        self.get_memory = lib.nvmlDeviceGetMemoryInfo
        self.get_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(MemoryInfo)]
        self.get_memory.restype = ctypes.c_int
        self.procs_fn, self.proc_struct = None, ProcessInfo
        for fn_name, struct in (("nvmlDeviceGetComputeRunningProcesses_v3", ProcessInfo),
                                ("nvmlDeviceGetComputeRunningProcesses_v2", ProcessInfo),
                                ("nvmlDeviceGetComputeRunningProcesses", ProcessInfoV1)):
            fn = getattr(lib, fn_name, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p]
                fn.restype = ctypes.c_int
                self.procs_fn, self.proc_struct = fn, struct
                break
        self.proc_buffer = (self.proc_struct * 256)()
        self.mem = MemoryInfo()

    def error(self, code):
        try:
            return self.lib.nvmlErrorString(code).decode()
        except Exception:
            return f"error {code}"

    def check(self, code, what):
        if code != NVML_SUCCESS:
            raise NVMLError(f"{what} failed: {self.error(code)} ({code})")

    def handle(self, index):
        handle = ctypes.c_void_p()
        fn = getattr(self.lib, "nvmlDeviceGetHandleByIndex_v2", None) or self.lib.nvmlDeviceGetHandleByIndex
        fn.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = ctypes.c_int
        self.check(fn(index, ctypes.byref(handle)), f"nvmlDeviceGetHandleByIndex_v2({index})")
        return handle

    def name(self, handle):
        buf = ctypes.create_string_buffer(96)
        fn = self.lib.nvmlDeviceGetName
        fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return buf.value.decode() if fn(handle, buf, 96) == NVML_SUCCESS else "?"

    def memory(self, handle):
        """(used, total) in bytes."""
        code = self.get_memory(handle, ctypes.byref(self.mem))
        if code != NVML_SUCCESS:
            raise NVMLError(f"nvmlDeviceGetMemoryInfo failed: {self.error(code)} ({code})")
        return self.mem.used, self.mem.total

    def processes(self, handle):
        """{pid: used bytes} of the compute processes, or None when NVML will not tell."""
        if self.procs_fn is None:
            return None
        count = ctypes.c_uint(len(self.proc_buffer))
        code = self.procs_fn(handle, ctypes.byref(count), self.proc_buffer)
        if code != NVML_SUCCESS:
            return None
        out = {}
        for i in range(min(count.value, len(self.proc_buffer))):
            used = self.proc_buffer[i].usedGpuMemory
            # NVML_VALUE_NOT_AVAILABLE (all ones) when the driver cannot tell (e.g. in a container)
            out[self.proc_buffer[i].pid] = None if used >= (1 << 63) else int(used)
        return out

    def shutdown(self):
        try:
            self.lib.nvmlShutdown()
        except Exception:
            pass


def parse_args(argv):
    if "--" in argv:
        cut = argv.index("--")
        own, cmd = argv[:cut], argv[cut + 1:]
    else:
        own, cmd = argv, []
    parser = argparse.ArgumentParser(description="Peak NVML used memory of a command.")
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU (default 0)")
    parser.add_argument("--out", required=True, help="JSON result file")
    parser.add_argument("--interval-ms", type=float, default=1.0, help="sampling interval (default 1 ms)")
    parser.add_argument("--process-interval-ms", type=float, default=50.0,
                        help="per-process sampling interval (default 50 ms; 0: off)")
    parser.add_argument("--baseline-s", type=float, default=0.2, help="baseline window (default 0.2 s)")
    parser.add_argument("--timeout", type=float, default=0.0, help="kill CMD after this many seconds (0: never)")
    parser.add_argument("--env", action="append", default=[], metavar="VAR=VALUE", help="set for CMD only")
    parser.add_argument("--unset", action="append", default=[], metavar="VAR", help="remove from CMD's environment")
    parser.add_argument("--label", default="", help="copied into the JSON")
    parser.add_argument("--timeline", default="", help="also write every sample as CSV (seconds,used_bytes)")
    args = parser.parse_args(own)
    if not cmd:
        parser.error("no command: give it after --")
    return args, cmd


def main(argv=None):
    args, cmd = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        nvml = NVML()
        handle = nvml.handle(args.gpu)
        nvml.memory(handle)
        gpu_name = nvml.name(handle)
    except NVMLError as exc:
        sys.stderr.write(f"nvml_peak: {exc}\n")
        return 3

    # 1. the idle baseline
    base_samples = []
    t_end = time.perf_counter() + args.baseline_s
    while time.perf_counter() < t_end:
        base_samples.append(nvml.memory(handle)[0])
        time.sleep(0.001)
    base_samples.sort()
    baseline = base_samples[len(base_samples) // 2]
    total = nvml.memory(handle)[1]
    procs_before = nvml.processes(handle) if args.process_interval_ms > 0 else None
    pids_before = set(procs_before or {})

    # 2. the command
    env = dict(os.environ)
    for name in args.unset:
        env.pop(name, None)
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            sys.stderr.write(f"nvml_peak: --env wants VAR=VALUE, not {item!r}\n")
            return 2
        env[name] = value
    sys.stdout.flush()
    t0 = time.perf_counter()
    try:
        child = subprocess.Popen(cmd, env=env, start_new_session=True)
    except OSError as exc:
        sys.stderr.write(f"nvml_peak: cannot start {cmd[0]}: {exc}\n")
        return 127

    def forward(signum, _frame):
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)

    timed_out = False
    if args.timeout > 0:
        def on_timeout():
            nonlocal timed_out
            if child.poll() is None:
                timed_out = True
                sys.stderr.write(f"nvml_peak: timeout after {args.timeout:g} s: killing {cmd[0]}\n")
                forward(signal.SIGTERM, None)
                time.sleep(5)
                if child.poll() is None:
                    forward(signal.SIGKILL, None)
        timer = threading.Timer(args.timeout, on_timeout)
        timer.daemon = True
        timer.start()

    # 3. sample until it exits
    interval = args.interval_ms / 1000.0
    proc_interval = args.process_interval_ms / 1000.0
    peak, peak_t, count = baseline, 0.0, 0
    timeline = [] if args.timeline else None
    peak_procs, peak_procs_t, proc_samples, proc_known = 0, 0.0, 0, True
    next_proc = t0
    errors = 0
    while True:
        now = time.perf_counter()
        try:
            used = nvml.memory(handle)[0]
        except NVMLError:
            errors += 1
            used = None
        if used is not None:
            count += 1
            if used > peak:
                peak, peak_t = used, now - t0
            if timeline is not None:
                timeline.append((now - t0, used))
        if proc_interval > 0 and now >= next_proc:
            next_proc = now + proc_interval
            procs = nvml.processes(handle)
            if procs is not None:
                proc_samples += 1
                mine = [v for pid, v in procs.items() if pid not in pids_before]
                if any(v is None for v in mine):
                    proc_known = False
                summed = sum(v for v in mine if v is not None)
                if summed > peak_procs:
                    peak_procs, peak_procs_t = summed, now - t0
        if child.poll() is not None:
            break
        time.sleep(interval)
    wall = time.perf_counter() - t0
    rc = child.returncode
    if rc < 0:  # killed by a signal: report it as the shell would
        rc = 128 - rc
    if timed_out:
        rc = 124
    nvml.shutdown()

    result = {
        "label": args.label,
        "command": cmd,
        "gpu_index": args.gpu,
        "gpu_name": gpu_name,
        "total": total,
        "baseline_used": baseline,
        "baseline_min": base_samples[0],
        "baseline_max": base_samples[-1],
        "peak_used": peak,
        "peak_above_baseline": peak - baseline,
        "peak_at_s": round(peak_t, 4),
        "samples": count,
        "sample_errors": errors,
        "mean_interval_ms": round(1000.0 * wall / count, 4) if count else None,
        "wall_s": round(wall, 4),
        "rc": rc,
        "timed_out": timed_out,
        "process_samples": proc_samples,
        "peak_process_used": peak_procs if proc_samples and proc_known else None,
        "peak_process_at_s": round(peak_procs_t, 4) if proc_samples and proc_known else None,
        "env": {item.partition("=")[0]: item.partition("=")[2] for item in args.env},
    }
    with open(args.out, "w", encoding="utf-8") as handle_out:
        json.dump(result, handle_out, indent=1)
        handle_out.write("\n")
    if timeline is not None:
        with open(args.timeline, "w", encoding="utf-8") as handle_out:
            handle_out.write("seconds,used_bytes\n")
            for t, used in timeline:
                handle_out.write(f"{t:.5f},{used}\n")
    gib = 1 << 30
    sys.stderr.write(f"nvml_peak: {args.label or cmd[0]}: peak {peak / gib:.3f} GiB used, "
                     f"{(peak - baseline) / gib:.3f} GiB above the baseline; {count} samples in {wall:.2f} s; rc {rc}\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
