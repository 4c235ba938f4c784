"""The log watcher: follow running jobs' stdout/stderr, match the catalog, spot hangs.

Drive it from the controller:

    watcher = LogWatcher(sink, cluster="lab")
    task = asyncio.create_task(watcher.run(stop))   # polls every `interval`
    ...each Slurm poll: watcher.sync(running_jobs)  # list[SlurmJob]; others are dropped

`sync` starts following new jobs' files, updates changed ones (a higher restart count is
a new run: progress and repeat limits start over, file positions are kept since a
requeued job may append) and lets jobs that stopped running linger for `linger` so their
last lines (usually the error) are still read. One cycle stats every file, reads at most
`max_read_per_file` new bytes from each (so one runaway writer cannot starve the others)
and `max_read_per_cycle` in all, runs the catalog's trigger prefilter over each block,
and decodes and matches only the lines around prefilter hits.

Per job and cycle, root and cascade matches become one `log_match` signal carrying the
evidence lines (file, line number, rank and node when the prefixes or the job layout
say); the same rule on the same rank/node is not reported again within
`repeat_interval`. A running job that showed progress and then none for `hang_after`
gets one `hang` signal (re-armed when progress resumes), whose synthetic evidence line
matches the catalog rule `trainmedic.hang`.

Threads: a cycle runs in a worker thread (`run`, `poll_and_submit`); its file I/O
(stat, open, read) holds no lock, so `watch`/`sync`/`view`, which the event loop calls,
only ever wait for the in-memory scan of one block, never for a file (a job owner
chooses the path: a FIFO, a hung mount). Output files are regular files only (see
`tail.FileTail`); a path that is not one is reported once and listed in the job's view.
Signals the router could not deliver (Temporal down) are kept, up to
`max_undelivered`, and offered again with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from trainmedic.catalog.correlation import Topology, parse_line
from trainmedic.catalog.loader import Catalog, load_catalog
from trainmedic.catalog.matcher import LineMatch, Matcher
from trainmedic.catalog.scanner import clip, decode_line
from trainmedic.domain import Evidence, EvidenceSource, Role
from trainmedic.domain.incident import IncidentSignal
from trainmedic.domain.slurm import SlurmJob
from trainmedic.durations import Duration
from trainmedic.errors import DeliveryError
from trainmedic.watchers.base import SignalSink
from trainmedic.watchers.progress import JobProgress, ProgressConfig, ProgressPatterns, SeenLine
from trainmedic.watchers.remote_tail import RemoteFiles, RemoteFileTail
from trainmedic.watchers.tail import Block, FileTail

log = logging.getLogger(__name__)

_HIT_WINDOW = 2048  # bytes either side of a prefilter hit kept from an over-long line
_TRIGGERING = (Role.ROOT, Role.CASCADE)


class LogWatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interval: Duration = timedelta(seconds=0.5)
    max_read_per_file: int = Field(1 << 20, ge=4096)  # per cycle
    max_read_per_cycle: int = Field(64 << 20, ge=4096)
    max_line: int = Field(32 << 10, ge=1024)  # longer lines are scanned in fragments
    catch_up_bytes: int = Field(4 << 20, ge=0)  # of a file already big when first seen
    repeat_interval: Duration = timedelta(seconds=60)
    max_evidence: int = Field(24, ge=1)  # per signal
    linger: Duration = timedelta(seconds=5)  # keep reading after a job stops running
    max_undelivered: int = Field(1000, ge=1)  # signals kept while the router cannot deliver
    progress: ProgressConfig = ProgressConfig()


class LogWatchStats(BaseModel):
    jobs: int = 0
    files: int = 0
    files_present: int = 0
    bytes_read: int = 0
    lines: int = 0
    long_lines: int = 0
    resets: int = 0
    cycles: int = 0
    matches: int = 0
    suppressed: int = 0  # matches not reported again (repeat limit)
    signals: int = 0
    hangs: int = 0


class JobLogView(BaseModel):
    """What the watcher knows about one job (for the CLI and the restart budget)."""

    job_id: str
    run: int | None = None
    files: list[str] = Field(default_factory=list)
    progress: str | None = None
    checkpoint: str | None = None
    stalled_s: float | None = None
    hang_reported: bool = False
    refused: dict[str, str] = Field(default_factory=dict)  # path -> why it is not read


@dataclass(slots=True)
class _Hit:
    match: LineMatch
    evidence: Evidence


@dataclass(slots=True)
class _Job:
    job_id: str
    run: int | None
    topo: Topology
    tails: dict[str, FileTail]
    progress: JobProgress = field(default_factory=JobProgress)
    pending: list[_Hit] = field(default_factory=list)
    last_sent: dict[tuple[str, str | None, int | None], float] = field(default_factory=dict)
    lingering_since: float | None = None  # no longer running: read a little more, then drop
    announce_run: bool = False  # a later run began: say where its output starts

    def log_from(self) -> dict[str, int]:
        """Where this run's output begins in each file (0 for the first run)."""
        return {path: tail.run_start for path, tail in self.tails.items()}


