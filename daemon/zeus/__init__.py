"""Zeus's optimizers (NSDI '23) hosted in the daemon: the batch-size optimizer
(:mod:`offcut.daemon.zeus.bso`), the power-limit optimizer (:mod:`offcut.daemon.zeus.plo`),
their durable registry (:mod:`offcut.daemon.zeus.registry`, with its power-limit calls in
:mod:`offcut.daemon.zeus.power_profiles`), their own storage in the state file
(:mod:`offcut.daemon.zeus.storage`: their tables and one commit path) and their gRPC services
(:mod:`offcut.daemon.zeus.service`); docs/zeus.md, "The batch-size optimizer", "The power-limit
optimizer" and "Storage". The subsystem imports neither the engine nor the scheduler, and they
import nothing of it (``pyproject.toml``'s import contracts)."""
