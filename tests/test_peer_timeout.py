"""A lost peer ends the generation in bounded time (docs/execution.md, "A lost peer"): real
gloo processes of offcut.client.elastic, the peer timeout from ``OFFCUT_PEER_TIMEOUT_S`` as the
launcher sets it ([slurm] peer_timeout_s), a peer SIGKILLed mid-step, one that vanishes without
closing its connections (SIGSTOP: what a node that dies or drops off the network looks like
to its peers), and survivors that are not in a collective at all (only the heartbeat on the
generation's store can tell them)."""

from __future__ import annotations

import signal
import time

import pytest

from offcut.client.elastic import EXIT_RESTART

from elastic_helpers import Generation

PEER_TIMEOUT_S = 8
#: every rank trains; at step 5 rank 2 says so and (in "local" mode) every rank enters a long
#: local phase with no collective (e.g. data loading), in which only the heartbeat can notice
#: a lost peer
SCRIPT = (
    "import logging, os, sys, time\n"
    "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
    "from offcut.client.elastic import ElasticRun\n"
    "mode = sys.argv[1]\n"
    "with ElasticRun.from_env() as run:\n"
    "    print('collective timeout', run.timeout_s, flush=True)\n"
    "    step = 0\n"
    "    while True:\n"
    "        step += 1\n"
    "        run.should_stop()\n"
    "        if step == 5:\n"
    "            print('step 5', flush=True)\n"
    "        if step >= 5 and mode == 'local':\n"
    "            time.sleep(3600)\n"
    "        time.sleep(0.02)\n")


def _run(tmp_path, mode: str, victim: int, how: signal.Signals):
    g = Generation(3, tmp_path / "ckpt", tmp_path / "logs", [mode],
                   script=["-c", SCRIPT],
                   extra={"OFFCUT_PEER_TIMEOUT_S": str(PEER_TIMEOUT_S)})
    try:
        for r in g.ranks:
            r.wait_for(r"step 5", stream="out")
        g.ranks[victim].signal(how)
        lost_at = time.monotonic()
        survivors = [r for i, r in enumerate(g.ranks) if i != victim]
        codes = [r.wait(timeout_s=PEER_TIMEOUT_S + 60) for r in survivors]
        took = max(r.ended for r in survivors) - lost_at
    finally:
        g.kill()
    return g, survivors, codes, took


@pytest.mark.parametrize("victim", [1, 0])
def test_a_peer_killed_mid_step_ends_every_survivor_with_75_in_bounded_time(torch, tmp_path,
                                                                            victim):
    g, survivors, codes, took = _run(tmp_path, "train", victim, signal.SIGKILL)
    assert codes == [EXIT_RESTART, EXIT_RESTART], g.tails()
    assert took < PEER_TIMEOUT_S + 10, took
    for r in survivors:
        assert f"collective timeout {float(PEER_TIMEOUT_S)}" in r.out   # from the variable
        assert "Traceback" not in r.err


def test_a_vanished_peer_that_closes_nothing_ends_the_survivors_within_the_peer_timeout(
        torch, tmp_path):
    g, survivors, codes, took = _run(tmp_path, "train", 2, signal.SIGSTOP)
    assert codes == [EXIT_RESTART, EXIT_RESTART], g.tails()
    assert took < PEER_TIMEOUT_S + 10, took
    assert took >= PEER_TIMEOUT_S * 0.8, took   # it was the timeout, not a closed socket


@pytest.mark.parametrize("victim", [2, 0])
def test_survivors_outside_any_collective_learn_of_the_loss_from_the_heartbeat(torch, tmp_path,
                                                                               victim):
    g, survivors, codes, took = _run(tmp_path, "local", victim, signal.SIGKILL)
    assert codes == [EXIT_RESTART, EXIT_RESTART], g.tails()
    assert took < PEER_TIMEOUT_S + 10, took
    for r in survivors:
        assert "is lost" in r.err, r.tail()
