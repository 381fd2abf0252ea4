#!/usr/bin/env python3
"""The SPANK plugin on a one-node Slurm (munged, slurmctld, slurmd on
loopback; configuration, state and logs in a temporary directory; CPUs as
the resources, the fake GPU of tests/shim as the device).

Checks:
  1. `srun -n 2 --poolshim=CONFIG --poolshim-stats=DIR` of the fake-GPU
     program: both tasks under the shim with CONFIG's stack, one statistics
     file per task named by job, step, node and rank, whose reports carry
     them; `poolshim stats DIR` merges the two.
  2. A job without the options: no shim, no poolshim variable, no preload.
  3. A bad CONFIG: srun and sbatch refuse it at submission with the
     checker's messages, whether plugstack.conf says required or optional;
     the job never exists (its command leaves no trace and the next job's
     id follows the last good one).
  4. `#SBATCH --poolshim --poolshim-stats=DIR`: the batch script and the
     srun inside it run under the shim (step "batch", then step 0).
  5. plugstack.conf's config= and stats= are what a bare --poolshim uses.
  6. A library= missing on the node: the tasks do not start, the reason is said.
Skips with one line where Slurm or munge is absent or will not start.
Usage: POOLSHIM_BUILD=build tests/cluster/test_slurm.py
"""
import glob
import json
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemons import BUILD, Checks, Daemons, Skip, clean_environment, free_ports, need_programs, skip, tail, wait_until

NAME = "slurm"
build = os.path.abspath(BUILD)
plugin = os.path.join(build, "slurm", "spank_poolshim.so")
cli = os.path.join(build, "poolshim")
program = os.path.join(build, "shimtest", "prog_runtime")

GOOD_INI = """; a stack under another name, so the report shows this file was read
[resource.clustered]
type = pool
[device.*]
resource = clustered
"""
SITE_INI = GOOD_INI.replace("clustered", "sitewide")
BAD_INI = """[global]
stats = maybe
[resource.main]
type = pool
initial_size = lots
"""


