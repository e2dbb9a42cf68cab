"""Calibrates the simulator (mlsl_tf.simulate) on emulated-host runs and validates it: measured vs
predicted ResNet-50 step time on 2, 3, 4 hosts at 1 and 10 Gbit/s, each within 10% or not.

    sudo python benchmarks/calibrate_sim.py [--hosts 2,3,4] [--rates 1gbit,10gbit] [--runs 3] [--configs ...]
        [--out benchmarks/results/calibration.jsonl]         # measure (root: namespaces), fit, validate
    python benchmarks/calibrate_sim.py --measured FILE.jsonl  # fit and validate earlier measurements
    python benchmarks/calibrate_sim.py --measured NEW.jsonl --fits FIT.jsonl  # predict new runs, fit nothing

1. Measure: per (hosts, rate), benchmarks/training.py runs ResNet-50 (batch 16 per rank) on one
   emulated host per rank (benchmarks/hosts.py) in each configuration: compute alone, gradients
   alone (comm, comm_bf16), fifo, priority, overlap, overlap_bf16. Its "median" lines are kept.
2. Fit, from the measurements of --fit-hosts (default all): per comm run, the beta (s per byte
   on the busiest link, alpha fixed at --alpha) with which the simulator's communication-alone
   step (every gradient submitted at once, no compute) matches `comm`; then, per rate, the
   link's beta and, for the machine, the CPU's: the emulated hosts share --cores cores, so
   when the kernel's TCP work is the bottleneck a byte costs c x (ranks sending at once per
   core) -- beta(hosts) = max(beta_link, c x max(1, pof2(hosts) / cores)), pof2 being the
   ranks MPICH's reduce-scatter/allgather runs among (measured: comm alone at 10 Gbit/s on
   2, 3, 4 hosts takes 1 : 1.9 : 3.0, where the link alone says 1 : 2 : 1.5). The simulator is
   then given the link's beta and the CPU's (SimFabric cpu_beta, shared_cores) and charges each
   phase of a collective by the ranks that send in it: pof2 in the allreduce's main part, every
   rank in the bf16 path's all-to-all and allgather; a transfer stops while the background thread
   runs the codec (MPICH over TCP moves the bytes inside that thread's MPI calls). Then the codec
   cost (CPU s per byte of the bf16 path, one figure for the machine: least squares over every
   comm_bf16 run); then how much computing and communicating slow each other (--cpu both, the
   default: compute 1 + k times slower while the link carries data and the link 1 + k times
   slower while compute runs -- on this 2-core machine TCP and TensorFlow share the cores),
   least squares over the fifo, priority and overlap steps (--cpu-fit; k is how the machine's
   cores are shared, not a property of one policy); k is scaled by the ranks per core,
   max(1, hosts / cores), as each rank's compute competes with that many ranks' TCP work
   (fitted per host count, k at 10 Gbit/s was 0.85, 1.57, 1.87 on 2, 3, 4 hosts: 0.85, 1.05,
   0.94 per rank per core). Several --measured files (passes of the same jobs) are fitted on
   as the median of their samples per (hosts, rate, config). Per-layer compute = the measured
   `compute` step split by the table's FLOPs (backward = 2 x forward); each sample of a row is
   predicted from the compute-alone time measured in the same file as it where there is one
   (the machine's speed drifts between passes), else from the median of all compute samples,
   and the row's prediction is the median of its samples' (as its measured step is the median
   of theirs).
3. Validate: every (hosts, rate, config) measured, predicted with the fitted figures; JSON lines
   {hosts, rate, config, measured_s, predicted_s, error, fitted_on} and a summary line. Rows
   that were fitted on (comm, comm_bf16 and the --cpu-fit configurations of the fit hosts) are
   marked; the summary counts the others (overlap_bf16, horovod: never fitted on) and all rows
   separately.
"""

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from mlsl_tf import simulate  # noqa: E402

# training.py configuration -> simulator policy
POLICY_OF = {"fifo": "fifo", "priority": "priority", "overlap": "overlap", "overlap_bf16": "bf16",
             "horovod": "horovod", "comm": "overlap", "comm_bf16": "bf16"}
