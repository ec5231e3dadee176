"""A real one-node Slurm cluster on 127.0.0.1 for the tests: Debian's munge, slurmctld and slurmd
started as plain processes (no systemd), configuration and state in a fresh folder.

Needs root (slurmd runs jobs as their user; munged and the daemons read /etc/munge) and the Debian
packages ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them on CI)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from flows.server import stop_child

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing() -> str:
    """Why a one-node Slurm cannot be started here ('' when it can)."""
    absent = [d for d in DAEMONS + ("sbatch", "squeue", "sinfo") if shutil.which(d) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the one-node Slurm fixture must run as root"
    return ""


def _conf(root: Path, cpus: int, mem_mb: int, port: int) -> str:
    return f"""ClusterName=embedsweep
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={port}
SlurmdPort={port + 1}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=normal Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _ensure_munge_key() -> None:
    key = Path("/etc/munge/munge.key")
    if not key.exists() or key.stat().st_size < 32:
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(1024))
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)


def _munge_running() -> bool:
    return subprocess.run(["munge", "-n"], capture_output=True).returncode == 0


@contextlib.contextmanager
def one_node_slurm(root: Path, port: int = 6917):
    """Start munged (unless one answers), slurmctld and slurmd with a configuration in ``root``;
    yield the environment (``SLURM_CONF``) that the Slurm client commands need; stop what was
    started."""
    root = Path(root)
    for sub in ("state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    cpus = os.cpu_count() or 1
    mem_mb = int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, cpus, mem_mb, port))
    env = dict(os.environ, SLURM_CONF=str(conf))
    started: list[subprocess.Popen] = []
    try:
        if not _munge_running():
            _ensure_munge_key()
            for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
                Path(d).mkdir(parents=True, exist_ok=True)
                shutil.chown(d, "munge", "munge")
            started.append(
                subprocess.Popen(
                    ["runuser", "-u", "munge", "--", "munged", "--foreground", "--force"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            _wait(_munge_running, 20, "munged did not answer `munge -n`")
        for daemon in ("slurmctld", "slurmd"):
            started.append(
                subprocess.Popen(
                    [daemon, "-D", "-f", str(conf)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,  # both log to files in root
                )
            )
            time.sleep(1.0)

        def idle():
            out = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True
            ).stdout
            return out.strip() in ("idle", "mixed", "allocated")

        _wait(idle, 60, f"the Slurm node did not come up idle; see {root}/slurmctld.log, slurmd.log")
        yield env
    finally:
        subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True)
        for p in reversed(started):
            stop_child(p)


def _wait(cond, seconds, message):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.5)
    raise RuntimeError(message)
