"""The project's docs/ stand on their own: every `docs/<file>.md §N` citation in src/, tests/ and bench/ names an
existing file and an existing numbered section, every docs file the README links exists, links between docs
resolve, rule ids named in the docs exist, and the generated rule tables of docs/rules.md are current."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SCANNED = ("src", "tests", "bench")

#: a section number as the code writes it: 3, 3.2, 4d, 2.1.3 (a trailing sentence dot is not part of it)
NUM = r"\d+[a-z]?(?:\.\d+)*"
#: how code names a doc: docs/domain.md, domain.md, ``docs/bridge_perf_notes.md``, bridge_perf_notes, BPN
_REF = re.compile(r"(?<![\w/.-])(?:docs/)?(?P<name>[a-z][a-z_]*)\.md\b|(?<![\w/.-])(?:docs/)?(?P<bare>bridge_perf_notes)\b"
                  r"|\b(?P<bpn>BPN)\b")
_SEC = re.compile(rf"§\s?(?P<a>{NUM})(?:\s?[-–]\s?(?P<b>{NUM}))?")
#: right after a doc name, "section 4.4" / "sections 3.2-3.3" count as citations too
_SEC_WORD = re.compile(rf"(?:§|sections?\s+)\s?(?P<a>{NUM})(?:\s?[-–]\s?(?P<b>{NUM}))?")
_SEP = re.compile(r"\s*(?:,|/|;|and|or)?\s*(?=§)")
#: bare § preceded by one of these belongs to a paper or another document, not to ours
_FOREIGN = re.compile(r"(report|paper|arxiv|table|rfc|section|pep)\W{0,3}$", re.I)
_HEADING = re.compile(rf"^#{{1,6}}\s+(?P<num>{NUM})\.?\s", re.M)


def _our_docs() -> set[str]:
    return {p.stem for p in DOCS.glob("*.md")}


def _text(path: Path) -> str:
    # YAML double-quoted strings may spell § as \xA7
    return path.read_text(encoding="utf-8", errors="replace").replace("\\xA7", "§")


def _scanned_files() -> list[Path]:
    out = []
    for top in SCANNED:
        for p in sorted((REPO / top).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".json", ".sbatch", ".md", ".txt", ".toml", ".j2",
                                             ".html", ".sh") and "__pycache__" not in p.parts:
                out.append(p)
    return out


def _chain(text: str, pos: int) -> list[tuple[int, str]]:
    """(position, section) of the § chain starting at ``pos`` (``§3.4/§4.4``, ``§4, §6``, ``§7.1-7.2``)."""
    nums: list[tuple[int, str]] = []
    pos = re.compile(r"[`\s]*").match(text, pos).end()
    while True:
        s = _SEC_WORD.match(text, pos)
        if not s:
            return nums
        nums.extend((s.start(), n) for n in (s.group("a"), s.group("b")) if n)
        pos = s.end()
        sep = _SEP.match(text, pos)
        if not sep:
            return nums
        pos = sep.end()


def citations() -> list[tuple[str, int, str, str]]:
    """(file, line, doc name, section) for every citation of a docs/ file with a section number.

    A bare ``§N`` also counts when its file names exactly one of our docs (e.g. sweep/phases.py cites domain.md
    once and then writes ``(§6.2)``) and it is not a paper's section (``DeepSeek-V3 report §3.2.2``)."""
    ours = _our_docs() | {"domain", "rules", "bridge_perf_notes", "anchors"}
    out = []
    for path in _scanned_files():
        text = _text(path)
        rel = str(path.relative_to(REPO))
        claimed: set[int] = set()
        named: set[str] = set()
        for m in _REF.finditer(text):
            name = m.group("name") or m.group("bare") or ("bridge_perf_notes" if m.group("bpn") else None)
            if name not in ours:
                continue
            named.add(name)
            line = text.count("\n", 0, m.start()) + 1
            for at, n in _chain(text, m.end()):
                claimed.add(at)
                out.append((rel, line, name, n.rstrip(".")))
        if len(named) == 1:
            (only,) = named
            for s in _SEC.finditer(text):
                if s.start() in claimed or _FOREIGN.search(text[max(0, s.start() - 12):s.start()]):
                    continue
                line = text.count("\n", 0, s.start()) + 1
                for n in (s.group("a"), s.group("b")):
                    if n:
                        out.append((rel, line, only, n.rstrip(".")))
    return out


def sections(name: str) -> set[str]:
    return {m.group("num").rstrip(".") for m in _HEADING.finditer((DOCS / f"{name}.md").read_text(encoding="utf-8"))}


