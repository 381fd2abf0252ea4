#!/usr/bin/env python3
"""poolshim's metrics in a real Prometheus: `poolshim top --prometheus
--textfile DIR` feeds a real node_exporter's textfile collector, which a
real Prometheus scrapes every second (both on loopback, their data in a
temporary directory), and the shipped rules pass promtool.

Checks:
  1. tools/prometheus/poolshim.rules.yml: `promtool check rules`, and its
     unit tests `promtool test rules poolshim.rules.test.yml`.
  2. While a program under the shim (the fake GPU) holds memory, a query
     through Prometheus' HTTP API returns every poolshim_* series of it,
     with labels pid, device, rank, jobid, user and command (a command
     with quotes, a backslash, a newline and UTF-8: the newline shown as
     '?', as poolshim top shows every control character, the rest
     unchanged), and the
     reserved bytes its exit report gives; once it has exited, none.
  3. The service removes its file when stopped.
  4. As root, --all-users: the processes of two users, each with its user.
Skips with one line where Prometheus or node_exporter is absent or will not start.
Usage: POOLSHIM_BUILD=build tests/cluster/test_prometheus.py
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemons import (BUILD, Checks, Daemons, Skip, clean_environment, free_ports, http_json, need_programs, skip,
                     tail, wait_until)

NAME = "prometheus"
here = os.path.dirname(os.path.abspath(__file__))
rules_dir = os.path.join(here, "..", "..", "tools", "prometheus")
build = os.path.abspath(BUILD)
cli = os.path.join(build, "poolshim")
library = os.path.join(build, "libpoolshim.so")
holder_program = os.path.join(build, "shimtest", "prog_neighbours")
METRICS = ["poolshim_requested_bytes", "poolshim_requested_peak_bytes", "poolshim_reserved_bytes",
           "poolshim_reserved_peak_bytes", "poolshim_allocations_total", "poolshim_allocation_failures_total",
           "poolshim_allocation_seconds_total", "poolshim_barriers_total", "poolshim_maps_total",
           "poolshim_given_back_bytes_total", "poolshim_oom_retries_total"]


def exporter_binary():
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def start_monitoring(d, textdir):
    """node_exporter and Prometheus; returns Prometheus' URL once it scrapes."""
    need_programs("prometheus", "promtool")
    exporter = exporter_binary()
    if not exporter:
        raise Skip("not installed: prometheus-node-exporter (make deps installs it)")
    for f in (cli, library, holder_program):
        if not os.path.exists(f):
            raise Skip(f"{f} is missing (make all test-shim builds it)")
    exporter_port, prometheus_port = free_ports(2)
    d.start("node_exporter", [exporter, f"--web.listen-address=127.0.0.1:{exporter_port}",
                              "--collector.disable-defaults", "--collector.textfile",
                              "--collector.textfile.directory=" + textdir])
    config = os.path.join(d.dir, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: node
    static_configs:
      - targets: ['127.0.0.1:{exporter_port}']
""")
    d.start("prometheus", ["prometheus", "--config.file=" + config, "--storage.tsdb.path=" + d.dir + "/data",
                           f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn"])
    url = f"http://127.0.0.1:{prometheus_port}"

    def scraping():
        if not d.alive("prometheus") or not d.alive("node_exporter"):
            return "dead"
        try:
            up = http_json(url + "/api/v1/query", {"query": 'up{job="node"}'})["data"]["result"]
            return "up" if up and up[0]["value"][1] == "1" else None
        except OSError:
            return None
    state = wait_until(scraping, 40, 0.25)
    if state != "up":
        which = "node_exporter" if not d.alive("node_exporter") else "prometheus"
        raise Skip(f"{which} did not come up in 40 s: " + tail(d.log_of(which), 2).replace("\n", " | "))
    return url


def printable(text):
    """A command as poolshim top shows it: '?' for each C0 control character or DEL."""
    return "".join("?" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in text)


def query(url, promql):
    try:
        return http_json(url + "/api/v1/query", {"query": promql})["data"]["result"]
    except OSError:
        return []


class Holder:
    """prog_neighbours hold: a program under the shim holding 3 blocks of
    1 MiB + 1000 bytes until told to end (its exit report on stderr)."""

    def __init__(self, d, name, registry, job, rank, argv0=None, user=None):
        self.signals = os.path.join(d.dir, name)
        os.mkdir(self.signals)
        os.chmod(self.signals, 0o777)
        self.output = os.path.join(d.dir, name + ".txt")
        env = clean_environment(LD_PRELOAD=library, LD_LIBRARY_PATH=os.path.join(build, "fake"),
                                POOLSHIM_TEST_NEIGHBOURS_DIR=registry, FAKE_CUDA_MEMORY="268435456",
                                POOLSHIM_DECAY_MS="0", POOLSHIM_STATS="json", SLURM_JOB_ID=job, RANK=str(rank),
                                FAKE_CUDA_SHARED_CAPACITY_FILE=os.path.join(self.signals, "capacity"))
        argv = [argv0 or holder_program, "hold", self.signals, "6"]
        if user:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] + argv
        with open(self.output, "w") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                            stdin=subprocess.DEVNULL, cwd=d.dir)
        self.ready = wait_until(lambda: os.path.exists(os.path.join(self.signals, "ready"))
                                or self.process.poll() is not None, 15) and self.process.poll() is None
        self.command = " ".join(argv[argv.index("--") + 1:] if user else argv)

    def end(self):
        open(os.path.join(self.signals, "release"), "w").close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with open(self.output, errors="replace") as f:
            text = f.read()
        report = text[text.find('{"poolshim": 1'):] if '{"poolshim": 1' in text else "{}"
        try:
            return self.process.returncode, json.loads(report.strip().splitlines()[0]) if report else {}
        except (json.JSONDecodeError, IndexError):
            return self.process.returncode, {}


def main():
    check = Checks(NAME)
    d = Daemons(NAME)
    service = None
    try:
        textdir = os.path.join(d.dir, "textfile")
        os.mkdir(textdir)
        try:
            url = start_monitoring(d, textdir)
        except Skip as why:
            d.stop_all()
            d.remove()
            skip(NAME, why)

        # 1. the shipped rules
        r = subprocess.run(["promtool", "check", "rules", "poolshim.rules.yml"], cwd=rules_dir, capture_output=True,
                           text=True)
        check.expect(r.returncode == 0 and "SUCCESS" in r.stdout, "promtool check rules poolshim.rules.yml",
                     r.stdout + r.stderr)
        r = subprocess.run(["promtool", "test", "rules", "poolshim.rules.test.yml"], cwd=rules_dir,
                           capture_output=True, text=True)
        check.expect(r.returncode == 0 and "SUCCESS" in r.stdout, "promtool test rules poolshim.rules.test.yml",
                     r.stdout + r.stderr)

        # 2. one user's processes: series while the program runs, none after
        registry = os.path.join(d.dir, "registry")
        service = subprocess.Popen([cli, "top", "--prometheus", "--textfile", textdir, "--interval", "1", "--dir",
                                    registry], stdout=subprocess.DEVNULL, stderr=open(d.dir + "/service.txt", "w"))
        odd = os.path.join(d.dir, 'bin', 'prög "q" \\b\nl')
        os.makedirs(os.path.dirname(odd))
        os.symlink(holder_program, odd)
        holder = Holder(d, "holder", registry, "31337", 3, argv0=odd)
        check.expect(holder.ready, "the program under the shim holds its memory", tail(holder.output))
        found = wait_until(lambda: query(url, 'poolshim_reserved_bytes{jobid="31337"}'), 20, 0.25) or []
        labels = found[0]["metric"] if found else {}
        me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        want = {"__name__": "poolshim_reserved_bytes", "pid": str(holder.process.pid), "device": "0", "rank": "3",
                "jobid": "31337", "user": me, "command": printable(holder.command), "job": "node"}
        check.expect(len(found) == 1 and {k: labels.get(k) for k in want} == want,
                     "Prometheus returns the program's series with pid, device, rank, jobid, user and command",
                     f"{found}\nwanted {want}")
        names = sorted(s["metric"]["__name__"] for s in query(url, '{__name__=~"poolshim_.+",jobid="31337"}'))
        check.expect(names == sorted(METRICS), f"all {len(METRICS)} poolshim_* series of the program",
                     f"{names}")
        reserved = int(found[0]["value"][1]) if found else -1
        rc, report = holder.end()
        at_exit = report.get("devices", [{}])[0].get("bytes", {}).get("reserved_current")
        check.expect(rc == 0 and reserved == at_exit and reserved > 0,
                     "its reserved bytes in Prometheus are its exit report's", f"{reserved} vs {at_exit}, rc {rc}")
        gone = wait_until(lambda: not query(url, '{__name__=~"poolshim_.+",jobid="31337"}'), 20, 0.25)
        check.expect(gone, "once it has exited, Prometheus returns no poolshim_* series of it",
                     str(query(url, '{__name__=~"poolshim_.+",jobid="31337"}')))

        # 3. the service removes its file when stopped
        service.terminate()
        service.wait(timeout=10)
        check.expect(service.returncode == 0 and not os.listdir(textdir),
                     "SIGTERM: the service ends and removes its file", f"rc {service.returncode}, {os.listdir(textdir)}")
        service = None

        # 4. every user's processes (root)
        if os.geteuid() != 0 or not shutil.which("setpriv"):
            print("skip --all-users: needs root and setpriv")
        else:
            parent = os.path.join(d.dir, "shm")
            os.mkdir(parent)
            os.chmod(parent, 0o1777)
            os.chmod(d.dir, 0o755)
            nobody = int(subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True).stdout.strip() or 65534)
            service = subprocess.Popen([cli, "top", "--prometheus", "--all-users", "--dir", parent, "--textfile",
                                        textdir, "--interval", "1"], stdout=subprocess.DEVNULL,
                                       stderr=open(d.dir + "/service_all.txt", "w"))
            mine = Holder(d, "root_holder", os.path.join(parent, "poolshim-0"), "31338", 0)
            theirs = Holder(d, "nobody_holder", os.path.join(parent, f"poolshim-{nobody}"), "31338", 1,
                            user=nobody)
            check.expect(mine.ready and theirs.ready, "two users' programs under the shim",
                         tail(mine.output) + tail(theirs.output))

            def both():
                series = query(url, 'poolshim_reserved_bytes{jobid="31338"}')
                return series if len(series) == 2 else None
            series = wait_until(both, 20, 0.25) or []
            users = sorted((s["metric"]["user"], s["metric"]["pid"]) for s in series)
            want = sorted([("root", str(mine.process.pid)), ("nobody", str(theirs.process.pid))])
            check.expect(users == want, "--all-users (root): both users' processes, each with its user",
                         f"{users}, wanted {want}; {tail(d.dir + '/service_all.txt', 3)}")
            mine.end()
            theirs.end()
        check.finish()
    finally:
        if service and service.poll() is None:
            service.terminate()
            service.wait(timeout=10)
        d.close()


if __name__ == "__main__":
    main()
