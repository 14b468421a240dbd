"""Python API (:class:`Client`, :func:`make_task_spec`) and the ``offcut`` command-line
interface.

Example::

    from offcut.client import Client, make_task_spec, read_scalability_csv
    from offcut.errors import NotFound

    spec = make_task_spec("resnet18", nodes="1-8", work_samples=1.2e9,
                          scalability=read_scalability_csv("resnet18.csv"))
    with Client() as c:                        # $OFFCUT_ADDRESS or the local socket
        task = c.submit(spec, owner="alice").task
        print(c.get_task(task.task_id).state)
        for update in c.watch(task.task_id, timeout_s=60):
            print(update.placements)
"""

from offcut.client.api import Client
from offcut.client.taskspec import make_task_spec, parse_node_range, read_scalability_csv

__all__ = ["Client", "make_task_spec", "parse_node_range", "read_scalability_csv"]
