"""Recorder: write a capture (an mla-bisect dump) from any framework's forward pass — vLLM, SGLang, your own
kernels — by handing it the layer's inputs and the tensors at each probe point. A thin layer over DumpWriter."""
from __future__ import annotations

from .dump_write import DumpWriter


def _as_list(v):
    if v is None:
        return None
    if hasattr(v, "tolist"):
        v = v.tolist()
    return [int(i) for i in v]


def _rows(t):
    return int(t.shape[0])


class Recorder:
    """Records one layer's probes into `path` (with process_rank=r: this process's rank r only, into
    PATH.rank{r}.h5).

        with Recorder("capture.h5", hf_config, engine="vllm", engine_dtype="bf16", layer_index=3) as rec:
            rec.inputs(h=hidden_states, positions=positions)   # or x=attention_input
            rec.probe("q_c", q_c)                               # this rank's local shard, [T, ...]
            ...

    inputs() fixes the step's geometry (tokens, sequences, context) and comes before the first probe; replay needs
    it, from every rank's process alike. A capture without inputs (probe() straight away: one sequence of the
    tensor's T tokens) serves `mla-bisect compare` only."""

    def __init__(self, path, config, mode="prefill", tp=1, engine="capture", engine_dtype="bf16",
                 process_rank=None, layer_index=0, form=None, input_norm=None, **writer_options):
        self.path = path
        self.config = config  # a dict, a transformers config, or a path to config.json
        self.mode = mode
        self.tp = tp
        self.engine = engine
        self.engine_dtype = engine_dtype
        self.process_rank = process_rank
        self.layer_index = layer_index
        self.form = form
        self.input_norm = input_norm  # None: inputs() decides (h given: True); a process without inputs: False
        self.writer_options = writer_options
        self._writer = None
        self._closed = False

    # --- geometry -> DumpWriter
    def _open(self, tokens, batch, context, input_norm):
        opts = dict(self.writer_options)
        if self.form is not None:
            opts["form"] = self.form
        self._writer = DumpWriter(
            self.path,
            config=self.config,
            mode=self.mode,
            tp=self.tp,
            engine=self.engine,
            engine_dtype=self.engine_dtype,
            tokens=tokens,
            batch=batch,
            context=context,
            input_norm=input_norm,
            layer_index=self.layer_index,
            process_rank=self.process_rank,
            **opts,
        )

    def inputs(self, x=None, h=None, positions=None, seq_lens=None, context_lens=None, block_table=None,
               kv_cache=None, index_cache=None):
        """The layer's input: h (the decoder layer's input, before input_layernorm) or x (the attention
        input), [T, hidden] with the sequences of the step concatenated; positions [T]; seq_lens [B] new
        tokens per sequence (default one sequence of T); context_lens [B] cached tokens before the step
        (decode/chunked); block_table [B, max_blocks] and kv_cache [layers, num_blocks, 64, L+R] for a step
        with context; for a DSA model (index_topk) with context, index_cache [layers, num_blocks, 64, Di] float32,
        the indexer's keys of the cached tokens (idx_k, rope lanes in our order), paged like kv_cache by the
        same block_table."""
        if self._writer is not None:
            raise RuntimeError(f"Recorder {self.path}: inputs() given twice, or after the first probe")
        if (x is None) == (h is None):
            raise ValueError("Recorder.inputs: give exactly one of x (the attention input) or h (the layer input)")
        act = h if h is not None else x
        T = _rows(act)
        seq = _as_list(seq_lens) or [T]
        ctx = _as_list(context_lens) or [0] * len(seq)
        if sum(seq) != T:
            raise ValueError(f"Recorder.inputs: seq_lens {seq} add up to {sum(seq)} tokens, the input has {T}")
        if len(ctx) != len(seq):
            raise ValueError(f"Recorder.inputs: {len(ctx)} context_lens for {len(seq)} sequences")
        # Run options describe B sequences of `tokens` each; sequences of different lengths are one run of T tokens
        # (batch 1, no context of its own) whose inputs carry the real layout, each sequence's context included (as
        # `mla-bisect run --input` reads such a dump).
        uniform = all(s == seq[0] for s in seq)
        tokens, batch = (seq[0], len(seq)) if uniform else (T, 1)
        context = [] if self.mode == "prefill" or not uniform else (ctx[:1] if len(set(ctx)) == 1 else ctx)
        self._open(tokens, batch, context, input_norm=h is not None)
        self._writer.inputs(x=act, positions=positions, seq_lens=seq, context_lens=ctx, block_table=block_table,
                            kv_cache=kv_cache, index_cache=index_cache)
        return self

    def probe(self, name, tensor, rank=None, layer=0):
        """One probe point: `tensor` is rank `rank`'s local shard in our layout ([T, ...], heads on axis 1),
        numpy or torch, in the dtype the engine computed it in. rank defaults to process_rank (or 0 at tp 1)."""
        if self._writer is None:
            self._open(_rows(tensor), 1, [], input_norm=bool(self.input_norm))
        self._writer.probe(name, tensor, rank=rank, layer=layer)
        return self

    def close(self):
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # An exception inside the block closes the dump as "stopped: after <last probe> (<exception>)".
        if not self._closed and self._writer is not None:
            self._closed = True
            return self._writer.__exit__(exc_type, exc, tb)
        self._closed = True
        return False


class ModelRecorder:
    """Records several layers of one forward, one Recorder per layer, into the whole-model capture PATH
    (PATH.layer<L>.h5, per rank PATH.layer<L>.rank<R>.h5 with process_rank): what `mla-bisect replay PATH` replays
    layer by layer and `mla-bisect compare` compares with another system's.

        rec = ModelRecorder("cap.h5", hf_config, tp=8, process_rank=rank, engine="vllm", launch_id=step_id)
        # in the hook of layer L (every layer, every rank):
        rec.layer(L).inputs(h=hidden_states, positions=positions)
        rec.layer(L).probe("q_c", q_c)
        ...
        rec.close()        # or: with ModelRecorder(...) as rec:

    Keyword arguments are the Recorder's (mode, tp, engine, engine_dtype, process_rank, launch_id, ...), the same
    for every layer. A layer's file is written when close() is called, or earlier by rec.close_layer(L)."""

    def __init__(self, path, config, **recorder_options):
        import os

        self.path = os.fspath(path)
        if os.path.exists(self.path):
            raise ValueError(f"ModelRecorder: {self.path} exists; a whole-model capture is the set "
                             f"{self.layer_path(0)} ... beside a PATH that is not a file: choose another PATH")
        self.config = config
        self.options = recorder_options
        self._layers = {}

    def layer_path(self, layer):
        stem = self.path[:-3] if self.path.endswith(".h5") else self.path
        return f"{stem}.layer{int(layer)}.h5"

    def layer(self, layer):
        """The Recorder of checkpoint layer `layer` (made on first use)."""
        layer = int(layer)
        if layer not in self._layers:
            self._layers[layer] = Recorder(self.layer_path(layer), self.config, layer_index=layer, **self.options)
        return self._layers[layer]

    def close_layer(self, layer):
        rec = self._layers.get(int(layer))
        if rec is not None:
            rec.close()

    def close(self):
        for rec in self._layers.values():
            rec.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        for rec in self._layers.values():
            rec.__exit__(exc_type, exc, tb)
        return False