CONFIGS = ["compute", "comm", "comm_bf16", "fifo", "priority", "overlap", "overlap_bf16"]
TOLERANCE = 0.10
ALPHA = 20e-6  # s per message over the emulated TCP links; 100 MB steps barely depend on it
# The bf16 codec runs on each rank's background thread, on the cores its TensorFlow computes on:
# by default, while both run they split those cores evenly (compute and codec each 1 + 1 times
# slower), so the codec's CPU seconds come out of compute's. Not fitted (--codec-sharing).
CODEC_SHARING = 1.0
# MPICH over TCP moves a message only inside its owner's MPI calls (rendezvous handshakes, refilling
# the sockets): every transfer, not only the CPU-bound ones, waits while the background thread runs
# the codec (SimFabric thread_progress; --thread-progress 0: only where the CPU binds).
THREAD_PROGRESS = True
# The fp32 training configurations the CPU-sharing factor k is fitted on (least squares over all
# of them; --cpu-fit). overlap_bf16 is never fitted on.
CPU_FIT = ("fifo", "priority", "overlap")


def pof2(n):
    return 1 << (max(1, n).bit_length() - 1)


def cpu_share(hosts, cores):
    """Ranks moving bytes at once per core of the machine the emulated hosts share, in the phase
    that carries an fp32 allreduce's bytes (MPICH's reduce-scatter/allgather among pof2 ranks;
    the simulator's SendBeta charges every phase this way)."""
    return max(1.0, pof2(hosts) / cores)


def ranks_per_core(hosts, cores):
    """Ranks (one per emulated host) that share each core of the machine: how many processes'
    TCP work competes with one rank's compute."""
    return max(1.0, hosts / cores)


def effective_beta(beta_link, cpu_beta, hosts, cores):
    return max(beta_link, cpu_beta * cpu_share(hosts, cores))


def fit_link_and_cpu(points, cores, grid=200):
    """points = {rate: [(hosts, beta_eff)]} -> ({rate: beta_link}, cpu_beta) minimising the squared
    log error of effective_beta (grid search over the CPU's beta, 0 included, then each rate's best
    beta_link)."""
    logs = [math.log(b) for pts in points.values() for _, b in pts]
    lo, hi = min(logs) - math.log(4 * cores), max(logs)

    def best_link(pts, c):
        # below every point's beta the link never binds: the smallest candidate stands for that
        candidates = [math.exp(lo + (hi - lo) * j / grid) for j in range(grid + 1)]
        return min(candidates, key=lambda bl: sum(math.log(effective_beta(bl, c, h, cores) / b) ** 2 for h, b in pts))

    best = None
    # 0 first: where the CPU never binds the fit says so, rather than its smallest candidate (which
    # the simulator would still charge, e.g. to the bf16 codec's phases)
    for c in [0.0] + [math.exp(lo + (hi - lo) * i / grid) for i in range(grid + 1)]:
        links = {rate: best_link(pts, c) for rate, pts in points.items()}
        err = sum(math.log(effective_beta(links[rate], c, h, cores) / b) ** 2
                  for rate, pts in points.items() for h, b in pts)
        if best is None or err < best[0] - 1e-12:
            best = (err, links, c)
    return best[1], best[2]


def training_command(python, hosts, rate, runs, configs, model="resnet50"):
    """argv of one measuring job: benchmarks/training.py on `hosts` emulated hosts (one rank each)."""
    return [python, os.path.join(HERE, "training.py"), "--models", model, "--links", rate, "--np", str(hosts),
            "--configs", ",".join(configs), "--runs", str(runs)]


def parse_medians(lines, hosts):
    """training.py's {"median": ...} lines -> rows {hosts, rate, config, step_s}."""
    rows = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        m = obj.get("median") if isinstance(obj, dict) else None
        if m and "step_s" in m:
            rows.append({"hosts": m.get("ranks", hosts), "rate": m["link"], "config": m["config"],
                         "model": m["model"], "step_s": m["step_s"]})
    return rows


