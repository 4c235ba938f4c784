"""Training progress in job logs, and hangs: a running job whose logs stop progressing.

A *progress marker* is the text a trainer prints as it advances (`step 1234`, Megatron's
`iteration  100/ 1000`, a tqdm/Lightning bar's `450/1000 [02:13<02:43`, HF Trainer's
`{'loss': ...}` dict, `saved checkpoint`). A job has progressed when a marker different
from the last one shows up: a hung loop that reprints the same line does not count.

A job that has shown progress at least once and then none for `hang_after` gets one
hang report; the detector re-arms when progress resumes. The last checkpoint marker is
kept too, so the restart budget can tell whether a restarted job got anywhere.

Patterns are bytes regexes run over whole blocks of new output (one pass, the last match
wins), never line by line, so following thousands of files stays cheap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainmedic.durations import Duration

# Case-sensitive on purpose (explicit [Ss]): an inline (?i) disables re's literal scans.
# The lookbehinds keep config echoes out: `max_steps=1000`, `warmup_steps 100`, and
# plurals (`Total optimization steps = 4,000`, `Num Epochs = 3`) are not progress.
DEFAULT_PROGRESS_PATTERNS: tuple[str, ...] = (
    # step 123 | Step 5/100 | global_step=123 | iteration 100/ 1000 (Megatron) | iter: 7
    r"(?<![A-Za-z_])(?:global[_ ]step|[Ss]tep|STEP|[Ii]ter(?:ation)?|ITER(?:ATION)?)"
    r"\s*[=:#]?\s*\[?\s*\d+(?:\s*/\s*\d+)?",
    # Epoch 3 | epoch=3 | Epoch [3/10]
    r"(?<![A-Za-z_])(?:[Ee]poch|EPOCH)\s*[=:]?\s*\[?\s*\d+(?:\s*/\s*\d+)?",
    # tqdm / Lightning bars: 450/1000 [02:13<02:43, 3.37it/s]
    r"\d+/\d+ \[[\d:]+<[\d:?]+",
    r"\d+(?:\.\d+)?\s?(?:it/s|s/it)\b",
    # Hugging Face Trainer's log dicts: {'loss': 2.31, 'grad_norm': ..., 'epoch': 0.12}
    r"\{'(?:loss|train_loss|eval_loss)': [^\n\r}]{0,300}\}?",
)

DEFAULT_CHECKPOINT_PATTERNS: tuple[str, ...] = (
    # "saved checkpoint at step 1200", Megatron "successfully saved checkpoint from
    # iteration 1000", "saving checkpoint at iteration 2000", HF "Saving model
    # checkpoint to out/checkpoint-500"
    r"[Ss]av(?:ed|ing)\s+(?:model\s+|a\s+|the\s+)?checkpoint",
    r"[Cc]heckpoint\s+(?:saved|written|stored)",
    # Lightning ModelCheckpoint: "saving model to '/x/epoch=3-step=4000.ckpt'"
    r"[Ss]aving model to \S+\.ckpt",
    # DeepSpeed: "[Torch] Checkpoint global_step1000 is ready now!"
    r"[Cc]heckpoint \S+ is ready now",
)

# Literals every match of the default patterns contains. Finding the last one with
# bytes.rfind and checking only its line is ~30x cheaper than running the regexes over a
# block of output that has no progress in it.
DEFAULT_PROGRESS_TRIGGERS: tuple[str, ...] = (
    "step", "Step", "STEP", "iter", "Iter", "ITER", "poch", "POCH",
    "it/s", "s/it", "<", "loss'",
)  # fmt: skip
DEFAULT_CHECKPOINT_TRIGGERS: tuple[str, ...] = ("heckpoint", ".ckpt")
_MAX_TRIGGER_TRIES = 64  # literal hits that fail the regex before one regex pass instead

# The step a checkpoint line names: step=4000, iteration 1000, checkpoint-500, global_step1000.
_CKPT_STEP = re.compile(r"(?:global_step|step|iteration|iter|checkpoint)[\s=:_-]*(\d+)", re.I)
_SPACES = re.compile(r"\s+")
_MARKER_KEEP = 80
_LINE_KEEP = 300


class ProgressConfig(BaseModel):
    """What counts as progress, and how long without it is a hang."""

    model_config = ConfigDict(extra="forbid")

    patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_PROGRESS_PATTERNS))
    extra_patterns: list[str] = Field(default_factory=list)  # added to `patterns`
    checkpoint_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_CHECKPOINT_PATTERNS)
    )
    # Literals every match contains (a fast path). None: the defaults' literals while
    # the default patterns are in use, else no fast path (one regex pass per block).
    triggers: list[str] | None = None
    checkpoint_triggers: list[str] | None = None
    hang_after: Duration = timedelta(minutes=10)

    def progress_triggers(self) -> list[str] | None:
        if self.triggers is not None:
            return self.triggers
        if self.patterns == list(DEFAULT_PROGRESS_PATTERNS) and not self.extra_patterns:
            return list(DEFAULT_PROGRESS_TRIGGERS)
        return None

    def checkpoint_trigger_list(self) -> list[str] | None:
        if self.checkpoint_triggers is not None:
            return self.checkpoint_triggers
        if self.checkpoint_patterns == list(DEFAULT_CHECKPOINT_PATTERNS):
            return list(DEFAULT_CHECKPOINT_TRIGGERS)
        return None

    @field_validator("patterns", "extra_patterns", "checkpoint_patterns")
    @classmethod
    def _compiles(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern.encode())
            except re.error as error:
                raise ValueError(f"bad progress pattern {pattern!r}: {error}") from error
        return value


def _combine(patterns: list[str]) -> re.Pattern[bytes]:
    if not patterns:
        return re.compile(b"(?!)")
    return re.compile(b"|".join(b"(?:" + p.encode() + b")" for p in patterns))


def _last_match(
    regex: re.Pattern[bytes], buf: bytes, start: int, end: int | None = None
) -> re.Match[bytes] | None:
    """The last match in buf[start:end], looking at the end first.

    Trainers print progress on most lines, so the last few KiB nearly always hold the
    answer and the rest of a big block is never scanned.
    """
    end = len(buf) if end is None else end
    window = 4096
    while True:
        lo = max(start, end - window)
        last = None
        for last in regex.finditer(buf, lo, end):  # noqa: B007 - the last one is wanted
            pass
        if last is not None or lo == start:
            return last
        window *= 8


def _line_bounds(buf: bytes, start: int, pos: int) -> tuple[int, int]:
    lo = max(buf.rfind(b"\n", start, pos), buf.rfind(b"\r", start, pos), start - 1) + 1
    his = [h for h in (buf.find(b"\n", pos), buf.find(b"\r", pos)) if h >= 0]
    return lo, min(his) if his else len(buf)


def _last_match_by_trigger(
    regex: re.Pattern[bytes], triggers: list[bytes], buf: bytes, start: int
) -> re.Match[bytes] | None:
    """The last match in buf[start:], checking only lines that hold a trigger literal."""
    hi = len(buf)
    found = [buf.rfind(t, start, hi) for t in triggers]
    for _ in range(_MAX_TRIGGER_TRIES):
        pos = max(found)
        if pos < 0:
            return None
        lo, line_end = _line_bounds(buf, start, pos)
        last = None
        for last in regex.finditer(buf, lo, line_end):  # noqa: B007 - the last one is wanted
            pass
        if last is not None:
            return last
        hi = lo
        # Only triggers found inside the rejected line need looking up again.
        found = [
            buf.rfind(t, start, hi) if p >= hi else p for t, p in zip(triggers, found, strict=True)
        ]
    return _last_match(regex, buf, start, hi)


def line_around(buf: bytes, start: int, end: int, keep: int = _LINE_KEEP) -> str:
    """The line (\\n- or \\r-delimited: progress bars redraw with \\r) holding buf[start:end]."""
    lo = max(buf.rfind(b"\n", 0, start), buf.rfind(b"\r", 0, start)) + 1
    hi_n, hi_r = buf.find(b"\n", end), buf.find(b"\r", end)
    his = [h for h in (hi_n, hi_r) if h >= 0]
    hi = min(his) if his else len(buf)
    lo = max(lo, start - keep)
    hi = min(hi, max(end, lo + keep))
    return buf[lo:hi].decode("utf-8", errors="replace").replace("\x00", "").strip()


def marker_text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    return _SPACES.sub(" ", text).strip()[:_MARKER_KEEP]


def checkpoint_marker(line: str) -> str:
    """'checkpoint@1200' when the line names a step, else the line itself (clipped)."""
    steps = _CKPT_STEP.findall(line)
    if steps:
        return f"checkpoint@{steps[-1]}"
    return f"checkpoint: {line[:_MARKER_KEEP]}"


@dataclass(frozen=True, slots=True)
class Sighting:
    """One progress (or checkpoint) line found in a block."""

    marker: str
    line: str
    offset: int  # index in the block's data where the match starts


class ProgressPatterns:
    """The compiled patterns of a ProgressConfig."""

    def __init__(self, config: ProgressConfig) -> None:
        self.config = config
        self.progress = _combine([*config.patterns, *config.extra_patterns])
        self.checkpoint = _combine(config.checkpoint_patterns)
        triggers = config.progress_triggers()
        self.triggers = [t.encode() for t in triggers] if triggers else None
        ckpt_triggers = config.checkpoint_trigger_list()
        self.checkpoint_triggers = [t.encode() for t in ckpt_triggers] if ckpt_triggers else None

    def _last(
        self, regex: re.Pattern[bytes], triggers: list[bytes] | None, buf: bytes, start: int
    ) -> re.Match[bytes] | None:
        if triggers:
            return _last_match_by_trigger(regex, triggers, buf, start)
        return _last_match(regex, buf, start)

    def scan_progress(self, buf: bytes, start: int) -> Sighting | None:
        """The last progress sighting in buf[start:]."""
        if m := self._last(self.progress, self.triggers, buf, start):
            return Sighting(marker_text(m.group(0)), line_around(buf, *m.span()), m.start())
        return None

    def scan_checkpoint(self, buf: bytes, start: int) -> Sighting | None:
        """The last checkpoint sighting in buf[start:]."""
        if m := self._last(self.checkpoint, self.checkpoint_triggers, buf, start):
            line = line_around(buf, *m.span())
            return Sighting(checkpoint_marker(line), line, m.start())
        return None

    def scan(self, buf: bytes, start: int) -> tuple[Sighting | None, Sighting | None]:
        """The last progress and the last checkpoint sighting in buf[start:]."""
        return self.scan_progress(buf, start), self.scan_checkpoint(buf, start)


@dataclass(slots=True)
class SeenLine:
    """Where a progress line was seen (for evidence)."""

    text: str
    file: str
    line_no: int | None
    wall: datetime


class JobProgress:
    """Progress and hang state of one run of one job."""

    def __init__(self) -> None:
        self.marker: str | None = None
        self.line: SeenLine | None = None
        self.last_mono: float | None = None  # when progress was last seen (monotonic)
        self.checkpoint: str | None = None
        self.checkpoint_line: SeenLine | None = None
        self.hang_reported = False
        self.stalls = 0

    def observe(self, marker: str, line: SeenLine, mono: float) -> bool:
        """Record a progress marker; True when it is progress (differs from the last)."""
        if marker == self.marker and self.last_mono is not None:
            return False
        self.marker = marker
        self.line = line
        self.last_mono = mono
        self.hang_reported = False  # re-armed: the next stall is a new hang
        return True

    def observe_checkpoint(self, marker: str, line: SeenLine, mono: float) -> None:
        if marker != self.checkpoint:
            self.checkpoint = marker
            self.checkpoint_line = line
            # A new checkpoint is progress too (some trainers print little else).
            self.observe(marker, line, mono)

    def stalled_for(self, mono: float) -> float | None:
        return None if self.last_mono is None else mono - self.last_mono

    def check_hang(self, mono: float, hang_after: float) -> bool:
        """True once per stall: progress was seen, and none for `hang_after` seconds."""
        stalled = self.stalled_for(mono)
        if stalled is None or self.hang_reported or stalled < hang_after:
            return False
        self.hang_reported = True
        self.stalls += 1
        return True

    def shift(self, seconds: float) -> None:
        """Forgive time the watcher itself was not looking (a paused controller)."""
        if self.last_mono is not None:
            self.last_mono += seconds

    @property
    def summary(self) -> str | None:
        """The `progress` a signal carries: the last checkpoint if any, else the marker."""
        return self.checkpoint or self.marker
