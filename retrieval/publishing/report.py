"""The gate's report: every check, its figures, its threshold and whether it refused."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Outcome = Literal["passed", "refused", "skipped"]


class Check(BaseModel):
    """One check of a candidate build against the live one."""

    model_config = ConfigDict(extra="forbid")

    name: str
    outcome: Outcome
    summary: str
    threshold: str = ""
    figures: dict[str, Any] = Field(default_factory=dict)


class GateReport(BaseModel):
    """Every check of ``candidate`` against ``live``; ``passed`` when none refused."""

    model_config = ConfigDict(extra="forbid")

    live_build: str | None
    candidate_build: str
    checks: list[Check]
    seconds: float = 0.0
    timings: dict[str, float] = Field(
        default_factory=dict, description="seconds per phase: diff, load, encode, search")

    @property
    def passed(self) -> bool:
        return not self.refused

    @property
    def refused(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "refused"]

    def check(self, name: str) -> Check:
        """The check called ``name`` (KeyError listing the names there are)."""
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check {name!r}; checks: {[c.name for c in self.checks]}")

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, **self.model_dump(mode="json")}

    def text(self) -> str:
        """Human-readable: one line per check, then the verdict."""
        lines = [f"candidate {self.candidate_build} against live {self.live_build or '(none)'}"]
        for check in self.checks:
            mark = {"passed": "ok     ", "refused": "REFUSED", "skipped": "skipped"}[check.outcome]
            limit = f"  [{check.threshold}]" if check.threshold else ""
            lines.append(f"  {mark} {check.name}: {check.summary}{limit}")
        verdict = ("passed" if self.passed else
                   "refused by: " + ", ".join(c.name for c in self.refused))
        phases = ", ".join(f"{name} {value:.2f}" for name, value in self.timings.items())
        lines.append(f"gate {verdict} ({self.seconds:.2f} s" + (f": {phases})" if phases else ")"))
        return "\n".join(lines)
