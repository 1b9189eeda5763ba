"""``durable.noop``: units that do nothing (optionally sleeping), for smoke tests and benchmarks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ..errors import InputRejected
from ..operations import JobContext, Operation, Unit, register


@register
class Noop(Operation):
    """``units`` units that do nothing (optionally sleeping): smoke tests and benchmarks."""

    name = "durable.noop"
    label = "No-op (smoke test)"

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        units = data.get("units", 1)
        sleep = data.get("sleep", 0)
        if not isinstance(units, int) or not 0 <= units <= 10_000_000:
            raise InputRejected("units", "must be an integer from 0 to 10,000,000")
        if not isinstance(sleep, int | float) or not 0 <= sleep <= 60:
            raise InputRejected("sleep", "must be a number of seconds from 0 to 60")
        return {"units": units, "sleep": sleep}

    def total_units(self, ctx: JobContext) -> int:
        return ctx.input["units"]

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        start = (ctx.checkpoint or {}).get("next", 0)
        for index in range(start, ctx.input["units"]):
            yield Unit(key=f"n:{index}", checkpoint={"next": index + 1})

    def run_unit(self, ctx: JobContext, unit: Unit) -> None:
        if ctx.input["sleep"]:
            time.sleep(ctx.input["sleep"])