_MAX_ENDED = 20_000  # dropped jobs whose read positions are kept for a next run


def _later(run: int | None, ended: int | None) -> bool:
    return run is not None and ended is not None and run > ended


def output_paths(job: SlurmJob) -> list[str]:
    """The files a running job writes to, per-task patterns (%t %n %N) filled in."""
    paths: list[str] = []
    for path in (job.stdout_path, job.stderr_path):
        if not path or path == "/dev/null":
            continue
        for expanded in _expand_task_patterns(path, job):
            if expanded not in paths:
                paths.append(expanded)
    return paths


_TASK_FIELD = re.compile(r"%(\d*)([tnN])")


def _expand_task_patterns(path: str, job: SlurmJob, limit: int = 1024) -> list[str]:
    if not _TASK_FIELD.search(path):
        return [path]
    nodes = job.nodes or ([job.batch_host] if job.batch_host else [])
    tpn = _tasks_per_node(job) or 1
    tasks = job.tasks or tpn * max(1, len(nodes))
    out: list[str] = []
    for task in range(min(tasks, limit)):
        index = task // tpn
        node = nodes[index] if index < len(nodes) else ""
        values = {"t": str(task), "n": str(index), "N": node}

        def fill(m: re.Match[str], values: dict[str, str] = values) -> str:
            value = values[m.group(2)]
            return value.zfill(int(m.group(1))) if m.group(1) and value.isdigit() else value

        expanded = _TASK_FIELD.sub(fill, path)
        if expanded not in out:
            out.append(expanded)
    return out


def _tasks_per_node(job: SlurmJob) -> int | None:
    if job.tasks_per_node:
        return job.tasks_per_node
    count = job.node_count or len(job.nodes)
    if job.tasks and count and job.tasks % count == 0:
        return job.tasks // count
    return None


