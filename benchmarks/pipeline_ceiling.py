"""What the pipeline itself carries when the model is nearly free: whole audits of 1 M and 5 M sentences.

Run:  python benchmarks/pipeline_ceiling.py [--sizes 1000000 5000000] [--texts same-mix] [--workers 2] [--keep DIR]
      [--code DIR]

The model is the tests' tiny BERT (``tests/builders.build_tiny_model``: hidden 32, 2 layers), so the
embedding costs little and what bounds the audit is the rest: probe loading and its gate, the commit path
(each part's validation, write and manifest entry), Prefect's and Dask's bookkeeping, the analyses. For each
size, on a fresh root, the installed CLI runs ``normaudit audit --model TINY --probes FILE --root ROOT
--timings --workers W`` in a subprocess (a local cluster of W Dask workers and the temporary Prefect API; no
PREFECT_API_URL or NORMAUDIT_* from the caller's environment), and this script prints:

- the whole audit's wall seconds and items/s, against plain ``Embedder.embed`` of the same texts with the same
  tiny model, run by this script as the audit's workers run it (W processes of cores // W torch threads; half
  of the texts before the audit, half after, so load drift on a shared machine weighs on both sides alike):
  the ratio audit / plain; and against ``SentenceTransformer.encode`` at its defaults in the same processes, on
  ``--st-sample`` texts (the file's first half of them before the audit, its last half after): the encode a user
  runs by hand (benchmarks/ceiling_baselines.py);
- parts committed per second: parts in the partition's manifest / seconds of the embedding phase
  (``embed_probes`` in ``--timings``);
- peak RSS and CPU-seconds of every process of the audit (the CLI process holds the flow and the local Dask
  scheduler; each Dask worker; the Prefect API), sampled every ``--poll`` seconds, whole (with the kernel's
  high-water mark read at each sample, so a peak between samples counts: ``million_audit.TreeSampler``) and in
  each phase (until the first commit, while rows commit, after the last one), with each process's ratio largest /
  smallest size to three decimals (workers ranked by their peak: #1 is the larger); each Dask worker's peak
  in each tenth of the audit's wall time (a creep rises tenth by tenth, a spike does not), and every sample
  of every process in ``rss-timeline.csv`` beside the size's probe file;
- the CLI's CPU-seconds and RSS at each tenth of the rows committed (polled from the manifest) and at the
  moment the last row is committed, the end of the embedding phase, so the commit path's CPU and that of
  the analyses and the report after it can be told apart; the analyses' seconds (``run_analyses``);
- at the end, between the smallest and the largest size: the flow (CLI) process's marginal CPU-seconds per
  million items, whole audit and up to the end of the embedding phase, and the ratio of its peak RSS.

Texts (``--texts``, benchmarks/ceiling_texts.py). ``same-mix`` (default): every item a template sentence of
two English words drawn at random (``a photo of a house and a tree.``), the first n items the same whatever
the sizes, every size the same mix of texts, so the ratios between sizes measure size alone.
``singles-then-pairs``: the set of the runs before issue 36's ninth part (one-word sentences up to 1,156,092
items, then longer word pairs), to compare with them. Every item has the property ``zipf``: its first word's
wordfreq Zipf frequency; the file has write_probe_file's columns (item_id, text, kind, lang, source, zipf).
The whole file is the probe file the flow loads, however large: whether the flow's probe loading holds it is
part of what this measures.

Memory guard: on a shared machine, if available memory (psutil) drops below ``--min-available-gib`` during
an audit, the audit is stopped (SIGTERM to the CLI, SIGKILL of what is left of the processes it started) and
the size is reported as ``stopped at X rows committed, RSS Y GiB at Z s``.

``--code DIR`` runs the audit on another checkout of the code (e.g. a git worktree of an earlier commit):
DIR goes first on the CLI's PYTHONPATH (the Dask workers inherit it), this process imports ``pipeline`` and
``tests`` from it too (the plain encode, the tiny model, the texts), and the output names DIR's commit and
where the subprocess found ``pipeline``, ``flows`` and the SQL files.

Every figure is measured in this one run; exit status 1 when an audit fails or had to be stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from ceiling_baselines import ParallelEncode, use_code
from ceiling_texts import MIXES, ceiling_sentences

GIB = 2**30
SET = "template-sentences"
# the probe file's set name is its stem; the same name at every size (each size has its own fresh root)
# an audit's phases as the benchmark tells them apart: no row committed yet (start-up, the probe preparation and
# the first shards), rows committing, every row committed (the analyses, the report, the shutdown)
PHASES = ("until the first commit", "embedding", "analyses and report")


def commit_of(base: Path) -> str:
    """The commit checked out in ``base``, with ``+ uncommitted changes`` when its tree differs from it."""
    head = subprocess.run(["git", "-C", str(base), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return "unknown (not a git checkout)"
    dirty = subprocess.run(["git", "-C", str(base), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + (" + uncommitted changes" if dirty else "")


def subprocess_env(base: Path, code: Path | None) -> dict:
    from million_audit import cli_env

    env = cli_env()
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(base), *filter(None, [env.get("PYTHONPATH")])])
    return env


def where_subprocess_imports(env: dict, cwd: Path) -> str:
    """Where a Python started with ``env`` finds pipeline, flows and the SQL files (checked, not assumed)."""
    probe = ("import flows, pipeline; from pipeline.analysis.sql import sql_dir; "
             "print(pipeline.__file__, flows.__file__, sql_dir())")
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"error: a subprocess with the audit's environment cannot import the code:\n{out.stderr}")
    return out.stdout.strip()


class Watch:
    """The audit subprocess, watched from this thread: rows committed, the CLI's CPU and RSS, free memory."""

    def __init__(self, proc: subprocess.Popen, root: str, n: int, min_available: int, poll_s: float):
        self.proc, self.root, self.n, self.min_available, self.poll_s = proc, root, n, min_available, poll_s
        self.cli = psutil.Process(proc.pid)
        self.t0 = time.monotonic()
        self.started: dict[int, psutil.Process] = {}  # every process seen under the CLI, to end if stopped
        self.marks: list[tuple[int, float, float, float]] = []  # (rows, s, CLI CPU s, CLI RSS) per tenth
        self.embed_end: tuple[float, float, float] | None = None  # (s, CLI CPU s, CLI RSS) when rows reach n
        self.stopped: str | None = None
        self.rows = self.parts = 0
        self.min_seen = psutil.virtual_memory().available

    def run(self) -> int:
        from million_audit import manifest_rows

        step = max(1, self.n // 10)
        next_mark = step
        while self.proc.poll() is None:
            try:
                for p in self.cli.children(recursive=True):
                    self.started.setdefault(p.pid, p)
                cpu = sum(self.cli.cpu_times()[:2])
                rss = self.cli.memory_info().rss
            except psutil.Error:
                time.sleep(self.poll_s)
                continue
            now = time.monotonic() - self.t0
            parts, rows = manifest_rows(self.root)
            if rows > self.rows:  # a manifest caught mid-rewrite reads as (0, 0): keep the last good count
                self.parts, self.rows = parts, rows
            if self.rows >= next_mark:  # one line per tenth of the rows (a part may cross several)
                self.marks.append((self.rows, now, cpu, rss))
                next_mark = (self.rows // step + 1) * step
            if self.embed_end is None and self.rows >= self.n:
                self.embed_end = (now, cpu, rss)
            available = psutil.virtual_memory().available
            self.min_seen = min(self.min_seen, available)
            if available < self.min_available:
                self.stop(now, rss, available)
                break
            time.sleep(self.poll_s)
        return self.proc.wait()

    def phase(self) -> str:
        """The audit's phase as the manifest shows it (see :data:`PHASES`)."""
        if self.embed_end is not None:
            return PHASES[2]
        return PHASES[1] if self.rows else PHASES[0]

    def stop(self, now: float, rss: int, available: int) -> None:
        self.stopped = (f"stopped at {self.rows:,} rows committed ({self.parts} parts), CLI RSS {rss / GIB:.2f} GiB "
                        f"at {now:.0f} s (available memory {available / GIB:.2f} GiB)")
        print(f"  memory guard: {self.stopped}; ending the audit", flush=True)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for p in self.started.values():  # psutil refuses a pid that was reused by another process
            with contextlib.suppress(psutil.Error):
                p.kill()


def audit(args, env: dict, tiny: str, probes: str, root: str, log: Path, n: int):
    """Run the audit subprocess; returns (wall s, exit status, output, TreeSampler, Watch)."""
    from million_audit import CLI, TreeSampler

    cmd = [CLI, "audit", "--model", tiny, "--probes", probes, "--root", root, "--timings",
           "--workers", str(args.workers)]
    t = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=Path(root).parent)
        sampler = TreeSampler(proc.pid, every_s=args.poll)
        watch = Watch(proc, root, n, int(args.min_available_gib * GIB), args.poll)
        sampler.phase = watch.phase
        rc = watch.run()
    wall = time.perf_counter() - t
    sampler.stop()
    return wall, rc, log.read_text(), sampler, watch


def one_size(args, env: dict, tiny: str, plain: ParallelEncode, st: ParallelEncode, work: Path, n: int) -> dict:
    from million_audit import parse_timings

    from pipeline.storage.shards import default_shard_size

    print(f"\n== {n:,} items ==", flush=True)
    folder = work / f"n{n}"
    folder.mkdir(parents=True, exist_ok=True)
    probes = str(folder / f"{SET}.parquet")
    t = time.perf_counter()
    frame = ceiling_sentences(n, args.texts)
    frame.write_parquet(probes)
    assert frame.height == n and frame["item_id"].n_unique() == n, "the benchmark's set has duplicate ids"
    del frame
    size = default_shard_size(n)
    print(f"probe file: {n:,} rows, {os.path.getsize(probes) / 2**20:.0f} MiB, built in "
          f"{time.perf_counter() - t:.0f} s; {-(-n // size)} shards of {size:,}", flush=True)

    half, sample = n // 2, min(args.st_sample, n) // 2
    first = plain.seconds(probes, 0, half)
    print(f"plain encode, first half: {half / first:,.0f} items/s", flush=True)
    st_first = st.seconds(probes, 0, sample) if sample else None
    root = str(folder / "root")
    vm = psutil.virtual_memory()
    print(f"before the audit: load average {os.getloadavg()[0]:.2f}, available memory {vm.available / GIB:.1f} GiB",
          flush=True)
    wall, rc, out, sampler, watch = audit(args, env, tiny, probes, root, folder / "audit.log", n)
    second = plain.seconds(probes, half, n)
    rate = n / (first + second)
    print(f"plain encode, second half: {(n - half) / second:,.0f} items/s; both: {rate:,.0f} items/s", flush=True)
    st_rate = None
    if sample:  # the sample's first half before the audit (the file's first rows), its second half after (its last)
        st_rate = 2 * sample / (st_first + st.seconds(probes, n - sample, n))
        print(f"sentence-transformers encode (batch 32), {2 * sample:,} texts, the file's first and last "
              f"{sample:,}: {st_rate:,.0f} items/s", flush=True)
    res = {"n": n, "wall": wall, "rc": rc, "plain": rate, "st": st_rate, "stopped": watch.stopped,
           "embed_end": watch.embed_end,
           "cli_peak": sampler.cli_peak(), "cli_cpu": max(sampler.cpu.get(sampler.root.pid, 0.0),
                                                           watch.embed_end[1] if watch.embed_end else 0.0)}
    if watch.stopped or rc != 0:
        if not watch.stopped:
            print(out[-4000:])
        print(f"AUDIT {'STOPPED' if watch.stopped else f'FAILED (exit {rc})'}: "
              f"{watch.stopped or 'see ' + str(folder / 'audit.log')}")
    timings = parse_timings(out)
    embed_s = timings.get("embed_probes", (0, float("nan")))[1]
    res.update(parts=watch.parts, embed_s=embed_s, analyses=timings.get("run_analyses", (0, float("nan")))[1])
    if not watch.stopped:
        print(f"audit: exit {rc}, {wall:.1f} s = {n / wall:,.0f} items/s -> whole audit / plain encode = "
              f"{n / wall / rate:.3f}" + (f", / sentence-transformers encode = {n / wall / st_rate:.3f}"
                                          if st_rate else ""))
    print(f"embedding phase (embed_probes): {embed_s:.1f} s; {watch.parts} parts in the manifest "
          f"({watch.rows:,} rows) -> {watch.parts / embed_s:.2f} parts committed/s")
    for step, (runs, secs) in timings.items():
        print(f"  {step:24s} {runs:5d} runs {secs:9.1f} s")
    print(f"analyses (run_analyses): {res['analyses']:.1f} s")
    print("CLI (flow + Dask scheduler) as the rows were committed (polled from the manifest):")
    for rows, s, cpu, rss in watch.marks:
        print(f"  {rows:>10,} rows at {s:7.1f} s: CPU {cpu:7.1f} s, RSS {rss / GIB:5.2f} GiB")
    if watch.embed_end:
        s, cpu, rss = watch.embed_end
        print(f"  embedding phase ended (all {n:,} rows committed) at {s:.1f} s: CLI CPU {cpu:.1f} s, "
              f"RSS {rss / GIB:.2f} GiB; after it (analyses, report, shutdown): CLI CPU "
              f"{res['cli_cpu'] - cpu:.1f} s")
    print("processes (peak RSS, CPU-seconds):")
    for line in sampler.report(min_bytes=0):
        print("  " + line)
    print(f"lowest available memory during the audit: {watch.min_seen / GIB:.1f} GiB")
    res["procs"] = {}  # label -> CPU-seconds of each process with that label
    res["ranked"] = {}  # "label #k" (k-th largest peak of that label) -> {phase: peak RSS}, "whole" included
    for pid, (label, _) in sorted(sampler.peak.items()):
        res["procs"].setdefault(label, []).append(sampler.cpu.get(pid, 0.0))
    print("peak RSS by phase (" + " / ".join(PHASES) + "):")
    for label in dict.fromkeys(label for label, _ in sampler.peak.values()):
        pids = sorted((pid for pid, (lab, _) in sampler.peak.items() if lab == label),
                      key=lambda pid: -sampler.peak[pid][1])
        for k, pid in enumerate(pids, 1):
            phases = {ph: sampler.phase_peak.get((pid, ph), 0) for ph in PHASES}
            res["ranked"][f"{label} #{k}"] = {"whole": sampler.peak[pid][1], **phases}
            print(f"  {label} #{k} (pid {pid}): " + " / ".join(f"{v / GIB:.3f}" if v else "—" for v in phases.values())
                  + " GiB")
    print("Dask workers' peak RSS in each tenth of the audit's wall time (GiB; a creep rises, a spike does not):")
    for pid in sorted((p for p, (lab, _) in sampler.peak.items() if lab == "Dask worker"),
                      key=lambda p: -sampler.peak[p][1]):
        print(f"  pid {pid}: " + " ".join(f"{v:.2f}" for v in sampler.tenths(pid, wall)))
    sampler.write_timeline(folder / "rss-timeline.csv")
    prep = timings.get(PREPARATION) or timings.get("prepare_probes")  # the latter: code before the blocks
    res["prep_s"] = prep[1] if prep else None
    if prep and not watch.stopped:
        print(f"probe preparation: {prep[1]:.1f} s of wall time ({prep[1] / wall:.1%} of the audit), "
              f"{prep[0]} task runs on {args.workers} workers")
    return res


PREPARATION = "probe preparation wall"  # a line of --timings: first preparation task's start to the last one's end


def summary(results: list[dict]) -> None:
    print("\n== summary ==")
    print("| items | whole audit | items/s | plain encode items/s | audit / plain | sentence-transformers items/s | "
          "audit / sentence-transformers | parts/s (embed phase) | CLI peak RSS | CPU s: CLI / workers / Prefect API | "
          "CLI CPU at embed end | analyses s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        procs = r["procs"]
        workers = " + ".join(f"{v:.1f}" for v in procs.get("Dask worker", [])) or "—"
        api = " + ".join(f"{v:.1f}" for v in procs.get("Prefect API", [])) or "—"
        rate = "—" if r["stopped"] else f"{r['n'] / r['wall']:,.0f}"
        ratio = "—" if r["stopped"] else f"{r['n'] / r['wall'] / r['plain']:.3f}"
        st_rate = f"{r['st']:,.0f}" if r["st"] else "—"
        st_ratio = "—" if r["stopped"] or not r["st"] else f"{r['n'] / r['wall'] / r['st']:.3f}"
        end = f"{r['embed_end'][1]:.1f} s at {r['embed_end'][0]:.0f} s" if r["embed_end"] else "—"
        wall = r["stopped"] or (f"{r['wall']:.1f} s" + ("" if r["rc"] == 0 else f" (FAILED, exit {r['rc']})"))
        print(f"| {r['n']:,} | {wall} | {rate} | {r['plain']:,.0f} | {ratio} | {st_rate} | {st_ratio} | "
              f"{r['parts'] / r['embed_s']:.2f} | "
              f"{r['cli_peak'] / GIB:.2f} GiB | {r['cli_cpu']:.1f} / {workers} / {api} | {end} | "
              f"{r['analyses']:.1f} |")
    done = [r for r in results if r["rc"] == 0 and not r["stopped"]]
    ranked = list(dict.fromkeys(key for r in results for key in r["ranked"]))
    print("\npeak RSS of each process, whole audit and by phase (#1 is the process of its kind with the largest peak):")
    print("| process | phase | " + " | ".join(f"{r['n']:,}" for r in results) + " | largest / smallest size |")
    print("|---|---|" + "---|" * len(results) + "---|")
    for key in ranked:
        for phase in ("whole", *PHASES):
            peaks = [r["ranked"].get(key, {}).get(phase) for r in results]
            ratio = f"{peaks[-1] / peaks[0]:.3f}" if peaks[0] and peaks[-1] else "—"
            print(f"| {key} | {phase} | " + " | ".join(f"{p / GIB:.3f} GiB" if p else "—" for p in peaks)
                  + f" | {ratio} |")
    for r in results:
        share = f"{r['prep_s']:.1f} s, {r['prep_s'] / r['wall']:.1%} of the audit" if r["prep_s"] else "—"
        print(f"probe preparation at {r['n']:,}: {share}")
    if len(done) >= 2:
        small, big = done[0], done[-1]
        millions = (big["n"] - small["n"]) / 1e6
        print(f"flow (CLI) marginal CPU per million items, {small['n']:,} -> {big['n']:,}: whole audit "
              f"{(big['cli_cpu'] - small['cli_cpu']) / millions:.1f} s", end="")
        if small["embed_end"] and big["embed_end"]:
            embed_cpu = (big["embed_end"][1] - small["embed_end"][1]) / millions
            print(f"; up to the end of the embedding phase {embed_cpu:.1f} s", end="")
        print(f"\nflow (CLI) peak RSS {big['n']:,} / {small['n']:,}: {big['cli_peak'] / small['cli_peak']:.2f}")
    else:
        print("marginal CPU and RSS ratio: not computed (fewer than two sizes completed)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000], help="items per audit")
    ap.add_argument("--texts", choices=MIXES, default="same-mix",
                    help="the sentences (benchmarks/ceiling_texts.py; default same-mix: every size the same mix)")
    ap.add_argument("--workers", type=int, default=2, help="local Dask worker processes (default 2)")
    # 200,000 texts (~20 s of encode) ran at 7,314 and 10,736 items/s in one run (docs/benchmarks.md, issue 36's
    # eleventh part): too short a window on a shared machine to decide a ratio near 1
    ap.add_argument("--st-sample", type=int, default=1_000_000,
                    help="texts for the sentence-transformers baseline, half before the audit and half after "
                         "(default 1,000,000, or the whole file if smaller; 0: none)")
    ap.add_argument("--keep", help="work folder to keep (default: a temporary one, removed)")
    ap.add_argument("--code", help="a checkout of normaudit to audit with (default: this repository)")
    ap.add_argument("--poll", type=float, default=0.25, help="seconds between samples (default 0.25)")
    ap.add_argument("--min-available-gib", type=float, default=2.0,
                    help="stop an audit when the machine's available memory drops below this (default 2)")
    args = ap.parse_args()

    code = Path(args.code).resolve() if args.code else None
    base = use_code(code)
    from tests.builders import build_tiny_model  # from --code: the same tiny model the tests of that code use

    work = Path(args.keep or tempfile.mkdtemp(prefix="normaudit-ceiling-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = subprocess_env(base, code)
    tiny = str(build_tiny_model(work / "tiny-model"))
    threads = max(1, (os.cpu_count() or 1) // args.workers)  # per worker: the audit's default (Settings)
    model_name = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in model_name.splitlines()
                       if line.startswith("Model name")), "?")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}; machine: {os.cpu_count()} cores ({model_name}), "
          f"{psutil.virtual_memory().total / GIB:.0f} GiB")
    print(f"code: {base} at commit {commit_of(base)}")
    print(f"the audit's subprocess imports pipeline, flows and reads the SQL files from: "
          f"{where_subprocess_imports(env, work)}")
    print(f"sizes {', '.join(f'{n:,}' for n in args.sizes)}; texts: {args.texts}; "
          f"model: the tests' tiny BERT ({tiny}); "
          f"{args.workers} local workers of {threads} torch thread(s); plain encode in {args.workers} processes of "
          f"{threads} thread(s)")
    plain = ParallelEncode(base, tiny, args.workers, threads, "embedder")
    st = ParallelEncode(base, tiny, args.workers, threads, "sentence-transformers")
    results = [one_size(args, env, tiny, plain, st, work, n) for n in args.sizes]
    summary(results)
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if all(r["rc"] == 0 and not r["stopped"] for r in results) else 1)


if __name__ == "__main__":
    main()
