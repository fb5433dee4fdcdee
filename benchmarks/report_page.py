"""The docs' benchmarks page, generated from the benchmarks' JSON rather than written by hand.

``python -m benchmarks.report_page`` first copies the newest ``<name>-<timestamp>.json`` of
each benchmark in ``benchmarks/results/`` (gitignored, written by ``common.write_results``) into
``docs/benchmarks/figures/`` (committed; one file per benchmark, the markdown report beside the
JSON folded into it under ``"markdown"``) when it is newer than the copy there, then writes
``docs/benchmarks.md`` from ``docs/benchmarks/figures/`` alone: per benchmark its current
figures, the machine they were measured on and the command that reproduces them. So the page
can be regenerated from committed data on any checkout; ``benchmarks/README.md`` stays the
history of how the figures came to be.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "benchmarks" / "figures"
PAGE = ROOT / "docs" / "benchmarks.md"
_STAMP = re.compile(r"^(?P<name>.+)-(?P<stamp>\d{8}T\d{6}Z)$")
_FLAG = re.compile(r"""add_argument\(\s*["'](--[A-Za-z0-9-]+)["']""")


def newest(folder: Path) -> dict[str, Path]:
    """The newest ``<name>-<timestamp>.json`` of each benchmark name in ``folder``."""
    found: dict[str, tuple[str, Path]] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        match = _STAMP.match(path.stem)
        if match and (match["name"] not in found or match["stamp"] > found[match["name"]][0]):
            found[match["name"]] = (match["stamp"], path)
    return {name: path for name, (_, path) in sorted(found.items())}


def collect(results: Path = RESULTS, figures: Path = FIGURES) -> list[str]:
    """Copy each benchmark's newest result into ``figures`` when newer; returns those names."""
    current = newest(figures)
    copied = []
    for name, path in newest(results).items():
        if name in current and current[name].stem >= path.stem:
            continue
        payload = json.loads(path.read_text(encoding="utf-8"))
        report = path.with_suffix(".md")
        if "markdown" not in payload and report.is_file():
            payload["markdown"] = report.read_text(encoding="utf-8").rstrip()
        figures.mkdir(parents=True, exist_ok=True)
        (figures / path.name).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        if name in current:
            current[name].unlink()
        copied.append(name)
    return copied


def _module(name: str) -> str:
    """The benchmarks module that writes results under ``name``."""
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if re.search(rf"""(publish_report|write_results)\(\s*["']{re.escape(name)}["']""",
                     path.read_text(encoding="utf-8")):
            return path.stem
    return name.replace("-", "_")


def _argument(value: str) -> str:
    if os.path.isabs(value):
        try:
            return os.path.relpath(value, ROOT)
        except ValueError:
            return value
    return value


def reproduce(name: str, config: Mapping[str, Any]) -> str:
    """``python -m benchmarks.<module>`` with the arguments the run was given (as the module
    still names them; its output folder left to the default)."""
    module = _module(name)
    source = ROOT / "benchmarks" / f"{module}.py"
    flags = set(_FLAG.findall(source.read_text(encoding="utf-8"))) if source.is_file() else set()
    words = [f"python -m benchmarks.{module}"]
    for key, raw in config.items():
        flag, value = "--" + key.replace("_", "-"), str(raw)
        if key == "out" or value == "None":
            continue
        if value in ("True", "False"):
            negative = "--no-" + key.replace("_", "-")
            if value == "True" and flag in flags:
                words.append(flag)
            elif value == "False" and negative in flags:
                words.append(negative)
            continue
        if flag not in flags:
            continue
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        items = parsed if isinstance(parsed, list | tuple) else [value]
        words.append(flag + "".join(f" {_argument(str(item))}" for item in items))
    return " ".join(words)


def machine(environment: Mapping[str, Any]) -> str:
    """One paragraph: CPU, load, interpreter, platform, revision and library versions."""
    if not environment:
        return "not recorded"
    load = environment.get("load_average")
    parts = [f"{environment.get('cpus_usable', '?')} usable of {environment.get('cpu_count', '?')}"
             f" {environment.get('processor', '')} cores".replace("  ", " ")]
    if environment.get("cpu_model"):
        parts.append(str(environment["cpu_model"]))
    if "vector_extensions" in environment:  # recorded since 2026-12-06; absent before
        parts.append("vector extensions: "
                     + (", ".join(environment["vector_extensions"]) or "none of those looked for"))
    if load:
        parts.append("load average " + " / ".join(f"{x:.1f}" for x in load))
    parts.append(f"Python {environment.get('python', '?')} on {environment.get('platform', '?')}")
    if environment.get("git_sha"):
        parts.append(f"revision `{environment['git_sha'][:12]}`")
    packages = environment.get("packages") or {}
    text = "; ".join(parts)
    if packages:
        text += " — " + ", ".join(f"{k} {v}" for k, v in packages.items() if v)
    return text


def _demote(markdown: str, levels: int = 2) -> str:
    """The report's own headings moved under the page's (``#`` becomes ``###``)."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" * levels + line if not fenced and line.startswith("#") else line)
    return "\n".join(out)


def _compact(results: Any, limit: int = 40) -> str:
    """Results without a markdown report: scalars as a table, anything else as clipped JSON."""
    if isinstance(results, Mapping) and all(
            isinstance(v, str | int | float | bool) or v is None for v in results.values()):
        rows = "\n".join(f"| {k} | {v} |" for k, v in results.items())
        return f"| figure | value |\n|---|---|\n{rows}"
    lines = json.dumps(results, indent=1, default=str).splitlines()
    clipped = lines[:limit] + ([f"... ({len(lines) - limit} more lines)"] if len(lines) > limit
                               else [])
    return "```json\n" + "\n".join(clipped) + "\n```"


def benchmark_names() -> list[str]:
    """Every name a benchmarks module writes results under."""
    pattern = re.compile(r"""(?:publish_report|write_results)\(\s*["']([A-Za-z0-9_-]+)["']""")
    return sorted({name for path in (ROOT / "benchmarks").glob("*.py")
                   for name in pattern.findall(path.read_text(encoding="utf-8"))})


def render(paths: Iterable[Path]) -> str:
    sections, seen = [], set()
    for path in paths:
        payload = json.loads(path.read_text(encoding="utf-8"))
        match = _STAMP.match(path.stem)
        assert match is not None, path  # newest() keeps only stamped names
        name, stamp = match["name"], match["stamp"]
        seen.add(name)
        results = {k: v for k, v in payload.items()
                   if k not in ("config", "environment", "markdown")}
        figures = (_demote(payload["markdown"]) if payload.get("markdown")
                   else _compact(results.get("results", results)))
        sections.append(
            f"## {name}\n\nMeasured {stamp[:4]}-{stamp[4:6]}-{stamp[6:8]} "
            f"{stamp[9:11]}:{stamp[11:13]} UTC (`docs/benchmarks/figures/{path.name}`).\n\n"
            f"{figures}\n\n**Machine:** {machine(payload.get('environment') or {})}\n\n"
            f"**Reproduce:**\n\n```\n{reproduce(name, payload.get('config') or {})}\n```\n")
    body = "\n".join(sections) if sections else "No benchmark figures have been collected yet.\n"
    missing = [name for name in benchmark_names() if name not in seen]
    if missing:
        body += ("\n## Not collected yet\n\nThese benchmarks have no figures here yet (their "
                 "latest reports are in the history): "
                 + ", ".join(f"`python -m benchmarks.{_module(n)}` ({n})" for n in missing)
                 + ".\n")
    return (
        "# Benchmarks\n\n"
        "<!-- generated by `python -m benchmarks.report_page` from docs/benchmarks/figures/; "
        "do not edit -->\n\n"
        "The current figures of each benchmark that has been collected, the machine they were "
        "measured on and the command that reproduces them (run from the repository root after "
        "`make install`; figures on a shared machine move with its load, which is recorded). "
        "To refresh this page, run a benchmark (it writes `benchmarks/results/`), then "
        "`python -m benchmarks.report_page`. How the figures came to be, run by run, is the "
        "history in `benchmarks/README.md`; the floor and the peers measured before this "
        "project are in `benchmarks/REFERENCE.md`.\n\n" + body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--figures", type=Path, default=FIGURES)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--no-collect", action="store_true",
                        help="render the committed figures only, copying nothing")
    args = parser.parse_args(argv)
    if not args.no_collect:
        for name in collect(args.results, args.figures):
            print(f"collected {name}")
    args.page.write_text(render(newest(args.figures).values()), encoding="utf-8")
    print(f"wrote {args.page}")


if __name__ == "__main__":
    main()
