class SoftsynError(Exception):
    """A user-facing error: the CLI prints its message and exits with code 2, without a traceback."""


class SoftsynDefect(RuntimeError):
    """softsyn's own output is wrong (an emitted model the ONNX checker refuses, from a valid source): a bug in
    softsyn, never the user's input, so the CLI reports it as an internal error and exits with code 3."""


class LibraryFailure(SoftsynError):
    """A library softsyn drives (torch.export, AOTInductor, Triton) failed on the design: exit 2 like bad input (the
    model may hold what the library cannot take), with a pointer to --debug, whose trace holds the library's own
    (a compile worker's traceback, which one line cuts)."""
