"""What several passes share about precision, below them all: the rules and facts the precision pass, fusion and
the compile loop each read (router: the `moe_router` rule; bf16: whether a target realises bf16 cells; uniform: the
float design a compile's precision.default realises). These modules import no pass, so every pass can import them
(passes.fuse prices fusions at the uniform precision; the precision pass maps a quantised default through the compile
loop's mapping, which reads the router rule)."""
