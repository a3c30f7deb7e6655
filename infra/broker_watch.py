"""The broker watch of `make demo`: every few seconds, start again any node of the local Kafka
cluster (``KAFKA_RUN_DIR``) whose JVM is gone, with the data and offsets it had.

A node killed by a crash, the OOM killer or a chaos round comes back without a human; the
other nodes are left alone. A node the cluster's own ``ctr kafka down`` stopped is not started
again only because the demo stops this watch first. Run under infra/supervise.sh; SIGTERM ends
it between two checks.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

from infra.broker import BrokerError, LocalKafka
from infra.broker_settings import BrokerSettings
from runtime.kafka_settings import KafkaSettings

log = logging.getLogger("ctr.broker_watch")


def dead_nodes(cluster: LocalKafka) -> list[int]:
    """The nodes of the recorded layout without a live JVM."""
    return sorted(node for node, pid in cluster.state().pids.items() if pid is None)


def watch(cluster: LocalKafka, *, every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        dead = dead_nodes(cluster)
        if not dead:
            continue
        log.warning("node(s) %s not running; starting them again", dead)
        started = time.monotonic()
        try:
            cluster.start(nodes=dead)
        except BrokerError as exc:  # it tries again at the next check
            log.error("could not start node(s) %s: %s", dead, exc)
            continue
        log.warning("node(s) %s running again after %.1f s", dead, time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=3.0, help="seconds between checks")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cluster = LocalKafka(KafkaSettings(), BrokerSettings())
    if cluster.existing_layout() is None:
        parser.error(f"no local cluster under {cluster.settings.kafka_dir}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("watching %s every %g s", cluster.settings.kafka_dir, args.every)
    watch(cluster, every_s=args.every, stop=stop)


if __name__ == "__main__":
    main()
