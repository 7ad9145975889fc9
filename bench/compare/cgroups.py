"""The same CPU for each system under test, on a machine that others load: cgroup v1 ``cpu``.

On a shared machine the kernel splits the cores between sessions (autogroup), then between
processes by niceness. A system whose processes sit in many sessions (Ray daemonizes its
raylet, GCS and workers) then gets more of the cores than one whose processes share one
(``modelplex local``), and the comparison measures that, not the systems. So each system
runs in a cgroup of its own with the same CFS quota (``--cpus``) and the same weight, and the
load generator in a third; inside a group, the processes split its CPU as they would in a
Kubernetes pod with that CPU limit.

The groups sit at the top of the hierarchy (``/sys/fs/cgroup/cpu/modelplex-bench-<pid>-<name>``),
where their weight counts against other sessions' (a nested group only splits its parent's
default weight), and are removed, their processes moved back to the root group, when the run
ends.

A small machine is reproduced on any machine with ``shared=True`` (``--shared-cpus 2``): one
group with a quota of two cores and a cpuset of two CPUs, holding the load generator and both
systems (each in its turn), so that they compete for two cores as they do on a 2-core machine
or in a pod with a 2-CPU limit.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")
#: The weight of each group. Another session's processes weigh 1024 together (autogroup), so
#: a group of this weight gets its quota even while other people's tests load the machine.
SHARES = 8192


def available() -> str | None:
    """Why CPU groups cannot be used here, or None when they can."""
    if not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {CPU_ROOT}"
    if not os.access(CPU_ROOT, os.W_OK):
        return f"{CPU_ROOT} is not writable (run as root)"
    return None


def first_cpus(count: int) -> str | None:
    """The cpuset of this process's first ``count`` CPUs (``"0-1"``), or None where there are fewer."""
    allowed = sorted(os.sched_getaffinity(0))
    return ",".join(map(str, allowed[:count])) if len(allowed) >= count else None


class CpuGroup:
    """One cgroup with a CPU quota of ``cores`` (None: no quota, weight only), and where ``cpus``
    is given, a cpuset of those CPUs beside it: a quota alone lets a group's threads run on every
    core of a large machine at once, which a small machine's cores do not."""

    def __init__(self, name: str, cores: float | None, shares: int = SHARES, cpus: str | None = None):
        self.name, self.cores, self.shares, self.cpus = name, cores, shares, cpus
        self.path = CPU_ROOT / f"modelplex-bench-{os.getpid()}-{name}"
        self.cpuset_path = CPUSET_ROOT / self.path.name if cpus is not None else None

    def create(self) -> CpuGroup:
        self.path.mkdir(exist_ok=True)
        period = int((self.path / "cpu.cfs_period_us").read_text())
        quota = -1 if self.cores is None else int(self.cores * period)
        (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        (self.path / "cpu.shares").write_text(str(self.shares))
        if self.cpuset_path is not None:
            self.cpuset_path.mkdir(exist_ok=True)
            (self.cpuset_path / "cpuset.cpus").write_text(str(self.cpus))
            (self.cpuset_path / "cpuset.mems").write_text((CPUSET_ROOT / "cpuset.mems").read_text().strip())
        return self

    def _procs_files(self) -> list[Path]:
        return [self.path / "cgroup.procs", *([self.cpuset_path / "cgroup.procs"] if self.cpuset_path else [])]

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) here; what it starts from now on stays here."""
        for procs in self._procs_files():
            procs.write_text(str(pid))

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started inside this group, so that every process it forks is in it too."""
        joins = " && ".join(f"echo $$ > {shlex.quote(str(procs))}" for procs in self._procs_files())
        return ["/bin/sh", "-c", f"{joins} && exec \"$@\"", "cgroup-exec", *argv]

    def throttled_s(self) -> float:
        """How long the quota held the group back so far (cpu.stat's throttled_time)."""
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":
                return int(value) / 1e9
        return 0.0

    def remove(self) -> None:
        """Move what is left to the root groups, then delete the groups."""
        for path, root in ((self.path, CPU_ROOT), (self.cpuset_path, CPUSET_ROOT)):
            if path is None or not path.exists():
                continue
            for pid in (path / "cgroup.procs").read_text().split():
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:  # it ended meanwhile
                    pass
            path.rmdir()

    def describe(self) -> str:
        quota = "no quota" if self.cores is None else f"quota {self.cores:g} cores"
        cpuset = f", cpuset {self.cpus}" if self.cpus is not None else ""
        return f"{self.name}: {quota}, cpu.shares {self.shares}{cpuset}"


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


class Groups:
    """The groups of one benchmark run: one per system (the same quota each) and the load generator's.

    ``shared=True`` is a small machine instead: one group of ``cores`` CPUs (a quota and a cpuset
    of that many CPUs) that the load generator and each system in its turn share, as a 2-core
    machine's processes share its cores."""

    def __init__(self, cores: float, client_cores: float | None = None, *, shared: bool = False):
        self.cores, self.shared = cores, shared
        if shared:
            count = max(1, math.ceil(cores))
            cpus = first_cpus(count)
            if cpus is None:
                raise ValueError(f"a shared group of {cores:g} CPUs needs {count} CPUs; this process may use "
                                 f"{len(os.sched_getaffinity(0))}")
            self.client = CpuGroup("machine", cores, cpus=cpus if CPUSET_ROOT.exists() else None)
        else:
            self.client = CpuGroup("load-generator", client_cores)
        self.systems: dict[str, CpuGroup] = {}

    def __enter__(self) -> Groups:
        self.client.create().add(os.getpid())  # this process drives the load
        # SIGTERM unwinds the run (stacks stopped, groups removed) as Ctrl-C does.
        self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def system(self, name: str) -> CpuGroup:
        if self.shared:
            return self.client
        group = self.systems.get(name)
        if group is None:
            group = self.systems[name] = CpuGroup(name.lower().replace(" ", "-"), self.cores).create()
        return group

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self._sigterm)
        (CPU_ROOT / "cgroup.procs").write_text(str(os.getpid()))
        if self.client.cpuset_path is not None:
            (CPUSET_ROOT / "cgroup.procs").write_text(str(os.getpid()))
        for group in [*self.systems.values(), self.client]:
            try:
                group.remove()
            except OSError as error:
                print(f"cgroups: could not remove {group.path}: {error}", flush=True)

    def describe(self) -> dict:
        return {"cores_per_system": self.cores, "shares": SHARES, "shared": self.shared,
                "groups": [g.describe() for g in [*self.systems.values(), self.client]]}
