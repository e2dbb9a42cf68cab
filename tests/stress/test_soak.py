"""100,000 mixed eager collectives (every result checked) and 20,000 distinct names on 2 ranks,
RSS sampled: no wrong result, memory flat after warm-up."""

import sys

from conftest import HERE, records, report


def test_soak_mixed_collectives_and_distinct_names(mlslrun):
    r, seconds = mlslrun(2, sys.executable, HERE / "soak_worker.py", 100000, 20000, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    results = records(r.stdout, "SOAK")
    assert len(results) == 2, r.stdout[-2000:]
    for res in results:
        assert res["wrong"] == 0, res
        rss = {(phase, i): kib for phase, i, kib in res["rss_kib"]}
        warm = rss[("mixed", 20000)]
        growth_mixed = rss[("mixed", 90000)] - warm
        growth_distinct = rss[("end", 20000)] - rss[("distinct", 2000)]
        report(test="soak", rank=res["rank"], seconds=round(seconds, 1), mixed_s=res["mixed_s"],
               distinct_s=res["distinct_s"], rss_after_warmup_mib=warm // 1024,
               growth_mixed_kib=growth_mixed, growth_distinct_kib=growth_distinct,
               names_known=res["names_known"], names_forgotten=res["names_forgotten"])
        assert growth_mixed < 30 * 1024, res["rss_kib"]
        assert growth_distinct < 30 * 1024, res["rss_kib"]
