"""The gate's verdict from two measured sides (pure): broken before drift before slower, every finding
kept."""

from __future__ import annotations

from deploykit.gate.judge import (
    changed_parts,
    clear_positions,
    drift_acceptable,
    drift_between,
    speed_findings,
    verdict,
    why_not_acceptable,
)
from deploykit.gate.run import release_part
from deploykit.smoke.fingerprint import tie_margin
from tests.gate.sides import case, fingerprint, point, side


def judged(baseline, candidate, threshold: float = 0.25):  # type: ignore[no-untyped-def]
    drift, _ = drift_between(baseline.fingerprint, candidate.fingerprint)
    assert baseline.figures is not None and candidate.figures is not None
    speed = speed_findings(baseline.figures, candidate.figures, threshold)
    return verdict(baseline, candidate, drift, speed), drift, speed


def test_the_same_answers_at_the_same_speed_promote() -> None:
    (reason, summary), drift, speed = judged(side("baseline"), side())
    assert reason is None and drift is None
    assert "as fast" in summary
    assert {(f.metric, f.streams) for f in speed if f.judged} == {
        ("tokens_per_s", 1),
        ("tpot_ms", 1),
        ("tokens_per_s", 4),
        ("tpot_ms", 4),
        ("kv_cache_tokens", None),
    }


def test_ids_parting_at_a_clear_margin_hold_drift_and_say_where() -> None:
    baseline = side("baseline", fp=fingerprint([5, 6, 7], [0.5, 0.5, 0.5]))
    candidate = side(fp=fingerprint([5, 9, 7], [0.5, 0.5, 0.5]))
    (reason, summary), drift, _ = judged(baseline, candidate)
    assert reason == "drift"
    assert drift is not None
    assert (drift.case, drift.position, drift.expected_id, drift.got_id) == ("pattern1", 1, 6, 9)
    assert drift.near_tie is False and drift.baseline_gap == 0.5
    assert "expected id 6, got id 9" in summary


def test_a_bfloat16_candidate_is_judged_at_bfloat16s_tolerance_so_its_near_ties_are_skipped() -> None:
    # The baseline (float32) is certain at position 1 by 0.3 nats: a tie at bfloat16's margin (0.5).
    baseline = side("baseline", fp=fingerprint([5, 6, 7], [0.9, 0.3, 0.9]))
    candidate = side(fp=fingerprint([5, 9, 7], [0.9, 0.3, 0.9], dtype="bfloat16"))
    drift, tolerance = drift_between(baseline.fingerprint, candidate.fingerprint)  # type: ignore[arg-type]
    assert tolerance == candidate.fingerprint.tolerance  # type: ignore[union-attr]
    assert tie_margin(tolerance) > 0.3
    assert drift is None
    # The same flip judged at float32's tolerance would be drift.
    strict, _ = drift_between(
        baseline.fingerprint, side(fp=fingerprint([5, 9, 7], [0.9, 0.3, 0.9])).fingerprint
    )  # type: ignore[arg-type]
    assert strict is not None and strict.position == 1


def test_a_logprob_that_moves_beyond_the_tolerance_is_drift_with_the_delta() -> None:
    baseline = side("baseline", fp=fingerprint([5, 6], [0.5, 0.5]))
    moved = fingerprint([5, 6], [0.5, 0.5])
    moved.answers[0].top[1] = {6: -1.5, 1006: -2.0}  # the chosen token's logprob moved by 0.5 nats
    (reason, _), drift, _ = judged(baseline, side(fp=moved))
    assert reason == "drift" and drift is not None
    assert drift.logprob_delta is not None and abs(drift.logprob_delta - 0.5) < 1e-9
    assert drift.got_id == drift.expected_id == 6


def test_a_candidate_slower_beyond_the_threshold_holds_slower_naming_the_figure() -> None:
    candidate = side(load=[point(1, 290), point(4, 300, tpot_ms=5.1)])
    (reason, summary), _, speed = judged(side("baseline"), candidate)
    assert reason == "slower"
    slower = [f for f in speed if f.slower]
    assert [(f.metric, f.streams) for f in slower] == [("tokens_per_s", 4)]
    assert slower[0].ratio == round(300 / 900, 4)
    assert "tokens_per_s at 4 stream(s): 300 vs the baseline's 900" in summary


def test_tpot_and_kv_capacity_are_judged_too_and_start_up_time_is_only_reported() -> None:
    baseline = side("baseline", kv=100_000)
    baseline.figures.startup_s = 10.0  # type: ignore[union-attr]
    candidate = side(load=[point(1, 300, tpot_ms=9.0), point(4, 900)], kv=50_000)
    candidate.figures.startup_s = 100.0  # type: ignore[union-attr]
    (reason, _), _, speed = judged(baseline, candidate)
    assert reason == "slower"
    by_metric = {(f.metric, f.streams): f for f in speed}
    assert by_metric[("tpot_ms", 1)].slower and by_metric[("kv_cache_tokens", None)].slower
    startup = by_metric[("startup_s", None)]
    assert startup.ratio == 10.0 and not startup.judged and not startup.slower


def test_within_the_threshold_is_not_slower() -> None:
    candidate = side(load=[point(1, 230), point(4, 700, tpot_ms=6.2)])  # 0.77 and 0.78: within 25 %
    (reason, _), _, _ = judged(side("baseline"), candidate)
    assert reason is None


def test_broken_wins_over_drift_and_slower_and_names_the_failed_case() -> None:
    candidate = side(
        fp=fingerprint([9, 9, 9], [0.5, 0.5, 0.5]),
        load=[point(1, 10), point(4, 10)],
        cases=[case("completion", passed=False, diagnosis="every logprob is NaN")],
    )
    (reason, summary), drift, _ = judged(side("baseline"), candidate)
    assert reason == "broken" and drift is not None  # the drift is still reported
    assert "case completion: every logprob is NaN" in summary


