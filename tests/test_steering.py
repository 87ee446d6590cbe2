"""The in-engine state machine, driven the way an engine drives it."""

import math

import pytest
import torch

from agent_gravity._probe import ProbeSpec, answer_key, line_confidence
from agent_gravity._steering import LINE_WAIT, Action, Exit, ReasoningIds, Steering, SteeringSpec
from agent_gravity.backends._logits import apply_action

EOS, NL, END0, END1, PREFIX, SPACED_END0 = 2, 10, 100, 101, 102, 103


def make_spec(policy=None, min_tokens=0, max_reasoning=50, reasoning=True, **more) -> SteeringSpec:
    ids = ReasoningIds(end_ids=(END0, END1), end_start_ids=(END0, SPACED_END0), answer_prefix_ids=(PREFIX,),
                       line_break_ids=(NL,),
                       newline_ids=(NL,), max_reasoning_tokens=max_reasoning)
    return SteeringSpec(key="k", eos_ids=(EOS,), policy=policy, min_tokens=min_tokens,
                        reasoning=ids if reasoning else None, **more)


def drive(steering: Steering, script: list[tuple[float, int]], out: list[int] | None = None) -> list[int]:
    """Play the model: at each step it wants ``token`` at ``entropy``; forced tokens win. Extends ``out``."""
    out = [] if out is None else out
    for entropy, wanted in script:
        action = steering.step(entropy, out)
        out.append(action.force if action.force is not None else wanted)
    return out


def test_model_closing_its_reasoning_gets_the_rest_of_the_marker_forced():
    steering = Steering(make_spec())
    out = drive(steering, [(2.0, 5), (2.0, 6), (2.0, NL), (2.0, END0), (2.0, 0), (2.0, 0), (2.0, 7), (2.0, 8)])
    assert out == [5, 6, NL, END0, END1, PREFIX, 7, 8]
    assert steering.exit is Exit.MODEL and not steering.terminated_early
    assert steering.reasoning_tokens == 3 and steering.answer_start == 6


def test_the_marker_written_with_a_leading_space_closes_reasoning_too():
    steering = Steering(make_spec())
    out = drive(steering, [(2.0, 5), (2.0, SPACED_END0), (2.0, 0), (2.0, 0), (2.0, 7)])
    assert out == [5, SPACED_END0, END1, PREFIX, 7] and steering.exit is Exit.MODEL


def test_end_of_sequence_stays_banned_until_the_answer_has_text():
    steering = Steering(make_spec())
    out = drive(steering, [(1.0, END0), (1.0, 0), (1.0, 0)])
    assert steering.step(1.0, out) == Action(ban=(EOS,))
    out.append(NL)
    assert steering.step(1.0, out) == Action(ban=(EOS,))  # a bare newline is no answer
    out.append(7)
    assert steering.step(1.0, out) == Action()


def test_gravity_closes_reasoning_at_the_next_line_start_after_the_lock():
    policy = {"name": "window_mean", "window": 2, "threshold": 0.5}
    steering = Steering(make_spec(policy=policy))
    script = [(0.1, 5), (0.1, 6), (0.1, 7), (0.1, NL)] + [(0.1, 9)] * 6
    out = drive(steering, script)
    # locked from token 1 on, but the line ends only at token 3: the lock there closes reasoning at token 4
    assert steering.lock is not None and steering.lock.step == 3
    assert out[:7] == [5, 6, 7, NL, END0, END1, PREFIX]
    assert steering.exit is Exit.GRAVITY and steering.terminated_early
    assert steering.reasoning_tokens == 4 and steering.answer_start == 7


def test_a_lock_where_the_model_was_closing_anyway_is_credited_to_the_model():
    policy = {"name": "window_mean", "window": 2, "threshold": 0.5}
    steering = Steering(make_spec(policy=policy))
    out: list[int] = []
    for token in (5, 6, NL):
        steering.step(0.1, out, top_id=token)
        out.append(token)
    action = steering.step(0.1, out, top_id=END0)
    assert action.force == END0
    assert steering.exit is Exit.MODEL and not steering.terminated_early and steering.lock is not None


def test_gravity_waits_for_min_tokens():
    policy = {"name": "window_mean", "window": 2, "threshold": 0.5}
    steering = Steering(make_spec(policy=policy, min_tokens=6))
    out = drive(steering, [(0.1, NL)] * 12)
    assert steering.lock.step == 5
    assert out[6:9] == [END0, END1, PREFIX]


