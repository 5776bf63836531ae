"""The engines' batching settings from the serving simulation (softsyn.timing.serving), when the constraints have a
`serving:` block; without one the engine settings keep the KV-budget defaults (softsyn.emit.engines).

Rules (docs/serving.md, "Engine settings"), each written beside the value it set:

    max_num_seqs / max_batch_size       serving.max_batch, at most the sequences of the design's context length that
                                        the KV budget holds (the KV-budget default; when it holds fewer, that number
                                        and a note)
    max_num_batched_tokens / max_num_tokens
                                        the most tokens one simulated step carried (the prompts admitted in it, whole,
                                        plus one per running decode), at least max_num_seqs (vLLM requires it) and
                                        max_model_len (any prompt the engine admits fits one step: TensorRT-LLM's
                                        chunked prefill is off by default): every step the simulation formed fits one
                                        engine step without chunking a prompt
    cudagraph_capture_sizes / cuda_graph_config.batch_sizes
                                        the decode batch sizes the simulation ran, each rounded up to the engines'
                                        usual bucket (a power of two) and at most max_num_seqs: the engines pad a batch
                                        to the next captured size, so each simulated batch runs from a graph

max_model_len stays the design's KV length: vLLM's KV pool is paged, so a smaller limit frees no memory and would
only refuse the requests beyond the simulated tail; a note says when the simulated requests are longer than it.
"""
from __future__ import annotations

from softsyn.constraints.serving import Serving
from softsyn.results.serving import ServingSchedule


def buckets(batches: list[int], most: int) -> list[int]:
    """Each batch size rounded up to a power of two, at most `most`; distinct, ascending."""
    return sorted({min(1 << (max(b, 1) - 1).bit_length(), most) for b in batches})


def _span(batches: list[int]) -> str:
    return f"{batches[0]}..{batches[-1]} ({len(batches)} distinct)" if len(batches) > 1 else str(batches[0])


def serving_settings(serving: Serving, schedule: ServingSchedule, kv_seqs: int | None, max_len: int,
                     fallback: list[int]) -> tuple[dict, list[str], list[str]]:
    """(the settings that replace the KV-budget defaults, one line per value saying where it came from, notes for the
    compile log). `kv_seqs`: the sequences of `max_len` tokens the KV budget holds (None: it does not bind);
    `fallback`: the default capture sizes, for a simulation that ran no decode step."""
    seqs, notes = serving.max_batch, []
    why = f"serving.max_batch {serving.max_batch}"
    if kv_seqs is not None and kv_seqs < seqs:
        seqs = kv_seqs
        why = (f"the {kv_seqs} sequences of {max_len} tokens the KV budget holds, below serving.max_batch "
               f"{serving.max_batch}")
        notes.append(f"runtime/: max_num_seqs {seqs}, not serving.max_batch {serving.max_batch}: the KV budget holds "
                     f"{kv_seqs} sequences of {max_len} tokens")
    elif kv_seqs is not None:
        why += f" (the KV budget holds {kv_seqs} sequences of {max_len} tokens)"
    else:
        why += " (no area_constraint: the KV budget does not bound it)"
    tokens = max(schedule.max_step_tokens, seqs, max_len)
    token_why = "the most tokens one simulated step carried (admitted prompts + running decodes)"
    if tokens > schedule.max_step_tokens:
        floor = "max_num_seqs" if tokens == seqs else "max_model_len"
        token_why += f", {schedule.max_step_tokens}, raised to {floor} {tokens}"
    if schedule.decode_batches:
        sizes = buckets(schedule.decode_batches, seqs)
        size_why = (f"the simulated decode batch sizes {_span(schedule.decode_batches)}, each rounded up to a power "
                    f"of two, at most max_num_seqs {seqs}")
    else:
        sizes, size_why = fallback, "the simulation ran no decode step: the KV-budget default"
    if schedule.longest > max_len:
        notes.append(f"runtime/: the longest simulated request ({schedule.longest} tokens, prompt + generated) is "
                     f"longer than max_model_len {max_len} (the design's KV length): the engines refuse or cut such "
                     "requests; raise workload.context_len or kv_cache.max_length to serve them")
    lines = [f"max_num_seqs / max_batch_size {seqs}: {why}",
             f"max_num_batched_tokens / max_num_tokens {tokens}: {token_why}",
             f"cudagraph_capture_sizes / cuda_graph_config.batch_sizes {sizes}: {size_why}"]
    return {"max_seqs": seqs, "batched_tokens": tokens, "capture": sizes}, lines, notes
