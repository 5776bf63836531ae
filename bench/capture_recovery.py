"""Whether softsyn's CUDA-graph capture (softsyn.emit.torch_kernel_choice.graph_of) leaves the device usable after a
capture fails: a capture made to fail (a synchronize inside it), then a random draw and a new capture, each printed.
Before unmark_capture the draw failed with "Offset increment outside graph capture encountered unexpectedly" and ended
a whole compile (H100, 2026-12-07). GPU only; runs in seconds:

    python3 bench/capture_recovery.py
"""
import torch

from softsyn.emit.torch_kernel_choice import graph_of


def main() -> int:
    x = torch.ones(4, device="cuda")

    def bad():
        y = x + 1
        torch.cuda.synchronize()  # not permitted while capturing
        return y

    try:
        graph_of(bad, warm=0)
        print("the capture did not fail: nothing checked")
        return 1
    except Exception as exc:  # noqa: BLE001 - the failure is the point
        print("capture failed as meant:", type(exc).__name__, str(exc).splitlines()[0][:120])
    try:
        print("random draw after it:", torch.randn(3, device="cuda").sum().item())
        graph = graph_of(lambda: x * 2)
        graph.replay()
        torch.cuda.synchronize()
        print("capture after it: ran")
        return 0
    except Exception as exc:  # noqa: BLE001 - the answer is the failure
        print("STILL BROKEN:", type(exc).__name__, str(exc).splitlines()[0][:200])
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
