"""Output directories: a manifest of what softsyn wrote, and an all-or-nothing swap.

Every output directory (`analyze -o`, `compile -o`) holds MANIFEST: the kind of output, the design,
and every file softsyn wrote there (size, sha256, the command that wrote it). A command writing
into DIR:

1. checks DIR before any work (`check`): new, empty, or holding a manifest; a non-empty DIR without
   one is refused, and so is an input model inside DIR;
2. writes its files into a staging folder beside DIR (`replace` yields it), `.DIR.softsyn-staging-*`,
   locked (flock) while its process lives and marked as ours (STAGING_MARK);
3. commits: what in DIR this command does not replace (the user's files, other commands' entries)
   is hard-linked into the staging folder, the manifest is written, then the staging folder and DIR
   are exchanged in one rename (renameat2 RENAME_EXCHANGE; where the file system lacks it, DIR is
   renamed to `.DIR.softsyn-backup-*` first) and the old tree is deleted.

So at every instant DIR is the previous complete output or the new one (or, between the two
renames of the fallback, the backup is). A process killed on the way leaves a staging folder or a
backup; the next command on DIR deletes it, or restores it where DIR is missing, once the lock
shows its owner is gone and its marker, manifest or emptiness shows it is ours.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from softsyn import __version__
from softsyn.errors import SoftsynError

MANIFEST = "softsyn-manifest.json"
SCHEMA = "softsyn.manifest/1"
STAGING_MARK = ".softsyn-staging"  # in a staging folder until its manifest is complete
STAGING, BACKUP = "staging", "backup"
# The earlier entries each command replaces; everything else in DIR is kept.
REPLACES = {"compile": {"compile", "analyze"}, "analyze": {"analyze"}, "signoff": {"signoff"}, "report": {"report"}}
PRIMARY = ("analyze", "compile")  # the commands that make an output directory; signoff and report add to one
RENAME_EXCHANGE = 2
AT_FDCWD = -100


@dataclass(frozen=True)
class FileRecord:
    size: int
    sha256: str
    by: str  # the command that wrote it


@dataclass(frozen=True)
class Manifest:
    kind: str  # the command that made the directory: analyze | compile
    design: str
    model: str  # the MODEL argument it was made from
    files: dict[str, FileRecord]  # posix path relative to DIR -> record
    softsyn: str = __version__

    def to_json(self) -> str:
        files = {p: {"size": r.size, "sha256": r.sha256, "by": r.by} for p, r in sorted(self.files.items())}
        return json.dumps({"schema": SCHEMA, "softsyn": self.softsyn, "kind": self.kind, "design": self.design,
                           "model": self.model, "files": files}, indent=1) + "\n"


@dataclass
class Staged:
    """The staging folder a command writes into; after the commit, what of DIR was kept."""

    path: Path
    out: Path
    kept: tuple[str, ...] = ()  # entries softsyn did not write, kept in DIR
    sealed: dict = field(default_factory=dict)  # rel -> (size, mtime_ns, FileRecord) checksummed before the commit

    def seal(self, rel: str, kind: str) -> None:
        """Checksum a finished file now, in the step that wrote it (a GB of weights took 7 s to hash at the
        commit, after the compile log's last row): the commit takes the record while size and mtime are unchanged."""
        path = self.path / rel
        if path.is_file():
            st = path.stat()
            self.sealed[rel] = (st.st_size, st.st_mtime_ns, _record(path, kind))

    def record(self, rel: str, kind: str) -> "FileRecord":
        """The manifest's record of a staged file: its seal when the file is unchanged since, else hashed now."""
        st = (self.path / rel).stat()
        size, mtime, record = self.sealed.get(rel, (None, None, None))
        return record if (size, mtime) == (st.st_size, st.st_mtime_ns) and record.by == kind else _record(
            self.path / rel, kind)


def read_manifest(directory: Path) -> Manifest | None:
    """DIR's manifest; None when DIR has none (SoftsynError naming the file when it is not one)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return _parse(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SoftsynError(f"{path}: not a readable softsyn manifest ({type(exc).__name__}: {exc}); "
                           "remove the directory yourself or choose another one") from None


def _parse(data) -> Manifest:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"schema is not {SCHEMA!r}")
    if data["kind"] not in PRIMARY or not isinstance(data["design"], str) or not isinstance(data["model"], str):
        raise ValueError("kind, design or model is not valid")
    files = {}
    for rel, record in data["files"].items():
        parts = PurePosixPath(rel).parts
        if not parts or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or rel == MANIFEST:
            raise ValueError(f"file path {rel!r} is not inside the directory")
        size, digest, by = record["size"], record["sha256"], record["by"]
        if type(size) is not int or size < 0 or not isinstance(digest, str) or len(digest) != 64 or by not in REPLACES:
            raise ValueError(f"record of {rel} is not valid")
        files[rel] = FileRecord(size, digest, by)
    return Manifest(data["kind"], data["design"], data["model"], files, str(data.get("softsyn", "")))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _unchanged(path: Path, record: FileRecord) -> bool:
    return path.is_file() and not path.is_symlink() and path.stat().st_size == record.size \
        and sha256(path) == record.sha256


def input_paths(provenance: dict) -> list[Path]:
    """The files a design was read from (ONNX file, model folder, export cache entry): never inside an output."""
    paths = [provenance.get("file"), (provenance.get("cache") or {}).get("path")]
    source = provenance.get("source")
    if source and not str(source).startswith("zoo:") and Path(source).exists():
        paths.append(source)
    return [Path(p) for p in paths if p]


# ------------------------------------------------------------------------------------------ checks

def _target(directory) -> Path:
    out = Path(os.path.abspath(Path(directory).expanduser()))
    out = out.resolve() if out.is_symlink() else out
    if out.exists() and not out.is_dir():
        raise SoftsynError(f"{directory}: exists and is not a directory")
    cwd = Path.cwd().resolve()
    if out.resolve() == cwd or out.resolve() in cwd.parents:
        raise SoftsynError(f"{directory}: is the current directory or holds it; softsyn replaces an output directory "
                           "as a whole: run it from elsewhere or write to a sub-directory")
    return out


def _existing(out: Path, kind: str) -> Manifest | None:
    """DIR's manifest after the checks every command makes before it writes there."""
    takes = (f"{kind} takes the output directory of `softsyn analyze MODEL -o DIR` or `softsyn compile MODEL -o DIR`")
    if not out.is_dir():
        if kind not in PRIMARY:
            raise SoftsynError(f"{out}: no such directory; {takes}")
        return None
    manifest = read_manifest(out)
    if manifest is None and kind not in PRIMARY:
        raise SoftsynError(f"{out}: not a softsyn output directory (no {MANIFEST}); {takes}")
    entries = sorted(p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in out.iterdir())
    if manifest is None and entries:
        shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
        raise SoftsynError(f"{out}: not a softsyn output directory (no {MANIFEST}) and not empty: it holds {shown}; "
                           "choose a new or empty directory so nothing of yours is overwritten")
    if manifest is not None and kind == "analyze" and manifest.kind == "compile":
        raise SoftsynError(f"{out}: holds the compiled design {manifest.design} (softsyn compile {manifest.model}); "
                           "analyze -o would mix its reports with that model's: choose another directory")
    return manifest


def _check_inputs(out: Path, inputs) -> None:
    for given in inputs:
        path = Path(given).resolve()
        if path == out.resolve() or out.resolve() in path.parents:
            raise SoftsynError(f"{out}: the input {given} is inside this output directory, which softsyn replaces; "
                               "write the output somewhere else")


def _probe_writable(out: Path) -> None:
    ancestor = out.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise SoftsynError(f"{out}: cannot create it: {ancestor} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.softsyn-probe-", dir=ancestor))
    except OSError as exc:
        raise SoftsynError(f"{out}: cannot write there: {exc.strerror} ({ancestor})") from None


