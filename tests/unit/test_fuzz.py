"""Generated bad input at every entry point (bench/fuzz_inputs.py), a few hundred each.

The full run, 10,000 inputs per entry point, is `make fuzz`. Here each door
gets enough inputs to catch a regression on every `make test`: no exception
other than the documented refusal, and nothing stored or in force changed by
an input that was refused.
"""

from __future__ import annotations

import pytest

from bench.fuzz_inputs import DOORS, fuzz
from shared.public import parse_target


@pytest.mark.parametrize("door", sorted(DOORS))
def test_bad_input_at_every_door_crashes_nothing_and_changes_nothing(door):
    result = fuzz(door, 150)
    assert result.inputs >= 150


@pytest.mark.parametrize("payload, words", [
    (b'{"container": "nope", "container": "c07", "objective": 30}', "key twice"),
    (b'{"container": "c07", "objective": 5e-324}', "at least 0.001"),
    (b'{"container": "c07", "objective": 86401}', "at most 86400"),
    (b'{"container": "c07", "objective": NaN}', "neither JSON nor msgpack"),
])
def test_target_requests_outside_the_bounds_or_with_a_key_twice_are_refused(payload, words):
    with pytest.raises(Exception, match=words):
        parse_target(payload)
