"""Writing and reading mla-bisect dumps (HDF5, schema_version 1, the layout probes/dump_write.cpp writes) from Python,
so that a capture of another system (HF transformers, a serving engine) is an ordinary dump the C++ tool compares,
inspects and replays.

    from mla_bisect.dump import DumpWriter, read_dump
    w = DumpWriter("cap.h5", config=hf_config_dict, mode="prefill", tp=1, engine="hf-transformers",
                   engine_dtype="bf16", tokens=T)
    w.inputs(x=hidden_states)              # /inputs: x [T, H] (+ positions, seq_lens, ... defaults from the run)
    w.probe("q_c", tensor)                 # numpy array or torch tensor, the rank's LOCAL shard
    w.close()                              # status "complete"
    d = read_dump("cap.h5")                # d.attrs, d.inputs, d.probes[(0, "q_c")].ranks[0].l2 ...

Records. Every probe(...) computes what the C++ engines record (core/probe/probe.cpp compute_probe_record, ported in
mla_bisect.hashing): l2, absmax, mean, std, NaN/Inf counts, token_l2, head_l2, the sketch seeded by the probe's
name at the shard's global column offset, and the checksum over the raw bit patterns of the recorded dtype (bf16,
fp16, fp32; fp8_e4m3 / fp8_e5m2 by the 8-bit analogue that mla_bisect.hashing documents). The tensor is stored as
float32 (probe level "full" by default). Probe metadata (order, stage, contract, global shape, heads_axis, rope_from)
comes from the stage graph of the config and run (mla_bisect.graph, a port of build_graph): an unknown probe name or
a tensor whose shape is not the rank's local shape is a ValueError naming the probe, layer and rank. Local shards:
"heads" probes hold heads rank*N/tp ..; "partial" probes (o_partial) the rank's partial sum; "replicated" the
whole tensor. A tensor may carry leading axes that multiply to T ([B, S, N, P] for [T, N, P]).

Crash safety. The writer uses the C++ journal (probes/journal.h, mla_bisect.journal): at construction it writes
FILE.h5.journal (a header record with the run's metadata, fsynced, flock held while the writer lives) and removes
an older FILE.h5; inputs() swaps in a header carrying the inputs (a new journal renamed over the old one); every
probe is one CRC'd record appended with writev(2) straight from the record's buffers (the tensor's float32 data is
not copied), which the kernel keeps when the process is killed: a probe is durable against a crash once probe()
returns. close() appends a finish record, fsyncs the journal, writes FILE.h5 (to FILE.h5.tmp.PID, fsynced,
renamed into place) from the records it wrote, the data kept in memory (up to HOLD_BYTES for all open writers of
the process together; past it read back from the journal), and removes the journal. A capture killed at any
point therefore leaves either the finished FILE.h5 or a journal that `mla-bisect inspect FILE.h5` (and every other
C++ command) folds into FILE.h5, with status "stopped: after layer L probe P rank R" naming the last probe
committed; read_dump folds it in memory the same way (it never writes; recover_dump writes FILE.h5 as the C++
reader does). A writer killed before its header reached the journal leaves its header in FILE.h5.journal.tmp.PID
(folded as the journal, "stopped: before the first probe"), or nothing but an empty journal or temporary file: that
reads as "stopped: before the run wrote its header (...)", nothing else known, and is not folded. A journal whose
writer is alive reads as it stands, status "running: ...". Leaving a `with DumpWriter(...)` block by an exception
closes the dump with status "stopped: after ... (the exception)".

Ranks. One process recording every rank (process_rank=None): probe(..., rank=r) for r in 0..tp-1; the dump format
keeps a probe's ranks in rank order, so a rank recorded before the lower ranks of the same probe waits in memory
until they come (and close() marks the dump stopped if they never do). One process per rank (process_rank=r, or
"auto": MLA_RANK, RANK (torchrun), OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID with the matching world size,
which must equal tp): the process writes FILE.rank{r}.h5 with root attributes process_rank, processes (= tp) and
launch_id, as `mla-bisect run --rank` does, and removes FILE.h5 (the set owns that name). read_dump("FILE.h5"), like
every C++ command, merges FILE.rank0.h5 ... when FILE.h5 is absent, provided the parts agree on the launch id,
model, run options, engine, mode and inputs. The ranks of one capture agree on a launch id by, in this order: the
launch_id argument; the MLA_LAUNCH_ID environment variable; torch.distributed's environment (a hash of
TORCHELASTIC_RUN_ID, MASTER_ADDR and MASTER_PORT: unique per torchrun launch when torchrun is given --rdzv-id, else
per master port); or shared_launch_id(), which rank 0 draws and broadcasts over an initialised torch.distributed
process group (call it on every rank and pass the result).

Run options. tokens is the number of new tokens per sequence (RunSpec.tokens, `run --tokens`); the graph's T is
tokens x batch. context: cached tokens per sequence (decode, chunked). The HF config dict is stored as the root
attribute model (JSON); layer_index (which layer of the real model /layer0 holds) as a root attribute and, so that a
journal folded by the C++ reader keeps it, as run_options.layer_index too.

Modules. This module is the package's face for dumps: every name above is imported from it. The work is done in
mla_bisect.dump_write (DumpWriter, and HOLD_BYTES: the memory its records may hold), mla_bisect.dump_read
(read_dump, a rank set merged), mla_bisect.dump_journal (a journal folded; recover_dump), mla_bisect.dump_h5 (the
HDF5 file written and read), mla_bisect.dump_types (Dump, Inputs, Probe, Record, DumpError), mla_bisect.dump_ranks
(rank files, process ranks, launch ids) and mla_bisect.tensors (numpy arrays and torch tensors in).
"""
from . import __version__  # noqa: F401
from . import hashing  # noqa: F401
from . import journal as jr  # noqa: F401
from .dump_h5 import h5py_group_type, write_h5  # noqa: F401
from .dump_journal import recover_dump  # noqa: F401
from .dump_ranks import launch_id_from_env, rank_dump_path, shared_launch_id  # noqa: F401
from .dump_read import read_dump  # noqa: F401
from .dump_types import (FORMAT, READ_SCHEMA_VERSIONS, SCHEMA_VERSION, Dump, DumpError, Inputs, Probe,  # noqa: F401
                         Record)
from .dump_write import ENGINE_DTYPES, HOLD_BYTES, DumpWriter  # noqa: F401
from .graph import (PAGE_SIZE, ProbeSpec, build_graph, config_dict, default_form, parse_hf_config,  # noqa: F401
                    probe_request)
from .tensors import tensor_values  # noqa: F401