def test_the_code_cites_the_docs() -> None:
    cites = citations()
    assert len(cites) > 80, f"only {len(cites)} citations found: the scanner lost track of the code's citations"
    assert {c[2] for c in cites} >= {"domain", "rules", "bridge_perf_notes", "anchors"}


def test_every_cited_docs_file_exists() -> None:
    missing = sorted({(f, ln, name) for f, ln, name, _ in citations() if not (DOCS / f"{name}.md").is_file()})
    assert not missing, "citations of missing docs files: " + "; ".join(f"{f}:{ln} docs/{n}.md" for f, ln, n in missing)


def test_every_cited_section_exists() -> None:
    bad = []
    cache: dict[str, set[str]] = {}
    for f, ln, name, num in citations():
        if not (DOCS / f"{name}.md").is_file():
            continue
        secs = cache.setdefault(name, sections(name))
        if num not in secs:
            bad.append(f"{f}:{ln} docs/{name}.md §{num}")
    assert not bad, "citations of sections that docs/ does not have: " + "; ".join(bad)


def test_scanner_reads_chains_and_ranges() -> None:
    text = ("x (docs/domain.md §3.4/§4.4) y ``docs/bridge_perf_notes.md`` §2 z docs/domain.md §7.1-7.2, §8. "
            "w docs/domain.md section 4.4) v docs/rules.md: no section here")
    got = [[n for _, n in _chain(text, m.end())] for m in _REF.finditer(text)]
    assert got == [["3.4", "4.4"], ["2"], ["7.1", "7.2", "8"], ["4.4"], []]


def test_readme_links_to_existing_docs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\(((?:\./)?docs/[\w./-]+\.md)(?:#[\w-]*)?\)", readme))
    assert linked, "README links no docs/ file"
    missing = sorted(p for p in linked if not (REPO / p).is_file())
    assert not missing, f"README links missing docs: {missing}"


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_relative_links_in_docs_resolve(doc: str) -> None:
    text = (DOCS / doc).read_text(encoding="utf-8")
    targets = {t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in t}
    missing = sorted(t for t in targets if not (DOCS / t).resolve().exists())
    assert not missing, f"docs/{doc} links to missing files: {missing}"


def test_rule_ids_named_in_the_docs_exist() -> None:
    from moetune.rules.check import load_rules

    known = set(load_rules())
    pat = re.compile(r"\b(?:PAR|TOPO|MOE|OVL|RCP|CG|PRC|OFF|FSDP|MLM|GUI)-\d{3}[a-z]*\b")
    bad = []
    for p in sorted(DOCS.glob("*.md")):
        for rid in sorted(set(pat.findall(p.read_text(encoding="utf-8")))):
            if rid not in known:
                bad.append(f"docs/{p.name}: {rid}")
    assert not bad, "rule ids the registry does not have: " + "; ".join(bad)


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_rules_doc", REPO / "tools" / "gen_rules_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rules_doc_is_current() -> None:
    gen = _gen_module()
    text = (DOCS / "rules.md").read_text(encoding="utf-8")
    assert gen.render(text) == text, "docs/rules.md is out of date: run python tools/gen_rules_doc.py"


def test_rules_doc_lists_every_rule_once() -> None:
    from moetune.rules.check import load_rules

    text = (DOCS / "rules.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| ([A-Z]+-\d+[a-z]*) \|", text, re.M)
    assert sorted(rows) == sorted(load_rules()), "each registered rule must have exactly one table row"


def test_hardware_table_matches_the_system_catalog() -> None:
    """docs/domain.md §5 restates the system catalog; every row must agree with catalog/systems/*.json."""
    from moetune.catalog.systems import get_system

    text = (DOCS / "domain.md").read_text(encoding="utf-8")
    sec = text[text.index("## 5. Hardware"):text.index("## 6.")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in sec.splitlines()
            if line.startswith("| ") and not line.startswith("| system")]
    assert len(rows) >= 7
    num = lambda cell: None if cell == "—" else float(cell.split()[0])  # noqa: E731
    for name, bf16, fp8, fp4, hbm, nvlink, domain, nic in rows:
        s = get_system(name)
        peaks = s.gpu.peak_tflops
        assert num(bf16) == peaks["bf16"], name
        assert num(fp8) == peaks.get("fp8"), name
        assert num(fp4) == peaks.get("nvfp4"), name
        assert float(hbm.split(";")[1].split()[0]) == pytest.approx(s.gpu.hbm_gib), name
        assert num(nvlink) == s.nvlink_bw_gbs and int(domain) == s.nvlink_domain and num(nic) == s.scaleout_bw_gbs, name