def test_budget_closes_reasoning_mid_line_with_a_newline_first():
    steering = Steering(make_spec(max_reasoning=4))
    out = drive(steering, [(3.0, 5)] * 10)
    assert out[:8] == [5, 5, 5, 5, NL, END0, END1, PREFIX]
    assert steering.exit is Exit.BUDGET and not steering.terminated_early


def test_gravity_off_never_fires():
    steering = Steering(make_spec(policy=None, max_reasoning=100))
    drive(steering, [(0.0, NL)] * 60)
    assert steering.lock is None and steering.exit is None


def test_reasoning_moves_end_of_sequence_onto_the_marker_and_the_answer_is_never_empty():
    steering = Steering(make_spec())
    assert steering.step(1.0, []) == Action(ban=(EOS,), merge_into=END0)
    drive(steering, [(1.0, END0), (1.0, 0), (1.0, 0), (1.0, EOS)])
    assert steering.answer_start == 3


def test_a_discarded_sample_is_overwritten_not_appended():
    steering = Steering(make_spec())
    steering.step(1.0, [])
    steering.step(1.5, [])  # the engine threw the first sample away (chunked prefill)
    steering.step(2.0, [5])
    assert steering.entropy == [1.5, 2.0]


def test_plain_generation_records_the_lock_but_never_forces():
    policy = {"name": "window_mean", "window": 2, "threshold": 0.5}
    steering = Steering(make_spec(policy=policy, reasoning=False))
    out = drive(steering, [(0.1, 5)] * 10)
    assert out == [5] * 10
    assert steering.lock is not None and steering.exit is None


def test_spec_round_trips_through_plain_data_and_rejects_bad_data():
    spec = make_spec(policy={"name": "window_mean", "window": 3, "threshold": 0.7}, min_tokens=4)
    assert SteeringSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="invalid agent_gravity settings"):
        SteeringSpec.from_dict({"key": "k"})
    bad_policy = dict(spec.to_dict(), policy={"name": "window_mean", "window": 0})
    with pytest.raises(ValueError, match="window must be a number from 1"):
        SteeringSpec.from_dict(bad_policy)


def test_apply_action_forces_bans_and_moves_mass():
    row = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    forced = row.clone()
    apply_action(forced, Action(force=2))
    assert forced.argmax().item() == 2 and torch.isinf(forced[[0, 1, 3]]).all()
    merged = row.clone()
    apply_action(merged, Action(ban=(3,), merge_into=0))
    assert math.isinf(merged[3].item())
    assert merged[0].exp().item() == pytest.approx(0.5)
    assert merged.exp().sum().item() == pytest.approx(1.0)


LOOP = {"name": "loop", "repeats": 3, "max_period": 8, "min_span": 6, "threshold": 0.5}
LOW = {"name": "window_mean", "window": 2, "threshold": 0.5}


def test_a_loop_in_reasoning_closes_it_mid_line_with_reason_loop():
    steering = Steering(make_spec(loop=LOOP))
    out = drive(steering, [(2.0, 40), (2.0, 41)] + [(0.1, 5 + i % 2) for i in range(20)])
    assert steering.exit is Exit.LOOP and steering.reason == "loop" and steering.terminated_early
    n = steering.reasoning_tokens
    assert out[n:n + 4] == [NL, END0, END1, PREFIX] and steering.lock.reason == "loop"


def test_a_loop_in_the_answer_stops_the_output_but_never_before_the_answer_has_text():
    steering = Steering(make_spec(loop=LOOP))
    out = drive(steering, [(2.0, END0), (1.0, 0), (1.0, 0)] + [(0.1, 7 + i % 2) for i in range(20)])
    assert steering.exit is Exit.MODEL and steering.stopped is not None and steering.reason == "loop"
    stop = out.index(EOS)
    assert 3 + 6 <= stop < 3 + 12 and out[3:stop] == [7 + i % 2 for i in range(stop - 3)]


def test_nothing_is_cut_inside_an_open_bracket_or_under_structured_output():
    brackets = ((60, 1), (61, -1))
    inside = [(0.1, 60)] + [(0.1, 7 + i % 2) for i in range(20)] + [(0.1, 61)] + [(0.1, 7 + i % 2) for i in range(12)]
    steering = Steering(make_spec(loop=LOOP, reasoning=False, brackets=brackets))
    out = drive(steering, inside)
    assert out.index(61) == 21 and 21 < out.index(EOS) <= 21 + 7, "a loop is cut only outside its bracket"
    structured = Steering(make_spec(policy=LOW, loop=LOOP, structured=True, max_reasoning=20))
    out = drive(structured, [(0.1, NL)] * 24 + [(0.1, 7 + i % 2) for i in range(20)])
    assert structured.exit is Exit.BUDGET and not structured.terminated_early and EOS not in out


