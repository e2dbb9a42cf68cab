"""Reads the Chrome-trace timeline the core writes (MLSL_TF_TIMELINE=path, mlslrun
--timeline-filename) and draws it as a PNG Gantt chart.

    python -m mlsl_tf.timeline trace.json -o trace.png [--start-ms A --end-ms B] [--rank R]

What the core writes (ops/core/scheduler.cc), per rank (pid):
  X "negotiate"  tensor name, lane "negotiation": submitted -> agreed by every rank
  X "queue"      tensor name, lane "queue": agreed -> its (fused) buffer started; every part
                 of one fused buffer ends its queue span at the same instant
  X "chunk"      the work's label ("grad_3", or "fused[N] grad_3" for N fused tensors led by
                 grad_3), lane "inflight K" (one lane per in-flight slot), args bytes, chunk,
                 priority
  X other        a non-chunked collective ("allgather", ...), lane "collective"
  i "preempt"    "preempted by LABEL", args tensor: the label whose remaining chunks waited
  i "done"       tensor name: its result is available
  i "start"      lane "framework": a deferred update's reduction was started (the backward pass
                 produced the gradient; cross-iteration overlap, mlsl_tf/overlap.py)
  i "take"       lane "framework": that result was handed to the graph that asked for it (the
                 next forward pass reached the variable)
and Horovod's names (category "horovod", args tensor), one lane per tensor ("allreduce.grad_3"):
  X NEGOTIATE_ALLREDUCE (_BROADCAST, _ALLGATHER, ...): submitted -> agreed by every rank
  X ALLREDUCE (BROADCAST, ALLGATHER, ALLTOALL, REDUCESCATTER, BARRIER): agreed -> done, with
                 X QUEUE inside it until the transfer started
  i CYCLE_START  a background cycle began (mark_cycles / HOROVOD_TIMELINE_MARK_CYCLES)
(Trace.activities and Trace.cycle_starts; the chart and summary use mlsl_tf's own events).
The file is a valid trace while the job runs: the core rewrites the closing "]" after the
events it adds; a file read in the middle of a write (or cut short) loads up to its last
whole event.
The chart has one row per in-flight slot (chunks coloured by priority) above one row per
tensor (negotiate / queue / transfer / done), with the preemptions marked on both.
Standard library only, except matplotlib for the PNG.
"""

import argparse
import collections
import dataclasses
import json
import re
import sys
from typing import Optional

PHASES = ("negotiate", "queue", "chunk", "collective")
FRAMEWORK_MARKS = (("start", "#2ca02c", ">", "started (gradient ready)"),
                   ("take", "#d62728", "o", "taken (next forward pass)"))
PHASE_COLOURS = {"negotiate": "#b0b0b0", "queue": "#f5a623", "chunk": "#2a6fdb", "collective": "#7b4fc9"}
_FUSED = re.compile(r"fused\[(\d+)\] (.*)\Z", re.S)
_PREEMPTED_BY = "preempted by "


@dataclasses.dataclass(frozen=True)
class Span:
    name: str       # tensor name, or the work label for chunks
    phase: str      # one of PHASES
    pid: int
    lane: str
    start_us: float
    dur_us: float
    args: dict

    @property
    def end_us(self):
        return self.start_us + self.dur_us


@dataclasses.dataclass(frozen=True)
class Instant:
    name: str
    kind: str       # "done", "preempt" or the event's category
    pid: int
    lane: str
    at_us: float
    args: dict