def check(directory, kind: str, inputs=()) -> Path:
    """Refuse, before any work, what `replace` would refuse; clean our leftovers beside DIR; prove DIR's
    parent writable. Returns DIR as an absolute path."""
    out = _target(directory)
    if out.parent.is_dir():
        with _locked(out.parent):
            _recover(out)
    _existing(out, kind)
    if kind in PRIMARY:
        _check_inputs(out, inputs)
    _probe_writable(out)
    return out


# ------------------------------------------------------------------------------------------ locks

@contextlib.contextmanager
def _locked(folder: Path):
    """Exclusive flock on a folder for softsyn processes (released by the kernel if we are killed)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _owner_gone(folder: Path) -> bool:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _leftovers(out: Path, role: str) -> list[Path]:
    prefix = f".{out.name}.softsyn-{role}-"
    return sorted(p for p in out.parent.iterdir() if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink())


def _ours(folder: Path) -> bool:
    if (folder / STAGING_MARK).is_file() or not any(folder.iterdir()):
        return True
    try:
        return read_manifest(folder) is not None
    except SoftsynError:
        return False


def _complete(folder: Path) -> bool:
    try:
        return not (folder / STAGING_MARK).exists() and read_manifest(folder) is not None
    except SoftsynError:
        return False


def _recover(out: Path) -> None:
    """Leftovers of killed runs on DIR: restore DIR where a swap was cut between its renames, delete the rest."""
    stagings = [p for p in _leftovers(out, STAGING) if _owner_gone(p) and _ours(p)]
    backups = [p for p in _leftovers(out, BACKUP) if _owner_gone(p) and _ours(p)]
    if not out.exists() and any(_complete(b) for b in backups):
        done = [s for s in stagings if _complete(s)]
        chosen = done[0] if done else next(b for b in backups if _complete(b))
        os.rename(chosen, out)
        stagings = [s for s in stagings if s != chosen]
        backups = [b for b in backups if b != chosen]
    for folder in stagings + backups:
        _remove_tree(folder)


def _remove_tree(folder: Path) -> None:
    """Delete a staging folder or an old tree, its marker and manifest last (so a kill half-way leaves
    what still proves it ours); read-only folders are made writable on the way. Never raises: what
    stays is a leftover for the next run."""
    def writable_and_retry(function, path, _exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), 0o700)
            function(path)

    proofs = (MANIFEST, STAGING_MARK)
    with contextlib.suppress(OSError):
        folder.chmod(0o700)
        for child in folder.iterdir():
            if child.name in proofs:
                continue
            if child.is_dir() and not child.is_symlink():
                if sys.version_info >= (3, 12):
                    shutil.rmtree(child, onexc=writable_and_retry)
                else:
                    shutil.rmtree(child, onerror=writable_and_retry)
            else:
                child.unlink()
        if any(child.name not in proofs for child in folder.iterdir()):
            return
        for name in proofs:
            (folder / name).unlink(missing_ok=True)
        folder.rmdir()


# ------------------------------------------------------------------------------------------ the swap

def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one rename (Linux renameat2); False where the kernel or file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _walk(root: Path):
    """(files and links, empty folders) under root, as posix paths relative to it."""
    files, empty = [], []
    for folder, dirs, names in os.walk(root):
        rel = Path(folder).relative_to(root)
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = [d for d in dirs if d not in links]
        if not dirs and not names and not links and folder != str(root):
            empty.append(rel.as_posix())
        files += [(rel / n).as_posix() for n in names + links]
    return files, empty


def _plan(out: Path, old: Manifest | None, kind: str, new: set[str]):
    """What of DIR to keep: (kept paths, their records where softsyn wrote them, empty folders)."""
    if old is None or not out.is_dir():
        return [], {}, []
    files, empty = _walk(out)
    replaced = {rel for rel, r in old.files.items() if r.by in REPLACES[kind]}
    keep, carried = [], {}
    for rel in files:
        if rel == MANIFEST:
            continue
        record = old.files.get(rel)
        ours = record is not None and _unchanged(out / rel, record)
        if record is not None and not ours and (rel in replaced or rel in new):
            raise SoftsynError(f"{out / rel}: changed since softsyn wrote it (not as in {MANIFEST}); "
                               "move it out of the directory, then run again")
        if rel in new and record is None:
            raise SoftsynError(f"{out / rel}: exists and was not written by softsyn; "
                               "move it out of the directory, then run again")
        if rel in replaced or rel in new:
            continue
        keep.append(rel)
        if ours:
            carried[rel] = record
    return keep, carried, empty


def _mirror_folders(src_root: Path, dst_root: Path, rel: PurePosixPath) -> None:
    """Create dst_root/rel's folders with the modes of src_root/rel's."""
    for part in reversed([rel, *rel.parents][:-1]):
        dst = dst_root / part
        if not dst.exists():
            dst.mkdir()
            shutil.copymode(src_root / part, dst)


def _link_kept(out: Path, staging: Path, keep: list[str], empty: list[str]) -> None:
    for rel in keep:
        src, dst = out / rel, staging / rel
        _mirror_folders(out, staging, PurePosixPath(rel).parent)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
            continue
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            if not src.is_file():
                raise
            shutil.copy2(src, dst)
    for rel in empty:
        _mirror_folders(out, staging, PurePosixPath(rel))


def _record(path: Path, kind: str) -> FileRecord:
    return FileRecord(path.stat().st_size, sha256(path), kind)


def _rescue(old_tree: Path, out: Path, known: set[str]) -> None:
    """Files that appeared in DIR while it was being swapped (not planned for) move into the new DIR."""
    files, _ = _walk(old_tree)
    for rel in files:
        if rel not in known and not os.path.lexists(out / rel):
            _mirror_folders(old_tree, out, PurePosixPath(rel).parent)
            os.rename(old_tree / rel, out / rel)


def _commit(staged: Staged, kind: str, design: str, model: str) -> None:
    out, staging = staged.out, staged.path
    with _locked(out.parent):
        _recover(out)
        old = _existing(out, kind)
        new = {rel for rel in _walk(staging)[0] if rel != STAGING_MARK}
        keep, carried, empty = _plan(out, old, kind, new)
        _link_kept(out, staging, keep, empty)
        records = {rel: staged.record(rel, kind) for rel in sorted(new)}
        primary = kind if kind in PRIMARY else old.kind
        manifest = Manifest(primary, design if kind in PRIMARY else old.design,
                            model if kind in PRIMARY else old.model, {**carried, **records})
        (staging / MANIFEST).write_text(manifest.to_json())
        (staging / STAGING_MARK).unlink()
        if not out.exists():
            os.rename(staging, out)
        else:
            shutil.copymode(out, staging)
            if _exchange(staging, out):
                old_tree = staging
            else:
                old_tree = Path(tempfile.mkdtemp(prefix=f".{out.name}.softsyn-{BACKUP}-", dir=out.parent))
                os.rename(out, old_tree)
                os.rename(staging, out)
            try:  # DIR is the new output now: what fails from here leaves a leftover, never an error
                _rescue(old_tree, out, set(keep) | set(old.files if old else ()) | {MANIFEST})
                _remove_tree(old_tree)
            except OSError:
                pass
    staged.kept = tuple(sorted(rel for rel in keep if rel not in carried) + sorted(f"{rel}/" for rel in empty))


@contextlib.contextmanager
def replace(directory, kind: str, design: str, model: str = "", inputs=(), progress: bool = True):
    """Yield a Staged whose folder the command fills; on a clean exit, DIR becomes it (see the module doc).

    An OSError inside (no space, read-only file system...) is a SoftsynError naming DIR; DIR is left as
    it was and the staging folder removed."""
    out = check(directory, kind, inputs)
    staged = lock = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with _locked(out.parent):  # a recovering process sees the new folder locked or not at all
            staged = Staged(Path(tempfile.mkdtemp(prefix=f".{out.name}.softsyn-{STAGING}-", dir=out.parent)), out)
            lock = os.open(staged.path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(lock, fcntl.LOCK_EX)
            (staged.path / STAGING_MARK).write_text(json.dumps({"pid": os.getpid(), "kind": kind}) + "\n")
        staged.path.chmod(0o777 & ~_umask())  # mkdtemp makes 0700; DIR reads like any folder the user makes
        yield staged
        _commit(staged, kind, design, model)
    except OSError as exc:
        where = str(exc.filename or out)
        if staged is not None:
            where = where.replace(str(staged.path), str(out))
        raise SoftsynError(f"{out}: cannot write the output: {exc.strerror or exc} ({where}); "
                           "the directory is as it was") from None
    finally:
        if lock is not None:
            os.close(lock)
        if staged is not None and staged.path.exists():
            _remove_tree(staged.path)
    if progress and staged.kept:
        shown = ", ".join(staged.kept[:5]) + (f", ... ({len(staged.kept)} entries)" if len(staged.kept) > 5 else "")
        print(f"[softsyn] {out}: kept what softsyn did not write: {shown}", file=sys.stderr, flush=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
