"""Programs that Slurm runs or that run beside Slurm (hooks, watcher, launcher). See
``slurm_plugin/README.md`` for setting them up.

Modules (the hook path imports only the standard library, python-hostlist and, when it has
something to send, grpc):

* :mod:`~offcut.slurm_plugin.hooks`: PrologSlurmctld / EpilogSlurmctld program
  (``python -I -m offcut.slurm_plugin.hooks prolog|epilog``).
* :mod:`~offcut.slurm_plugin.install`: writes the shell wrappers Slurm runs.
* :mod:`~offcut.slurm_plugin.watcher`: the polling watcher (``offcut-slurm watch``).
* :mod:`~offcut.slurm_plugin.sources`: reading Slurm (CLI JSON or pyslurm) into observations.
* :mod:`~offcut.slurm_plugin.slurm_json`: pure parsing of Slurm's JSON and the idle rule.
* :mod:`~offcut.slurm_plugin.slurm_cli`: ``sinfo``/``squeue``/``sbatch``/``scancel``/``scontrol``
  calls with timeouts and clear errors (shared with the launcher).
* :mod:`~offcut.slurm_plugin.launcher`: the launcher (``offcut-slurm launch``), composing
  :mod:`~offcut.slurm_plugin.placements` (the desired state),
  :mod:`~offcut.slurm_plugin.job_ownership` (whose job it is),
  :mod:`~offcut.slurm_plugin.job_accounting` (jobs ended while it was away),
  :mod:`~offcut.slurm_plugin.launch_reports` (reports to the daemon),
  :mod:`~offcut.slurm_plugin.job_stops` and :mod:`~offcut.slurm_plugin.job_submission`,
  over :mod:`~offcut.slurm_plugin.launch_types`.
* :mod:`~offcut.slurm_plugin.node_run`: the per-node supervisor a job's batch script runs: the
  task's processes on the node, the stop signal forwarded, the protocol's exit code
  (``python -m offcut.slurm_plugin.node_run``; standard library only).
* :mod:`~offcut.slurm_plugin.owners`: whose account runs a task's jobs (its owner's:
  ``sbatch --uid/--gid``) and which owners are refused.
* :mod:`~offcut.slurm_plugin.nodelist`: hostlist expansion and the daemon's node-name rule.
* :mod:`~offcut.slurm_plugin.rpc`: a light node-event sender (stubs + optional bearer token).
* :mod:`~offcut.slurm_plugin.power_helper`: the GPU power helper (zeusd's API, per-job
  authorisation) and the node epilog's restore (``offcut-slurm power-helper`` /
  ``power-restore``); :mod:`~offcut.slurm_plugin.job_gpus`: which job a process is in and
  which GPUs it holds; :mod:`~offcut.slurm_plugin.gpu_backends`: NVML and the recording
  stand-in.
* :mod:`~offcut.slurm_plugin.cli`: the ``offcut-slurm`` command.

The daemon is reached through ``offcut.v1`` only (docs/architecture.md, "Layers"); of the daemon's
code, only its config model (``offcut.daemon.config``: the ``[slurm]`` section) is imported, by the
launcher and ``offcut-slurm``, never by the hooks.
"""
