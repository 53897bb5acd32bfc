"""The lines `grpokit preflight` prints that are not the verdict's."""

from __future__ import annotations

from grpokit.preflight.measure import CompletionStats, DrawRecord, Measurement
from grpokit.preflight.report import completions_line, preflight_json
from grpokit.preflight.verdict import Verdict


def _measurement(mean_terminated_length: float | None) -> Measurement:
    return Measurement(
        settings=DrawRecord(8, 8, 1.0, 1.0, 0, 64, 0.04, "group", None, 0),
        infos=[],
        rewards=[],
        total_mean=0.0,
        total_zero_variance_share=1.0,
        completions=CompletionStats(40.0, 12, 64, 0.25, mean_terminated_length, 1.8, 0.9),
    )


def test_the_length_of_completions_ended_by_eos_reads_as_a_mean_not_a_count() -> None:
    assert completions_line(_measurement(35.0)) == (
        "completions: mean length 40 tokens (min 12, max 64; mean 35 of those ended by EOS); "
        "truncated at 64: 25%; entropy 1.80 nats/token; distinct per group 90%"
    )
    assert "(min 12, max 64; none ended by EOS)" in completions_line(_measurement(None))


def test_preflight_json_records_how_the_samples_were_drawn_without_the_system_prompt() -> None:
    doc = preflight_json(_measurement(35.0), Verdict("go"))
    # In this order in the file, as the records' fields are declared.
    assert list(doc["settings"].items()) == [
        ("prompts", 8),
        ("generations", 8),
        ("temperature", 1.0),
        ("top_p", 1.0),
        ("top_k", 0),
        ("max_completion_length", 64),
        ("beta", 0.04),
        ("scale_rewards", "group"),
        ("seed", 0),
        ("samples", 64),
    ]
