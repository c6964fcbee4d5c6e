"""The README is a newcomer's page and every other text has one home under docs/ (issue 30).

- README.md is at most 300 lines.
- No paragraph of the README is repeated in docs/*.md. A paragraph is a blank-line-separated block
  whose text, with whitespace runs collapsed to one space, is at least 120 characters long. Fenced
  code blocks are left out on both sides (a usage line or a TOML example may fairly appear twice);
  tables count, as one paragraph each. "Repeated" means the README paragraph occurs verbatim
  (after the same normalization) anywhere in a doc, so a paragraph copied into a longer one is caught.
- Every docs/*.md is linked from the README.
- Every relative link in README.md, docs/*.md and benchmarks/README.md points to a file that exists, and a `#fragment`
  on a link to a markdown file names one of that file's headings (GitHub's anchor rule).
- The README's test command is the one CI runs (.ci/run runs scripts/test.sh).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MIN_PARAGRAPH = 120

_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _without_fences(text: str) -> list[str]:
    """The lines outside fenced code blocks; a fenced block becomes one blank line."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        if not fenced:
            out.append(line)
    return out


def _norm(text: str) -> str:
    return " ".join(text.split())


def paragraphs(text: str) -> list[str]:
    """Blank-line-separated blocks outside code fences, whitespace-normalized, of ≥ MIN_PARAGRAPH characters."""
    blocks = re.split(r"\n\s*\n", "\n".join(_without_fences(text)))
    return [p for p in map(_norm, blocks) if len(p) >= MIN_PARAGRAPH]


def links(text: str) -> list[str]:
    prose = re.sub(r"`[^`\n]*`", "", "\n".join(_without_fences(text)))  # a link shown as inline code is not a link
    return _LINK.findall(prose)


