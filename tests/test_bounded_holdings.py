"""Nothing a caller holds grows without bound (docs/operations.md "Retention",
docs/security.md): per-owner caps on active tasks and Zeus jobs, the retention of Zeus trial
and observation rows, and GetJob's pages. Real gRPC daemons and real SQLite files."""

from __future__ import annotations

import random
import sqlite3
from collections import Counter

import grpc
import pytest

from daemon_helpers import make_spec, start_secured, zeus_spec
from offcut.daemon.zeus.storage import ZeusStorage
from offcut.zeus_views import BatchSizeJobSpec
from offcut.daemon.zeus.registry import ZeusRegistry
from offcut.errors import InvalidArgument, NotFound, ResourceExhausted


def count(path, table, job_id):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(f"SELECT COUNT(*) FROM {table} WHERE job_id = ?", (job_id,)).fetchone()[0]
    finally:
        db.close()


# ----------------------------------------------------------------------------- caps
def test_a_users_active_tasks_are_capped_and_others_go_on(daemons, user_tokens):
    srv, c = start_secured(daemons, user_tokens, max_active_tasks_per_owner=3)
    alice, mallory, admin = c["alice"], c["mallory"], c["admin"]
    ids = [alice.submit(make_spec(f"a{i}"), request_id=f"r{i}").task.task_id for i in range(3)]
    before = [(t.task_id, t.state) for t in admin.list_tasks()]
    with pytest.raises(ResourceExhausted, match="^max_active_tasks_per_owner: .*'alice' has 3"):
        alice.submit(make_spec("a3"), request_id="r3")
    assert [(t.task_id, t.state) for t in admin.list_tasks()] == before  # nothing changed
    # an accepted request retried gets its stored reply, not the refusal
    assert alice.submit(make_spec("a2"), request_id="r2").task.task_id == ids[2]
    # another owner is not affected; an admin is not capped (docs/security.md)
    assert mallory.submit(make_spec("m0")).task.owner == "mallory"
    assert admin.submit(make_spec("a-by-admin"), owner="alice").task.owner == "alice"
    with pytest.raises(ResourceExhausted):
        alice.submit(make_spec("a4"))
    alice.cancel(ids[0])
    alice.cancel(ids[1])  # two freed: alice holds 2 (one of them the admin's), may add 1
    assert alice.submit(make_spec("a5")).task.owner == "alice"
    with pytest.raises(ResourceExhausted):
        alice.submit(make_spec("a6"))
    # the count is the state's: rebuilt after a restart, equal to the unfinished tasks
    daemons.stop(srv)
    srv, c = start_secured(daemons, user_tokens, max_active_tasks_per_owner=3)
    with pytest.raises(ResourceExhausted, match="'alice' has 3"):
        c["alice"].submit(make_spec("a7"))
    active = srv.engine.scheduler.active.values()
    assert srv.engine.scheduler.active_owners == Counter(t.owner for t in active)


def test_a_users_zeus_jobs_are_capped(daemons, user_tokens):
    _, c = start_secured(daemons, user_tokens, max_zeus_jobs_per_owner=2)
    alice, mallory, admin = c["alice"], c["mallory"], c["admin"]
    first = alice.register_zeus_job(zeus_spec("j1"))
    alice.register_zeus_job(zeus_spec("j2"))
    with pytest.raises(ResourceExhausted, match="^max_zeus_jobs_per_owner: "):
        alice.register_zeus_job(zeus_spec("j3"))
    with pytest.raises(NotFound):
        alice.get_zeus_job("j3")  # nothing was registered
    # the identical spec again answers as before (idempotent), another user is unaffected
    assert alice.register_zeus_job(zeus_spec("j1")).spec == first.spec
    assert mallory.register_zeus_job(zeus_spec("m1")).owner == "mallory"
    assert admin.register_zeus_job(zeus_spec("j4"), owner="alice").owner == "alice"
    alice.delete_zeus_job("j2")
    alice.delete_zeus_job("j4")
    assert alice.register_zeus_job(zeus_spec("j3")).owner == "alice"


# ----------------------------------------------------------------------------- GetJob pages
def finished_trials(client, job_id, n, seed=0):
    """Run ``n`` trials to a verdict (each converges at epoch 1 at a random cost)."""
    rng = random.Random(seed)
    for _ in range(n):
        p = client.predict_batch_size(job_id)
        client.report_epoch(job_id, p.trial_number, 1, 10.0, rng.uniform(500, 5000), 0.9)