class LogWatcher:
    """Follows many jobs' log files; thread-safe between `sync`/`watch` and a cycle."""

    def __init__(
        self,
        sink: SignalSink,
        *,
        cluster: str = "default",
        catalog: Catalog | None = None,
        matcher: Matcher | None = None,
        config: LogWatchConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        remote: RemoteFiles | None = None,
    ) -> None:
        self.sink = sink
        # SSH mode: the files are on the far side of the connection, fetched once a cycle.
        self.remote = remote
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cluster = cluster
        self.matcher = matcher or Matcher(catalog if catalog is not None else load_catalog())
        self.config = config or LogWatchConfig()
        self.patterns = ProgressPatterns(self.config.progress)
        self.clock = clock
        self._resolution = min(5.0, self.config.progress.hang_after.total_seconds() / 20)
        self.stats = LogWatchStats()
        self.last_cycle_s: float | None = None  # the last cycle's duration (telemetry)
        self._jobs: dict[str, _Job] = {}
        # `_lock` guards the jobs' state and is never held across file I/O; `_cycle_lock`
        # keeps cycles one at a time and is only taken in cycle threads, never on the loop.
        self._lock = threading.Lock()
        self._cycle_lock = threading.Lock()
        self._undelivered: deque[IncidentSignal] = deque()
        self._retry_at = 0.0
        self._backoff = 0.0
        self._cursor = 0  # round-robin start, so a cycle budget never starves the same files
        self._last_cycle: float | None = None
        # Where each dropped job's files were read up to, with its run: a requeued job's
        # next run resumes there instead of reading the old run's lines again (with
        # --open-mode=append they stay in the file). Bounded; oldest forgotten first.
        self._ended: OrderedDict[str, tuple[int | None, dict[str, tuple[int, int, bytes]]]] = (
            OrderedDict()
        )

    # -- what to follow ----------------------------------------------------------------

    def watch(
        self,
        job_id: str,
        paths: Iterable[str],
        nodelist: list[str] | None = None,
        tasks_per_node: int | None = None,
        run: int | None = None,
    ) -> None:
        """Follow `paths` for `job_id` (idempotent: call again with the current view)."""
        wanted = list(dict.fromkeys(p for p in paths if p))
        with self._lock:
            job = self._jobs.get(job_id)
            resume: dict[str, tuple[int, int, bytes]] = {}
            if job is None:
                job = _Job(job_id, run, Topology(nodelist, tasks_per_node), {})
                self._jobs[job_id] = job
                log.debug("watching job %s: %s", job_id, wanted)
                ended = self._ended.pop(job_id, None)
                if ended is not None and _later(run, ended[0]):
                    resume = ended[1]
                    job.announce_run = True
            elif run is not None and job.run is not None and run != job.run:
                # A requeued job is a new run: its progress and repeat limits start over,
                # and its evidence starts where the old run's lines end.
                log.info("job %s: run %s -> %s", job_id, job.run, run)
                job.run = run
                job.progress = JobProgress()
                job.last_sent.clear()
                job.pending.clear()
                for tail in job.tails.values():
                    tail.run_start = tail.offset
                job.announce_run = True
            elif job.run is None:
                job.run = run
            job.lingering_since = None
            if nodelist is not None or tasks_per_node is not None:
                job.topo = Topology(nodelist or job.topo.nodelist, tasks_per_node)
            for path in wanted:
                if path not in job.tails:
                    tail = (RemoteFileTail if self.remote else FileTail)(
                        path,
                        max_line=self.config.max_line,
                        catch_up_bytes=self.config.catch_up_bytes,
                    )
                    if path in resume:
                        tail.resume_at(*resume[path])
                    job.tails[path] = tail
            for path in list(job.tails):
                if path not in wanted:
                    del job.tails[path]

    def unwatch(self, job_id: str, *, now: bool = False) -> None:
        """Stop following a job: at once, or after `linger` (its last lines still count)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return
            if now:
                del self._jobs[job_id]
            elif job.lingering_since is None:
                job.lingering_since = self.clock()

    def sync(self, jobs: Iterable[SlurmJob]) -> None:
        """Follow exactly the running jobs among `jobs` (the controller's current view)."""
        running = {job.job_id: job for job in jobs if job.is_running}
        for job in running.values():
            self.watch(
                job.job_id,
                output_paths(job),
                nodelist=job.nodes,
                tasks_per_node=_tasks_per_node(job),
                run=job.restarts,
            )
        with self._lock:
            gone = [job_id for job_id in self._jobs if job_id not in running]
        for job_id in gone:
            self.unwatch(job_id)

    def watched(self) -> list[str]:
        with self._lock:
            return [j for j, job in self._jobs.items() if job.lingering_since is None]

    def view(self, job_id: str) -> JobLogView | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            return JobLogView(
                job_id=job_id,
                run=job.run,
                files=list(job.tails),
                progress=job.progress.marker,
                checkpoint=job.progress.checkpoint,
                stalled_s=job.progress.stalled_for(self.clock()),
                hang_reported=job.progress.hang_reported,
                refused={p: t.refused for p, t in job.tails.items() if t.refused},
            )

    # -- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set. File I/O runs in a worker thread, off the event loop."""
        interval = self.config.interval.total_seconds()
        self._loop = asyncio.get_running_loop()
        while not stop.is_set():
            started = self.clock()
            try:
                signals = await asyncio.to_thread(self.poll)
                await self._submit(signals)
            except Exception:  # a watcher that dies silently is worse than one that logs
                log.exception("log watcher cycle failed")
            spent = self.clock() - started
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.05, interval - spent))

    async def poll_and_submit(self) -> list[IncidentSignal]:
        """One cycle, then hand its signals to the sink (tests, benchmarks)."""
        self._loop = asyncio.get_running_loop()
        signals = await asyncio.to_thread(self.poll)
        await self._submit(signals)
        return signals

    async def _submit(self, signals: list[IncidentSignal]) -> None:
        self._undelivered.extend(signals)
        if not self._undelivered or self.clock() < self._retry_at:
            self._trim_undelivered()
            return
        while self._undelivered:
            signal = self._undelivered[0]
            try:
                await self.sink.submit(signal)
            except DeliveryError as error:
                # Temporal is down: keep this one and the rest, offer them again later.
                if self._backoff == 0.0:
                    log.warning(
                        "log watcher: cannot deliver (%s); keeping %d signal(s) for a retry",
                        error,
                        len(self._undelivered),
                    )
                self._backoff = min(30.0, max(0.5, self._backoff * 2))
                self._retry_at = self.clock() + self._backoff
                self._trim_undelivered()
                return
            except Exception:
                log.exception("sink refused %s signal for job %s", signal.kind, signal.job_id)
            self._undelivered.popleft()
        if self._backoff:
            log.info("log watcher: delivering again")
        self._backoff = 0.0
        self._retry_at = 0.0

    def _trim_undelivered(self) -> None:
        excess = len(self._undelivered) - self.config.max_undelivered
        if excess > 0:
            log.warning("log watcher: %d undelivered signal(s) dropped (oldest first)", excess)
            for _ in range(excess):
                self._undelivered.popleft()

    def poll(self) -> list[IncidentSignal]:
        """One cycle over every followed file; returns the signals it found (no I/O).

        Blocking: call it from a thread (`run` and `poll_and_submit` do)."""
        with self._cycle_lock:
            started = time.perf_counter()
            try:
                return self._cycle()
            finally:
                self.last_cycle_s = time.perf_counter() - started

    def _cycle(self) -> list[IncidentSignal]:
        now = self.clock()
        cfg = self.config
        with self._lock:
            self._forgive_pause(now)
            entries = [(job, tail) for job in self._jobs.values() for tail in job.tails.values()]
            if entries:
                self._cursor %= len(entries)
                order = entries[self._cursor :] + entries[: self._cursor]
                self._cursor += 1
            else:
                order = []
        budget = cfg.max_read_per_cycle
        if self.remote is not None:
            self._fetch_remote(order, budget)
        read_total = lines = long_lines = resets = 0
        for job, tail in order:
            if budget <= 0:
                break  # the rest is read next cycle; nothing is skipped
            before = (tail.bytes_read, tail.lines, tail.long_lines, tail.resets)
            # File I/O without the lock: the event loop must never wait on a file.
            blocks = tail.poll(min(cfg.max_read_per_file, budget))
            if blocks:
                with self._lock:
                    if self._jobs.get(job.job_id) is job:  # not dropped meanwhile
                        for block in blocks:
                            self._scan_block(job, tail, block, now)
            read = tail.bytes_read - before[0]
            budget -= read
            read_total += read
            lines += tail.lines - before[1]
            long_lines += tail.long_lines - before[2]
            resets += tail.resets - before[3]
        with self._lock:
            return self._finish_cycle(now, read_total, lines, long_lines, resets)

    def _fetch_remote(self, order: list[tuple[_Job, FileTail]], budget: int) -> None:
        """One remote command for this cycle's files (called in the cycle's thread)."""
        remote, loop = self.remote, self._loop
        if remote is None or loop is None:
            return
        requests, tails = [], {}
        for _, tail in order:
            if budget <= 0 or not isinstance(tail, RemoteFileTail):
                break
            request = tail.request(min(self.config.max_read_per_file, budget))
            requests.append(request)
            tails[tail.path] = tail
            budget -= request.length
        try:
            future = asyncio.run_coroutine_threadsafe(remote.snapshot(requests), loop)
            slices = future.result(remote.timeout + 10)
        except Exception as error:  # the connection is down: nothing is read, nothing lost
            log.warning("log watcher: cannot read the job logs over SSH: %s", error)
            return
        for path, piece in slices.items():
            tails[path].snapshot = piece

    def _finish_cycle(
        self, now: float, read_total: int, lines: int, long_lines: int, resets: int
    ) -> list[IncidentSignal]:
        cfg = self.config
        self.stats.bytes_read += read_total
        self.stats.lines += lines
        self.stats.long_lines += long_lines
        self.stats.resets += resets
        signals: list[IncidentSignal] = []
        hang_after = cfg.progress.hang_after.total_seconds()
        linger = cfg.linger.total_seconds()
        for job_id, job in list(self._jobs.items()):
            if job.announce_run and job.lingering_since is None:
                job.announce_run = False
                signals.append(self._run_signal(job))
            if job.pending:
                signal = self._match_signal(job, now)
                if signal is not None:
                    signals.append(signal)
            if job.lingering_since is None:
                if job.progress.check_hang(now, hang_after):
                    signals.append(self._hang_signal(job, hang_after))
            elif now - job.lingering_since >= linger:
                del self._jobs[job_id]
                self._remember_end(job)
        self._update_stats(len(signals), sum(s.kind == "hang" for s in signals))
        return signals

    def _forgive_pause(self, now: float) -> None:
        # A controller paused (GC, suspended VM, blocked loop) did not see progress
        # either; without this every job would look hung the moment it wakes up.
        if self._last_cycle is not None:
            gap = now - self._last_cycle
            slack = max(10.0, 5 * self.config.interval.total_seconds())
            if gap > slack:
                log.warning("log watcher did not run for %.1f s; not counting it as stall", gap)
                for job in self._jobs.values():
                    job.progress.shift(gap)
        self._last_cycle = now

    # -- scanning ----------------------------------------------------------------------

    def _scan_block(self, job: _Job, tail: FileTail, block: Block, now: float) -> None:
        buf = block.data
        if block.end:
            self._match_lines(job, tail, block)
        # Progress: new bytes only, plus a little before (a marker cut by the last read).
        start = max(0, block.fresh_from - 128)
        # Checkpoints are rare and always looked for. Progress is only looked for once
        # the last sighting is `progress_resolution` old: a job printing every step costs
        # one scan per resolution instead of one per read, and a hang is reported at
        # most that much early (the resolution is 1/20 of `hang_after`, at most 5 s).
        checkpoint = self.patterns.scan_checkpoint(buf, start)
        last = job.progress.last_mono
        progress = None
        if last is None or now - last >= self._resolution:
            progress = self.patterns.scan_progress(buf, start)
        if progress is None and checkpoint is None:
            return
        wall = datetime.now(UTC)
        # In file order, so the later of the two sets the job's last marker.
        found = [(s, c) for s, c in ((progress, False), (checkpoint, True)) if s is not None]
        found.sort(key=lambda item: item[0].offset)
        for sighting, is_checkpoint in found:
            line_no = block.line_no + (
                0 if block.fragment else buf.count(b"\n", 0, sighting.offset)
            )
            seen = SeenLine(sighting.line, tail.path, line_no if block.line_known else None, wall)
            if is_checkpoint:
                job.progress.observe_checkpoint(sighting.marker, seen, now)
            else:
                job.progress.observe(sighting.marker, seen, now)

    def _match_lines(self, job: _Job, tail: FileTail, block: Block) -> None:
        buf, end = block.data, block.end
        line_no, cursor = block.line_no, 0
        last_start = -1
        for hit in self.matcher.prefilter.finditer(buf, 0, end):
            if block.fragment:
                start, stop = 0, end
            else:
                start = buf.rfind(b"\n", 0, hit.start()) + 1
                if start == last_start:
                    continue  # one decision per line
                stop = buf.find(b"\n", hit.end(), end)
                if stop < 0:
                    stop = end
                line_no += buf.count(b"\n", cursor, start)
                cursor = start
            last_start = start
            if stop - start > self.config.max_line:
                # Part of an over-long line: judge the text around the hit only.
                start, stop = (
                    max(start, hit.start() - _HIT_WINDOW),
                    min(stop, hit.end() + _HIT_WINDOW),
                )
            text = decode_line(buf[start:stop])
            matches = self.matcher.match(text)
            if not matches:
                continue
            ctx = parse_line(text, job.topo)
            for match in matches:
                self.stats.matches += 1
                job.pending.append(
                    _Hit(
                        match,
                        Evidence(
                            source=EvidenceSource.LOG,
                            text=clip(text),
                            file=tail.path,
                            line_no=line_no if block.line_known else None,
                            rule_id=match.rule.id,
                            node=ctx.node,
                            rank=ctx.rank,
                            gpu=ctx.gpu,
                        ),
                    )
                )
            if len(job.pending) > 4 * self.config.max_evidence:
                # A storm of matching lines in one cycle: keep the earliest of each kind.
                job.pending = _thin(job.pending, self.config.max_evidence)

    # -- signals -----------------------------------------------------------------------

    def _match_signal(self, job: _Job, now: float) -> IncidentSignal | None:
        hits, job.pending = job.pending, []
        repeat = self.config.repeat_interval.total_seconds()
        fresh: list[_Hit] = []
        others: list[_Hit] = []
        seen: set[tuple[str | None, str | None, int | None, str | None]] = set()
        for hit in hits:
            ev = hit.evidence
            dedup = (ev.file, ev.rule_id, ev.line_no, ev.text)
            if dedup in seen:
                continue  # the overlap of an over-long line's fragments
            seen.add(dedup)
            if hit.match.rule.role not in _TRIGGERING:
                others.append(hit)
                continue
            # Cascades repeat on every rank: one report per rule. Roots are kept per
            # rank/node, since the same error on a second node is news.
            cascade = hit.match.rule.role is Role.CASCADE
            key = (hit.match.rule.id, None if cascade else ev.node, None if cascade else ev.rank)
            sent = job.last_sent.get(key)
            if sent is not None and now - sent < repeat:
                self.stats.suppressed += 1
                continue
            job.last_sent[key] = now
            fresh.append(hit)
        if not fresh:
            return None
        chosen = _thin(fresh, self.config.max_evidence)
        room = self.config.max_evidence - len(chosen)
        if room > 0:
            chosen += others[: min(room, 4)]  # confirmations ride along as context
        evidence = [hit.evidence for hit in chosen]
        rules = list(dict.fromkeys(hit.match.rule.id for hit in fresh))
        nodes = list(dict.fromkeys(ev.node for ev in evidence if ev.node))
        detail = f"{len(fresh)} catalog line(s) in the job's logs: {', '.join(rules[:8])}"
        return IncidentSignal(
            source="log",
            kind="log_match",
            job_id=job.job_id,
            nodes=nodes,
            at=datetime.now(UTC),
            detail=detail,
            evidence=evidence,
            progress=job.progress.summary,
            run=job.run,
            log_from=job.log_from(),
        )

    def _remember_end(self, job: _Job) -> None:
        self._ended[job.job_id] = (
            job.run,
            {path: tail.position() for path, tail in job.tails.items() if tail.exists},
        )
        while len(self._ended) > _MAX_ENDED:
            self._ended.popitem(last=False)

    def _run_signal(self, job: _Job) -> IncidentSignal:
        """A later run of a requeued job began: where its output starts. Evidence-only
        (the router keeps it for that run's incident, if one comes)."""
        where = ", ".join(f"{p} @ {off}" for p, off in job.log_from().items())
        return IncidentSignal(
            source="log",
            kind="run_started",
            job_id=job.job_id,
            at=datetime.now(UTC),
            detail=f"run {job.run} of job {job.job_id} starts at {where or 'no file yet'}",
            run=job.run,
            log_from=job.log_from(),
        )

    def _hang_signal(self, job: _Job, hang_after: float) -> IncidentSignal:
        progress = job.progress
        seen = progress.line
        stalled = progress.stalled_for(self.clock()) or hang_after
        at = seen.wall.strftime("%Y-%m-%dT%H:%M:%SZ") if seen else "?"
        synthetic = (
            f"trainmedic: no training progress for {int(stalled)} s "
            f"(last: {progress.marker} at {at})"
        )
        evidence: list[Evidence] = []
        if seen is not None:
            ctx = parse_line(seen.text, job.topo)
            evidence.append(
                Evidence(
                    source=EvidenceSource.LOG,
                    text=clip(seen.text),
                    file=seen.file,
                    line_no=seen.line_no,
                    node=ctx.node,
                    rank=ctx.rank,
                )
            )
        evidence.append(
            Evidence(source=EvidenceSource.PROGRESS, text=synthetic, rule_id="trainmedic.hang")
        )
        log.warning("job %s: %s", job.job_id, synthetic)
        return IncidentSignal(
            source="log",
            kind="hang",
            job_id=job.job_id,
            nodes=list(job.topo.nodelist),
            at=datetime.now(UTC),
            detail=synthetic,
            evidence=evidence,
            progress=progress.summary,
            run=job.run,
            log_from=job.log_from(),
        )

    def _update_stats(self, signals: int, hangs: int) -> None:
        stats = self.stats
        stats.cycles += 1
        stats.signals += signals
        stats.hangs += hangs
        stats.jobs = len(self._jobs)
        tails = [t for job in self._jobs.values() for t in job.tails.values()]
        stats.files = len(tails)
        stats.files_present = sum(t.exists for t in tails)


def _thin(hits: list[_Hit], limit: int) -> list[_Hit]:
    """At most `limit` hits, spread over rules and ranks: roots first, then the earliest
    line of each (rule, rank), so a cascade on 512 ranks leaves room for the root."""
    if len(hits) <= limit:
        return hits
    ordered = sorted(
        hits, key=lambda h: (h.match.rule.role is not Role.ROOT, -h.match.rule.precedence)
    )
    chosen: list[_Hit] = []
    seen: set[tuple[str, int | None, str | None]] = set()
    for hit in ordered:
        key = (hit.match.rule.id, hit.evidence.rank, hit.evidence.node)
        if key in seen:
            continue
        seen.add(key)
        chosen.append(hit)
        if len(chosen) >= limit:
            return chosen
    for hit in ordered:
        if len(chosen) >= limit:
            break
        if hit not in chosen:
            chosen.append(hit)
    return chosen