def test_nothing_is_cut_once_a_tool_call_may_have_begun():
    guard = 62  # a token holding "<": it may open <tool_call>
    looping = [(0.1, 7 + i % 2) for i in range(30)]
    steering = Steering(make_spec(loop=LOOP, reasoning=False, guard_ids=(guard,)))
    out = drive(steering, [(0.1, 30), (0.1, guard)] + looping)
    assert EOS not in out and steering.stopped is None and not steering.terminated_early
    free = Steering(make_spec(loop=LOOP, reasoning=False, guard_ids=(guard,)))
    assert EOS in drive(free, [(0.1, 30)] + looping), "without the guard token the loop is cut"
    assert SteeringSpec.from_dict(make_spec(guard_ids=(guard,)).to_dict()).guard_ids == (guard,)


class FakeProber:
    """Records probes; the test answers them the way the engine would, later."""

    def __init__(self):
        self.asked: list[list[int]] = []

    def __call__(self, ids):
        self.asked.append(list(ids))


def probing(probe=ProbeSpec(agree=2, gap=3), policy=LOW, **more):
    steering = Steering(make_spec(policy=policy, probe=probe, **more))
    steering.prober = FakeProber()
    return steering


def test_a_lock_starts_a_probe_on_the_reasoning_so_far_and_the_main_stream_goes_on():
    steering = probing()
    out = drive(steering, [(0.1, 5), (0.1, 6), (0.1, NL), (0.1, 7)])
    assert steering.prober.asked == [[5, 6, NL, END0, END1, PREFIX]]
    assert out == [5, 6, NL, 7] and steering.exit is None  # unconfirmed: nothing forced
    assert steering.probes.in_flight


def test_agreeing_probes_confirm_the_exit_and_disagreeing_ones_do_not():
    steering = probing()
    out = drive(steering, [(0.1, NL)] * 3)
    steering.probe_answered(" 42.\nmore", 3)
    drive(steering, [(0.1, NL)] * 3, out)
    assert len(steering.prober.asked) == 2 and steering.exit is None
    steering.probe_answered("41", 2)  # disagrees: no exit
    drive(steering, [(0.1, NL)] * 3, out)
    assert steering.exit is None and len(steering.prober.asked) == 3
    steering.probe_answered("41!", 2)
    drive(steering, [(0.1, NL)] * 4, out)
    assert steering.exit is Exit.GRAVITY and steering.lock.policy == "probe(window_mean)"
    assert steering.lock.values["probes"] == 3 and steering.probes.tokens == 7


def test_hesitant_probe_answers_never_count_as_agreement():
    assert answer_key("Wait, maybe 42") == "" and answer_key("  Thursday.\n") == "thursday"
    steering = probing()
    out = drive(steering, [(0.1, NL)] * 3)
    steering.probe_answered("hmm", 1)
    drive(steering, [(0.1, NL)] * 3, out)
    steering.probe_answered("hmm", 1)
    drive(steering, [(0.1, NL)] * 3, out)
    assert len(steering.prober.asked) == 3
    assert steering.exit is None


def test_under_min_confidence_unsure_or_unmeasured_probe_answers_confirm_nothing():
    steering = probing(ProbeSpec(agree=2, gap=3, min_confidence=0.8))
    out = drive(steering, [(0.1, NL)] * 3)
    steering.probe_answered("42", 1, 0.95)
    drive(steering, [(0.1, NL)] * 3, out)
    steering.probe_answered("42", 1, 0.5)  # the same answer, but the model was not sure of it
    drive(steering, [(0.1, NL)] * 3, out)
    steering.probe_answered("42", 1, None)  # a backend that did not measure: not confirmed either
    drive(steering, [(0.1, NL)] * 3, out)
    assert steering.exit is None and [r.answer for r in steering.probes.records[:3]] == ["42", "", ""]
    steering.probe_answered("42", 1, 0.9)
    drive(steering, [(0.1, NL)] * 3, out)
    steering.probe_answered("42", 1, 0.99)
    drive(steering, [(0.1, NL)] * 4, out)
    assert steering.exit is Exit.GRAVITY and steering.probes.records[-1].confidence == 0.99


