"""Spool directories: the one implementation that writes and reads trainmedic's drop boxes.

A spool is a directory of small JSON files: the epilog/strigger reports
(`trainmedic report`) and the node agents' signals. Whoever can put a file there can
make the controller act, so (DESIGN "Trust and identity"):

- the directory must be a real directory (not a link), owned by an accepted owner and
  not group/world-writable; otherwise nothing in it is read (logged once);
- a file is opened with O_NOFOLLOW|O_NONBLOCK (a link or a FIFO can neither redirect nor
  stall the reader), must be a regular file with one link (a hard link to someone else's
  file is refused), owned by an accepted owner (root, the controller's own uid, and the
  configured ones), not group/world-writable, and at most `max_bytes` long;
- with a site key configured, a file must carry an HMAC-SHA256 over its purpose, its
  name and its bytes (`seal`); an unsigned or badly signed file is forged.

A refused or malformed file is moved to `bad/` with the reason beside it
(`bad/<name>.reason`): never deleted silently, never read again. A file that cannot even
be moved is remembered (by inode) and skipped, so it costs one log line, not one per poll.

Delivery keeps a file until its reader says it was handled: a `DeliveryError` (Temporal
down) or `SpoolRetry` (Slurm unreachable) keeps it and backs the whole spool off
(0.5 s doubling to 30 s, one log line when it starts failing and one when it recovers).
A handled file is deleted; one that cannot be deleted is remembered by inode and not
handed out again (a restart of the controller may deliver it once more, which the
router's incident-key dedup absorbs; the alternative, renaming to `.done` before
delivery, would lose the report if the controller died in between).

Writers (`write_spool_file`) create the file under a temporary name with O_EXCL and
mode 0640, fsync it, rename it into place and fsync the directory: a reader never sees
half a file and a power cut never leaves a renamed empty one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import hmac
import json
import logging
import os
import pwd
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainmedic.config import Settings
from trainmedic.errors import ConfigError, DeliveryError

logger = logging.getLogger(__name__)

SPOOL_FILE_MAX = 1 << 20  # no real report is near this; a bigger file is not ours
KEY_FILE_ENV = "TRAINMEDIC_SPOOL_KEY_FILE"
OWNERS_ENV = "TRAINMEDIC_SPOOL_OWNERS"
BAD_DIR = "bad"
FILE_MODE = 0o640  # group-readable so a controller in the writer's group can read it
DIR_MODE = 0o750
_MAGIC = b"trainmedic-hmac-sha256 "
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_BACKOFF_MIN = 0.5
_BACKOFF_MAX = 30.0
_MAX_SINK_FAILURES = 5  # a report that keeps crashing its reader is set aside after this
_MIN_KEY_BYTES = 16


class SpoolRefused(Exception):
    """A spool file that will not be handled: moved to bad/ with `reason` beside it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason  # a short slug: symlink, owner, mode, too-big, forged, ...
        self.detail = detail


class SpoolRetry(Exception):
    """Not now (a dependency such as Slurm is unreachable): keep the file, back off."""


class SpoolConfigError(ConfigError):
    """The spool key file is missing, unsafe or too short, or an owner is unknown:
    found at start-up, named like any other bad setting."""

    def __init__(self, message: str, source: str = KEY_FILE_ENV) -> None:
        super().__init__(source, [message])


# ----------------------------------------------------------------------------- policy


def load_key(path: Path) -> bytes:
    """The site key: a regular file, not readable by group or others, >= 16 bytes."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as error:
        raise SpoolConfigError(f"spool key {path}: {error.strerror or error}") from error
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpoolConfigError(f"spool key {path}: not a regular file")
        if st.st_mode & 0o077:
            # A key others can read signs nothing: anyone could forge with it.
            raise SpoolConfigError(f"spool key {path}: mode {st.st_mode & 0o777:o}; use 0600")
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(data) < _MIN_KEY_BYTES:
        raise SpoolConfigError(f"spool key {path}: shorter than {_MIN_KEY_BYTES} bytes")
    return data


def parse_owners(text: str) -> frozenset[int]:
    """`slurm,1001` or the JSON list pydantic-settings would take: user names or uids."""
    text = text.strip()
    if not text:
        return frozenset()
    items: list[str]
    if text.startswith("["):
        try:
            items = [str(x) for x in json.loads(text)]
        except ValueError as error:
            raise SpoolConfigError(f"not a JSON list: {error}", OWNERS_ENV) from error
    else:
        items = [x for x in text.split(",") if x.strip()]
    uids: set[int] = set()
    for item in (x.strip() for x in items):
        if item.isdigit():
            uids.add(int(item))
        else:
            try:
                uids.add(pwd.getpwnam(item).pw_uid)
            except KeyError as error:
                raise SpoolConfigError(f"no such user {item!r}", OWNERS_ENV) from error
    return frozenset(uids)


@dataclass(frozen=True, slots=True)
class SpoolPolicy:
    """What a spool accepts. Root and the reader's own uid are always accepted owners."""

    owners: frozenset[int] = field(default_factory=frozenset)
    max_bytes: int = SPOOL_FILE_MAX
    key: bytes | None = None

    @property
    def accepted(self) -> frozenset[int]:
        return self.owners | {0, os.geteuid()}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, signed: bool = True) -> SpoolPolicy:
        """From TRAINMEDIC_SPOOL_OWNERS and (when `signed`) TRAINMEDIC_SPOOL_KEY_FILE."""
        env = os.environ if env is None else env
        owners = parse_owners(env.get(OWNERS_ENV, ""))
        key_file = env.get(KEY_FILE_ENV, "").strip()
        key = load_key(Path(key_file)) if signed and key_file else None
        return cls(owners=owners, key=key)