def test_a_missed_known_answer_is_drift_naming_the_case_before_the_fingerprint() -> None:
    candidate = side(
        fp=fingerprint([5, 9, 7], [0.5, 0.5, 0.5]),
        cases=[
            case("completion", passed=True),
            case("known:capital", passed=False, diagnosis="expected 'Paris', got 'Lyon'"),
        ],
    )
    (reason, summary), drift, _ = judged(
        side("baseline", fp=fingerprint([5, 6, 7], [0.5, 0.5, 0.5])), candidate
    )
    assert reason == "drift" and drift is not None
    assert summary.startswith("the candidate misses a known answer: known:capital: expected 'Paris'")
    assert "the fingerprint too: probe 'pattern1' at generated position 1" in summary


def test_a_failed_load_sample_is_broken_never_as_fast() -> None:
    candidate = side(
        load=[point(1, 300), point(4, 0, tpot_ms=None, problem="8 of 8 load request(s) incomplete")]
    )
    (reason, summary), _, speed = judged(side("baseline"), candidate)
    assert reason == "broken" and "4 stream(s)" in summary
    assert all(f.streams != 4 for f in speed)


def test_a_baseline_that_fails_on_its_own_is_no_baseline() -> None:
    (reason, summary), _, _ = judged(
        side("baseline", problem="the fingerprint could not be taken: timeout"), side()
    )
    assert reason == "broken" and summary.startswith("the baseline fails on its own")


def test_what_changed_is_every_key_part_that_differs() -> None:
    changed = changed_parts(side("baseline"), side(vllm="0.31.0", dtype="bfloat16"))
    assert changed == {"dtype": ["float32", "bfloat16"], "vllm": ["0.32.0+cpu", "0.31.0"]}


def test_the_key_keeps_the_plans_spelling_of_the_release_the_server_runs() -> None:
    assert release_part("0.32.0+cpu", "0.32.0") == "0.32.0+cpu"  # /version drops the local label
    assert release_part("0.32.0+cpu", "0.31.0") == "0.31.0"  # another release: the one it runs
    assert release_part("0.32.0+cpu", None) == "0.32.0+cpu"


def test_a_difference_within_the_baselines_own_spread_is_noise_not_slower() -> None:
    # The same server measured against itself on a busy 2-core host: best 380 vs 270 tok/s (× 0.71, beyond
    # the 25 % threshold), but the baseline's own samples went as low as 250: not slower.
    baseline = side("baseline", load=[point(1, 380).model_copy(update={"tokens_per_s_worst": 250.0})])
    (reason, _), _, speed = judged(baseline, side(load=[point(1, 270)]))
    assert reason is None
    (finding,) = [f for f in speed if f.metric == "tokens_per_s"]
    assert finding.ratio < 0.75 and finding.baseline_worst == 250.0 and not finding.slower
    # Below every baseline sample and beyond the threshold: slower.
    (reason, _), _, _ = judged(baseline, side(load=[point(1, 240)]))
    assert reason == "slower"


def test_tpot_outside_the_baselines_spread_is_slower_and_inside_it_is_not() -> None:
    worst = {"tpot_ms_worst": 9.0}
    baseline = side("baseline", load=[point(4, 900, tpot_ms=5.0).model_copy(update=worst)])
    inside, _, _ = judged(baseline, side(load=[point(4, 900, tpot_ms=8.0)]))
    outside, _, _ = judged(baseline, side(load=[point(4, 900, tpot_ms=9.5)]))
    assert inside[0] is None and outside[0] == "slower"


def test_a_comparison_where_every_position_is_a_near_tie_judged_nothing_and_holds() -> None:
    # The tiny random model's gaps (0.00025 to 0.11 nats) are all under bfloat16's tie margin (~0.5): a
    # bfloat16 candidate "matches" a float32 baseline only because nothing could be compared.
    baseline = side("baseline", fp=fingerprint([5, 6, 7], [0.01, 0.05, 0.11]))
    candidate = side(fp=fingerprint([5, 6, 7], [0.01, 0.05, 0.11], dtype="bfloat16"))
    drift, tolerance = drift_between(baseline.fingerprint, candidate.fingerprint)  # type: ignore[arg-type]
    assert drift is None
    clear = clear_positions(baseline.fingerprint, tolerance)  # type: ignore[arg-type]
    assert clear == (0, 3)
    reason, summary = verdict(baseline, candidate, drift, [], clear)
    assert reason == "drift" and "all 3 of the baseline's positions are near ties" in summary
    # At float32's own tolerance the same baseline compares every position.
    assert clear_positions(baseline.fingerprint, baseline.fingerprint.tolerance) == (3, 3)  # type: ignore[union-attr,arg-type]


def test_a_person_may_accept_fingerprint_drift_but_never_a_missed_known_answer_or_a_slower_candidate() -> (
    None
):
    drifted = side(fp=fingerprint([5, 9, 7], [0.5, 0.5, 0.5]))
    assert drift_acceptable("drift", drifted, [])
    missed = side(cases=[case("known:capital", passed=False, diagnosis="expected 'Paris'")])
    assert not drift_acceptable("drift", missed, [])
    (_, _), _, speed = judged(side("baseline"), side(load=[point(1, 300), point(4, 100)]))
    assert not drift_acceptable("drift", drifted, speed)
    assert not drift_acceptable("broken", drifted, []) and not drift_acceptable(None, drifted, [])
    assert why_not_acceptable(missed, []).startswith("it misses a known answer (known:capital)")
    assert why_not_acceptable(drifted, speed).startswith("it is also slower: tokens_per_s at 4 stream(s)")