def anchor(heading: str) -> str:
    """GitHub's heading anchor: markup dropped, lowercased, punctuation removed, spaces to hyphens."""
    text = re.sub(r"[`*]|\[|\]\([^)]*\)", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _without_fences(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        a = anchor(m.group(1))
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def test_paragraph_rule_sees_text_not_code():
    text = "a " * 70 + "\n\n```\n" + "b " * 70 + "\n```\n\nshort\n\n| t | " + "c " * 70 + "|\n|---|---|\n"
    ps = paragraphs(text)
    assert len(ps) == 2 and ps[0].startswith("a a") and ps[1].startswith("| t |")
    assert links("[x](a.md) ![y](img/b.png#z) `[no](code)`\n```\n[no](fenced.md)\n```") == ["a.md", "img/b.png#z"]
    assert anchor("Readiness, server info and per-request stats") == "readiness-server-info-and-per-request-stats"
    assert anchor("Sequential gate: `--budget`") == "sequential-gate---budget"
    assert anchor("Gate efficiency (benchmarks/gate_efficiency.py)") == "gate-efficiency-benchmarksgate_efficiencypy"


def test_readme_is_at_most_300_lines():
    n = len(README.read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines; move detail to docs/ and link it"


def test_no_readme_paragraph_is_repeated_in_docs():
    docs = {p.name: _norm("\n".join(_without_fences(p.read_text()))) for p in DOCS}
    repeated = [(para[:80], name) for para in paragraphs(README.read_text()) for name, doc in docs.items() if para in doc]
    assert not repeated, f"README paragraphs that docs/ already holds (keep one copy, link it): {repeated}"


def test_every_doc_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in links(README.read_text()) if not re.match(r"\w+:", t)}
    missing = [p.name for p in DOCS if p.resolve() not in linked]
    assert not missing, f"docs not linked from README.md: {missing}"


@pytest.mark.parametrize("doc", [README, *DOCS, ROOT / "benchmarks/README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in links(doc.read_text()):
        if re.match(r"[a-zA-Z][\w+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: links to no file or no heading: {broken}"


def test_readme_test_command_is_what_ci_runs():
    assert "bash scripts/test.sh" in README.read_text()
    assert "scripts/test.sh" in (ROOT / ".ci/run").read_text()


# a backticked repository path: starts at a top-level folder of the repository (or is a top-level file), no spaces
_REPO_PATH = re.compile(r"`((?:qverify|tests|docs|benchmarks|scripts|\.ci)/[A-Za-z0-9_./*-]+|README\.md|pyproject\.toml)"
                        r"(?::[0-9-]+)?`")


def repo_paths(text: str) -> list[str]:
    """Backticked paths into this repository in prose (code blocks left out: they show commands, not claims)."""
    return [p.rstrip("/.") for p in _REPO_PATH.findall("\n".join(_without_fences(text)))]


def test_repo_path_rule_sees_paths_not_commands():
    assert repo_paths("see `qverify/gate/sequential.py` and `tests/x/` but not `qverify gate`") == \
        ["qverify/gate/sequential.py", "tests/x"]


@pytest.mark.parametrize("doc", [README, *DOCS, ROOT / "benchmarks" / "README.md"], ids=lambda p: p.name)
def test_backticked_repository_paths_exist(doc: Path):
    """Issue 36.3: README's code map named the deleted gate/sequential.py, docs/eval.md a test file that does not
    exist. A path in backticks is a claim that it exists (globs must match something)."""
    # `qverify/x/mod.attr` names an attribute of qverify/x/mod.py
    missing = [p for p in repo_paths(doc.read_text()) if not any(ROOT.glob(p)) and not any(ROOT.glob(p.rsplit(".", 1)[0] + ".py"))]
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


# "<number> FP8 KV tokens per replica" / "<n> sessions of 100k": the one capacity figure docs quote (issue 36.3)
_KV_TOKENS = re.compile(r"([0-9][0-9,.]*)\s*(k|M)?\s+(?:FP8\s+)?(?:KV\s+)?tokens per replica", re.IGNORECASE)
_SESSIONS = re.compile(r"\b([0-9]+) sessions of 100k")


def _tokens(number: str, unit: str | None) -> float:
    return float(number.replace(",", "")) * {"k": 1e3, "m": 1e6}.get((unit or "").lower(), 1)


def test_the_kv_capacity_figure_is_the_planners_and_the_same_everywhere():
    """docs/capacity.md's worked example is the one place the K2.6 figure lives, recomputed here; README and docs/
    link to it. Any other mention of K2.6's FP8 KV tokens per replica or sessions of 100k must agree (before: 315k
    and 3 in README, 965,574 and 9 in docs/serve.md)."""
    from qverify.capacity import plan
    from qverify.capacity.sources import load_config
    from qverify.serve.profile import load_profile

    p = plan(load_config("kimi-k2.6")[0], "fp8kv_nvfp4shared", gpu="b200", tp=4,
             mem_fraction=load_profile("kimi-k2.6").flags["mem_fraction_static"])
    capacity = (ROOT / "docs" / "capacity.md").read_text()
    assert f"| {p.kv_tokens_per_replica:,} (" in capacity and f"| {p.sessions_at_context}, with {p.margin.spare_tokens:,}" \
        in capacity, "docs/capacity.md's K2.6 table is not what the planner computes"
    for doc in (README, *DOCS):
        for para in re.split(r"\n\s*\n", "\n".join(_without_fences(doc.read_text()))):
            if "K2.6" not in para and "Kimi" not in para:
                continue
            for number, unit in _KV_TOKENS.findall(_norm(para)):
                assert abs(_tokens(number, unit) - p.kv_tokens_per_replica) <= 0.01 * p.kv_tokens_per_replica, (doc.name, para)
            for n in _SESSIONS.findall(_norm(para)):
                assert int(n) == p.sessions_at_context, (doc.name, para)


def test_readmes_qverify_toml_loads_and_its_kimi_model_gets_kimis_profile(tmp_path):
    """Issue 36.1: the example paired model /models/kimi-k2.6 with profile b200-tp4, which leaves Kimi's thinking on
    (answers cut at `length`, empty content), and had no trust_remote_code although Kimi's tokenizer is its own code."""
    from qverify.config import load_config
    from qverify.serve.profile import load_profile

    example = re.search(r"### qverify\.toml.*?```toml\n(.*?)\n```", README.read_text(), re.DOTALL)[1]
    (tmp_path / "qverify.toml").write_text(example)
    cfg = load_config(tmp_path / "qverify.toml")
    assert "kimi" in str(cfg.model).lower() and cfg.trust_remote_code
    assert load_profile(cfg.serving.profile).chat_template_kwargs == {"thinking": False}