def test_get_job_pages_every_trial_once_and_bad_values_are_refused(daemon):
    _, client = daemon
    client.register_zeus_job(zeus_spec("paged", beta_knob=None))
    finished_trials(client, "paged", 25)
    seen, pages, before = [], 0, 0
    while True:
        page = client.get_zeus_job("paged", page_size=7, before_trial_number=before)
        assert page.trial_count == 25 and len(page.trials) <= 7
        seen.extend(t.trial_number for t in page.trials)
        pages += 1
        before = page.next_before_trial_number
        if not before:
            break
    assert sorted(seen) == list(range(1, 26)) and len(seen) == 25 and pages == 4
    assert [t.trial_number for t in client.get_zeus_job("paged").trials] == list(range(1, 26))
    assert len(list(client.zeus_trials("paged", page_size=10))) == 25
    for field, kw in (("page_size", dict(page_size=1001)), ("page_size", dict(page_size=-1)),
                      ("before_trial_number", dict(before_trial_number=-5))):
        with pytest.raises(InvalidArgument, match=f"^{field}: "):
            client.get_zeus_job("paged", **kw)


# ----------------------------------------------------------------------------- retention
def test_trial_rows_beyond_retention_are_pruned_and_a_restart_agrees(daemons):
    srv, client = daemons.start("z", zeus_trial_retention=5, zeus_trial_rows_retention=150,
                                durability="normal")
    path = srv.config.state
    client.register_zeus_job(zeus_spec("long", beta_knob=None))
    finished_trials(client, "long", 320)
    rows = count(path, "zeus_trials", "long")
    assert 150 <= rows < 150 + 100 + 1  # pruned in batches once 100 are beyond the retention
    kept = [t.trial_number for t in client.zeus_trials("long")]
    assert kept == sorted(kept, reverse=True) or sorted(kept) == list(range(321 - rows, 321))
    assert sorted(kept) == list(range(321 - rows, 321))  # the newest, each once
    with pytest.raises(NotFound, match="^trial_number: .*zeus_trial_rows_retention"):
        client.report_epoch("long", 1, 2, 10.0, 1.0, 0.9)
    before = client.get_zeus_job("long", page_size=1000)
    daemons.stop(srv)
    srv, client = daemons.start("z", zeus_trial_retention=5, zeus_trial_rows_retention=150,
                                durability="normal")
    after = client.get_zeus_job("long", page_size=1000)
    assert list(after.trials) == list(before.trials) and after.trial_count == 320
    finished_trials(client, "long", 10, seed=1)  # it goes on after the restart
    assert client.get_zeus_job("long").trial_count == 330


def drive(registry, job_id, n, rng, who):
    """``n`` trials on ``job_id``: predictions, each converging at epoch 1 at a cost drawn
    from ``rng`` (depending on the batch size)."""
    out = []
    for _ in range(n):
        p = registry.predict(job_id, "", who)
        energy = rng.uniform(500, 5000) * (1 + p.batch_size / 256)
        registry.report(job_id, p.trial_number, 1, 10.0, energy, 0.9, who)
        out.append((p.batch_size, p.exploration))
    return out


class Admin:
    user, is_admin = "", True


@pytest.mark.parametrize("window", [5, 0])
def test_predictions_are_unchanged_by_pruning_where_the_policy_does_not_read_it(tmp_path, window):
    """With a window (or no arm past the observation retention) Thompson sampling reads only
    rows that are kept: a registry that prunes (observation retention 100, trial rows 150)
    predicts exactly as one that keeps everything, also across a restart."""
    spec = BatchSizeJobSpec.create(job_id="j", batch_sizes=(32, 64, 128), default_batch_size=64,
                                   eta_knob=0.5, max_epochs=5, target_metric=0.7,
                                   max_power_w=250.0, seed=3, beta_knob=None, higher_is_better=True,
                                   window_size=window)
    who = Admin()
    small = ZeusStorage(tmp_path / "small.sqlite", durability="normal")
    pruning = ZeusRegistry(small, trial_retention=5, trial_rows_retention=150,
                           observation_retention=100)
    keeping = ZeusRegistry(ZeusStorage(tmp_path / "all.sqlite", durability="normal"),
                           trial_retention=5, trial_rows_retention=10**6,
                           observation_retention=None)
    for r in (pruning, keeping):
        r.register(spec, None, who, "")
    n = 2400 if window else 95  # unwindowed: no arm passes the 100 kept runs
    a = drive(pruning, "j", n, random.Random(1), who)
    b = drive(keeping, "j", n, random.Random(1), who)
    assert a == b
    if window:  # observed runs beyond the kept ones were deleted (rows and memory)
        assert count(tmp_path / "small.sqlite", "zeus_observations", "j") < n
    assert count(tmp_path / "small.sqlite", "zeus_trials", "j") < 150 + 100 + 1
    pruning.commits.flush()
    small.close()
    pruning = ZeusRegistry(ZeusStorage(tmp_path / "small.sqlite", durability="normal"),
                           trial_retention=5, trial_rows_retention=150,
                           observation_retention=100)
    assert drive(pruning, "j", 200 if window else 5, random.Random(2), who) == \
        drive(keeping, "j", 200 if window else 5, random.Random(2), who)