def read_measured(path):
    """Rows of one file: this script's {"measured": ...} lines, or training.py's "median" lines (the
    hosts taken from the file's "job" lines, which carry the rank count)."""
    with open(path) as f:
        lines = f.read().splitlines()
    ranks = set()
    for line in lines:
        if line.startswith('{"job"'):
            ranks.add(json.loads(line)["job"].get("ranks"))
    ranks.discard(None)
    if len(ranks) > 1:
        raise ValueError(f"{path}: jobs of several rank counts {sorted(ranks)}; give one file per host count")
    hosts = ranks.pop() if ranks else 2
    rows = parse_medians(lines, hosts) + [json.loads(l)["measured"] for l in lines if l.startswith('{"measured"')]
    # This machine's speed drifts by tens of percent within an hour (ResNet-50 compute alone on 2
    # hosts: 0.84 s, then 0.56 s twenty minutes later): a file that timed compute alone pairs that
    # figure with each of its other rows, which are then predicted from the compute of their own run.
    computes = {(r["hosts"], r["rate"]): r["step_s"] for r in rows if r["config"] == "compute"}
    for r in rows:
        if r["config"] != "compute" and (r["hosts"], r["rate"]) in computes:
            r.setdefault("compute_s", computes[(r["hosts"], r["rate"])])
    return rows


def aggregate(rows):
    """One row per (hosts, rate, config, model): the median step of its samples, how many there were,
    the median of the compute times paired with them (compute_s, where any was) and, where any was,
    each sample's own (computes_s, None for a sample without one), so that each can be predicted
    from the speed the machine had when it was taken."""
    groups = {}
    for r in rows:
        groups.setdefault((r["hosts"], r["rate"], r["config"], r.get("model", "resnet50")), []).append(r)
    out = []
    for (h, rate, c, m), rs in sorted(groups.items()):
        row = {"hosts": h, "rate": rate, "config": c, "model": m, "step_s": statistics.median(r["step_s"] for r in rs),
               "samples": len(rs)}
        paired = [r["compute_s"] for r in rs if r.get("compute_s")]
        if paired:
            row["compute_s"] = statistics.median(paired)
            row["computes_s"] = [r.get("compute_s") for r in rs]
        out.append(row)
    return out


def measure(ns):
    rows = []
    for rate in ns.rates:
        for hosts in ns.hosts:
            cmd = training_command(ns.python, hosts, rate, ns.runs, ns.configs)
            print(json.dumps({"running": cmd}), file=sys.stderr, flush=True)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=ns.timeout)
            got = parse_medians(out.stdout.splitlines(), hosts)
            for r in got:
                r["hosts"] = hosts
            rows += got
    return rows


def predict(table, compute_s, hosts, alpha, beta, policy, interference=0.0, binary=None, codec=0.0, cpu="both",
            codec_sharing=CODEC_SHARING, cpu_beta=0.0, cores=0, thread_progress=THREAD_PROGRESS):
    """Simulated step time of `policy` on `hosts` ranks; compute_s = 0 for communication alone.
    cpu_beta, cores: the emulated hosts' TCP work on the machine's shared cores (0: not modelled);
    thread_progress: every transfer moves only while the background thread is free (SimFabric)."""
    layers = simulate.timed_layers(table, compute_s) if compute_s > 0 else \
        [(n, 0.0, 0.0, g) for n, _, _, g in simulate.timed_layers(table, 1.0)]
    overrides = {"interference": interference, "contention": interference} if cpu == "both" else {cpu: interference}
    overrides.update(codec_interference=codec_sharing, codec_contention=codec_sharing)
    if cpu_beta > 0 and cores > 0:
        overrides.update(cpu_beta=float(cpu_beta), shared_cores=int(cores))
    if thread_progress:
        overrides.update(thread_progress=1)
    text = simulate.config_text(layers, hosts, 1.0 / beta, alpha, policy, steps=5, warmup=1,
                                overrides=overrides, codec=codec)
    return simulate.run_config(text, binary)["step_s"]


def fit_log_monotone(measured, model, lo=1e-12, hi=1e-6, iterations=40):
    """The x in [lo, hi] with model(x) = measured, model increasing (fit_monotone on log x / lo)."""
    return lo * math.exp(fit_monotone(measured, lambda y: model(lo * math.exp(y)), math.log(hi / lo), iterations))


