"""The user-facing docs stay inside the repository and in step with the code: no path of one
machine (or outside the checkout) in README.md, docs/ or benchmarks/README.md; the settings
reference equals what tools/settings_doc.py generates from the settings table; every kept
benchmark result is named in a doc."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import settings_doc  # noqa: E402

# absolute paths of a machine, and the shared folder beside a checkout
OUTSIDE = re.compile(r"(?<![\w.~-])(/work\b|/home/|/root\b|/tmp/\S|/Users/|/mnt/)|\.\./shared\b")
RESULTS_KEPT_AT_MOST = 40


def user_docs():
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def outside_paths(path):
    """'file:line: text' for each line of a document that names a path outside the repository."""
    hits = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if OUTSIDE.search(line):
            hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return hits


def test_the_path_check_catches_each_kind(tmp_path):
    bad = ["see /work/main/x.py", "`../shared/DESIGN.md`", "/home/me/venv/bin/python", "/root/.cache",
           "cd /tmp/x && run"]
    good = ["`<horovod-venv>/bin/python`", "benchmarks/results/a.jsonl", "run it from /tmp", "https://example.org/home"]
    doc = tmp_path / "d.md"
    doc.write_text("\n".join(bad + good) + "\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        hits = outside_paths(doc)
    finally:
        ROOT = saved
    assert [h.split(":")[1] for h in hits] == [str(i) for i in range(1, len(bad) + 1)], hits


def test_no_doc_points_outside_the_repository():
    hits = [h for doc in user_docs() if doc.exists() for h in outside_paths(doc)]
    assert hits == [], "paths outside the repository (use repository-relative paths or <placeholders>):\n" + \
        "\n".join(hits)


def test_settings_reference_is_generated_from_the_table():
    _, committed, _ = settings_doc.split((ROOT / "README.md").read_text())
    generated = settings_doc.generate(settings_doc.settings_rows())
    assert committed == generated, "README.md's settings reference is stale: python tools/settings_doc.py --write"
    # every declared setting has its row (the table, not a hand-written list)
    for name, *_ in settings_doc.settings_rows():
        assert f"`{name}`" in committed


def test_every_kept_result_is_named_in_a_doc():
    results = ROOT / "benchmarks" / "results"
    files = sorted(p for p in results.rglob("*") if p.is_file())
    assert len(files) <= RESULTS_KEPT_AT_MOST, f"{len(files)} files under benchmarks/results (at most 40)"
    text = "\n".join(doc.read_text() for doc in user_docs() if doc.exists())
    unnamed = [str(p.relative_to(results)) for p in files if str(p.relative_to(results)) not in text]
    assert unnamed == [], f"benchmarks/results files no doc names (name them or delete them): {unnamed}"


def test_relative_links_resolve():
    """Every markdown link to a file of the repository names one that exists."""
    broken = []
    for doc in user_docs():
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", line):
                if "://" not in target and not (doc.parent / target).exists():
                    broken.append(f"{doc.relative_to(ROOT)}:{n}: {target}")
    assert broken == [], "links to missing files:\n" + "\n".join(broken)
