"""What one user can make the daemon keep is bounded per owner (issue 37, finding 2;
docs/security.md, "Round two: what one user makes the daemon keep"): a user's submissions are
RESOURCE_EXHAUSTED naming ``max_retained_tasks_per_owner`` / ``max_retained_task_bytes_per_owner``
once its tasks in memory (queued, running, finished not yet retired) reach them, so a
submit+cancel flood with the largest commands stops growing memory and the state file; other
owners and admins go on; retirement frees the budget; a restart rebuilds the counts.
Real gRPC daemons and real SQLite files."""

from __future__ import annotations

import os

import pytest

from daemon_helpers import T0, core_spec, make_spec, start_secured
from offcut.daemon.app.engine import Engine
from offcut.daemon.app.model import CancelEvent, NodeEvent, SubmitEvent, Task
from offcut.daemon.app.scheduler.state import retained_bytes
from offcut.daemon.app.solvers.allocator import Allocator
from offcut.daemon.app.store import Store
from offcut.errors import ResourceExhausted

MIB = 1 << 20


def state_bytes(path) -> int:
    """The state file's size on disk with its WAL [bytes]."""
    return sum(os.path.getsize(p) for p in (str(path), f"{path}-wal") if os.path.exists(p))


def command(size: int) -> list[str]:
    """A command of ``size`` bytes in arguments of at most 64 KiB (the per-argument limit)."""
    return ["x" * min(65536, size - at) for at in range(0, size, 65536)]


def big_spec(name: str, size: int):
    """A spec whose command is ``size`` bytes."""
    return make_spec(name, command=command(size))


def big_core_spec(name: str, size: int):
    """:func:`big_spec` as the core's TaskSpec (for the engine without gRPC)."""
    return core_spec(name, command=command(size))


def test_a_submit_cancel_flood_is_refused_at_the_byte_budget(daemons, user_tokens):
    """Was: every pair added its 1 MiB command to memory (a day) and about 3 MiB to the
    journal (a week); 300 pairs took 317 MiB of RSS and 902 MiB of state file."""
    budget = 4 * MIB
    srv, c = start_secured(daemons, user_tokens, max_retained_task_bytes_per_owner=budget,
                           durability="normal")
    alice, mallory, admin = c["alice"], c["mallory"], c["admin"]
    path = srv.config.state
    start = state_bytes(path)
    accepted = 0
    with pytest.raises(ResourceExhausted) as refused:
        for i in range(50):  # 50 x 512 KiB: far past the budget
            tid = alice.submit(big_spec(f"a{i}", 512 * 1024), request_id=f"r{i}").task.task_id
            alice.cancel(tid)
            accepted += 1
    assert 4 <= accepted < 8  # 8 x (512 KiB + overhead) > 4 MiB
    message = str(refused.value)
    assert message.startswith("max_retained_task_bytes_per_owner: owner 'alice' has tasks of ")
    assert f"{budget:,}" in message and "finished in the last 1 day" in message
    kept = srv.engine.scheduler.retained_owners["alice"]
    assert kept[0] == accepted and kept[1] <= budget
    # the refusals change nothing: the state file no longer grows
    grown = state_bytes(path)
    before = [(t.task_id, t.state) for t in admin.list_tasks()]
    for i in range(10):
        with pytest.raises(ResourceExhausted, match="^max_retained_task_bytes_per_owner: "):
            alice.submit(big_spec(f"b{i}", 512 * 1024))
    assert [(t.task_id, t.state) for t in admin.list_tasks()] == before
    assert state_bytes(path) == grown
    # what the flood added is a few copies of the budget (journal rows with their replies)
    assert grown - start < 5 * budget
    # a retried accepted request gets its stored reply; a small task still fits
    again = alice.submit(big_spec("a0", 512 * 1024), request_id="r0")
    assert again.decision.duplicate and again.task.spec.name == "a0"
    assert alice.submit(make_spec("small")).task.owner == "alice"
    # another owner is unaffected, an admin is not capped (docs/security.md)
    assert mallory.submit(big_spec("m", 512 * 1024)).task.owner == "mallory"
    assert admin.submit(big_spec("x", 512 * 1024), owner="alice").task.owner == "alice"


def test_a_users_tasks_in_memory_are_capped_by_count(daemons, user_tokens):
    """Was: ``max_active_tasks_per_owner`` counted unfinished tasks only, so submit+cancel
    pairs of small tasks grew memory (a day) and the journal (a week) without bound."""
    srv, c = start_secured(daemons, user_tokens, max_retained_tasks_per_owner=5,
                           durability="normal")
    alice, mallory = c["alice"], c["mallory"]
    for i in range(5):
        alice.cancel(alice.submit(make_spec(f"a{i}")).task.task_id)
    with pytest.raises(ResourceExhausted, match="^max_retained_tasks_per_owner: .*'alice' has 5"):
        alice.submit(make_spec("a5"))
    assert len(srv.engine.scheduler.tasks) == 5
    assert mallory.submit(make_spec("m0")).task.owner == "mallory"


def test_retirement_frees_the_budget_and_a_restart_rebuilds_it(tmp_path):
    """Engine level, with explicit event times: a finished task leaving memory
    (finished_task_retention_s later) takes its bytes off its owner; the counts after a
    restart equal those the running daemon kept."""
    path = tmp_path / "s.sqlite"
    budget = 2 * MIB
    kw = dict(finished_task_retention_s=60.0, max_retained_task_bytes_per_owner=budget,
              max_retained_tasks_per_owner=100)
    engine = Engine(Store(path, durability="normal"), Allocator("dp"), **kw)
    try:
        t = T0
        for i in range(3):  # 3 x 600 KiB fit, the 4th not
            out = engine.apply(SubmitEvent(t, big_core_spec(f"a{i}", 600 * 1024), "alice"),
                               capped=True)
            engine.apply(CancelEvent(t + 1, out.tasks[0].task_id))
            t += 2
        with pytest.raises(ResourceExhausted) as refused:
            engine.apply(SubmitEvent(t, big_core_spec("a3", 600 * 1024), "alice"), capped=True)
        assert refused.value.field == "max_retained_task_bytes_per_owner"
        assert "finished in the last 60 s" in str(refused.value)
        held = engine.scheduler.retained_owners["alice"]
        assert held[0] == 3
        assert held[1] == sum(retained_bytes(x) for x in engine.scheduler.tasks.values())
        engine.apply(NodeEvent(t + 61, "slurm", 1, idle=("n1",)))  # the 3 retire
        assert "alice" not in engine.scheduler.retained_owners
        engine.apply(SubmitEvent(t + 62, big_core_spec("a4", 600 * 1024), "alice"), capped=True)
        kept = dict(engine.scheduler.retained_owners)
    finally:
        engine.close()
    engine = Engine(Store(path, durability="normal"), Allocator("dp"), **kw)
    try:
        assert engine.scheduler.retained_owners == kept
        assert kept["alice"][0] == 1
    finally:
        engine.close()


def test_the_estimate_counts_the_command_and_curve():
    small = Task("t1", big_core_spec("a", 10), "alice", T0)
    large = Task("t2", big_core_spec("a", 10 + MIB), "alice", T0)
    assert retained_bytes(large) - retained_bytes(small) == MIB + 16 * 56  # 16 more arguments
    assert retained_bytes(small) > 2048
