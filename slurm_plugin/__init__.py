"""Programs that Slurm runs or that run beside Slurm (hooks, watcher, launcher)."""
