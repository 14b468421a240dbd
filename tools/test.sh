#!/usr/bin/env bash
# The test command of README.md: install what the tests need into the current Python
# environment, then run the whole suite (arguments go to pytest, e.g. -x or -k NAME).
#
#  * torch first when none is installed, pinned: torch==2.13.0 is a local CPU build on these
#    machines, while an unpinned torch pulls several GB of CUDA packages (an installed torch
#    is kept: the examples extra asks for torch>=2.3);
#  * the project with its test and example extras (editable);
#  * Slurm for the Slurm tests (tests/slurm_cluster.py starts and stops its own clusters:
#    munge, slurmctld, slurmd, and slurmdbd on a private MariaDB for accounting): installed
#    with apt-get when missing and this runs as root on Debian/Ubuntu (about 30 s); elsewhere
#    those tests skip and say why.
# Real-data tests skip without ../shared/data.
set -euo pipefail
cd "$(dirname "$0")/.."

python -c 'import torch' 2>/dev/null || python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e '.[dev,examples]'

if { [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmdbd ] || [ ! -x /usr/sbin/mariadbd ]; } \
        && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends munge slurmctld slurmd slurm-client \
        slurmdbd mariadb-server >/dev/null
fi

exec python -m pytest -q "$@"
