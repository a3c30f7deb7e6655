"""`make soak`: the whole platform as `make demo` runs it, under steady traffic for a long run,
sampled every minute, judged by :mod:`infra.soak.rules`; with ``CHAOS=1`` a component
is SIGKILLed every few minutes and the project's own supervision must bring it back; at the
end the traffic stops, everything drains, and the exact views are checked against what the
producer delivered.

Settings (environment): ``SOAK_MINUTES`` (60), ``SOAK_RATE`` (1000 events/s), ``CHAOS`` (0|1),
``SOAK_SAMPLE_S`` (60), ``SOAK_KILL_EVERY_S`` (240), ``SOAK_SEED``, ``RUN_DIR``. The demo's own
settings (``DEMO_BATCH_MINUTES``, ``API_PORT``, …) pass through. State lives under
``RUN_DIR/soak/demo`` (a fresh lake and broker per soak), the report under ``RUN_DIR/soak``:
``report.md``, ``samples.csv``, ``kills.csv``, ``requests.csv``, one PNG per group of series.

What supervises what in the demo (``CHAOS=1`` kills each):

- Kafka brokers (3-broker profile under chaos, in network namespaces when run as root, so that
  one can also be cut off for ``PARTITION_S`` and healed): the broker watch
  (``infra/broker_watch.py``);
- the archiver, the speed job, the API: ``infra/supervise.sh``, a restart loop;
- a running batch task (``ctr_batch``'s spark-submit): Airflow's task retries;
- Airflow's scheduler: ``infra/airflow-up.sh``'s component loop.

The modules, entry first: :mod:`~infra.soak.__main__` (``python -m infra.soak``: reads the
environment once into a :class:`~infra.soak.config.Config`), :mod:`~infra.soak.run` (one soak),
:mod:`~infra.soak.report` and :mod:`~infra.soak.rules` (the verdicts and the report),
:mod:`~infra.soak.chaos` (the kills), :mod:`~infra.soak.exactness` (the end: drain, compare),
:mod:`~infra.soak.sampler` (the minute samples), :mod:`~infra.soak.demo` (the platform's
processes and files), :mod:`~infra.soak.processes` (``/proc``).
"""