def test_probes_in_a_long_ramble_skip_the_confidence_test():
    steering = probing(ProbeSpec(agree=2, gap=3, min_confidence=0.8, lenient_after=5))
    out = drive(steering, [(0.1, NL)] * 3)
    steering.probe_answered("42", 1, 0.3)  # started at step 2: unsure, so it does not count
    drive(steering, [(0.1, NL)] * 4, out)
    steering.probe_answered("42", 1, 0.3)  # started at step 5: from lenient_after on, it counts
    drive(steering, [(0.1, NL)] * 3, out)
    steering.probe_answered("42", 1, 0.3)
    drive(steering, [(0.1, NL)] * 4, out)
    assert [r.answer for r in steering.probes.records[:3]] == ["", "42", "42"]
    assert steering.exit is Exit.GRAVITY


def test_under_hold_an_answer_confirms_only_once_it_has_held_that_many_reasoning_tokens():
    steering = probing(ProbeSpec(agree=2, gap=3, hold=6))
    out = drive(steering, [(0.1, NL)] * 3)
    for answer in ("8", "8", "16", "16"):  # probes at steps 2, 5, 8, 11: 8 held 3 tokens, then the reasoning moved on
        steering.probe_answered(answer, 1)
        drive(steering, [(0.1, NL)] * 3, out)
    assert steering.exit is None and [r.step for r in steering.probes.records] == [2, 5, 8, 11, 14]
    steering.probe_answered("16", 1)  # started at step 14: 16 has held 6 tokens
    drive(steering, [(0.1, NL)] * 4, out)
    assert steering.exit is Exit.GRAVITY
    assert steering.lock.step == 8 and steering.lock.values["agreeing"] == 3


def test_hold_leaves_probes_of_a_long_ramble_to_agree_alone():
    steering = probing(ProbeSpec(agree=2, gap=3, hold=30, lenient_after=5))
    out = drive(steering, [(0.1, NL)] * 3)
    steering.probe_answered("42", 1)  # step 2
    drive(steering, [(0.1, NL)] * 3, out)
    steering.probe_answered("42", 1)  # step 5: from lenient_after on, two agreeing probes suffice
    drive(steering, [(0.1, NL)] * 4, out)
    assert steering.exit is Exit.GRAVITY


def test_a_confirmed_exit_waits_for_a_line_start_then_closes_mid_line_after_a_line_break():
    steering = probing()
    out = drive(steering, [(0.1, 5), (0.1, 6), (0.1, NL)] + [(0.1, 7)] * 3)
    steering.probe_answered("42", 1)
    drive(steering, [(0.1, 7)] * 3, out)
    steering.probe_answered("42", 1)
    confirmed_at = len(out) - 1  # the step the engine last decided on
    drive(steering, [(0.1, 7)] * (LINE_WAIT - 1), out)
    assert steering.exit is None, "a confirmed exit waits for the line to end"
    drive(steering, [(0.1, 7)] * 4, out)
    assert steering.exit is Exit.GRAVITY and steering.reasoning_tokens == confirmed_at + LINE_WAIT
    assert out[confirmed_at + LINE_WAIT:][:4] == [NL, END0, END1, PREFIX], "closed mid-line after a line break"


def test_probe_confidence_is_the_least_likely_token_of_the_first_line():
    assert line_confidence([" 4", "2", ".", "\n", " Wait"], [0.9, 0.7, 0.95, 0.1, 0.01]) == 0.7
    assert line_confidence([" 4", "2.\n", "x"], [0.9, 0.6, 0.01]) == 0.6, "the token that ends the line counts"
    assert line_confidence(["\n"], [0.2]) is None and line_confidence([], []) is None
    with pytest.raises(ValueError, match="min_confidence"):
        ProbeSpec(min_confidence=0.0)


def test_without_a_prober_a_probe_confirmed_policy_never_exits_early():
    steering = Steering(make_spec(policy=LOW, probe=ProbeSpec(), max_reasoning=30))
    drive(steering, [(0.1, NL)] * 40)
    assert steering.exit is Exit.BUDGET and steering.probes.records == []


def test_interval_probing_ignores_entropy_and_respects_min_tokens():
    steering = probing(probe=ProbeSpec(agree=2, gap=1, interval=4), policy=None, min_tokens=6)
    drive(steering, [(3.0, 5)] * 9)
    assert [len(ids) for ids in steering.prober.asked] == [8 + 4]  # at token 8, mid-line: newline first
    assert steering.prober.asked[0][8] == NL


