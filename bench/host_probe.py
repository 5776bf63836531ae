"""The host work of a continuous-batching iteration on this machine (softsyn.characterize.host), written as a target
library's `serving_host:` block: the serving simulation adds it to every step (docs/serving.md, "Host work").

    python bench/host_probe.py                                   # CPU: prints the block
    python bench/host_probe.py --library softsyn/library/libs/cpu-ort.yaml     # and writes it into the library
    python3 bench/host_probe.py --provider cuda --library softsyn/library/libs/h200-ort-cuda.yaml   # the H200
        (bench/h200_session.sh `hostprobe` runs this and brings the library back)

Run it on the machine the library describes: the figures are that host's (its Python, its copies, its bus); a library
whose `device:` names another card or CPU is left unwritten (exit 2) unless --other-device. Exit 2: bad arguments
(one line).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from softsyn.characterize.host import host_yaml, measure_host, with_host_block  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--library", help="a library YAML file: its serving_host block replaced (or added)")
    ap.add_argument("--repeats", type=int, default=200, help="timings per figure, medians (default 200)")
    ap.add_argument("--other-device", action="store_true",
                    help="write the block into a library characterised on another device (a what-if; say so)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be positive")
    if args.library and not Path(args.library).is_file():
        print(f"host_probe: --library {args.library}: no such file", file=sys.stderr)
        return 2
    figures = measure_host(args.provider, args.repeats)
    block = host_yaml(figures)
    print(block, end="")
    if args.library:
        path = Path(args.library)
        text = path.read_text()
        described = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("device:")), "")
        if described and _card(described) != _card(figures["device"]) and not args.other_device:
            print(f"host_probe: {path} describes {_card(described)}, this is {_card(figures['device'])}: not written "
                  "(--other-device writes it all the same)", file=sys.stderr)
            return 2
        path.write_text(with_host_block(text, block))
        print(f"host_probe: wrote the serving_host block into {path}", file=sys.stderr)
    return 0


def _card(device: str) -> str:
    """A device description's first field: the GPU's name (or the CPU's model), what a library is characterised on."""
    return device.split(",")[0].strip()


if __name__ == "__main__":
    sys.exit(main())
