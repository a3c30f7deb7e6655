"""Test hosts (infra.hosts) share nothing but the network: a file a host writes under /tmp or in
its home is seen by no other host and not by the test, the test's tmp folders are out of every
host's sight, the checkout is read-only on a host, a bare host has no checkout and no .venv,
and a host's process stops with its process group, its log read from outside."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.broker import free_port
from infra.hosts import HOME, Hosts
from tests.support import ROOT
from tests.support.hosts import new_hosts
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    with new_hosts(tmp_path_factory) as made:
        yield made


def test_what_a_host_writes_is_seen_by_no_other_host_nor_by_the_test(
    hosts: Hosts, tmp_path: Path
) -> None:
    a, b = hosts.host("a"), hosts.host("b")
    name = f"/tmp/written-on-a-{uuid.uuid4().hex}"
    written = a.run(["sh", "-c", f"echo from-a > {name} && echo from-a > note"])
    assert written.returncode == 0, written.stderr
    # Host A keeps its files for its next processes; B has a /tmp and a home of its own.
    assert a.run(["cat", name, f"{HOME}/note"]).stdout == "from-a\nfrom-a\n"
    assert b.run(["cat", name]).returncode == 1
    assert b.run(["cat", "note"]).returncode == 1
    assert not Path(name).exists()
    # The test reads A's home outside, where the host's disk is kept; it is not under /tmp
    # for the hosts (the tests' tmp folders are).
    assert a.outside(HOME / "note").read_text() == "from-a\n"
    (tmp_path / "the-test-s").write_text("secret")
    assert a.run(["cat", str(tmp_path / "the-test-s")]).returncode == 1
    assert a.run(["ls", str(a.disk)]).returncode != 0


def test_the_checkout_is_read_only_on_a_host(hosts: Hosts) -> None:
    host = hosts.host("reader")
    touched = host.run(["touch", str(ROOT / "written-by-a-host")])
    assert touched.returncode != 0
    assert "Read-only file system" in touched.stderr
    imported = host.run([str(host.python), "-c", "import lake; print(lake.__file__)"])
    assert imported.stdout.strip() == str(ROOT / "lake" / "__init__.py"), imported.stderr
    ctr = host.run([str(host.venv_command("ctr")), "--help"])
    assert ctr.returncode == 0, ctr.stderr


def test_a_bare_host_has_spark_and_python_and_no_checkout(hosts: Hosts) -> None:
    bare = hosts.host("bare", bare=True)
    assert bare.run(["ls", "-A", str(ROOT)]).stdout == ""
    assert bare.run(["test", "-e", str(hosts.machine.venv_python)]).returncode == 1
    assert bare.run(["test", "-e", str(hosts.machine.jar_cache)]).returncode == 1
    python = bare.run([str(bare.python), "-c", "import sys; print(sys.version_info[:2])"])
    assert python.stdout.strip() == "(3, 11)", python.stderr
    no_code = bare.run([str(bare.python), "-c", "import lake"])
    assert "No module named 'lake'" in no_code.stderr
    spark = bare.run(["ls", str(bare.spark_home / "python" / "lib")])
    assert "pyspark.zip" in spark.stdout.split()
    assert bare.run(["test", "-x", str(bare.spark_home / "bin" / "spark-class")]).returncode == 0


def test_each_host_has_an_address_of_its_own_on_the_shared_network(hosts: Hosts) -> None:
    """What a host's processes bind and advertise (SPARK_LOCAL_IP): another host reaches it."""
    server, client = hosts.host("server"), hosts.host("client")
    assert server.address != client.address
    port = free_port()
    serve = (
        "import os, socket\n"
        "address = (os.environ['SPARK_LOCAL_IP'], int(os.environ['PORT']))\n"
        "with socket.create_server(address) as listener:\n"
        "    print('listening', flush=True)\n"
        "    listener.accept()[0].sendall(os.environ['SPARK_LOCAL_IP'].encode())\n"
    )
    listening = server.start("server", [str(server.python), "-c", serve], env={"PORT": str(port)})
    wait_until(lambda: "listening" in listening.output(), timeout_s=30, what="it listens")
    ask = f"import socket; print(socket.create_connection(('{server.address}', {port})).recv(99))"
    answer = client.run([str(client.python), "-c", ask])
    assert answer.stdout.strip() == repr(server.address.encode()), answer.stderr
    assert listening.popen.wait(timeout=30) == 0


def test_a_host_process_stops_with_its_group_and_its_log_is_read_outside(hosts: Hosts) -> None:
    host = hosts.host("runner")
    process = host.start("sleeper", ["sh", "-c", "echo started; sleep 300 & wait"])
    wait_until(lambda: "started" in process.output(), timeout_s=30, what="the process started")
    assert os.getpgid(process.pid) == process.pid
    assert process.kill() == -signal.SIGKILL
    # The sleep it started goes with it (once init has reaped it).
    wait_until(lambda: _group_gone(process.pid), timeout_s=30, what="the group is gone")
    assert process.log == host.disk / "logs" / "sleeper.log"


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False
