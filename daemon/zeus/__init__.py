"""Zeus's optimizers (NSDI '23) hosted in the daemon: the batch-size optimizer
(:mod:`offcut.daemon.zeus.bso`), the power-limit optimizer (:mod:`offcut.daemon.zeus.plo`),
their durable registry and their gRPC services (docs/zeus.md, "The batch-size optimizer" and
"The power-limit optimizer")."""
