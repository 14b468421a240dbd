"""The one conversion of Zeus's forms (offcut.zeus_views) to and from the offcut.v1 messages
(offcut.wire.zeus): every form comes back equal from its message, and the request direction
validates, naming the field."""

from __future__ import annotations

import math

import pytest

from offcut.errors import InvalidArgument
from offcut.trial_verdict import Verdict
from offcut.v1 import zeus_pb2
from offcut.wire import zeus as wire
from offcut.zeus_views import (BatchSizeJobSpec, PowerLimitSpec, PowerMeasurement, PowerPlan,
                               PowerProfile, Prediction, Resumed, ZeusJob, ZeusTrial)

SPEC = BatchSizeJobSpec.create(job_id="j", batch_sizes=(64, 32), default_batch_size=32,
                               eta_knob=0.5, beta_knob=2.0, max_epochs=5, target_metric=0.9,
                               higher_is_better=True, max_power_w=300.0, seed=7)
POWER = PowerLimitSpec.create(min_power_limit_w=150.0, max_power_limit_w=300.0, eta_knob=0.5,
                              step_w=50.0, selector="energy")


@pytest.mark.parametrize("view, to_pb, from_pb", [
    (Prediction(64, 3, math.inf, True), wire.prediction_to_pb, wire.prediction_from_pb),
    (Resumed(2, 32, 4, 12.5, 900.0, 1000.0, 2000.0, False, 3, True), wire.resumed_to_pb,
     wire.resumed_from_pb),
    (Verdict(True, False, 123.0, "stopped", True, suspended=False), wire.verdict_to_pb,
     wire.verdict_from_pb),
    (PowerPlan("profile", 250.0, 10, 40), wire.plan_to_pb, wire.plan_from_pb),
    (PowerProfile("j", 64, True, 200.0, (PowerMeasurement(250.0, 1.0, 200.0, 300.0),
                                         PowerMeasurement(200.0, 1.2, 180.0, 290.0))),
     wire.profile_to_pb, wire.profile_from_pb),
])
def test_each_answer_comes_back_equal_from_its_message(view, to_pb, from_pb):
    pb = to_pb(view)
    assert from_pb(type(pb).FromString(pb.SerializeToString())) == view


@pytest.mark.parametrize("power", [None, POWER])
def test_a_job_comes_back_equal_from_its_message(power):
    job = ZeusJob(spec=SPEC, power=power, phase="pruning", best_batch_size=32,
                  min_cost_j=math.inf, trials=(ZeusTrial(1, 32, "running", 1, 2.0, 3.0, 4.0, 5, 1),),
                  state_json='{"phase": "pruning"}', owner="alice", next_before_trial_number=0,
                  trial_count=1)
    back = wire.job_from_pb(zeus_pb2.ZeusJob.FromString(wire.job_to_pb(job).SerializeToString()))
    assert back == job and back.state() == {"phase": "pruning"}
    assert back.spec.batch_sizes == (32, 64) and (back.power is None) == (power is None)


def test_a_spec_without_beta_or_seed_leaves_them_unset_on_the_wire():
    spec = BatchSizeJobSpec.create(job_id="j", batch_sizes=(32,), default_batch_size=32,
                                   eta_knob=0.5, max_epochs=5, target_metric=0.9,
                                   higher_is_better=True, max_power_w=300.0)
    pb = wire.job_spec_to_pb(spec)
    assert not pb.HasField("beta_knob") and not pb.HasField("seed")
    assert not pb.HasField("power")
    assert wire.job_spec_from_pb(pb) == spec


def test_a_request_spec_is_validated_naming_the_field():
    pb = wire.job_spec_to_pb(SPEC, POWER)
    with pytest.raises(InvalidArgument) as err:
        wire.job_spec_from_pb(pb, max_batch_sizes=1)
    assert err.value.field == "spec.batch_sizes"
    pb.job_id = "x" * 201
    with pytest.raises(InvalidArgument) as err:
        wire.job_spec_from_pb(pb, max_id_len=200)
    assert err.value.field == "spec.job_id"
    with pytest.raises(InvalidArgument) as err:
        wire.power_spec_from_pb(pb.power, 0.5, max_power_limits=2)
    assert err.value.field == "spec.power.step_w"
