"""`dqoes control` with a name no policy can have: a clear error before anything is sent.

The registry's check passes names through for a policy this CLI does not know (the worker checks
those), so the message's own check on parameter names is what stops them."""

from __future__ import annotations

import asyncio

import pytest

from services.cli.common import CliError
from services.cli.operate import control_nodes


class NoBus:
    name = "test"

    async def request(self, *args, **kwargs):  # pragma: no cover - reaching it is the failure
        raise AssertionError("sent")


@pytest.mark.parametrize("name", ["a b", "x\nFAKE LOG LINE", "1st"])
def test_a_name_that_cannot_be_a_parameter_is_refused_before_sending(name):
    with pytest.raises(CliError, match="keys must be parameter names"):
        asyncio.run(control_nodes(NoBus(), ["n1"], {name: 1.0}))
