"""Re-predict stored sign-off measurements with another library (no device needed).

    python bench/repredict.py WORK/qwen3-0.6b-cuda WORK/qwen3-1.7b-cuda --target softsyn/library/libs/h200-ort-cuda.yaml

Each argument is a model directory that bench/correlation.py left under --work (bench/h200_session.sh
brings them back from the H200 as corr-MODELS.tgz): constraints.yaml, signoff/signoff.json (the device's
measured medians) and model-graph.onnx (the graph the device ran; its weights stay behind, the analysis
needs shapes only; bench/results/h200-measurements-*.tgz keeps them: `tar xzf FILE -C WORK`). The graph
is analysed here with --target and the library's predictions are set
against the stored measurements: the measured column is the device's, unchanged, so a library measured
after the sign-off run can be judged without another device session. Prints the correlation table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def repredict(directory: Path, target: str | None) -> list[dict]:
    from softsyn.design import Design

    needed = [directory / "signoff" / "signoff.json", directory / "model-graph.onnx", directory / "constraints.yaml"]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        print(f"{directory}: not a correlation model directory (missing {', '.join(missing)}); expected what "
              "bench/h200_session.sh brings back in corr-*.tgz", file=sys.stderr)
        raise SystemExit(2)
    signed = json.loads((directory / "signoff" / "signoff.json").read_text())
    design = Design.load(str(directory / "model-graph.onnx"), directory / "constraints.yaml",
                         target=target or signed["library"], progress=False)
    analysis = design.analyze()
    rows = []
    for g in signed["groups"]:
        critical = analysis.group(g["name"]).critical
        predicted = critical.arrival - critical.input_delay
        rows.append({"model": signed["design"], "group": g["name"], "dims": g["dims"], "predicted": predicted,
                     "measured": g["measured_median"], "p90": g["measured_p90"],
                     "error": (predicted - g["measured_median"]) / g["measured_median"],
                     "quiet": g["measured_quiet"],
                     "error_quiet": (predicted - g["measured_quiet"]) / g["measured_quiet"],
                     "machine": (signed.get("machine") or {}).get("factor"), "provider": signed["provider"],
                     "kernels": g["kernel_sum"], "residual": g["residual"], "scale": g["kernel_scale"]})
    return rows


def main() -> int:
    from correlation import table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--target", help="library name or YAML (default: the one the sign-off used)")
    args = parser.parse_args()
    rows = []
    for d in args.dirs:
        rows += repredict(d, str(Path(args.target).resolve()) if args.target and Path(args.target).exists()
                          else args.target)
    print("\n".join(table(rows, derate=all(r["provider"].startswith("CPU") for r in rows))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
