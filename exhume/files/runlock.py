"""The lock file of a run folder: who holds it, whether that process still runs, atomic takeover.

A lock is one JSON line written in one step (a hard link of a complete file, so no reader ever
sees it half written): ``host`` (``socket.gethostname()``), ``boot_id``
(``/proc/sys/kernel/random/boot_id``), ``pid_ns`` (the PID namespace), ``pid``, ``start`` (the
process's start time in clock ticks since boot, so a reused pid is not mistaken for the holder),
``since`` and a random ``nonce``. Its holder is judged (:func:`judge`):

- ``live``: this host, boot and PID namespace, and the pid runs the same process;
- ``stale``: this host, and the machine rebooted since, or the process is gone (or its pid reused);
- ``foreign``: another host or PID namespace, where this process cannot check: never taken over
  without ``force`` (a second machine sharing the folder over a network file system).

A stale (or forced) lock is taken over through a token file named after the old lock's nonce,
created with ``O_EXCL``: of several processes taking over the same lock exactly one creates the
token, checks the lock still holds what it judged, and replaces it (``os.replace``); the others
then see the winner's live lock. The token is removed when the winner releases the folder. A
lock that holds only a pid (written before these fields) is read as this host's.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_LOCK_BYTES = 4096


@dataclass(frozen=True)
class Holder:
    """The writer recorded in a lock file."""

    host: str
    pid: int
    boot_id: str | None = None
    pid_ns: str | None = None
    start: int | None = None
    since: str | None = None
    nonce: str | None = None
    replaced: str | None = None  # the nonce of the stale lock this one took over (its token is removed on release)

    def describe(self) -> str:
        when = f", since {self.since}" if self.since else ""
        return f"pid {self.pid} on host {self.host}{when}"


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, field 22 of ``/proc/PID/stat``), or None off Linux."""
    text = _read_text(f"/proc/{pid}/stat")
    if text is None:
        return None
    try:
        return int(text[text.rindex(")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def _pid_ns() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def me(replaced: str | None = None) -> Holder:
    """This process as a lock holder (with a fresh nonce)."""
    return Holder(host=socket.gethostname(), pid=os.getpid(), boot_id=_read_text("/proc/sys/kernel/random/boot_id"),
                  pid_ns=_pid_ns(), start=_start_ticks(os.getpid()), since=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                  nonce=secrets.token_hex(8), replaced=replaced)


def parse(raw: bytes) -> Holder | None:
    """The holder a lock file's bytes record; None when they are not a lock exhume writes."""
    text = raw.decode("utf-8", "replace").strip()
    if text.isdigit():  # a lock from before hosts were recorded: this host's
        return Holder(host=socket.gethostname(), pid=int(text))
    try:
        data = json.loads(text)
        fields = {k: data.get(k) for k in Holder.__dataclass_fields__}
        if not isinstance(fields["host"], str) or isinstance(fields["pid"], bool) or not isinstance(fields["pid"], int):
            return None
        if fields["start"] is not None and not isinstance(fields["start"], int):
            return None
        return Holder(**{k: (v if k in ("pid", "start") or v is None else str(v)) for k, v in fields.items()})
    except (ValueError, TypeError, AttributeError):
        return None


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def judge(holder: Holder | None) -> str:
    """``"live"``, ``"stale"`` or ``"foreign"`` (module docstring); an unreadable lock (None) is stale."""
    if holder is None:
        return "stale"
    here = me()
    if holder.host != here.host:
        return "foreign"
    if holder.boot_id and here.boot_id and holder.boot_id != here.boot_id:
        return "stale"  # the machine rebooted: no process of that boot runs
    if holder.pid_ns and here.pid_ns and holder.pid_ns != here.pid_ns:
        return "foreign"  # another container on this host: its pids are not ours
    if not _pid_runs(holder.pid):
        return "stale"
    if holder.start is not None and _start_ticks(holder.pid) not in (None, holder.start):
        return "stale"  # the pid now belongs to another process
    return "live"


def read(lock: Path) -> bytes | None:
    """The lock file's bytes (at most :data:`MAX_LOCK_BYTES`), or None when there is none."""
    try:
        with open(lock, "rb") as f:
            return f.read(MAX_LOCK_BYTES)
    except FileNotFoundError:
        return None


def _write_tmp(lock: Path, holder: Holder) -> Path:
    tmp = lock.with_name(f"{lock.name}.{os.getpid()}.{holder.nonce}.tmp")
    tmp.write_text(json.dumps(asdict(holder)) + "\n")
    return tmp


def create(lock: Path, holder: Holder) -> bool:
    """Create ``lock`` for ``holder`` in one step (a hard link of a written file); False if it exists."""
    tmp = _write_tmp(lock, holder)
    try:
        os.link(tmp, lock)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def token_of(lock: Path, raw: bytes) -> Path:
    """The takeover token of the lock whose bytes are ``raw`` (named after its nonce, else its digest)."""
    holder = parse(raw)
    key = holder.nonce if holder is not None and holder.nonce else hashlib.sha256(raw).hexdigest()[:16]
    return lock.with_name(f"{lock.name}.takeover-{key}")


def take_over(lock: Path, raw: bytes) -> Holder | None:
    """Replace the lock whose bytes were ``raw`` by this process's; None if another process got there first."""
    token = token_of(lock, raw)
    try:
        fd = os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return None  # another process is taking this lock over (or has)
    replaced = False
    try:
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        os.close(fd)
        if read(lock) != raw:  # it changed since it was judged: judge again
            return None
        old = parse(raw)
        holder = me(replaced=token.name.split("takeover-", 1)[1])
        os.replace(_write_tmp(lock, holder), lock)
        replaced = True
        if old is not None and old.replaced:  # the token the stale holder kept is no longer needed
            lock.with_name(f"{lock.name}.takeover-{old.replaced}").unlink(missing_ok=True)
        return holder
    finally:
        if not replaced:
            token.unlink(missing_ok=True)


def release(lock: Path, holder: Holder) -> None:
    """Remove ``lock`` if it is still ``holder``'s (a forced takeover may have replaced it), then its token."""
    raw = read(lock)
    if raw is not None and (parse(raw) or Holder("", 0)).nonce == holder.nonce:
        lock.unlink(missing_ok=True)
    if holder.replaced:
        lock.with_name(f"{lock.name}.takeover-{holder.replaced}").unlink(missing_ok=True)