@dataclasses.dataclass
class Trace:
    spans: list
    instants: list
    lanes: dict     # (pid, tid) -> lane name
    # Horovod's names: Span(tensor name, activity ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE"),
    # ...), and the CYCLE_START marks as Instant(..., kind "CYCLE_START", ...)
    activities: list = dataclasses.field(default_factory=list)
    cycle_starts: list = dataclasses.field(default_factory=list)

    def pids(self):
        return sorted({s.pid for s in self.spans} | {i.pid for i in self.instants})

    def for_rank(self, pid):
        return Trace([s for s in self.spans if s.pid == pid], [i for i in self.instants if i.pid == pid],
                     {k: v for k, v in self.lanes.items() if k[0] == pid},
                     [a for a in self.activities if a.pid == pid], [c for c in self.cycle_starts if c.pid == pid])

    def window(self, start_us=None, end_us=None):
        """The events overlapping [start_us, end_us] (either end open when None)."""
        lo = float("-inf") if start_us is None else start_us
        hi = float("inf") if end_us is None else end_us
        return Trace([s for s in self.spans if s.end_us >= lo and s.start_us <= hi],
                     [i for i in self.instants if lo <= i.at_us <= hi], dict(self.lanes),
                     [a for a in self.activities if a.end_us >= lo and a.start_us <= hi],
                     [c for c in self.cycle_starts if lo <= c.at_us <= hi])

    def activity(self, name, tensor=None):
        """The Horovod-named spans called `name` ("ALLREDUCE", ...), of `tensor` when given."""
        return [a for a in self.activities if a.phase == name and (tensor is None or a.name == tensor)]

    def chunks(self):
        return [s for s in self.spans if s.phase == "chunk"]

    def preemptions(self):
        return [i for i in self.instants if i.kind == "preempt"]


def split_label(label):
    """("grad_3", 4) for "fused[4] grad_3"; (label, 1) otherwise."""
    m = _FUSED.match(label)
    return (m.group(2), int(m.group(1))) if m else (label, 1)


def _cut_short(text):
    """The events of a JSON array not closed: a file cut short (a process that died before
    closing it) or read while the core was adding events. Chrome's trace format allows a missing
    closing bracket; the core writes one event per line, so a line written only in part is
    dropped (up to two, the closing bracket's and the event's)."""
    body = text.rstrip()
    for _ in range(3):
        body = body.rstrip().rstrip(",")
        try:
            return json.loads(body + ("" if body.endswith("]") else "\n]"))
        except json.JSONDecodeError as e:
            error = e
            cut = body.rfind("\n")
            if cut <= 0:
                break
            body = body[:cut]
    raise error


