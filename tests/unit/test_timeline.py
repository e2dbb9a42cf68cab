"""mlsl_tf.timeline on a synthetic trace written the way ops/core/timeline.cc writes one."""

import json
import os
import subprocess
import sys

import pytest

from mlsl_tf import timeline

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def span(name, cat, tid, ts, dur, args=None, pid=0):
    e = {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args is not None:
        e["args"] = args
    return e


def instant(name, cat, tid, ts, args=None, pid=0):
    e = {"name": name, "cat": cat, "ph": "i", "s": "t", "pid": pid, "tid": tid, "ts": ts}
    if args is not None:
        e["args"] = args
    return e


def chunk(label, tid, ts, dur, nbytes, index, priority):
    return span(label, "chunk", tid, ts, dur, {"bytes": nbytes, "chunk": index, "priority": priority})


# lanes as the core numbers them: first use order
LANES = ["negotiation", "queue", "inflight 0", "inflight 1", "collective"]
NEG, Q, S0, S1, COLL = range(5)


def synthetic_events():
    """A big low-priority tensor in 3 chunks, preempted by an urgent one; two small tensors
    fused into one buffer; one allgather."""
    ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "mlsl_tf rank 0"}}]
    ev += [
        span("big", "negotiate", NEG, 0, 100),
        span("big", "queue", Q, 100, 50),
        chunk("big", S0, 160, 1000, 1 << 20, 0, 9),
        chunk("big", S1, 170, 1000, 1 << 20, 1, 9),
        span("urgent", "negotiate", NEG, 300, 100),
        span("urgent", "queue", Q, 400, 770),
        instant("preempted by urgent", "preempt", Q, 1165, {"tensor": "big"}),
        chunk("urgent", S0, 1170, 200, 4096, 0, 0),
        instant("urgent", "done", Q, 1375),
        chunk("big", S1, 1180, 900, 524288, 2, 9),
        instant("big", "done", Q, 2085),
        span("small_a", "negotiate", NEG, 2100, 50),
        span("small_b", "negotiate", NEG, 2110, 45),
        span("small_a", "queue", Q, 2150, 20),
        span("small_b", "queue", Q, 2155, 15),
        chunk("fused[2] small_a", S0, 2175, 60, 2048, 0, 3),
        instant("small_a", "done", Q, 2240),
        instant("small_b", "done", Q, 2240),
        span("gathered", "negotiate", NEG, 2300, 40),
        span("gathered", "queue", Q, 2340, 5),
        span("gathered", "allgather", COLL, 2350, 100),
        instant("gathered", "done", Q, 2450),
    ]
    ev += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": i, "args": {"name": n}} for i, n in enumerate(LANES)]
    ev.append({"name": "end", "ph": "i", "s": "g", "pid": 0, "ts": 0})
    return ev


def write_trace(path, events, complete=True):
    # the core's layout: one event per line, each followed by a comma, then "end" and "]"
    lines = ["[\n"] + [json.dumps(e) + ",\n" for e in events[:-1]]
    if complete:
        lines.append(json.dumps(events[-1]) + "\n]\n")
    path.write_text("".join(lines))
    return path


@pytest.fixture
def trace_file(tmp_path):
    return write_trace(tmp_path / "trace.json", synthetic_events())


def test_parse_spans_lanes_and_instants(trace_file):
    t = timeline.load(str(trace_file))
    phases = [s.phase for s in t.spans]
    assert phases.count("negotiate") == 5 and phases.count("queue") == 5
    assert phases.count("chunk") == 5 and phases.count("collective") == 1
    assert t.lanes[(0, S1)] == "inflight 1"
    big = [s for s in t.chunks() if s.name == "big"]
    assert [(s.lane, s.start_us, s.end_us, s.args["bytes"], s.args["chunk"]) for s in big] == [
        ("inflight 0", 160, 1160, 1 << 20, 0), ("inflight 1", 170, 1170, 1 << 20, 1),
        ("inflight 1", 1180, 2080, 524288, 2)]
    (coll,) = [s for s in t.spans if s.phase == "collective"]
    assert (coll.name, coll.lane, coll.dur_us) == ("gathered", "collective", 100)
    (p,) = t.preemptions()
    assert p.name == "preempted by urgent" and p.args["tensor"] == "big" and p.at_us == 1165
    assert [i.name for i in t.instants if i.kind == "done"] == ["urgent", "big", "small_a", "small_b", "gathered"]
    # the "end" marker has no category and is not an mlsl_tf event
    assert all(i.name != "end" for i in t.instants)


def test_fused_chunk_members_and_labels(trace_file):
    t = timeline.load(str(trace_file))
    assert timeline.split_label("fused[12] grad_3") == ("grad_3", 12)
    assert timeline.split_label("grad_3") == ("grad_3", 1)
    members = {s.name + "#" + str(s.args["chunk"]): m for s, m in timeline.chunk_members(t)}
    assert sorted(members["fused[2] small_a#0"]) == ["small_a", "small_b"]
    assert members["big#2"] == ["big"] and members["urgent#0"] == ["urgent"]


def test_summary_counts(trace_file):
    s = timeline.summary(timeline.load(str(trace_file)))
    assert s["tensors"] == 5 and s["completions"] == 5
    assert s["chunks"] == 5 and s["chunk_bytes"] == (2 << 20) + 4096 + 524288 + 2048
    assert s["fused_buffers"] == 1 and s["preemptions"] == 1
    assert s["span_ms"] == pytest.approx(2.45)
    # chunks in flight: [160, 2080] and [2175, 2235]
    assert s["transfer_busy_ms"] == pytest.approx((2080 - 160 + 60) / 1e3)
    assert "1 preemptions" in timeline.format_summary(s)


