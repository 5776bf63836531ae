"""ONNX Runtime: sessions (session), IO binding (binding), seeded inputs (inputs), measurement and profiling (measure).

The one place softsyn opens an InferenceSession; characterisation, the passes (fusion checks) and the flows
(signoff, verify) all go through it.
"""
