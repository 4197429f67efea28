"""A million-item audit end to end with the installed CLI, against plain encode of the same texts.

Run:  python benchmarks/million_audit.py [--n 1000000] [--workers 1] [--no-kill | --kill-only] [--keep DIR]
                                       [--model M] [--probes FILE.parquet]

1. Builds the probe set: wordfreq's English words x the sentence templates (pipeline/probes/scale.py),
   written as a Parquet probe file (``wordfreq-sentences.parquet``: the set is named after the file).
2. Times plain ``Embedder.embed`` of the same texts with the audit's total torch threads (workers x
   threads per worker): the first half before the audit, the second half after it, so a machine whose
   load drifts weighs on both sides alike. Only our Embedder is timed (sentence-transformers' own
   ``encode`` is compared in benchmarks/embed_throughput.py).
3. Runs ``normaudit audit --model M --probes FILE --root FRESH --timings`` in a subprocess (the local
   cluster, the temporary Prefect API), sampling the RSS of the CLI process (the flow, the Dask
   scheduler) and of each process under it every half second; prints the whole audit's items/s
   (wall time of the command) / plain encode, the embedding phase's, the analyses' seconds and peak RSS.
4. Kill and resume on a second fresh root: starts the same audit, SIGKILLs the CLI once half of the rows
   are committed (read from the partition's manifest), checks that no process it started outlives it,
   reruns it, and checks with ``normaudit sql``: exactly N rows, 0 duplicate (probe_set, item_id), and
   that the rerun embedded only the shards the first run had not committed.

Every figure is a ratio or count measured in this one run; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.probes.scale import write_probe_file  # noqa: E402
from pipeline.storage.shards import default_shard_size  # noqa: E402
from pipeline.storage.store import MANIFEST  # noqa: E402

CLI = str(Path(sys.executable).with_name("normaudit"))
SET = "wordfreq-sentences"
ORPHAN_WAIT_S = 30.0


def cli_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "NORMAUDIT_"))}
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"  # rich tables: one row per line, parsable
    return env


def high_water(pid: int) -> int:
    """The kernel's peak resident set of ``pid`` so far (``VmHWM`` in ``/proc/<pid>/status``, Linux), in bytes;
    0 where there is none to read."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class TreeSampler:
    """Peak RSS of a process and of every process under it, sampled on a thread.

    A process's peak (``peak``) is the larger of its sampled RSS and the kernel's high-water mark read at each
    sample (:func:`high_water`), so a peak between two samples counts: a child that lives a second was otherwise
    caught at whichever moment a sample fell on (issue 36's twelfth part: 1.170 and 1.025 of one step's 1 M peak in
    two runs, 1.079 measured whole). Peaks per phase and per tenth, and the timeline, are the samples.
    """

    def __init__(self, pid: int, every_s: float = 0.5):
        self.root = psutil.Process(pid)
        self.peak: dict[int, tuple[str, int]] = {}
        # set ``phase`` to a callable naming the audit's current phase to also get each process's peak per phase
        self.phase = None
        self.phase_peak: dict[tuple[int, str], int] = {}
        self.cpu: dict[int, float] = {}  # last seen user + system CPU seconds per process
        self.peak_at: dict[int, float] = {}  # seconds after the start when the peak was seen
        self.t0 = time.monotonic()
        self.seen: set[int] = set()
        # every sample: (seconds after the start, pid, RSS bytes), to tell a creep from a spike
        self.timeline: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    @staticmethod
    def label(p: psutil.Process, root: psutil.Process) -> str:
        if p.pid == root.pid:
            return "CLI (flow + Dask scheduler)"
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            return "?"
        if "pipeline.audit.child" in cmd:  # its last argument names the step it runs
            return f"worker's child: {cmd.split()[-1]}"
        if "multiprocessing.resource_tracker" in cmd:
            return "multiprocessing resource tracker"
        if "spawn_main" in cmd or "distributed" in cmd:
            return "Dask worker"
        if "parent_watch" in cmd or "prefect" in cmd or "uvicorn" in cmd:
            return "Prefect API"
        return cmd[:60]

    def _run(self, every_s: float) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    times = p.cpu_times()
                except psutil.Error:
                    continue
                self.cpu[p.pid] = times.user + times.system
                self.timeline.append((time.monotonic() - self.t0, p.pid, rss))
                self.seen.add(p.pid)
                if self.phase is not None:
                    key = (p.pid, self.phase())
                    self.phase_peak[key] = max(self.phase_peak.get(key, 0), rss)
                label, old = self.peak.get(p.pid, (None, 0))
                top = max(rss, high_water(p.pid))
                if top > old:
                    self.peak[p.pid] = (label or self.label(p, self.root), top)
                    self.peak_at[p.pid] = time.monotonic() - self.t0
            self._stop.wait(every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def report(self, min_bytes: int = 100 << 20) -> list[str]:
        rows = sorted(self.peak.items(), key=lambda kv: -kv[1][1])
        return [f"{label} (pid {pid}): peak RSS {rss / 2**30:.2f} GiB at {self.peak_at[pid]:.0f} s, "
                f"CPU {self.cpu.get(pid, 0.0):.0f} s"
                for pid, (label, rss) in rows if rss >= min_bytes]

    def write_timeline(self, path) -> None:
        """Every sample as CSV: seconds, pid, process (its label), rss_gib."""
        with open(path, "w") as fh:
            fh.write("seconds,pid,process,rss_gib\n")
            for t, pid, rss in self.timeline:
                label = self.peak.get(pid, ("?", 0))[0]
                fh.write(f"{t:.2f},{pid},{label},{rss / 2**30:.4f}\n")

    def tenths(self, pid: int, end_s: float) -> list[float]:
        """The process's peak RSS (GiB) in each tenth of ``end_s`` seconds (0 where it was not sampled)."""
        out = [0.0] * 10
        for t, p, rss in self.timeline:
            if p == pid and t < end_s:
                k = min(9, int(10 * t / end_s))
                out[k] = max(out[k], rss / 2**30)
        return out

    def cli_peak(self) -> int:
        return self.peak.get(self.root.pid, ("", 0))[1]


def plain_rate_parts(texts: list[str], model: str, threads: int) -> callable:
    """A function timing plain Embedder.embed of a slice of ``texts`` (model loaded and warmed once)."""
    from pipeline.audit.steps import resolve
    from pipeline.embedding.embed import Embedder

    embedder = Embedder(resolve(model), device="cpu", threads=threads)
    embedder.embed(texts[:256])

    def run(lo: int, hi: int) -> float:
        t = time.perf_counter()
        embedder.embed(texts[lo:hi])
        return time.perf_counter() - t

    return run


def parse_timings(out: str) -> dict[str, tuple[int, float]]:
    found = {}
    for m in re.finditer(r"^\W*([a-z_ ]+?)\s*[│|]\s*(\d+)\s*[│|]\s*([\d.]+)\s*[│|]", out, re.M):
        found[m.group(1).strip()] = (int(m.group(2)), float(m.group(3)))
    return found


def audit_cmd(args, probes: str, root: str) -> list[str]:
    return [CLI, "audit", "--model", args.model, "--probes", probes, "--root", root, "--timings",
            "--workers", str(args.workers)]


def run_audit(args, probes: str, root: str, log: Path) -> tuple[float, str, TreeSampler, int]:
    t = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(audit_cmd(args, probes, root), stdout=fh, stderr=subprocess.STDOUT, env=cli_env())
        sampler = TreeSampler(proc.pid)
        rc = proc.wait()
    wall = time.perf_counter() - t
    sampler.stop()
    return wall, log.read_text(), sampler, rc


def manifest_rows(root: str) -> tuple[int, int]:
    """(parts, rows) committed under ``root`` (the one partition this benchmark writes)."""
    for m in Path(root).glob(f"embeddings/*/*/*/{MANIFEST}"):
        try:
            parts = json.loads(m.read_text())["parts"]
        except (OSError, ValueError, KeyError):
            return 0, 0
        return len(parts), sum(p["rows"] for p in parts)
    return 0, 0


def sql(root: str, query: str) -> list[dict]:
    out = subprocess.run([CLI, "sql", "--root", root, "--format", "json", query], capture_output=True, text=True,
                         env=cli_env(), check=True).stdout
    return json.loads(out)


def kill_and_resume(args, probes: str, root: str, work: Path, n: int, shards: int) -> bool:
    print(f"\n-- kill and resume on a fresh root: SIGKILL of the CLI at >= {n // 2:,} committed rows")
    log = work / "killed.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(audit_cmd(args, probes, root), stdout=fh, stderr=subprocess.STDOUT, env=cli_env())
        sampler = TreeSampler(proc.pid, every_s=0.25)
        while proc.poll() is None:
            parts, rows = manifest_rows(root)
            if rows >= n // 2:
                descendants = set(sampler.seen) - {proc.pid}
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.25)
        else:
            print(f"FAIL: the audit ended (exit {proc.returncode}) before half of the rows were committed")
            return False
    sampler.stop()
    parts, rows = manifest_rows(root)
    print(f"killed at {parts} committed shards of {shards} ({rows:,} rows)")
    deadline = time.monotonic() + ORPHAN_WAIT_S
    alive = [p for p in descendants if psutil.pid_exists(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    t_gone = ORPHAN_WAIT_S - max(0.0, deadline - time.monotonic())
    ok = not alive
    print(f"processes the CLI started: {len(descendants)}; alive {t_gone:.1f} s after the kill: {len(alive)}"
          + ("" if ok else f" FAIL {alive}"))
    wall, out, _, rc = run_audit(args, probes, root, work / "resumed.log")
    timings = parse_timings(out)
    embedded_shards = timings.get("embed_shard", (0, 0.0))[0]
    m = re.search(r"embedded ([\d,]+) items \((\d+) shards already committed(?:; (\d+) written by an interrupted "
                  r"run, checked and reused)?\)", out)
    skipped = int(m.group(2)) if m else -1
    print(f"rerun reused {int(m.group(3) or 0) if m else 0} part(s) written but not committed before the kill")
    print(f"rerun: exit {rc}, {wall:.0f} s; embed_shard ran {embedded_shards} times, {skipped} shards skipped "
          f"(committed before the kill: {parts}; expected to embed {shards - parts})")
    ok &= rc == 0 and embedded_shards == shards - parts and skipped == parts
    (row,) = sql(root, "select count(*) as n, count(distinct item_id) as ids from embeddings "
                       f"where probe_set = '{SET}'")
    dups = row["n"] - row["ids"]
    print(f"embeddings: {row['n']:,} rows, {dups} duplicate (probe_set, item_id)")
    ok &= row["n"] == n and dups == 0
    check = subprocess.run([CLI, "verify", "--root", root], capture_output=True, text=True, env=cli_env())
    orphans = check.stderr.count("orphan: ")
    print(f"normaudit verify: exit {check.returncode}, {orphans} orphan part(s) left")
    ok &= check.returncode == 0 and orphans == 0
    print("kill and resume:", "PASS" if ok else "FAIL")
    return ok


def uninterrupted(args, probes: str, texts: list[str], work: Path, threads: int) -> bool:
    """Plain encode (half before, half after) around one uninterrupted audit; prints the ratios, True if the
    flow process stayed within 3 GiB."""
    embed = plain_rate_parts(texts, args.model, threads)
    half = len(texts) // 2
    plain_first = embed(0, half)
    print(f"plain encode, first half: {half / plain_first:.0f} items/s", flush=True)

    root = str(work / "root")
    shutil.rmtree(root, ignore_errors=True)
    wall, out, sampler, rc = run_audit(args, probes, root, work / "audit.log")
    if rc != 0:
        print(out[-4000:])
        sys.exit(f"the audit failed (exit {rc}); its output is above and in {work / 'audit.log'}")
    plain_second = embed(half, len(texts))
    plain = len(texts) / (plain_first + plain_second)
    print(f"plain encode, second half: {(len(texts) - half) / plain_second:.0f} items/s; both: {plain:.0f} items/s")
    timings = parse_timings(out)
    audit_rate = args.n / wall
    embed_s = timings.get("embed_probes", (0, float("nan")))[1]
    print(f"\naudit: {wall:.0f} s = {audit_rate:.0f} items/s -> whole audit / plain encode = {audit_rate / plain:.3f}")
    print(f"embedding phase (embed_probes): {embed_s:.0f} s = {args.n / embed_s:.0f} items/s -> "
          f"{args.n / embed_s / plain:.3f} of plain encode")
    for step in ("api_start", "load_probes", "plan_shards", "embed_shard", "validate_and_commit", "run_analyses",
                 "compare_with_previous", "close_release", "render_report", "render_models_page"):
        if step in timings:
            runs, secs = timings[step]
            print(f"  {step:22s} {runs:4d} runs {secs:9.1f} s")
    print(f"analyses (run_analyses): {timings.get('run_analyses', (0, float('nan')))[1]:.1f} s")
    for line in sampler.report():
        print("  " + line)
    cli_gib = sampler.cli_peak() / 2**30
    ok = cli_gib <= 3.0
    print(f"flow process peak RSS {cli_gib:.2f} GiB ({'<=' if ok else 'OVER'} 3 GiB)")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="items (default 1,000,000)")
    ap.add_argument("--workers", type=int, default=1, help="local Dask worker processes")
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--no-kill", action="store_true", help="skip the kill-and-resume run")
    ap.add_argument("--kill-only", action="store_true",
                    help="only the kill-and-resume run (no plain encode, no uninterrupted audit)")
    ap.add_argument("--keep", help="work folder to keep (default: a temporary one, removed)")
    ap.add_argument("--probes", help="a Parquet probe file to audit instead of building --n sentences")
    args = ap.parse_args()

    work = Path(args.keep or tempfile.mkdtemp(prefix="normaudit-million-"))
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    import polars as pl

    global SET
    if args.probes:  # e.g. benchmarks/pipeline_ceiling.py's 5 M sentences: the set is named after the file
        probes, SET = args.probes, Path(args.probes).stem
        args.n = pl.scan_parquet(probes).select(pl.len()).collect().item()
    else:
        probes = str(work / f"{SET}.parquet")
        write_probe_file(probes, args.n)
    texts = [] if args.kill_only else pl.read_parquet(probes, columns=["text"])["text"].to_list()
    size = default_shard_size(args.n)
    shards = math.ceil(args.n / size)
    threads = max(1, (os.cpu_count() or 1) // args.workers) * args.workers
    print(f"machine: {os.cpu_count()} cores; probe set: {args.n:,} sentences (wordfreq English words x templates), "
          f"built in {time.perf_counter() - t:.1f} s; {shards} shards of {size}; model {args.model}; "
          f"{args.workers} worker(s); plain encode on {threads} threads")

    ok = True if args.kill_only else uninterrupted(args, probes, texts, work, threads)
    if not args.no_kill:
        ok &= kill_and_resume(args, probes, str(work / "root-killed"), work, args.n, shards)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