def spool_policy(settings: Settings, *, signed: bool) -> SpoolPolicy:
    """The controller's spool policy from its Settings (TRAINMEDIC_SPOOL_OWNERS,
    TRAINMEDIC_SPOOL_KEY_FILE); a bad key or owner is a ConfigError at start-up."""
    owners = parse_owners(settings.spool_owners)
    key_file = settings.spool_key_file
    return SpoolPolicy(owners=owners, key=load_key(key_file) if signed and key_file else None)


# ------------------------------------------------------------------------ signatures


def _mac(key: bytes, purpose: str, name: str, payload: bytes) -> str:
    # Purpose and name are signed too: a signed node-agent signal cannot be replayed as
    # an epilog report, nor copied under another name to be delivered twice.
    message = b"\0".join((b"trainmedic-spool-v1", purpose.encode(), name.encode(), payload))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def seal(payload: bytes, *, key: bytes | None, purpose: str, name: str) -> bytes:
    """The file's bytes: the payload, behind one signature line when a key is given."""
    if key is None:
        return payload
    return _MAGIC + _mac(key, purpose, name, payload).encode() + b"\n" + payload


def unseal(data: bytes, *, key: bytes | None, purpose: str, name: str) -> bytes:
    """The payload of a file; raises SpoolRefused when a key demands a good signature."""
    if data.startswith(_MAGIC):
        header, _, payload = data.partition(b"\n")
        if key is None:
            return payload  # signed by a writer that has a key; we cannot check: accept
        given = header[len(_MAGIC) :].strip().decode("ascii", "replace")
        if not hmac.compare_digest(given, _mac(key, purpose, name, payload)):
            raise SpoolRefused("forged", "signature does not match the site key")
        return payload
    if key is not None:
        raise SpoolRefused("forged", "unsigned, and a site key is configured")
    return data


# ---------------------------------------------------------------------------- writing


def write_spool_file(
    folder: Path,
    name: str,
    payload: bytes,
    *,
    key: bytes | None = None,
    purpose: str,
    mode: int = FILE_MODE,
) -> Path:
    """Add one file to a spool atomically and durably; returns its final path."""
    if "/" in name or name.startswith(".") or not name:
        raise ValueError(f"bad spool file name {name!r}")
    folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    data = seal(payload, key=key, purpose=purpose, name=name)
    tmp = folder / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # exactly this mode, whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.close(fd)
    final = folder / name
    os.replace(tmp, final)
    with contextlib.suppress(OSError):  # the rename itself survives a power cut
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return final