def load_events(path):
    """The event list of a trace file, also one not closed yet (see _cut_short)."""
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        if not text.lstrip().startswith("["):
            raise ValueError(f"{path}: not a Chrome-trace JSON array") from None
        try:
            data = _cut_short(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a Chrome-trace JSON file ({e})") from None
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of trace events")
    return data


def parse(events):
    """A Trace from Chrome-trace events (those of mlsl_tf's core; others are ignored)."""
    lanes = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            lanes[(int(e.get("pid", 0)), int(e.get("tid", 0)))] = str(e.get("args", {}).get("name", ""))
    spans, instants, activities, cycles = [], [], [], []
    for e in events:
        ph, cat = e.get("ph"), e.get("cat")
        if ph not in ("X", "i") or cat is None or "ts" not in e:
            continue
        pid, tid = int(e.get("pid", 0)), int(e.get("tid", 0))
        lane = lanes.get((pid, tid), f"lane {tid}")
        args = e.get("args") or {}
        if cat == "horovod":
            if ph == "X":
                activities.append(Span(str(args.get("tensor", lane)), str(e["name"]), pid, lane, float(e["ts"]),
                                       float(e.get("dur", 0)), args))
            else:
                cycles.append(Instant(str(e["name"]), str(e["name"]), pid, lane, float(e["ts"]), args))
            continue
        if ph == "X":
            phase = cat if cat in ("negotiate", "queue", "chunk") else "collective"
            spans.append(Span(str(e["name"]), phase, pid, lane, float(e["ts"]), float(e.get("dur", 0)), args))
        else:
            instants.append(Instant(str(e["name"]), cat, pid, lane, float(e["ts"]), args))
    spans.sort(key=lambda s: (s.start_us, s.end_us))
    instants.sort(key=lambda i: i.at_us)
    activities.sort(key=lambda s: (s.start_us, -s.dur_us))
    cycles.sort(key=lambda i: i.at_us)
    return Trace(spans, instants, lanes, activities, cycles)


def load(path):
    return parse(load_events(path))


def chunk_members(trace):
    """[(chunk span, [tensor names])]: which tensors each chunk carries. A fused buffer's parts
    all leave the queue at the instant the buffer is prepared, just before its first chunk, so
    its members are the tensors whose queue span ends last at or before that chunk among the
    queue ends that include the head tensor."""
    queue_ends = collections.defaultdict(list)  # (pid, head name) -> [(end, [names])]
    by_end = collections.defaultdict(list)
    for s in trace.spans:
        if s.phase == "queue":
            by_end[(s.pid, s.end_us)].append(s.name)
    for (pid, end), names in by_end.items():
        for n in names:
            queue_ends[(pid, n)].append((end, names))
    out = []
    for s in trace.chunks():
        head, n = split_label(s.name)
        members = [head]
        if n > 1:
            before = [(end, names) for end, names in queue_ends.get((s.pid, head), ()) if end <= s.start_us + 1]
            if before:
                members = list(max(before, key=lambda x: x[0])[1])
        out.append((s, members))
    return out


def _natural_key(name):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


ROW_ORDERS = ("submit", "name", "priority")


def tensor_rows(trace, order="submit"):
    """Tensor names in row order: "submit" by first appearance (submission), "name" by natural
    name order (grad_2 before grad_10), "priority" by the priority of the chunks a tensor heads
    (fused members have none: they follow, by first appearance)."""
    if order not in ROW_ORDERS:
        raise ValueError(f"row order {order!r}: choose from {', '.join(ROW_ORDERS)}")
    first, prio = {}, {}
    for s in trace.spans:
        name = split_label(s.name)[0] if s.phase == "chunk" else s.name
        first.setdefault(name, s.start_us)
        if s.phase == "chunk" and "priority" in s.args:
            prio.setdefault(name, s.args["priority"])
    for i in trace.instants:
        if i.kind == "done":
            first.setdefault(i.name, i.at_us)
    if order == "name":
        return sorted(first, key=_natural_key)
    if order == "priority":
        return sorted(first, key=lambda n: (prio.get(n, float("inf")), first[n], n))
    return sorted(first, key=lambda n: (first[n], n))


def summary(trace):
    """Counts and times of a trace (one rank's or all)."""
    chunks = trace.chunks()
    tensors = {i.name for i in trace.instants if i.kind == "done"}
    fused = {(s.pid, s.name, s.start_us) for s in chunks if split_label(s.name)[1] > 1 and s.args.get("chunk", 0) == 0}
    times = [s.start_us for s in trace.spans] + [s.end_us for s in trace.spans] + [i.at_us for i in trace.instants]
    busy = 0.0
    for pid in {s.pid for s in chunks}:  # time with at least one chunk in flight, per rank
        cur_start = cur_end = None
        for s in sorted((c for c in chunks if c.pid == pid), key=lambda c: c.start_us):
            if cur_end is None or s.start_us > cur_end:
                if cur_end is not None:
                    busy += cur_end - cur_start
                cur_start, cur_end = s.start_us, s.end_us
            else:
                cur_end = max(cur_end, s.end_us)
        if cur_end is not None:
            busy += cur_end - cur_start
    wall = (max(times) - min(times)) if times else 0.0
    return {
        "ranks": len(trace.pids()),
        "tensors": len(tensors),
        "completions": sum(1 for i in trace.instants if i.kind == "done"),
        "chunks": len(chunks),
        "chunk_bytes": int(sum(s.args.get("bytes", 0) for s in chunks)),
        "fused_buffers": len(fused),
        "preemptions": len(trace.preemptions()),
        "span_ms": wall / 1e3,
        "transfer_busy_ms": busy / 1e3,
    }


def format_summary(s):
    return (f"{s['tensors']} tensors ({s['completions']} completions), {s['chunks']} chunks "
            f"({s['chunk_bytes'] / 2**20:.1f} MiB), {s['fused_buffers']} fused buffers, "
            f"{s['preemptions']} preemptions; {s['span_ms']:.1f} ms traced, transfers in flight "
            f"{s['transfer_busy_ms']:.1f} ms")


def _draw_slots(plt, fig, ax_s, trace, slots, ms):
    """The in-flight slots: chunk bars coloured by priority."""
    cmap = plt.get_cmap("viridis")
    prios = [s.args.get("priority", 0) for s in trace.chunks()]
    pmax = max(max(prios), 1) if prios else 1
    for s in trace.spans:
        if s.phase not in ("chunk", "collective"):
            continue
        y = slots.index(s.lane)
        colour = cmap(s.args.get("priority", 0) / pmax) if s.phase == "chunk" else PHASE_COLOURS["collective"]
        ax_s.barh(y, max(s.dur_us / 1e3, 1e-3), left=ms(s.start_us), height=0.8, color=colour,
                  edgecolor="black", linewidth=0.2)
    ax_s.set_yticks(range(len(slots)), slots, fontsize=8)
    ax_s.set_ylim(-0.6, max(1, len(slots)) - 0.4)
    ax_s.invert_yaxis()
    ax_s.set_title("in-flight slots (colour: priority, dark = urgent)", fontsize=9)
    if prios:
        sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, pmax))
        fig.colorbar(sm, ax=ax_s, pad=0.01, fraction=0.03).set_label("priority", fontsize=8)


