"""A single-node Slurm cluster from the distribution's packages (slurm-wlm, munge), for the tests of
deploy/slurm/hostpin-gate: munged, slurmctld and slurmd run as root from a private directory, on
their own ports and munge socket, so nothing of the machine's own Slurm or munge is used or changed.
Everything is stopped and removed on exit, also when a test fails.

    with SlurmCluster(prolog=..., healthcheck=...) as c:
        c.submit("echo hi"); c.node()  # -> {"state": "idle", "reason": "none"}
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

NODE = "hostpin-test"
BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "srun", "sinfo", "squeue", "scancel")


def missing_binaries() -> list[str]:
    paths = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [b for b in BINARIES if shutil.which(b, path=paths) is None]


def _which(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmError(RuntimeError):
    pass


def _die_with_parent() -> None:
    """In the daemon before exec: SIGTERM when the test process dies, even by SIGKILL, so that no
    munged, slurmctld or slurmd outlives a test run that was killed before its clean-up."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 15, 0, 0, 0)


class SlurmCluster:
    def __init__(self, prolog: str | None = None, healthcheck: str | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="hostpin-slurm-", dir="/tmp"))
        self.conf = self.dir / "slurm.conf"
        self.prolog, self.healthcheck = prolog, healthcheck
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: dict[str, subprocess.Popen] = {}

    # -- set up --------------------------------------------------------------------------------------
    def _write_conf(self, health_interval: int = 0) -> None:
        d = self.dir
        ctld_port, slurmd_port = _free_ports(2)
        if not hasattr(self, "_ports"):
            self._ports = (ctld_port, slurmd_port)
        ctld_port, slurmd_port = self._ports
        lines = [
            "ClusterName=hostpintest", f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={d}/munge/munge.sock",
            "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log", f"SlurmdLogFile={d}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "MpiDefault=none",
            "ReturnToService=2", "SlurmctldTimeout=30", "SlurmdTimeout=30", "MinJobAge=600",
            f"NodeName={NODE} NodeHostname={socket.gethostname().split('.')[0]} NodeAddr=127.0.0.1 CPUs=1 "
            "RealMemory=100 State=UNKNOWN",
            f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=10 State=UP",
        ]
        if self.prolog:
            lines.append(f"Prolog={self.prolog}")
        if self.healthcheck and health_interval:
            lines += [f"HealthCheckProgram={self.healthcheck}", f"HealthCheckInterval={health_interval}",
                      "HealthCheckNodeState=IDLE"]
        self.conf.write_text("\n".join(lines) + "\n")

    def __enter__(self) -> "SlurmCluster":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(mode=0o700)
        os.chmod(d, 0o755)
        (d / "munge/munge.key").write_bytes(os.urandom(1024))
        os.chmod(d / "munge/munge.key", 0o400)
        self._daemon("munged", [_which("munged"), "--foreground", "--force", f"--key-file={d}/munge/munge.key",
                                f"--socket={d}/munge/munge.sock", f"--pid-file={d}/munge/munged.pid",
                                f"--log-file={d}/log/munged.log", f"--seed-file={d}/munge/munged.seed"],
                     lambda: (d / "munge/munge.sock").exists())
        self._write_conf()
        self._daemon("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)],
                     lambda: self.run("scontrol", "ping", check=False).find("is UP") >= 0)
        self._daemon("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", NODE],
                     lambda: self.node()["state"] == "idle")

    def _daemon(self, name: str, argv: list[str], ready) -> None:
        """Run in the foreground as our child (so it is ours to stop and to reap), until ready() holds."""
        log = open(self.dir / "log" / f"{name}.stderr", "wb")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            start_new_session=True, preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + 30
        while not ready():
            if self.procs[name].poll() is not None:
                raise SlurmError(f"{name} exited {self.procs[name].returncode}: "
                                 f"{(self.dir / 'log' / f'{name}.stderr').read_text(errors='replace')[-500:]}")
            if time.monotonic() > deadline:
                raise SlurmError(f"{name} not ready after 30 s: {self.log(name)[-500:]}")
            time.sleep(0.1)

    def reconfigure(self, health_interval: int = 0) -> None:
        self._write_conf(health_interval)
        self.run("scontrol", "reconfigure")

    # -- use -------------------------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True) -> str:
        proc = subprocess.run([_which(argv[0]), *argv[1:]], env=self.env, capture_output=True, text=True,
                              timeout=30)
        if check and proc.returncode != 0:
            raise SlurmError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def node(self) -> dict[str, str]:
        out = self.run("sinfo", "--noheader", "--Node", f"--nodes={NODE}", "--format=%T|%E", check=False).strip()
        state, _, reason = out.partition("|")
        return {"state": state, "reason": reason}

    def submit(self, command: str) -> str:
        out = self.dir / "job-%j.out"
        return self.run("sbatch", "--parsable", f"--output={out}", "--wrap", command).strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        text = self.run("scontrol", "show", "job", job_id, "--oneliner", check=False)
        fields = {}
        for part in text.split():
            key, eq, value = part.partition("=")
            if eq:
                fields[key] = value
        return fields

    def job_output(self, job_id: str) -> str:
        path = self.dir / f"job-{job_id}.out"
        return path.read_text() if path.exists() else ""

    def wait(self, condition, timeout: float, what: str, interval: float = 0.2):
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise SlurmError(f"timed out after {timeout:.0f} s waiting for {what}; node {self.node()}; "
                                 f"slurmd log tail: {self.log('slurmd')[-600:]}")
            time.sleep(interval)

    def log(self, name: str) -> str:
        path = self.dir / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- tear down ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """scancel and scontrol shutdown, then each daemon, our child, by its own process: TERM, then KILL."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", f"--nodelist={NODE}", check=False)
            self.run("scontrol", "shutdown", check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            steps = [(proc.terminate, 5.0), (proc.kill, 5.0)]
            if name != "munged":  # the Slurm daemons leave on `scontrol shutdown`; give them the time
                steps.insert(0, (None, 5.0))
            for stop, wait in steps:
                if stop is not None:
                    stop()
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        shutil.rmtree(self.dir, ignore_errors=True)
