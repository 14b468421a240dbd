"""GPU check of issue "GPU nodes as they are": on a machine with NVIDIA GPUs, run as root,

1. start the power helper (``offcut-slurm power-helper --gpus nvml``) on a private socket,
2. set a power limit on every GPU through it (zeusd's API, as a job would) and read it back
   with NVML,
3. train one generation of the GPU example (examples/elastic_digits, DDP over NCCL, one
   process per GPU, under the launcher's per-node supervisor ``offcut.slurm_plugin.node_run``)
   at that limit, measuring each GPU's energy counter (NVML, mJ) around it,
4. restore each GPU's default limit through the helper and read it back,

and print the limits, the measured energy and samples per joule. The figure lines also go,
with the machine and the command, to a new ``benchmarks/results/gpu_check-DATE-TIME.txt``
(``--no-results``: not written). Elsewhere (no NVML, no GPU, no CUDA build of torch, not root)
it prints why it cannot run and exits 3 (no file written).

    sudo python benchmarks/gpu_check.py [--samples 60000] [--limit-share 0.8] [--gpus 8]

Exit status: 0 every check held; 1 a check failed (printed); 3 cannot run here.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "elastic_digits" / "train.py"
CANNOT_RUN = 3


def cannot_run(why: str) -> None:
    print(f"gpu_check cannot run here: {why}", flush=True)
    raise SystemExit(CANNOT_RUN)


def preflight(max_gpus: int):
    """NVML and its GPUs (indices 0..n-1, at most ``max_gpus``), torch with CUDA, root;
    exits 3 (:func:`cannot_run`) naming what is missing."""
    try:
        import pynvml
    except ImportError:
        cannot_run("nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # pynvml.NVMLError: no driver, no GPU
        cannot_run(f"NVML does not answer ({exc}): no NVIDIA GPU or driver")
    if count < 1:
        cannot_run("NVML sees no GPU")
    try:
        import torch
    except ImportError:
        cannot_run("torch is not installed")
    if not torch.cuda.is_available():
        cannot_run(f"torch {torch.__version__} has no CUDA here (a CPU build?)")
    if not torch.distributed.is_nccl_available():
        cannot_run("torch was built without NCCL")
    if os.geteuid() != 0:
        cannot_run("the power helper sets limits through NVML, which needs root: run with sudo")
    return pynvml, list(range(min(count, max_gpus, torch.cuda.device_count())))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"gpu_check: timed out after {timeout_s:g} s waiting for {what}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=60_000, help="samples to train [samples]")
    p.add_argument("--batch-size", type=int, default=256, help="global batch size")
    p.add_argument("--limit-share", type=float, default=0.8,
                   help="the limit to set, as a share of the way from the GPU's minimum to its "
                        "maximum limit")
    p.add_argument("--gpus", type=int, default=8, help="use at most this many GPUs")
    add_option(p)
    args = p.parse_args(argv)
    pynvml, gpus = preflight(args.gpus)
    log = ResultsLog.from_args("gpu_check", args, argv)
    say = log.say
    from offcut.client.training.zeusd import ZeusdHttpClient

    failures: list[str] = []
    handles = {g: pynvml.nvmlDeviceGetHandleByIndex(g) for g in gpus}
    say(f"{len(gpus)} GPU(s): " + ", ".join(
            f"{g}: {pynvml.nvmlDeviceGetName(h)}" for g, h in handles.items()))
    tmp = Path(tempfile.mkdtemp(prefix="offcut-gpu-check-"))
    sock = tmp / "power.sock"
    helper = subprocess.Popen(
        [sys.executable, "-m", "offcut.slurm_plugin.cli", "power-helper", "--gpus", "nvml",
         "--socket", str(sock), "--state", str(tmp / "records.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(sock.exists, 60, "the power helper's socket")
        client = ZeusdHttpClient(str(sock))
        constraints = client.get_power_limit_constraints(gpus)
        defaults = {g: pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h)
                    for g, h in handles.items()}
        # 2. set through the helper, read back with NVML
        target = {}
        for g in gpus:
            lo, hi = constraints[g]
            target[g] = int(round((lo + args.limit_share * (hi - lo)) / 1000) * 1000)
            client.set_power_limit([g], target[g])
        for g, h in handles.items():
            got = pynvml.nvmlDeviceGetPowerManagementLimit(h)
            say(f"GPU {g}: limits {constraints[g][0] / 1e3:g}-{constraints[g][1] / 1e3:g} W, "
                f"default {defaults[g] / 1e3:g} W; set {target[g] / 1e3:g} W through the helper, "
                f"NVML reads {got / 1e3:g} W")
            if abs(got - target[g]) > 1000:
                failures.append(f"GPU {g}: NVML reads {got} mW after setting {target[g]} mW")
        # 3. one generation of the GPU example at that limit
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OFFCUT_", "ZEUSD_"))}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   OFFCUT_CHECKPOINT_DIR=str(tmp / "ckpt"), OFFCUT_GENERATION="1",
                   OFFCUT_NUM_NODES="1", CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)),
                   PYTHONUNBUFFERED="1")
        line = " ".join([sys.executable, str(EXAMPLE), "--samples", str(args.samples),
                         "--batch-size", str(args.batch_size), "--checkpoint-every-s", "0"])
        before = {g: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for g, h in handles.items()}
        t0 = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "offcut.slurm_plugin.node_run", "--procs", str(len(gpus)),
             "--node-rank", "0", "--num-nodes", "1", "--gpus-per-proc", "1", "--", line],
            env=env, capture_output=True, text=True, timeout=1800)
        took = time.monotonic() - t0
        after = {g: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for g, h in handles.items()}
        out = run.stdout + run.stderr
        joules = {g: (after[g] - before[g]) / 1e3 for g in gpus}
        total_j = sum(joules.values())
        accuracy = re.search(r"final test accuracy: ([0-9.]+)%", out)
        backend = "nccl" if "(nccl)" in out else "not nccl"
        say(f"training: exit {run.returncode}, {len(gpus)} process(es) ({backend}), "
            f"{args.samples} samples in {took:.1f} s"
            + (f", final test accuracy {accuracy.group(1)}%" if accuracy else ""))
        say("measured energy (NVML counters): " + ", ".join(
            f"GPU {g} {j:.1f} J" for g, j in joules.items())
            + f"; total {total_j:.1f} J, {args.samples / total_j:.2f} samples/J"
            if total_j > 0 else "measured energy: 0 J (the counters did not move)")
        if run.returncode != 0 or backend != "nccl" or not accuracy:
            failures.append(f"the GPU example did not train one generation over NCCL:\n"
                            f"{out[-3000:]}")
        # 4. restore through the helper, read back
        for g, h in handles.items():
            client.set_power_limit([g], defaults[g])
            got = pynvml.nvmlDeviceGetPowerManagementLimit(h)
            say(f"GPU {g}: restored {defaults[g] / 1e3:g} W, NVML reads {got / 1e3:g} W")
            if abs(got - defaults[g]) > 1000:
                failures.append(f"GPU {g}: NVML reads {got} mW after restoring {defaults[g]} mW")
    finally:
        helper.terminate()
        try:
            helper.wait(10)
        except subprocess.TimeoutExpired:
            helper.kill()
    for f in failures:
        say(f"FAILED: {f}")
    say("all checks held" if not failures else f"{len(failures)} check(s) failed")
    log.finish()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