def test_interval_probes_add_to_lock_probes():
    steering = probing(probe=ProbeSpec(agree=2, gap=1, interval=4), policy=LOW)
    out = drive(steering, [(3.0, 5)] * 5)
    assert [len(ids) for ids in steering.prober.asked] == [4 + 4], "on schedule at token 4, entropy still high"
    steering.probe_answered("7", 1)
    drive(steering, [(0.1, NL)] * 3, out)
    assert [len(ids) for ids in steering.prober.asked] == [8, 7 + 3], "then on the lock at token 7, off schedule"


def test_no_probe_starts_once_the_exit_is_confirmed():
    steering = probing(probe=ProbeSpec(agree=1, gap=1))
    out = drive(steering, [(0.1, 5)] * 3)
    steering.probe_answered("8", 1)
    drive(steering, [(0.1, 5)] * 4 + [(0.1, NL), (0.1, 5)], out)
    assert len(steering.prober.asked) == 1 and steering.exit is Exit.GRAVITY


def test_plain_generation_stops_a_loop_with_end_of_sequence():
    steering = Steering(make_spec(loop=LOOP, reasoning=False))
    out = drive(steering, [(2.0, 40)] + [(0.1, 7 + i % 3) for i in range(30)])
    stop = out.index(EOS)
    assert steering.stopped is not None and steering.reason == "loop" and steering.exit is None
    assert out[stop + 1:] == [EOS] * (len(out) - stop - 1), "once stopped, only end of sequence"
    assert 1 + 6 <= stop <= 1 + 9


def test_a_loop_that_has_passed_acts_no_more():
    steering = Steering(make_spec(loop=LOOP, reasoning=False, brackets=((60, 1), (61, -1))))
    script = [(0.1, 60)] + [(0.1, 7 + i % 2) for i in range(12)] + [(2.0, 30 + i) for i in range(10)] + [(2.0, 61)]
    out = drive(steering, script + [(2.0, 40 + i) for i in range(10)])
    assert EOS not in out and steering.stopped is None, "the loop inside the bracket ended long before it closed"


def test_an_open_bracket_in_the_reasoning_does_not_block_gravity_and_is_forgotten_after_it():
    steering = Steering(make_spec(policy=LOW, loop=LOOP, brackets=((60, 1),)))
    out = drive(steering, [(0.1, 60)] + [(0.1, NL)] * 4 + [(1.0, 0)] * 3 + [(0.1, 7 + i % 2) for i in range(20)])
    assert steering.exit is Exit.GRAVITY and steering.reasoning_tokens == 2
    assert steering.stopped is not None and EOS in out, "the answer's loop is still cut"


def test_a_loop_seen_by_the_gravity_policy_exits_as_a_loop():
    policy = {"name": "any_of", "policies": [{"name": "window_mean", "threshold": 0.01}, LOOP]}
    steering = Steering(make_spec(policy=policy))
    drive(steering, [(0.1, 7 + i % 2) for i in range(20)])
    assert steering.exit is Exit.LOOP and steering.reason == "loop"


def test_a_probe_is_credited_to_the_lock_that_asked_for_it_and_a_failing_prober_confirms_nothing():
    steering = probing()
    out = drive(steering, [(0.1, NL)] * 3)
    steering.probe_answered("8", 1)
    drive(steering, [(0.1, NL)] * 3, out)
    first_trigger = steering.probes.records[0].trigger
    assert first_trigger is not None and first_trigger.step == 1
    steering.probe_answered("8", 1)
    drive(steering, [(0.1, NL)], out)
    assert steering.lock.step == 2 and steering.lock.values["window"] == 2

    def broken(ids):
        raise RuntimeError("engine gone")

    failing = probing()
    failing.prober = broken
    drive(failing, [(0.1, NL)] * 12)
    assert failing.exit is None and len(failing.probes.records) >= 2
    assert all(r.answer == "" for r in failing.probes.records)


def test_a_probe_answered_after_reasoning_closed_changes_nothing():
    steering = probing()
    out = drive(steering, [(0.1, NL)] * 3 + [(0.1, END0)])
    steering.probe_answered("8", 1)
    drive(steering, [(0.1, 0)] * 3, out)
    assert steering.exit is Exit.MODEL and steering.probes.records[-1].answer == "8"