def write(path, text, mode=0o644):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def start_cluster(d):
    """munged, slurmctld, slurmd; returns the environment for srun and sbatch."""
    need_programs("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo")
    if not os.path.exists(plugin):
        raise Skip(f"{plugin} was not built (no slurm/spank.h: libslurm-dev)")
    for f in (cli, program):
        if not os.path.exists(f):
            raise Skip(f"{f} is missing (make all test-shim builds it)")
    key_dir, sock_dir = os.path.join(d.dir, "munge"), os.path.join(d.dir, "sock")
    os.mkdir(key_dir, 0o700)
    os.mkdir(sock_dir, 0o755)
    with open(os.path.join(key_dir, "munge.key"), "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(os.path.join(key_dir, "munge.key"), 0o400)
    socket_path = os.path.join(sock_dir, "munge.sock")
    d.start("munged", ["munged", "-F", "--socket=" + socket_path, "--key-file=" + key_dir + "/munge.key",
                       "--log-file=" + key_dir + "/munged.log", "--pid-file=" + key_dir + "/munged.pid",
                       "--seed-file=" + key_dir + "/munged.seed"])
    if not wait_until(lambda: os.path.exists(socket_path), 10):
        raise Skip("munged did not start: " + tail(d.log_of("munged"), 3).replace("\n", " | "))

    host = socket.gethostname().split(".")[0]
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    ctld_port, d_port = free_ports(2)
    for sub in ("state", "spool", "log"):
        os.mkdir(os.path.join(d.dir, sub))
    conf = os.path.join(d.dir, "slurm.conf")
    write(conf, f"""ClusterName=poolshimtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={d.dir}/state
SlurmdSpoolDir={d.dir}/spool
SlurmctldPidFile={d.dir}/slurmctld.pid
SlurmdPidFile={d.dir}/slurmd.pid
SlurmctldLogFile={d.dir}/log/slurmctld.log
SlurmdLogFile={d.dir}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
PlugStackConfig={d.dir}/plugstack.conf
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    write(os.path.join(d.dir, "plugstack.conf"), f"required {plugin}\n")
    env = clean_environment(SLURM_CONF=conf, LD_LIBRARY_PATH=os.path.join(build, "fake"),
                            POOLSHIM_TEST_NEIGHBOURS_DIR=os.path.join(d.dir, "registry"))
    d.start("slurmctld", ["slurmctld", "-D", "-f", conf], env=env)
    d.start("slurmd", ["slurmd", "-D", "-f", conf], env=env)

    def idle():
        if not d.alive("slurmctld") or not d.alive("slurmd"):
            return "dead"
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        return "idle" if r.stdout.strip() == "idle" else None
    state = wait_until(idle, 30, 0.25)
    if state != "idle":
        why = "slurmctld" if not d.alive("slurmctld") else "slurmd" if not d.alive("slurmd") else "the node"
        log = d.log_of("slurmd" if why == "slurmd" else "slurmctld")
        raise Skip(f"{why} did not come up in 30 s: " + tail(log, 2).replace("\n", " | "))
    return env


def run(argv, env, cwd, timeout=60):
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def report(path):
    with open(path) as f:
        return json.load(f)


def main():
    d = Daemons(NAME)
    try:
        try:
            env = start_cluster(d)
        except Skip as why:
            d.stop_all()
            d.remove()
            skip(NAME, why)
        host = socket.gethostname().split(".")[0]
        check = Checks(NAME)
        work = os.path.join(d.dir, "work")
        os.mkdir(work)
        write(os.path.join(work, "good.ini"), GOOD_INI)
        write(os.path.join(work, "bad.ini"), BAD_INI)

        # 1. srun -n 2 --poolshim=CONFIG --poolshim-stats=DIR
        r = run(["srun", "-n", "2", "--poolshim=good.ini", "--poolshim-stats=out", program, "basic"], env, work)
        check.expect(r.returncode == 0 and r.stdout.count("OK basic (shim active)") == 2,
                     "srun -n 2 --poolshim: both tasks run under the shim", r.stdout + r.stderr)
        files = sorted(glob.glob(os.path.join(work, "out", "*.json")))
        names = [os.path.basename(f) for f in files]
        job = names[0].split("_")[1].split(".")[0] if names else "?"
        want = [f"poolshim_{job}.0_{host}_rank0.json", f"poolshim_{job}.0_{host}_rank1.json"]
        check.expect(names == want, "one statistics file per task, named by job, step, node and rank",
                     f"{names}, wanted {want}")
        for rank, f in enumerate(files[:2]):
            rep = report(f)
            place = {k: rep.get(k) for k in ("rank", "local_rank", "node", "hostname", "job", "step")}
            check.expect(place == {"rank": rank, "local_rank": rank, "node": 0, "hostname": host, "job": job,
                                   "step": "0"}, f"rank {rank}'s report says where it ran", str(place))
            stack = rep["devices"][0].get("stack") if rep.get("devices") else None
            check.expect(stack == "clustered", f"rank {rank} ran with --poolshim's configuration", f"stack {stack}")
        r = run([cli, "stats", "out"], env, work)
        lines = r.stdout.splitlines()
        rows = [l.split()[0] for l in lines[3:] if l.strip() and not l.startswith("peaks")]
        check.expect(r.returncode == 0 and "poolshim stats: 2 processes" in r.stdout and rows == ["0", "1", "total"],
                     "poolshim stats merges the two tasks: rank 0, rank 1, total", r.stdout + r.stderr)
        r = run([cli, "stats", "--json", "out"], env, work)
        merged = json.loads(r.stdout) if r.returncode == 0 else {}
        calls = [p.get("calls") for p in merged.get("processes", [])]
        check.expect(merged.get("total", {}).get("processes") == 2 and calls == [1200, 1200]
                     and merged["total"].get("calls") == 2400,
                     "poolshim stats --json: 1,200 calls per task (prog_runtime basic), 2,400 in all", r.stdout)

        # 2. a job without the options
        r = run(["srun", "-n", "2", program, "basic"], env, work)
        check.expect(r.returncode == 0 and r.stdout.count("OK basic (shim inactive)") == 2,
                     "srun without --poolshim: no shim in either task", r.stdout + r.stderr)
        r = run(["srun", "-n", "1", "env"], env, work)
        plugin_sets = ("LD_PRELOAD=", "POOLSHIM_CONFIG=", "POOLSHIM_STATS=", "POOLSHIM_STATS_FILE=")
        leaked = [l for l in r.stdout.splitlines() if l.startswith(plugin_sets)]
        check.expect(r.returncode == 0 and not leaked and "SLURM_JOB_ID=" in r.stdout,
                     "srun without --poolshim: no preload, no poolshim setting", str(leaked))
        last_job = int([l for l in r.stdout.splitlines() if l.startswith("SLURM_JOB_ID=")][0].split("=")[1]) \
            if r.returncode == 0 else -1

        # 3. a bad configuration is refused at submission
        marker = os.path.join(work, "ran")
        r = run(["srun", "-n", "2", "--poolshim=bad.ini", "touch", marker], env, work)
        check.expect(r.returncode != 0 and "--poolshim=bad.ini: the configuration is invalid; the job is not "
                     "submitted" in r.stderr and "bad value `lots` for `initial_size`" in r.stderr,
                     "srun --poolshim=bad.ini: refused with the checker's messages", r.stderr)
        r2 = run(["srun", "--poolshim=missing.ini", "touch", marker], env, work)
        check.expect(r2.returncode != 0 and "--poolshim=missing.ini: cannot read the configuration" in r2.stderr,
                     "srun --poolshim=missing.ini: refused, the file named", r2.stderr)
        write(os.path.join(d.dir, "plugstack.conf"), f"optional {plugin}\n")
        r2 = run(["srun", "--poolshim-stats=out", "--poolshim=bad.ini", "touch", marker], env, work)
        check.expect(r2.returncode != 0 and "the configuration is invalid; the job is not submitted" in r2.stderr,
                     "an optional plugin in plugstack.conf refuses it too", r2.stderr)
        write(os.path.join(d.dir, "plugstack.conf"), f"required {plugin}\n")
        write(os.path.join(work, "bad.sh"), f"#!/bin/sh\n#SBATCH --poolshim=bad.ini\ntouch {marker}\n", 0o755)
        r3 = run(["sbatch", "bad.sh"], env, work)
        check.expect(r3.returncode != 0 and "the configuration is invalid; the job is not submitted" in r3.stderr
                     and "Submitted batch job" not in r3.stdout,
                     "#SBATCH --poolshim=bad.ini: sbatch refuses it", r3.stdout + r3.stderr)
        r = run(["srun", "-n", "1", "sh", "-c", "echo $SLURM_JOB_ID"], env, work)
        next_job = int(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip().isdigit() else -1
        check.expect(not os.path.exists(marker) and next_job == last_job + 1,
                     "the refused jobs never existed: nothing ran, the next job id follows the last good one",
                     f"marker {os.path.exists(marker)}, ids {last_job} then {next_job}")

        # 4. #SBATCH --poolshim: the batch script and its srun under the shim
        write(os.path.join(work, "good.sh"), f"""#!/bin/sh
#SBATCH -n 2
#SBATCH --poolshim=good.ini
#SBATCH --poolshim-stats=batch_out
{program} basic
srun -n 2 {program} basic
""", 0o755)
        r = run(["sbatch", "-W", "-o", "batch.txt", "good.sh"], env, work, timeout=120)
        job = r.stdout.split()[-1] if r.returncode == 0 else "?"
        with open(os.path.join(work, "batch.txt")) if os.path.exists(os.path.join(work, "batch.txt")) else \
                open(os.devnull) as f:
            out = f.read()
        names = sorted(os.path.basename(f) for f in glob.glob(os.path.join(work, "batch_out", "*.json")))
        want = sorted([f"poolshim_{job}.batch_{host}_rank0.json", f"poolshim_{job}.0_{host}_rank0.json",
                       f"poolshim_{job}.0_{host}_rank1.json"])
        check.expect(r.returncode == 0 and out.count("OK basic (shim active)") == 3 and names == want,
                     "#SBATCH --poolshim: the script (step batch) and its srun (step 0, 2 ranks) under the shim",
                     f"{r.stdout}{r.stderr}{out}files {names}, wanted {want}")

        # 5. the site's defaults in plugstack.conf
        write(os.path.join(d.dir, "site.ini"), SITE_INI)
        write(os.path.join(d.dir, "plugstack.conf"),
              f"required {plugin} config={d.dir}/site.ini stats={d.dir}/site_stats\n")
        r = run(["srun", "-n", "1", "--poolshim", program, "basic"], env, work)
        files = glob.glob(os.path.join(d.dir, "site_stats", "*.json"))
        stack = report(files[0])["devices"][0].get("stack") if len(files) == 1 else None
        check.expect(r.returncode == 0 and "shim active" in r.stdout and stack == "sitewide",
                     "plugstack.conf config= and stats=: a bare --poolshim uses them",
                     f"{r.stdout}{r.stderr}files {files}, stack {stack}")

        # 6. a library missing on the node: the tasks do not start, the reason is said
        write(os.path.join(d.dir, "plugstack.conf"), f"required {plugin} library={d.dir}/absent/libpoolshim.so\n")
        r = run(["srun", "-n", "1", "--poolshim", "sh", "-c", "echo ran"], env, work)
        check.expect("ran" not in r.stdout and "the library " + d.dir + "/absent/libpoolshim.so cannot be read on "
                     "this node" in r.stderr, "a library missing on the node: no task starts, the reason is said",
                     r.stdout + r.stderr)
        check.finish()
    finally:
        d.close()


if __name__ == "__main__":
    main()
