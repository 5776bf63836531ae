"""Which library describes this machine: a library's `device` header against the host's, and the shipped library
picked when the user names none.

A CPU library's delays are the machine it was characterised on (cpu-ort: an AMD EPYC VM; on a 2-core Intel Xeon VM
signoff read -81 % / -65 % against it), so analyze and compile compare it with this host and say so in one line,
and every report's banner carries the mismatch. A GPU library is compared only where a GPU answers here: analysing
for the H200 on a laptop is a plan for that device, not a mismatch."""
from __future__ import annotations

import importlib.resources
import os
import re
from dataclasses import dataclass

CHARACTERISE_HINT = ("characterise this machine (minutes): softsyn characterize --provider cpu --quick -o my-cpu.yaml, "
                     "then --target my-cpu.yaml")


HOST_ENV = "SOFTSYN_HOST_DEVICE"  # describes this machine instead of /proc/cpuinfo (a VM whose CPU name says nothing)
NO_GPU = "unknown CUDA device"  # how softsyn.runtime.session.describe_device("cuda") starts where no GPU answers


def host_cpu(described: str) -> str:
    """This machine's CPU as a library header describes one: $SOFTSYN_HOST_DEVICE, else `described`
    (softsyn.runtime.session.describe_device("cpu"), which the caller reads: the library floor does not)."""
    return os.environ.get(HOST_ENV) or described


def processor(text: str) -> str:
    """The processor's model name in a device description ("MODEL, N cores (ISA)"), lower case, without the clock
    ("@ 2.80GHz": the same part reports it or not depending on the hypervisor)."""
    name = text.split(",")[0].lower()
    return " ".join(re.sub(r"@\s*[\d.]+\s*[gm]hz", "", name).split())


def cores(text: str) -> str:
    found = re.search(r"(\d+) cores", text)
    return found.group(1) if found else ""


def isa(text: str) -> frozenset[str]:
    """The ISA extensions a CPU description lists in its parentheses (empty for a GPU's)."""
    found = re.search(r"cores \(([^)]*)\)", text)
    return frozenset(x.strip() for x in found.group(1).split(",")) if found else frozenset()


def same_device(a: str, b: str) -> bool:
    """Whether two device descriptions (softsyn.runtime.session.describe_device: "MODEL, N cores (ISA)" or a
    GPU's "NAME, MEMORY, DRIVER") name the same processor: the model name, on a CPU the core count and, where both
    list them, the ISA extensions (a hypervisor names every Xeon generation "Intel(R) Xeon(R) Processor", and AMX or
    AVX-512 FP16 change what the kernels run)."""
    same_isa = not isa(a) or not isa(b) or isa(a) == isa(b)
    return (processor(a), cores(a)) == (processor(b), cores(b)) and same_isa


def vendor(text: str) -> str:
    first = processor(text).split()
    return re.sub(r"\(r\)|\(tm\)", "", first[0]) if first else ""


def closeness(library_device: str, host: str) -> tuple[int, int, int, float]:
    """How near a library's device is to the host's, for ranking: same vendor, same processor name, same core
    count, then the share of ISA extensions in common."""
    both, either = isa(library_device) & isa(host), isa(library_device) | isa(host)
    return (int(vendor(library_device) == vendor(host)), int(processor(library_device) == processor(host)),
            int(cores(library_device) == cores(host)), len(both) / len(either) if either else 0.0)


@dataclass(frozen=True)
class Match:
    """The library chosen for this host, and whether its device is this one (`mismatch`: the one line saying it
    is not, empty when it is)."""
    library: str
    device: str
    host: str
    mismatch: str


def header_field(text: str, key: str) -> str:
    """A top-level `key: value` of a library file's header, read from its text (the tables are not parsed)."""
    found = re.search(rf"^{key}:\s*(.*)$", text, re.M)
    return found.group(1).strip().strip("'\"") if found else ""


def shipped_headers() -> dict[str, tuple[str, str]]:
    """{library name: (provider, device)} of the shipped libraries."""
    root = importlib.resources.files("softsyn.library.libs")
    out = {}
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            text = entry.read_text(encoding="utf-8")[:8192]
            out[entry.name[:-5]] = (header_field(text, "provider"), header_field(text, "device"))
    return out


def mismatch_line(name: str, device: str, host: str) -> str:
    """The one line saying a library describes another machine ("" when it describes this one)."""
    if not device or same_device(device, host):
        return ""
    return (f"library {name} was characterised on {device}; this machine is {host}: its timings describe that "
            f"machine, not this one")


def pick_cpu_library(host: str, default: str = "cpu-ort") -> Match:
    """The shipped CPU library whose device is `host` (host_cpu's description), else the closest (same vendor,
    then core count; ties go to `default`), with the mismatch said."""
    cpus = {name: device for name, (provider, device) in shipped_headers().items() if provider == "CPUExecutionProvider"}
    best = max(cpus, key=lambda name: (*closeness(cpus[name], host), name == default))
    line = mismatch_line(best, cpus[best], host)
    if line:
        line = f"no shipped library describes this machine; using the closest, {line}; {CHARACTERISE_HINT}"
    return Match(best, cpus[best], host, line)


def check_library(name: str, header: dict, host: str, gpu: str | None = None) -> str:
    """The mismatch line for a library the user named ("" when its device is this machine). `host`: this CPU
    (host_cpu); `gpu`: describe_device("cuda"), asked for only for a CUDA library (None: not asked). A GPU library
    where no GPU answers is no mismatch: the analysis is a plan for that device."""
    provider, device = str(header.get("provider", "")), str(header.get("device", ""))
    if provider == "CPUExecutionProvider":
        line = mismatch_line(name, device, host)
        return f"{line}; {CHARACTERISE_HINT}" if line else ""
    if provider == "CUDAExecutionProvider" and gpu and not gpu.startswith(NO_GPU):
        line = mismatch_line(name, device, gpu)
        return f"{line}; characterise this GPU: softsyn characterize --provider cuda -o my-gpu.yaml" if line else ""
    return ""
