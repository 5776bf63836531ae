"""IO binding: OrtValues on the provider's device and the one bound runner every timing loop calls.

A BoundRunner's `run()` (also its `__call__`, so timing loops take it as any zero-argument callable) is exactly
one `run_with_iobinding` call: the inputs were bound before, on the device, so no host data is copied inside it.
The outputs are bound either

- preallocated (`from_values`, characterisation's cells and ceilings): no allocation inside the call, or
- by name on the device (`from_feeds`, how the signoff times a model): ONNX Runtime allocates them in each call,
  as a serving loop that keeps its outputs on the device does.

The CUDA provider synchronises its stream at the end of a run, so the call covers every kernel.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort


def device_of(provider: str) -> str:
    """The OrtValue device of a provider: "cuda" or "cpu"."""
    return "cuda" if provider == "cuda" else "cpu"


def to_device(array: np.ndarray, device: str):
    """An OrtValue holding a copy of `array` on `device` ("cpu" | "cuda")."""
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, 0)


class KeptInputs:
    """Device inputs kept per (input name, shape) and updated in place when that shape comes again, as a serving engine
    keeps its buffers: a prefill at a prompt length seen before allocates nothing (three device allocations took
    ~0.6 ms of a 512-token prefill on the H200, 2026-12-03). `per_name` shapes are kept per input, the oldest dropped.
    The run calls are synchronous, so an update never races the call that read the value before."""

    def __init__(self, device: str, per_name: int = 4):
        self.device, self.per_name = device, per_name
        self.values: dict = {}  # (input name, shape) -> (its device OrtValue, the host array a CPU one reads)

    def __call__(self, name: str, array: np.ndarray):
        """`array` as the device OrtValue to bind to input `name`: the one kept for its shape, updated, else new."""
        key = (name, array.shape)
        kept = self.values.pop(key, None)
        if kept is None:
            host = array.copy()  # a CPU OrtValue shares its array's memory: kept beside it
            kept = (to_device(host, self.device), host)
        else:
            kept[0].update_inplace(np.ascontiguousarray(array))
        self.values[key] = kept  # the most recent last
        for old in [k for k in self.values if k[0] == name][:-self.per_name]:
            del self.values[old]
        return kept[0]


def empty(shape, elem: int, device: str):
    """An OrtValue of `shape` and onnx element type `elem` allocated on `device`, contents undefined."""
    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), elem, device, 0)


class BoundRunner:
    """One session with its inputs and outputs bound once; `run()` is one run_with_iobinding call.

    `run_options`: an ort.RunOptions passed to every call (None: the runtime makes its default one in the call)."""

    def __init__(self, sess, run_options=None):
        self.session = sess
        self.binding = sess.io_binding()
        self.run_options = run_options
        self.keep: list = []  # the OrtValues the binding refers to, alive as long as the runner

    @classmethod
    def from_values(cls, sess, inputs: dict, outputs: dict) -> "BoundRunner":
        """Inputs and preallocated outputs bound as the OrtValues given (no allocation, no transfer in the call)."""
        runner = cls(sess, ort.RunOptions())
        for name, value in inputs.items():
            runner.bind_input(name, value)
        for name, value in outputs.items():
            runner.bind_output(name, value)
        return runner

    @classmethod
    def from_feeds(cls, sess, feeds: dict[str, np.ndarray], provider: str = "cpu",
                   aliases: dict[str, str] | None = None) -> "BoundRunner":
        """Inputs copied to the device once (feeds the session has no input for are left out), outputs bound by name
        on the device and allocated by the runtime in each call. `aliases` {output: input}: that output is bound to
        the input's own buffer (a shared past/present KV buffer GroupQueryAttention updates in place, as the
        artifact runs; a separate present would be a copy of the whole cache every call)."""
        runner = cls(sess)
        device = device_of(provider)
        names = {i.name for i in sess.get_inputs()}
        bound = {}
        for name, array in feeds.items():
            if name in names:
                bound[name] = to_device(array, device)
                runner.bind_input(name, bound[name])
        for out in sess.get_outputs():
            source = (aliases or {}).get(out.name)
            if source in bound:
                runner.binding.bind_ortvalue_output(out.name, bound[source])
            else:
                runner.binding.bind_output(out.name, device, 0)
        return runner

    def bind_input(self, name: str, value) -> None:
        self.keep.append(value)
        self.binding.bind_ortvalue_input(name, value)

    def bind_output(self, name: str, value) -> None:
        self.keep.append(value)
        self.binding.bind_ortvalue_output(name, value)

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding, self.run_options)

    def arrays(self) -> dict[str, np.ndarray]:
        """The last run's tensor outputs by name, as host arrays the caller owns: a CPU output bound onto an input
        (a shared KV buffer) is otherwise a view of memory the runner's inputs hold."""
        return {o.name: np.array(v.numpy(), copy=True)
                for o, v in zip(self.session.get_outputs(), self.binding.get_outputs()) if v.is_tensor()}

    __call__ = run