def _draw_tensors(plt, ax_t, trace, rows, ms, order, max_label_rows):
    """The tensors: negotiate / queue / chunks (fused chunks on every member's row) / done, and the
    framework's marks. Returns the marks' legend entries."""
    row_of = {n: i for i, n in enumerate(rows)}
    n_rows = max(1, len(rows))
    carried = [(s, [s.name]) for s in trace.spans if s.phase != "chunk"] + chunk_members(trace)
    for s, names in carried:
        for name in names:
            if name in row_of:
                ax_t.barh(row_of[name], max(s.dur_us / 1e3, 1e-3), left=ms(s.start_us), height=0.8,
                          color=PHASE_COLOURS[s.phase], linewidth=0)
    done = [i for i in trace.instants if i.kind == "done" and i.name in row_of]
    ax_t.scatter([ms(i.at_us) for i in done], [row_of[i.name] for i in done], marker="|", s=18, color="black",
                 linewidths=0.8, zorder=3)
    framework = []
    for kind, colour, marker, label in FRAMEWORK_MARKS:
        pts = [i for i in trace.instants if i.kind == kind and i.name in row_of]
        if pts:
            ax_t.scatter([ms(i.at_us) for i in pts], [row_of[i.name] for i in pts], marker=marker, s=10,
                         color=colour, zorder=4)
            framework.append(plt.Line2D([], [], color=colour, marker=marker, ls="", label=label))
    step = max(1, -(-n_rows // max_label_rows))
    ax_t.set_yticks(range(0, len(rows), step), rows[::step], fontsize=6 if n_rows > 40 else 8)
    ax_t.set_ylim(-0.6, n_rows - 0.4)
    ax_t.invert_yaxis()
    ax_t.set_xlabel("ms since the first event")
    ax_t.set_title(f"tensors by {order}" + (f" (one label in {step})" if step > 1 else ""), fontsize=9)
    return framework


def draw(trace, path, title=None, order="submit", max_label_rows=60):
    """Writes a PNG Gantt chart of `trace` (one rank) to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    slots = sorted({s.lane for s in trace.chunks()} | {s.lane for s in trace.spans if s.phase == "collective"})
    rows = tensor_rows(trace, order)
    row_of = {n: i for i, n in enumerate(rows)}
    times = [s.start_us for s in trace.spans] + [s.end_us for s in trace.spans] + [i.at_us for i in trace.instants]
    t0 = min(times) if times else 0.0

    def ms(t):
        return (t - t0) / 1e3

    n_slot, n_rows = max(1, len(slots)), max(1, len(rows))
    height = min(40.0, 2.0 + 0.35 * n_slot + 0.085 * n_rows)
    fig, (ax_s, ax_t) = plt.subplots(2, 1, sharex=True, figsize=(14, height),
                                     gridspec_kw={"height_ratios": [0.6 + 0.35 * n_slot, 0.5 + 0.085 * n_rows]})
    _draw_slots(plt, fig, ax_s, trace, slots, ms)
    framework = _draw_tensors(plt, ax_t, trace, rows, ms, order, max_label_rows)
    for p in trace.preemptions():
        for ax in (ax_s, ax_t):
            ax.axvline(ms(p.at_us), color="red", lw=0.6, alpha=0.7, zorder=4)
        victim = p.args.get("tensor")
        if victim is not None and split_label(victim)[0] in row_of:
            ax_t.scatter([ms(p.at_us)], [row_of[split_label(victim)[0]]], marker="x", color="red", s=14, zorder=5)
    legend = [Patch(color=PHASE_COLOURS[k], label=k if k != "chunk" else "transfer (chunks)") for k in PHASES]
    legend.append(plt.Line2D([], [], color="red", lw=0.8, label="preemption (x: preempted tensor)"))
    legend.append(plt.Line2D([], [], color="black", marker="|", ls="", label="done"))
    legend += framework
    ax_t.legend(handles=legend, fontsize=7, loc="upper right", ncol=3)
    for ax in (ax_s, ax_t):
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(title or "mlsl_tf timeline", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m mlsl_tf.timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="the Chrome-trace JSON written with MLSL_TF_TIMELINE")
    p.add_argument("-o", "--output", help="PNG to write (default: the trace's name with .png)")
    p.add_argument("--rank", type=int, help="which rank (pid) to draw (default: the first in the file)")
    p.add_argument("--rows", choices=ROW_ORDERS, default="submit",
                   help="tensor row order: first submission (default), natural name order, or priority")
    p.add_argument("--start-ms", type=float, help="draw from this time (ms since the trace's first event)")
    p.add_argument("--end-ms", type=float, help="draw up to this time (ms since the trace's first event)")
    ns = p.parse_args(argv)
    try:
        trace = load(ns.trace)
    except (OSError, ValueError) as e:
        print(f"mlsl_tf.timeline: cannot read {ns.trace}: {e}", file=sys.stderr)
        return 1
    pids = trace.pids()
    if not pids:
        print(f"mlsl_tf.timeline: {ns.trace} holds no mlsl_tf events", file=sys.stderr)
        return 1
    rank = pids[0] if ns.rank is None else ns.rank
    if rank not in pids:
        print(f"mlsl_tf.timeline: rank {rank} is not in {ns.trace} (it has {', '.join(map(str, pids))})",
              file=sys.stderr)
        return 1
    trace = trace.for_rank(rank)
    if ns.start_ms is not None or ns.end_ms is not None:
        origin = min([s.start_us for s in trace.spans] + [i.at_us for i in trace.instants])
        trace = trace.window(None if ns.start_ms is None else origin + ns.start_ms * 1e3,
                             None if ns.end_ms is None else origin + ns.end_ms * 1e3)
    print(f"rank {rank}: " + format_summary(summary(trace)))
    out = ns.output or re.sub(r"(\.json)?\Z", ".png", ns.trace, count=1)
    draw(trace, out, title=f"{ns.trace} - rank {rank}", order=ns.rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