def test_row_orders(trace_file):
    t = timeline.load(str(trace_file))
    assert timeline.tensor_rows(t, "submit") == ["big", "urgent", "small_a", "small_b", "gathered"]
    assert timeline.tensor_rows(t, "priority")[:3] == ["urgent", "small_a", "big"]
    names = timeline.parse([span(n, "queue", 0, i, 1) for i, n in enumerate(["g_10", "g_2", "g_1"])])
    assert timeline.tensor_rows(names, "name") == ["g_1", "g_2", "g_10"]
    with pytest.raises(ValueError, match="row order 'size'"):
        timeline.tensor_rows(t, "size")


def test_window_and_rank_selection(trace_file):
    t = timeline.load(str(trace_file))
    w = t.window(2100, None)
    assert {s.name for s in w.spans} == {"small_a", "small_b", "fused[2] small_a", "gathered"}
    assert t.for_rank(1).spans == []


def test_truncated_file_still_loads(tmp_path):
    path = write_trace(tmp_path / "cut.json", synthetic_events(), complete=False)
    assert timeline.summary(timeline.load(str(path)))["chunks"] == 5


def test_not_a_trace_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a Chrome-trace"):
        timeline.load(str(bad))


def test_draw_writes_png(trace_file, tmp_path):
    out = tmp_path / "gantt.png"
    timeline.draw(timeline.load(str(trace_file)), str(out))
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 5000


def test_draw_many_tensors(tmp_path):
    ev = []
    for i in range(161):  # ResNet-50's count: rows stay drawable, labels thinned
        ev += [span(f"grad_{i}", "negotiate", NEG, i * 10, 5), span(f"grad_{i}", "queue", Q, i * 10 + 5, 3),
               chunk(f"grad_{i}", S0 + i % 2, i * 10 + 8, 9, 4096, 0, i), instant(f"grad_{i}", "done", Q, i * 10 + 17)]
    t = timeline.parse(ev)
    out = tmp_path / "many.png"
    timeline.draw(t, str(out), order="name")
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert timeline.summary(t)["tensors"] == 161


def test_command_line(trace_file, tmp_path):
    out = tmp_path / "cli.png"
    r = subprocess.run([sys.executable, "-m", "mlsl_tf.timeline", str(trace_file), "-o", str(out)],
                       capture_output=True, text=True, timeout=120, env=CLI_ENV)
    assert r.returncode == 0, r.stderr
    assert "5 tensors" in r.stdout and "1 preemptions" in r.stdout and "1 fused buffers" in r.stdout
    assert out.read_bytes()[:8] == PNG_MAGIC
    r = subprocess.run([sys.executable, "-m", "mlsl_tf.timeline", str(trace_file), "--rank", "4", "-o", str(out)],
                       capture_output=True, text=True, timeout=120, env=CLI_ENV)
    assert r.returncode == 1 and "rank 4 is not in" in r.stderr
    r = subprocess.run([sys.executable, "-m", "mlsl_tf.timeline", str(tmp_path / "missing.json")],
                       capture_output=True, text=True, timeout=120, env=CLI_ENV)
    assert r.returncode == 1 and "cannot read" in r.stderr


def test_file_read_in_the_middle_of_a_write_loads_up_to_its_last_whole_event(tmp_path):
    """The core replaces the closing bracket with new events and a new bracket in one write: a
    reader can catch it half done, the last event cut anywhere."""
    events = synthetic_events()[:-1]
    whole = "[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n"
    json.loads(whole)  # what the core leaves between writes: strict JSON
    path = tmp_path / "live.json"
    last = json.dumps(events[-1])
    cut_at = whole.rindex(last) + len(last) // 2
    for text, n in ((whole, len(events)), (whole[:cut_at], len(events) - 1),
                    (whole[:whole.rindex(last)], len(events) - 1), (whole[:-3] + ",\n", len(events))):
        path.write_text(text)
        assert len(timeline.load_events(str(path))) == n, text[-200:]


def test_horovod_named_events_are_kept_apart(trace_file):
    hv = [span("NEGOTIATE_ALLREDUCE", "horovod", 7, 0, 100, {"tensor": "big"}),
          span("ALLREDUCE", "horovod", 7, 100, 1985, {"tensor": "big"}),
          span("QUEUE", "horovod", 7, 100, 50, {"tensor": "big"}),
          {"name": "CYCLE_START", "cat": "horovod", "ph": "i", "s": "p", "pid": 0, "ts": 90}]
    plain = timeline.load(str(trace_file))
    t = timeline.parse(synthetic_events() + hv)
    assert timeline.summary(t) == timeline.summary(plain) and len(t.spans) == len(plain.spans)
    assert [(a.phase, a.name, a.start_us, a.dur_us) for a in t.activities] == [
        ("NEGOTIATE_ALLREDUCE", "big", 0, 100), ("ALLREDUCE", "big", 100, 1985), ("QUEUE", "big", 100, 50)]
    assert [a.phase for a in t.activity("ALLREDUCE", "big")] == ["ALLREDUCE"] and not t.activity("ALLREDUCE", "x")
    assert [c.at_us for c in t.cycle_starts] == [90]
    assert t.for_rank(0).activities == t.activities and t.for_rank(1).cycle_starts == []
    assert [a.phase for a in t.window(1000, None).activities] == ["ALLREDUCE"]
