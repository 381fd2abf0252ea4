"""Real daemons on loopback for the cluster tests (tests/cluster/).

Each daemon runs in the foreground as a child of the test, with its
configuration, state and logs in the test's temporary directory, on ports
the kernel hands out; it is stopped by its process id (SIGTERM, then
SIGKILL). A test that cannot start what it needs prints one line,
"SKIP <test>: why", and exits 0, so a machine without the daemons stays green.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

BUILD = os.environ.get("POOLSHIM_BUILD", "build")


class Skip(Exception):
    """The test cannot run here (a daemon or tool is missing or will not start)."""


def skip(name, why):
    print(f"SKIP {name}: {why}")
    sys.exit(0)


def need_programs(*names):
    missing = [n for n in names if not shutil.which(n)]
    if missing:
        raise Skip("not installed: " + ", ".join(missing) + " (make deps installs them)")


def free_ports(count):
    """Ports nothing listens on now (bound, read and closed together)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def clean_environment(**extra):
    """The caller's environment without Slurm's, poolshim's and the preload
    (a CI job may itself run under Slurm), plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("SLURM_") or k.startswith("POOLSHIM_") or k.startswith("SBATCH_")
                   or k.startswith("SRUN_") or k == "LD_PRELOAD")}
    env.update(extra)
    return env


def wait_until(what, seconds, step=0.1):
    """Calls what() until it returns a true value (returned) or time runs out (None)."""
    deadline = time.monotonic() + seconds
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(step)


def tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no %s)" % path


class Daemons:
    """The daemons one test started; stop_all() ends them, newest first."""

    def __init__(self, name):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"poolshim-{name}-")
        os.chmod(self.dir, 0o755)  # (munged wants its socket's directories searchable by all)
        self.started = []  # (name, Popen, log path)

    def start(self, label, argv, env=None):
        log = os.path.join(self.dir, label + ".out")
        with open(log, "w") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, cwd=self.dir)
        self.started.append((label, process, log))
        return process

    def alive(self, label):
        return any(l == label and p.poll() is None for l, p, _ in self.started)

    def log_of(self, label):
        return next((log for l, _, log in self.started if l == label), "")

    def stop_all(self):
        for label, process, _ in reversed(self.started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for label, process, _ in reversed(self.started):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.started = []

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def close(self):
        """Stops every daemon, then removes the directory, unless POOLSHIM_KEEP asks to keep it."""
        self.stop_all()
        if os.environ.get("POOLSHIM_KEEP"):
            print(f"kept {self.dir}")
        else:
            self.remove()


def http_json(url, params=None, timeout=5):
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


class Checks:
    """Counts failed expectations; each prints one line with what was seen."""

    def __init__(self, name):
        self.name = name
        self.failures = 0
        self.passed = 0

    def expect(self, condition, what, seen=""):
        if condition:
            self.passed += 1
            print(f"ok   {what}")
        else:
            self.failures += 1
            print(f"FAIL {what}" + (f"\n     seen: {seen}" if seen else ""))
        return condition

    def finish(self):
        print(f"{self.name}: {self.passed} passed, {self.failures} failed")
        sys.exit(1 if self.failures else 0)
