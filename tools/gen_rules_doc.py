#!/usr/bin/env python3
"""Regenerate the rule tables of docs/rules.md from the rules registry.

``moetune.rules.check.load_rules()`` is the single source of the rule catalogue. docs/rules.md holds hand-written
prose plus one generated block per rule area, delimited by ``<!-- BEGIN RULES <area> -->`` / ``<!-- END RULES
<area> -->`` (and a generated count table between ``<!-- BEGIN RULE COUNTS -->`` / ``<!-- END RULE COUNTS -->``).
This script rewrites those blocks in place; areas that have no block in the document are appended under an
"Other areas" section so that a new area is never silently left out.

    python tools/gen_rules_doc.py          # rewrite docs/rules.md
    python tools/gen_rules_doc.py --check  # exit 1 (and say so) when docs/rules.md is not current
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "rules.md"
sys.path.insert(0, str(REPO / "src"))

OTHER_HEADING = "## 14. Other areas"
_BLOCK = re.compile(r"<!-- BEGIN RULES (?P<area>[a-z_]+) -->\n.*?<!-- END RULES (?P=area) -->", re.S)
_COUNTS = re.compile(r"<!-- BEGIN RULE COUNTS -->\n.*?<!-- END RULE COUNTS -->", re.S)
LIB_SEVERITIES = ("error", "error(rt)", "error(env)", "warning", "info")


def _cell(text: str) -> str:
    """One Markdown table cell: pipes escaped, newlines folded."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _fix(rule) -> str:
    if rule.fix is None:
        return "—"
    if callable(rule.fix):
        return "computed from the config"
    return "<br>".join(f"`{k}={v!r}`" if isinstance(v, str) else f"`{k}={v}`" for k, v in rule.fix.items()) or "—"


def _fields(rule) -> str:
    return ", ".join(f"`{f}`" for f in rule.fields) or "—"


def area_table(rules: list) -> str:
    """The generated Markdown table of one area's rules, in id order."""
    lines = ["| id | severity | stage | applies to | fields read | fires when (paraphrase) | fix | source |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rules, key=lambda r: _sort_key(r.id)):
        applies = "both" if set(r.frontends) == {"bridge", "megatron-lm"} else ", ".join(r.frontends)
        lines.append("| " + " | ".join((r.id, _cell(r.severity), r.stage, applies, _cell(_fields(r)), _cell(r.text),
                                        _cell(_fix(r)), _cell(r.source))) + " |")
    return "\n".join(lines)


def _sort_key(rule_id: str) -> tuple:
    m = re.match(r"^([A-Z]+)-(\d+)(.*)$", rule_id)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else (rule_id, 0, "")


def count_table(by_area: dict[str, list]) -> str:
    lines = ["| area | rules | " + " | ".join(LIB_SEVERITIES) + " |", "|---|---|" + "---|" * len(LIB_SEVERITIES)]
    total: Counter = Counter()
    for area in sorted(by_area):
        c = Counter(r.severity for r in by_area[area])
        total.update(c)
        lines.append(f"| {area} | {len(by_area[area])} | " + " | ".join(str(c[s]) for s in LIB_SEVERITIES) + " |")
    lines.append(f"| **all** | **{sum(total.values())}** | " + " | ".join(str(total[s]) for s in LIB_SEVERITIES)
                 + " |")
    return "\n".join(lines)


def render(text: str) -> str:
    """docs/rules.md text with every generated block brought up to date."""
    from moetune.rules.check import load_rules

    by_area: dict[str, list] = {}
    for r in load_rules().values():
        by_area.setdefault(r.area, []).append(r)
    placed: set[str] = set()

    def block(m: re.Match) -> str:
        area = m.group("area")
        placed.add(area)
        body = area_table(by_area[area]) if area in by_area else "(no rules registered in this area)"
        return f"<!-- BEGIN RULES {area} -->\n{body}\n<!-- END RULES {area} -->"

    # the "Other areas" section is generated as a whole: drop it, then re-add what is left over
    text = text.split("\n" + OTHER_HEADING, 1)[0].rstrip("\n") + "\n"
    text = _BLOCK.sub(block, text)
    text = _COUNTS.sub(lambda m: f"<!-- BEGIN RULE COUNTS -->\n{count_table(by_area)}\n<!-- END RULE COUNTS -->",
                       text)
    rest = sorted(set(by_area) - placed)
    if rest:
        parts = [f"\n{OTHER_HEADING}\n\nAreas registered in `moetune.rules` that have no section above yet "
                 "(generated; give them a section of their own).\n"]
        for area in rest:
            parts.append(f"\n### {area}\n\n<!-- BEGIN RULES {area} -->\n{area_table(by_area[area])}\n"
                         f"<!-- END RULES {area} -->\n")
        text += "".join(parts)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report whether docs/rules.md is current")
    args = ap.parse_args(argv)
    old = DOC.read_text(encoding="utf-8")
    new = render(old)
    if args.check:
        if new != old:
            print("docs/rules.md is out of date with the rules registry: run python tools/gen_rules_doc.py",
                  file=sys.stderr)
            return 1
        return 0
    if new != old:
        tmp = DOC.with_suffix(".md.tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
