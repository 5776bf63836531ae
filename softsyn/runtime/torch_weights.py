"""One set of weights for a torch target's two packages (issue 28): DIR/model.pt2 holds them, DIR/model-prefill.pt2
none, and softsyn's runner hands both programs the same constant tensors.

model.pt2 is compiled with its weights beside a weightless .so in the archive (AOTInductor's "binary_blob" form:
torch._inductor.aoti_load_package loads it alone, as the README's loader does); model-prefill.pt2 is the weightless
.so only. To run both on one copy, `load_shared` reads the blob once through an AOTInductor container runner on
model.pt2's .so (update_constant_buffer_from_blob, extract_constants_map: the runner owns the one copy and is never
run), then loads each package's program without weights and points its constants at those tensors
(load_constants(..., user_managed=True)): decode from a copy of model.pt2 without its blob, so the package loader
allocates no second copy. Any step torch refuses raises SharingUnavailable with the reason: the caller falls back
and says so (softsyn.runtime.torch_package).

The archive's entry names are untrusted: only their suffixes are read, and files are written under fixed names in a
temporary folder.
"""
from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path

import torch

from softsyn.errors import SoftsynError

OWN, SHARED = "own", "decode"  # torch.json's packages.<name>.constants: in the package; model.pt2's, shared
BLOB_SUFFIX, SO_SUFFIX = ".blob", ".so"  # AOTInductor's weight blob and program in a package's archive


class SharingUnavailable(Exception):
    """This torch (or this package) cannot run both programs on one set of weights; the message says why."""


class SharedWeights:
    """The one copy of the weights: the container runner that owns them and {FQN: tensor} views of them."""

    def __init__(self, runner, tensors: dict[str, torch.Tensor]):
        self.runner, self.tensors = runner, tensors

    @property
    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in {t.data_ptr(): t for t in self.tensors.values()}.values())


def _entry(archive: zipfile.ZipFile, suffix: str) -> str | None:
    names = [n for n in archive.namelist() if n.endswith(suffix)]
    if len(names) > 1:
        raise SharingUnavailable(f"the archive holds {len(names)} {suffix} files, not one")
    return names[0] if names else None


def _container_runner(so: Path, device: str):
    """AOTInductor's container runner on `so` (never run: it only owns the constants)."""
    if device == "cuda":
        cls = getattr(torch._C._aoti, "AOTIModelContainerRunnerCuda", None)
        if cls is None:
            raise SharingUnavailable("this torch has no AOTIModelContainerRunnerCuda")
        return cls(str(so), 1, "cuda", str(so.parent))
    return torch._C._aoti.AOTIModelContainerRunnerCpu(str(so), 1)


def read_weights(package: Path, device: str, scratch: Path) -> SharedWeights:
    """model.pt2's weights, read once from its blob onto `device` through a container runner on its .so."""
    with zipfile.ZipFile(package) as archive:
        so_name, blob_name = _entry(archive, SO_SUFFIX), _entry(archive, BLOB_SUFFIX)
        if so_name is None or blob_name is None:
            raise SharingUnavailable(f"{package.name} holds no weight blob beside its program (compiled with its "
                                     "weights inside the .so)")
        so, blob = scratch / "weights.so", scratch / "weights.blob"
        for name, dest in ((so_name, so), (blob_name, blob)):
            with archive.open(name) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 24)
    try:
        runner = _container_runner(so, device)
        runner.update_constant_buffer_from_blob(str(blob))
        tensors = dict(runner.extract_constants_map(False))
    except (AttributeError, TypeError, RuntimeError) as exc:
        raise SharingUnavailable(f"reading {package.name}'s weights: {type(exc).__name__}: "
                                 f"{' '.join(str(exc).split())[:200]}") from None
    finally:
        blob.unlink(missing_ok=True)  # read into the runner's buffer: the file is not needed
    if not tensors:
        raise SharingUnavailable(f"{package.name}'s weight blob gave no constants")
    return SharedWeights(runner, tensors)


def without_blob(package: Path, dest: Path) -> Path:
    """A copy of `package` without its weight blob (the program and its files only), at `dest`."""
    with zipfile.ZipFile(package) as archive, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as out:
        for info in archive.infolist():
            if not info.filename.endswith(BLOB_SUFFIX):
                with archive.open(info) as src, out.open(info, "w") as sink:
                    shutil.copyfileobj(src, sink, 1 << 24)
    return dest


def point_at(runner, weights: SharedWeights, label: str) -> None:
    """Point a loaded, weightless program's constants at the shared tensors (no copy); every constant it names must
    be among them (the two programs are exported from one module: the same FQNs)."""
    try:
        wanted = list(runner.get_constant_fqns())
    except AttributeError:
        raise SharingUnavailable("this torch's AOTICompiledModel has no get_constant_fqns") from None
    missing = sorted(set(wanted) - set(weights.tensors))
    if missing:
        raise SharingUnavailable(f"{label} needs {len(missing)} constant{'s' if len(missing) != 1 else ''} model.pt2 "
                                 f"does not hold ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    try:
        runner.load_constants({name: weights.tensors[name] for name in wanted}, check_full_update=True,
                              user_managed=True)
    except (TypeError, RuntimeError) as exc:  # TypeError: a torch without user_managed
        raise SharingUnavailable(f"{label}: load_constants(user_managed=True) refused: {type(exc).__name__}: "
                                 f"{' '.join(str(exc).split())[:200]}") from None


def load_shared(decode: Path, prefill: Path, device: str, load) -> tuple[dict, SharedWeights]:
    """({"decode": runner, "prefill": runner}, the weights both read): `load(path)` loads one package (softsyn's
    aoti_load_package call). SharingUnavailable when any step is refused; nothing is kept then."""
    scratch = Path(tempfile.mkdtemp(prefix="softsyn-weights-"))
    try:
        weights = read_weights(decode, device, scratch)
        try:
            runners = {"decode": load(without_blob(decode, scratch / "decode.pt2")), "prefill": load(prefill)}
        except SoftsynError as exc:
            raise SharingUnavailable(str(exc)) from None
        point_at(runners["decode"], weights, decode.name)
        point_at(runners["prefill"], weights, prefill.name)
        return runners, weights
    finally:  # the runner has loaded its .so and the loaders have extracted theirs: the scratch files can go
        shutil.rmtree(scratch, ignore_errors=True)


def load_copied(decode: Path, prefill: Path, device: str, load):
    """The prefill package's runner with a copy of model.pt2's weights of its own (the fallback where sharing is
    refused: two copies in memory, as before); SharingUnavailable when even that cannot be done."""
    scratch = Path(tempfile.mkdtemp(prefix="softsyn-weights-"))
    try:
        weights = read_weights(decode, device, scratch)
        try:
            runner = load(prefill)
        except SoftsynError as exc:
            raise SharingUnavailable(str(exc)) from None
        wanted = set(runner.get_constant_fqns())
        if not wanted <= set(weights.tensors):
            raise SharingUnavailable(f"{prefill.name}'s constants are not all in {decode.name}")
        try:
            runner.load_constants({n: weights.tensors[n] for n in wanted}, check_full_update=True)
        except (TypeError, RuntimeError) as exc:
            raise SharingUnavailable(f"load_constants refused: {type(exc).__name__}: "
                                     f"{' '.join(str(exc).split())[:200]}") from None
        return runner  # the runner that read the blob goes with `weights`: the copy is the prefill program's
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