def safe_name(text: str, limit: int = 40) -> str:
    """A piece of a file name from untrusted text: letters, digits, '-', '_', '+'."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "-_+") else "_" for c in text)
    return cleaned[:limit] or "x"


# ---------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class SpoolItem:
    name: str
    payload: bytes  # verified and without the signature line
    ident: tuple[int, int]  # (device, inode): what "this file" means across cycles


@dataclass(slots=True)
class DrainResult:
    handled: int = 0  # read and handled (delivered or dropped on purpose)
    delivered: int = 0
    refused: int = 0
    kept: int = 0  # left for a later cycle (delivery failed, dependency down)


Handler = Callable[[SpoolItem], Awaitable[bool]]


class SpoolDir:
    """One spool directory read safely; `drain(handler)` once per cycle.

    `handler(item)` returns True when it delivered the item, False when it dropped it on
    purpose (e.g. a job that succeeded); raises SpoolRefused to set it aside, and
    DeliveryError or SpoolRetry to keep it for later.
    """

    def __init__(
        self,
        folder: Path,
        policy: SpoolPolicy,
        *,
        purpose: str,
        label: str,
        suffix: str = ".json",
        batch: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.folder = Path(folder)
        self.policy = policy
        self.purpose = purpose
        self.label = label
        self.suffix = suffix
        self.batch = batch
        self.clock = clock
        self.problem: str | None = None  # why the directory is not read now
        self.refused = 0
        self._skip: dict[str, tuple[int, int]] = {}  # undeletable/unmovable: by inode
        self._failures: dict[tuple[int, int], int] = {}  # sink crashes per file
        self._retry_at = 0.0
        self._backoff = 0.0
        self._failing_since: float | None = None

    # -- directory -----------------------------------------------------------------------

    def _open_dir(self) -> int | None:
        """A descriptor on the spool dir after checking it; None (logged once) when unfit."""
        try:
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            self._set_problem("does not exist (yet)", level=logging.INFO)
            return None
        except OSError as error:
            self._set_problem(f"cannot be opened: {error.strerror or error}")
            return None
        try:
            st = os.fstat(fd)
        except OSError as error:
            os.close(fd)
            self._set_problem(f"cannot be read: {error}")
            return None
        why = None
        if st.st_uid not in self.policy.accepted:
            why = f"is owned by uid {st.st_uid}, not an accepted owner"
        elif st.st_mode & 0o022:
            why = f"is group/world-writable (mode {st.st_mode & 0o7777:o})"
        if why:
            os.close(fd)
            self._set_problem(f"{why}: nothing in it is read")
            return None
        self._set_problem(None)
        return fd

    def _set_problem(self, problem: str | None, level: int = logging.WARNING) -> None:
        if problem == self.problem:
            return
        if problem is None:
            logger.info("%s %s: readable again", self.label, self.folder)
        else:
            logger.log(level, "%s %s %s", self.label, self.folder, problem)
        self.problem = problem

    def names(self) -> list[str]:
        """Candidate file names in order (oldest first by name); [] when unreadable."""
        try:
            found = os.listdir(self.folder)
        except OSError:
            return []
        return sorted(n for n in found if n.endswith(self.suffix) and not n.startswith("."))

    # -- one file ------------------------------------------------------------------------

    def _read(self, dfd: int, name: str) -> SpoolItem | None:
        """The verified item, None when it vanished; raises SpoolRefused."""
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise SpoolRefused("symlink", "a symbolic link, not a report") from error
            if error.errno == errno.ENXIO:
                raise SpoolRefused("not-regular", "a socket or device, not a file") from error
            raise SpoolRefused("unreadable", error.strerror or str(error)) from error
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SpoolRefused("not-regular", f"file type {stat.S_IFMT(st.st_mode):o}")
            if st.st_uid not in self.policy.accepted:
                raise SpoolRefused("owner", f"owned by uid {st.st_uid}, not an accepted owner")
            if st.st_mode & 0o022:
                raise SpoolRefused("mode", f"group/world-writable (mode {st.st_mode & 0o777:o})")
            if st.st_nlink != 1:
                raise SpoolRefused("hard-link", f"{st.st_nlink} links: may be another's file")
            limit = self.policy.max_bytes
            if st.st_size > limit:
                raise SpoolRefused("too-big", f"{st.st_size} bytes, limit {limit}")
            chunks: list[bytes] = []
            size = 0
            while size <= limit:
                chunk = os.read(fd, min(1 << 16, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > limit:
                raise SpoolRefused("too-big", f"grew past the limit of {limit} bytes")
        except OSError as error:
            raise SpoolRefused("unreadable", error.strerror or str(error)) from error
        finally:
            os.close(fd)
        payload = unseal(b"".join(chunks), key=self.policy.key, purpose=self.purpose, name=name)
        return SpoolItem(name, payload, (st.st_dev, st.st_ino))

    def set_aside(self, dfd: int, name: str, reason: str, detail: str) -> None:
        """Move `name` to bad/ and write why beside it; remember it when that fails."""
        self.refused += 1
        logger.warning("%s: %s set aside (%s: %s)", self.label, name, reason, detail)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(BAD_DIR, 0o700, dir_fd=dfd)
            bad = os.open(BAD_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        except OSError as error:
            self._remember_stuck(dfd, name, f"bad/ unusable: {error}")
            return
        try:
            target = name
            for n in range(1, 100):
                try:
                    os.stat(target, dir_fd=bad, follow_symlinks=False)
                except FileNotFoundError:
                    break
                target = f"{name}.{n}"  # an earlier file of that name is kept too
            os.rename(name, target, src_dir_fd=dfd, dst_dir_fd=bad)
            with contextlib.suppress(OSError):
                note = f"{reason}: {detail}\n".encode("utf-8", "replace")[:4096]
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                nfd = os.open(f"{target}.reason", flags, 0o600, dir_fd=bad)
                try:
                    os.write(nfd, note)
                finally:
                    os.close(nfd)
        except FileNotFoundError:
            pass  # gone meanwhile: nothing to set aside
        except OSError as error:
            self._remember_stuck(dfd, name, f"cannot move to bad/: {error}")
        finally:
            os.close(bad)

    def _remember_stuck(self, dfd: int, name: str, why: str) -> None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return
        if self._skip.get(name) != (st.st_dev, st.st_ino):
            logger.warning("%s: %s %s; ignoring it from now on", self.label, name, why)
        self._skip[name] = (st.st_dev, st.st_ino)

    def _done(self, dfd: int, item: SpoolItem) -> None:
        try:
            os.unlink(item.name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except OSError as error:
            # Not handed out again while it stays this inode (see the module docstring).
            if item.name not in self._skip:
                logger.warning(
                    "%s: %s delivered but cannot be deleted (%s); not delivering it again",
                    self.label,
                    item.name,
                    error.strerror or error,
                )
            self._skip[item.name] = item.ident

    def _skipped(self, dfd: int, name: str) -> bool:
        ident = self._skip.get(name)
        if ident is None:
            return False
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            del self._skip[name]
            return True
        if (st.st_dev, st.st_ino) == ident:
            return True
        del self._skip[name]  # a new file under the old name: read it
        return False

    # -- a cycle -------------------------------------------------------------------------

    def _load(self) -> tuple[int | None, list[SpoolItem]]:
        """Blocking part of a cycle: check the dir, read and verify up to `batch` files."""
        dfd = self._open_dir()
        if dfd is None:
            return None, []
        items: list[SpoolItem] = []
        try:
            names = [n for n in os.listdir(dfd) if n.endswith(self.suffix) and n[:1] != "."]
        except OSError as error:
            self._set_problem(f"cannot be listed: {error.strerror or error}")
            os.close(dfd)
            return None, []
        for name in list(self._skip):
            if name not in names:
                del self._skip[name]
        for name in sorted(names):
            if len(items) >= self.batch:
                break
            if self._skipped(dfd, name):
                continue
            try:
                item = self._read(dfd, name)
            except SpoolRefused as refused:
                self.set_aside(dfd, name, refused.reason, refused.detail)
                continue
            if item is not None:
                items.append(item)
        return dfd, items

    async def drain(self, handler: Handler) -> DrainResult:
        """One cycle. Never raises for a file's or the directory's problem."""
        result = DrainResult()
        if self.clock() < self._retry_at:
            return result
        dfd, items = await asyncio.to_thread(self._load)
        if dfd is None:
            return result
        try:
            for index, item in enumerate(items):
                try:
                    delivered = await handler(item)
                except SpoolRefused as refused:
                    await asyncio.to_thread(
                        self.set_aside, dfd, item.name, refused.reason, refused.detail
                    )
                    result.refused += 1
                    continue
                except (DeliveryError, SpoolRetry) as error:
                    # The outside world is down: keep this file and the rest, in order.
                    result.kept += len(items) - index
                    self._back_off(error, result.kept)
                    return result
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    self._sink_crashed(dfd, item, error)
                    result.kept += 1
                    continue
                result.handled += 1
                result.delivered += int(delivered)
                self._failures.pop(item.ident, None)
                await asyncio.to_thread(self._done, dfd, item)
            self._recovered()
        finally:
            os.close(dfd)
        return result

    def _sink_crashed(self, dfd: int, item: SpoolItem, error: Exception) -> None:
        count = self._failures.get(item.ident, 0) + 1
        self._failures[item.ident] = count
        if count >= _MAX_SINK_FAILURES:
            self._failures.pop(item.ident, None)
            self.set_aside(dfd, item.name, "sink-error", f"failed {count} times: {error!r}")
        else:
            logger.warning("%s: %s not handled (%r); trying again", self.label, item.name, error)

    def _back_off(self, error: Exception, waiting: int) -> None:
        now = self.clock()
        self._backoff = min(_BACKOFF_MAX, max(_BACKOFF_MIN, self._backoff * 2))
        self._retry_at = now + self._backoff
        if self._failing_since is None:
            self._failing_since = now
            logger.warning(
                "%s: cannot deliver now (%s); %d report(s) kept, retrying with backoff",
                self.label,
                error,
                waiting,
            )
        else:
            logger.debug("%s: still cannot deliver (%s)", self.label, error)

    def _recovered(self) -> None:
        if self._failing_since is not None:
            logger.info(
                "%s: delivering again after %.1f s", self.label, self.clock() - self._failing_since
            )
        self._failing_since = None
        self._backoff = 0.0
        self._retry_at = 0.0