def fit_monotone(measured, model, high=4.0, iterations=30):
    """The x in [0, high] with model(x) = measured, model increasing (bisection); 0 when model(0) >= measured."""
    if model(0.0) >= measured:
        return 0.0
    lo, hi = 0.0, high
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model(mid) < measured else (lo, mid)
    return (lo + hi) / 2


def fit_least_squares(loss, high=4.0, iterations=40):
    """The x in [0, high] minimising loss(x), taken as unimodal (golden-section search)."""
    g = (math.sqrt(5) - 1) / 2
    lo, hi = 0.0, high
    for _ in range(iterations):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if loss(a) <= loss(b) else (a, hi)
    x = (lo + hi) / 2
    return 0.0 if loss(0.0) <= loss(x) else x


def validate(rows, table, fit_hosts, binary=None, cpu="both", cores=None, alpha=ALPHA, codec_sharing=CODEC_SHARING,
             thread_progress=THREAD_PROGRESS, cpu_fit=CPU_FIT, fixed=None):
    """Fits on fit_hosts, predicts every row; returns (fits per rate, result rows). cores: of the
    machine the emulated hosts shared when measured (default: this one's); cpu_fit: the training
    configurations the CPU-sharing factor k is fitted on. fixed: {rate: fit} from an earlier
    validate (read_fits): nothing is fitted, every row is predicted with those figures and held out."""
    if fixed:  # the machine-wide figures are the same in every rate's fit
        first = next(iter(fixed.values()))
        cores, alpha = first["cores"], first["alpha_s"]
        codec_sharing, thread_progress, cpu = first["codec_sharing"], first["thread_progress"], first["cpu_model"]
    cores = cores or os.cpu_count()
    by = {(r["hosts"], r["rate"], r["config"]): r["step_s"] for r in rows}
    samples = {(r["hosts"], r["rate"], r["config"]): r.get("samples", 1) for r in rows}
    # compute alone of the runs each sample of a row was measured with (read_measured), else the
    # median of all compute samples; a row's prediction is the median of its samples' predictions
    paired = {(r["hosts"], r["rate"], r["config"]): r.get("computes_s") or [r["compute_s"]]
              for r in rows if r.get("compute_s")}
    computes_of = lambda h, rate, config: [c or by.get((h, rate, "compute"))  # noqa: E731
                                           for c in paired.get((h, rate, config), [None])]
    rates = sorted({r["rate"] for r in rows})
    if fixed:
        links = {rate: fixed[rate]["beta_s_per_byte"] for rate in rates if rate in fixed}
        cpu_beta = first["cpu_beta_s_per_byte"]
    else:
        measured_betas = {}
        for rate in rates:
            pts = [(h, fit_log_monotone(by[(h, rate, "comm")],
                                        lambda b, h=h: predict(table, 0, h, alpha, b, "overlap", binary=binary)))
                   for h in fit_hosts if (h, rate, "comm") in by]
            if pts:
                measured_betas[rate] = pts
        if not measured_betas:
            return {}, []
        links, cpu_beta = fit_link_and_cpu(measured_betas, cores)

    cache = {}

    def simulated(rate, h, compute, policy, **kw):
        # the link's beta and the machine's CPU beta go to the simulator, which charges each phase
        # of a collective the slower of the link and the cores shared by the ranks sending in it.
        # compute: one figure or the list of a row's samples' (-> the median of their predictions)
        computes = compute if isinstance(compute, list) else [compute]
        got = []
        for c in computes:
            key = (rate, h, c, policy, tuple(sorted(kw.items())))
            if key not in cache:
                cache[key] = predict(table, c, h, alpha, links[rate], policy, binary=binary, cpu_beta=cpu_beta,
                                     cores=cores, thread_progress=thread_progress, **kw)
            got.append(cache[key])
        return statistics.median(got)

    # The codec is CPU work, the same per byte at any link rate: one figure for the machine, fitted
    # on every comm_bf16 run (least squares of the relative error). The emulated hosts' background
    # threads share the machine's cores: per rank, a codec byte costs c x (ranks per core).
    bf16 = [(rate, h, by[(h, rate, "comm_bf16")]) for rate in rates if rate in links for h in fit_hosts
            if (h, rate, "comm_bf16") in by]

    def codec_loss(c):
        return sum((simulated(rate, h, 0, "bf16", codec=c * ranks_per_core(h, cores)) / t - 1) ** 2
                   for rate, h, t in bf16)

    codec = first["codec_s_per_byte"] if fixed else fit_least_squares(codec_loss, high=1e-6) if bf16 else 0.0
    codec_of = lambda h: codec * ranks_per_core(h, cores)  # noqa: E731
    fits, out = {}, []
    for rate in rates:
        if rate not in links:
            continue
        sim = functools.partial(simulated, rate)
        # k: how this machine's cores are shared between computing and moving bytes -- a property
        # of the machine, not of a policy, so one figure per rate over every run in cpu_fit
        runs = [(h, config, computes_of(h, rate, config), by[(h, rate, config)]) for config in cpu_fit
                for h in fit_hosts if (h, rate, config) in by and (h, rate, "compute") in by]

        def k_loss(k, sim=sim, runs=runs):
            return sum((sim(h, c, POLICY_OF[config], interference=k * ranks_per_core(h, cores), cpu=cpu) / t - 1)
                       ** 2 for h, config, c, t in runs)

        kappa = fixed[rate]["cpu_factor"] if fixed else fit_least_squares(k_loss) if runs else 0.0
        kappa_of = lambda h: kappa * ranks_per_core(h, cores)  # noqa: E731
        fits[rate] = {**fixed[rate], "fixed": True} if fixed else {
            "rate": rate, "alpha_s": alpha, "beta_s_per_byte": links[rate], "algbw_gbit": 8 / links[rate] / 1e9,
            "cpu_beta_s_per_byte": cpu_beta, "cores": cores,
            "measured_betas": {str(h): b for h, b in measured_betas[rate]},
            "codec_s_per_byte": codec, "codec_sharing": codec_sharing, "cpu_model": cpu, "cpu_factor": kappa,
            "thread_progress": bool(thread_progress), "cpu_fitted_on": list(cpu_fit),
            "fitted_on_hosts": list(fit_hosts)}
        for (h, r8, config), measured in sorted(by.items()):
            if r8 != rate or config not in POLICY_OF or (config not in ("comm", "comm_bf16")
                                                         and (h, rate, "compute") not in by):
                continue
            compute = [0.0] if config.startswith("comm") else computes_of(h, rate, config)
            predicted = sim(h, compute, POLICY_OF[config], interference=0.0 if compute == [0.0] else kappa_of(h),
                            codec=codec_of(h), cpu=cpu, codec_sharing=codec_sharing)
            fitted = not fixed and h in fit_hosts and config in ("comm", "comm_bf16", *cpu_fit)
            out.append({"hosts": h, "rate": rate, "config": config, "measured_s": measured,
                        "predicted_s": predicted, "error": predicted / measured - 1, "fitted_on": fitted,
                        "samples": samples[(h, rate, config)], "compute_s": statistics.median(compute),
                        **({"computes_s": compute} if len(compute) > 1 else {})})
    return fits, out


