"""Test hosts: each long-running process of a test on a host of its own, with its own disk, on
this one machine (docs/guides/development.md, "Test hosts").

A host is a Linux mount namespace the harness makes (``unshare --mount --propagation
private``), held open by a process that sleeps in it; every process started on the host joins
it (``nsenter --mount``, which execs: its pid is the process's own, and it leads a process
group of its own, so a test stops it or SIGKILLs it by pid or pgid). On a host:

- ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/home`` are fresh and empty (tmpfs): the test's
  tmp folders, which live under /tmp, and other hosts' files are out of sight;
- ``/home/ctr`` is the host's working folder (cwd and HOME), kept outside in
  ``<base>/<host>/home`` so that the test can read what the host wrote;
- the checkout is read-only (its .venv with it);
- a *bare* host has no checkout and no .venv at all: the checkout's folder and the machine
  user's home are empty, and it keeps only Spark (pyspark's distribution, at ``/opt/spark``),
  the base interpreter .venv was made from (at its own path) and what the test asks to keep
  (``keep``: e.g. the S3 jars at the path ``spark.executor.extraClassPath`` names).

Hosts share the machine's network (loopback included): they reach Kafka, the object store, a
Spark master and each other over it, as hosts reach each other over a network; the test
session's broker and S3 server listen on 127.0.0.1, which a network namespace of its own would
cut a host off from. Each host has an address of its own on it, ``127.0.0.N`` (the machine keeps
127.0.0.1), which its processes bind and advertise (``SPARK_LOCAL_IP``): Spark takes executors
with the same address for one machine and reads their shuffle files from its own disk
(``spark.shuffle.readHostLocalDisk``), which two hosts do not share. What a host cannot do is
read another's files.

Each process writes its output to ``<base>/<host>/logs/<name>.log``, opened by the harness
outside the host. Needs root (CAP_SYS_ADMIN), ``unshare``, ``nsenter`` and ``mount``
(util-linux): :func:`unavailable` says what is missing.

``python -m infra.hosts [--bare] -- COMMAND`` runs a command on a fresh host (``make test-host``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from infra.errors import InfraError

ROOT: Final = Path(__file__).resolve().parents[1]
HOME: Final = Path("/home/ctr")
SPARK_HOME: Final = Path("/opt/spark")
# Where what a host keeps waits while the machine's folders are hidden (empty again after).
STAGE: Final = Path("/mnt")
# Folders every host has to itself, and their modes.
OWN: Final = {Path("/tmp"): 0o1777, Path("/var/tmp"): 0o1777, Path("/dev/shm"): 0o1777}
# What a host process gets from the machine's environment (more only when the test says so).
PASSED: Final = ("PATH", "JAVA_HOME", "LANG", "LC_ALL", "TZ")
_READY_S: Final = 30.0
_MAX_HOSTS: Final = 250  # 127.0.0.2 to 127.0.0.251


class HostError(InfraError, RuntimeError):
    """A test host could not be made or a process not started on it; the message says why."""


def unavailable() -> str | None:
    """Why this machine cannot make test hosts (None: it can)."""
    missing = [tool for tool in ("unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} (util-linux) not installed"
    if os.geteuid() != 0:
        return "mount namespaces need root (CAP_SYS_ADMIN); CI runs the tests as root"
    probe = ["unshare", "--mount", "--propagation", "private", "true"]
    done = subprocess.run(probe, capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0:
        return f"`{shlex.join(probe)}` failed: {done.stderr.strip()}"
    return None


@dataclass(frozen=True)
class Machine:
    """What test hosts take from this machine: the ``checkout`` (read-only on a host, hidden on
    a bare one), the machine user's ``home`` (hidden on a bare host), the base interpreter
    ``python`` and .venv's ``venv_python``, pyspark's distribution ``spark_home``, the jar
    cache, and the ``environ`` host processes start from (:data:`PASSED`)."""

    checkout: Path
    home: Path
    python: Path
    venv_python: Path
    spark_home: Path
    jar_cache: Path
    environ: Mapping[str, str]
    hidden: tuple[Path, ...] = ()

    @classmethod
    def of(
        cls, environ: Mapping[str, str], *, jar_cache: Path, hidden: Sequence[Path] = ()
    ) -> Machine:
        """This process's machine, its environment ``environ``; ``hidden``: more folders no
        host may see (the test's tmp folders when they are not under /tmp)."""
        import pyspark

        return cls(
            checkout=ROOT,
            home=Path.home(),
            python=Path(getattr(sys, "_base_executable", sys.executable)),
            venv_python=Path(sys.executable),
            spark_home=Path(pyspark.__file__).parent,
            jar_cache=jar_cache,
            environ={k: v for k, v in environ.items() if k in PASSED},
            hidden=tuple(hidden),
        )


@dataclass(frozen=True)
class Bind:
    """``source`` (a machine folder) at ``target`` on the host, read-only or not."""

    source: Path
    target: Path
    read_only: bool


@dataclass(frozen=True)
class Layout:
    """The file system of one host: its own folder ``disk`` (outside), bare or not, the machine
    folders it ``keep``s (read-only, same path) on a bare host."""

    machine: Machine
    disk: Path
    bare: bool = False
    keep: tuple[Path, ...] = ()
    address: str = "127.0.0.2"

    def hidden(self) -> list[Path]:
        """The machine's folders replaced by empty ones (tmpfs), none inside another."""
        hidden = {*OWN, HOME.parent, *self.machine.hidden}
        if self.bare:
            hidden |= {self.machine.checkout, self.machine.home, SPARK_HOME.parent}
        if Path("/") in hidden:
            raise HostError("a host cannot hide the machine's root folder")
        return sorted(p for p in hidden if not any(h in p.parents for h in hidden))

    def binds(self) -> list[Bind]:
        """What the host keeps: its home, the checkout read-only (or on a bare host Spark, the
        base interpreter's installation and ``keep``), in the order they are mounted."""
        binds = [Bind(self.disk / "home", HOME, read_only=False)]
        if self.bare:
            binds.append(Bind(self.machine.spark_home, SPARK_HOME, read_only=True))
            prefix = self.machine.python.parent.parent
            kept = [prefix, *self.keep]
            binds += [Bind(p, p, read_only=True) for p in kept if self._under_hidden(p)]
        else:
            binds.append(Bind(self.machine.checkout, self.machine.checkout, read_only=True))
        return binds

    def _under_hidden(self, path: Path) -> bool:
        return any(path == h or h in path.parents for h in self.hidden())

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A host process's environment: the machine's :data:`PASSED` variables, the host's
        HOME, TMPDIR and address (SPARK_LOCAL_IP), on a host with the checkout the machine's
        jar cache, then ``extra``."""
        env = {**self.machine.environ, "HOME": str(HOME), "TMPDIR": "/tmp"}
        env["SPARK_LOCAL_IP"] = self.address
        if not self.bare:
            env["CTR_JAR_CACHE"] = str(self.machine.jar_cache)
        return {**env, **(extra or {})}

    def script(self) -> str:
        """The shell script that makes the host in a fresh mount namespace: each kept folder
        bound at a stage first (while it is still in sight), the machine's folders hidden,
        then the stage moved into place; ends by saying ``ready``."""
        lines = ["set -eu", f"mount -t tmpfs -o mode=0755 ctr-stage {STAGE}"]
        binds = self.binds()
        for n, bind in enumerate(binds):
            stage = STAGE / str(n)
            lines += [f"mkdir {stage}", f"mount --bind {_q(bind.source)} {stage}"]
            if bind.read_only:
                lines.append(f"mount -o remount,bind,ro {stage}")
        for folder in self.hidden():
            mode = OWN.get(folder, 0o755)
            lines.append(f"mount -t tmpfs -o mode={mode:04o} ctr-host {_q(folder)}")
        for n, bind in enumerate(binds):
            lines += [
                f"mkdir -p {_q(bind.target)}",
                f"mount --move {STAGE / str(n)} {_q(bind.target)}",
            ]
        lines += [f"umount {STAGE}", "echo ready"]
        return "\n".join(lines) + "\n"


def _q(path: Path) -> str:
    return shlex.quote(str(path))


@dataclass
class HostProcess:
    """A process on a host: ``pid`` (also its process group's id) and its ``log``."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """``sig`` to the process's group (the process and what it started)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> int:
        """SIGKILL the process group (a crash, as far as the process can tell); its code."""
        self.signal(signal.SIGKILL)
        return self.popen.wait(timeout=30)

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return self.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Host:
    """One test host (:class:`Layout`), started; its processes, to stop with it."""

    name: str
    layout: Layout
    holder: subprocess.Popen[bytes]
    processes: list[HostProcess] = field(default_factory=list)

    @property
    def disk(self) -> Path:
        """The host's own folder, outside: ``home/`` (its /home/ctr) and ``logs/``."""
        return self.layout.disk

    @property
    def address(self) -> str:
        """The host's own loopback address, what its processes bind and advertise."""
        return self.layout.address

    @property
    def python(self) -> Path:
        """The Python a host process runs: .venv's, or on a bare host the base interpreter."""
        machine = self.layout.machine
        return machine.python if self.layout.bare else machine.venv_python

    def venv_command(self, name: str) -> Path:
        """.venv's ``bin/<name>`` (``ctr``, ``spark-submit``, ``airflow``), on a host with the
        checkout."""
        if self.layout.bare:
            raise HostError(f"host {self.name} is bare: it has no .venv, no {name}")
        return self.layout.machine.venv_python.parent / name

    @property
    def spark_home(self) -> Path:
        return SPARK_HOME if self.layout.bare else self.layout.machine.spark_home

    def outside(self, inside: Path | str) -> Path:
        """Where the test finds the host's file ``inside`` (under /home/ctr)."""
        return self.disk / "home" / Path(inside).relative_to(HOME)

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return self.layout.environ(extra)

    def _command(self, argv: Sequence[str], cwd: Path | str | None) -> list[str]:
        enter = ["nsenter", f"--target={self.holder.pid}", "--mount", "--"]
        return [*enter, "sh", "-c", 'cd "$0" && exec "$@"', str(cwd or HOME), *argv]

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
    ) -> HostProcess:
        """Start ``argv`` on the host as process ``name`` (in /home/ctr, or ``cwd``), its
        output to ``logs/<name>.log``, in a process group of its own."""
        if self.holder.poll() is not None:
            raise HostError(f"host {self.name} is stopped")
        log = self.disk / "logs" / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                self._command(argv, cwd),
                env=self.environ(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = HostProcess(name, popen, log)
        self.processes.append(process)
        return process

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 120,
        capture: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the host to its end, its output captured (or the terminal's)."""
        return subprocess.run(
            self._command(argv, None),
            env=self.environ(env),
            capture_output=capture,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def stop(self) -> None:
        """Stop every process on the host (those it started too), then the host."""
        for process in self.processes:
            if process.alive():
                process.stop(timeout_s=20)
        namespace = _namespace(self.holder.pid)
        if namespace is not None:
            for pid in _members(namespace, but=self.holder.pid):
                _kill(pid)
        self.holder.kill()
        self.holder.wait(timeout=30)


def _namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _members(namespace: str, *, but: int) -> Iterator[int]:
    """The processes in the mount namespace ``namespace`` but ``but``."""
    for entry in Path("/proc").iterdir():
        if (
            entry.name.isdigit()
            and int(entry.name) != but
            and _namespace(int(entry.name)) == namespace
        ):
            yield int(entry.name)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class Hosts:
    """The test hosts of one test (or module), their folders under ``base``."""

    def __init__(self, base: Path, machine: Machine) -> None:
        self.base = base
        self.machine = machine
        self.hosts: dict[str, Host] = {}

    def host(self, name: str, *, bare: bool = False, keep: Sequence[Path] = ()) -> Host:
        """A new host ``name`` (bare: no checkout, no .venv; ``keep``: machine folders a bare
        host keeps, read-only at the same path), started, its address the next 127.0.0.N."""
        if name in self.hosts or not name.replace("-", "").isalnum():
            raise HostError(f"host name {name!r}: new, letters, digits and '-' only")
        if len(self.hosts) >= _MAX_HOSTS:
            raise HostError(f"at most {_MAX_HOSTS} hosts: one loopback address each")
        disk = self.base / name
        (disk / "home").mkdir(parents=True)
        (disk / "logs").mkdir()
        address = f"127.0.0.{len(self.hosts) + 2}"
        layout = Layout(self.machine, disk, bare=bare, keep=tuple(keep), address=address)
        host = Host(name, layout, _hold(layout))
        self.hosts[name] = host
        return host

    def stop(self) -> None:
        for host in self.hosts.values():
            host.stop()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _hold(layout: Layout) -> subprocess.Popen[bytes]:
    """The process that makes the host's namespace and sleeps in it, once it says ready."""
    script = layout.script() + "exec sleep infinity </dev/null >/dev/null\n"
    with (layout.disk / "logs" / "host.log").open("ab") as log:
        holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )
    assert holder.stdout is not None
    ready, _, _ = select.select([holder.stdout], [], [], _READY_S)
    line = holder.stdout.readline() if ready else b""
    holder.stdout.close()
    if line.strip() != b"ready":
        holder.kill()
        holder.wait(timeout=30)
        errors = (layout.disk / "logs" / "host.log").read_text(errors="replace").strip()
        raise HostError(f"host {layout.disk.name} could not be made: {errors or 'no answer'}")
    return holder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.hosts", description="Run a command on a fresh test host."
    )
    parser.add_argument("--bare", action="store_true", help="no checkout, no .venv")
    parser.add_argument("--keep", type=Path, action="append", default=[], help="bare: keep this")
    parser.add_argument("--disk", type=Path, help="the host's folder, kept (default: removed)")
    parser.add_argument("command", nargs="+", help="what to run (after --)")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason:
        print(f"error: no test hosts here: {reason}", file=sys.stderr)
        return 1
    from runtime.spark_settings import default_jar_cache

    base = args.disk.resolve() if args.disk else Path(tempfile.mkdtemp(prefix="ctr-hosts-"))
    machine = Machine.of(os.environ, jar_cache=default_jar_cache(os.environ))
    try:
        with Hosts(base, machine) as hosts:
            host = hosts.host("bare" if args.bare else "host", bare=args.bare, keep=args.keep)
            print(f"host {host.name}: /home/ctr is {host.outside(HOME)} outside", file=sys.stderr)
            done = host.run(args.command, timeout_s=24 * 3600, capture=False)
    finally:
        if not args.disk:
            shutil.rmtree(base, ignore_errors=True)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