def read_fits(path):
    """{rate: fit} from the {"fit": ...} lines of an earlier run's output (the last per rate)."""
    fits = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                obj = json.loads(line)
                if "fit" in obj:
                    fits[obj["fit"]["rate"]] = obj["fit"]
    if not fits:
        raise ValueError(f"{path}: no {{\"fit\": ...}} lines (expected this script's output)")
    return fits


def summary(results):
    held_out = [r for r in results if not r["fitted_on"]]
    ok = lambda rs: sum(abs(r["error"]) <= TOLERANCE for r in rs)  # noqa: E731
    worst = lambda rs: max((abs(r["error"]) for r in rs), default=None)  # noqa: E731
    return {"summary": {"held_out": len(held_out), "held_out_within_10pct": ok(held_out), "held_out_worst": worst(held_out),
                        "all": len(results), "all_within_10pct": ok(results), "all_worst": worst(results)}}


def main(argv=None):
    split = lambda s: s.split(",")  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=lambda s: [int(v) for v in s.split(",")], default=[2, 3, 4])
    p.add_argument("--rates", type=split, default=["1gbit", "10gbit"])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--configs", type=split, default=list(CONFIGS),
                   help="training.py configurations to measure (compute, comm and overlap are what the fit needs)")
    p.add_argument("--fit-hosts", type=lambda s: [int(v) for v in s.split(",")], default=[2, 3, 4],
                   help="host counts whose comm, comm_bf16 and overlap runs are fitted on (default: all)")
    p.add_argument("--measured", nargs="+", metavar="FILE",
                   help="skip measuring: training.py JSON lines (one host count per file) or this script's --out; "
                        "samples of the same (hosts, rate, config) in several files are fitted on as their median")
    p.add_argument("--cpu", choices=["interference", "contention", "both"], default="both",
                   help="how sharing the cores is modelled: compute slowed while the link carries data, or the "
                        "link slowed while compute runs, or both by the same factor (the one figure fitted on the overlap runs)")
    p.add_argument("--cores", type=int, default=os.cpu_count(),
                   help="cores of the machine the emulated hosts shared when measured (default: this one's)")
    p.add_argument("--alpha", type=float, default=ALPHA, help="s per message on the emulated links (fixed, not fitted)")
    p.add_argument("--codec-sharing", type=float, default=CODEC_SHARING,
                   help="compute and the bf16 codec each run 1 + this times slower while both run (not fitted; "
                        "1: they split the cores evenly, 0: the codec has a core of its own)")
    p.add_argument("--thread-progress", type=int, choices=[0, 1], default=int(THREAD_PROGRESS),
                   help="1: every transfer moves only while the background thread is out of the codec (MPICH over "
                        "TCP progresses inside the thread's MPI calls); 0: only the CPU-bound ones")
    p.add_argument("--cpu-fit", type=split, default=list(CPU_FIT),
                   help="training configurations the CPU-sharing factor k is fitted on (default: "
                        + ",".join(CPU_FIT) + "); the others are held out")
    p.add_argument("--fits", metavar="FILE",
                   help="fit nothing: predict the --measured rows with the fitted figures of this earlier output "
                        "(validation on passes the fit never saw)")
    p.add_argument("--out", help="append measurements, fits and results to this file")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--timeout", type=int, default=7200, help="seconds per (hosts, rate) job")
    ns = p.parse_args(argv)
    trainable = [c for c in POLICY_OF if not c.startswith("comm")]
    bad = [c for c in ns.cpu_fit if c not in trainable]
    if bad or not ns.cpu_fit:
        p.error(f"--cpu-fit {','.join(ns.cpu_fit)}: expected training configurations among {','.join(trainable)}")
    table = simulate.load_table("resnet50")
    try:
        fixed = read_fits(ns.fits) if ns.fits else None
    except (OSError, ValueError) as e:
        p.error(f"--fits: {e}")
    if fixed and not ns.measured:
        p.error("--fits needs --measured (the rows to predict)")
    if ns.measured:
        rows = aggregate([r for path in ns.measured for r in read_measured(path)])
        unfitted = sorted({r["rate"] for r in rows} - fixed.keys()) if fixed else []
        if unfitted:
            p.error(f"--fits {ns.fits} has no fit for {','.join(unfitted)} (it has {','.join(sorted(fixed))})")
    else:
        rows = measure(ns)
    emit = []
    emit += [{"measured": r} for r in rows if not ns.measured]
    fits, results = validate(rows, table, ns.fit_hosts, cpu=ns.cpu, cores=ns.cores, alpha=ns.alpha,
                             codec_sharing=ns.codec_sharing, thread_progress=bool(ns.thread_progress),
                             cpu_fit=tuple(ns.cpu_fit), fixed=fixed)
    emit += [{"fit": f} for f in fits.values()] + results + [summary(results)]
    for obj in emit:
        line = json.dumps(obj)
        print(line, flush=True)
        if ns.out:
            with open(ns.out, "a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
