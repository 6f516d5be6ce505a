// `mla-bisect run`: one engine on one model and input; prints the per-probe table.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <new>

#include <nlohmann/json.hpp>

#include "harness/cli/commands.h"
#include "harness/cli/run_options.h"
#include "harness/compare/format.h"
#include "core/engine/engine.h"
#include "core/engine/process_rank.h"
#include "core/model/errors.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/report/probe_table.h"
#include "harness/report/progress.h"
#include "harness/run/rendezvous.h"
#include "harness/run/run_meta.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "harness/run/watchdog.h"
#include "core/weights/loader.h"
#include "core/weights/weight_cache.h"
#include "probes/dump.h"

namespace mla::cli {

namespace {
struct RunCmdOptions {
  RunOptions run;
  std::string engine = "reference";
  std::string out;    // --out FILE.h5: write the dump
  std::string input;  // --input DUMP.h5: that dump's /inputs instead of synthetic ones
  std::string inject;     // --inject: planted bugs (docs/bugs.md)
  double watchdog = 0;    // --watchdog SECONDS per stage
  bool quiet = false;     // no progress lines
  bool no_table = false;  // no probe table (bisect's child runs: the dump holds it)
  std::string rank;       // --rank N|auto: one process per tp rank ("" : this process runs every rank)
  std::string rendezvous;  // --rendezvous PATH: where rank 0 publishes the communicator id
  double rendezvous_timeout = 300;
};

// The command line as parsed (options given, in declaration order), recorded in the dump.
std::string command_line(const CLI::App& cmd) {
  const auto quote = shell_quote;
  std::string s = "mla-bisect " + cmd.get_name();
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->count() == 0) continue;
    if (opt->get_expected_min() == 0) {
      s += " " + opt->get_name();
      continue;
    }
    for (const auto& r : opt->results()) s += " " + opt->get_name() + " " + quote(r);
  }
  return s;
}

// --input: the dump's batch and caches replace the synthetic ones, and the step's geometry (mode, tokens,
// batch, context, layers, attention form, seeds) follows the dump unless given explicitly; geometry that
// contradicts the dump's inputs is refused. Weights stay synthetic (--weight-seed, default the dump's).
Inputs inputs_from_dump(const std::string& path, const MlaConfig& cfg, const CLI::App& cmd, RunSpec& spec,
                        uint64_t& weight_seed) {
  DumpReadOptions ro;
  ro.probes = false;
  Dump d = read_dump(path, ro);
  const std::string who = "--input " + path;
  if (!d.has_inputs) throw UsageError(who + ": the dump has no /inputs group");
  const std::string dump_model = d.meta.model.is_object() ? d.meta.model.value("name", std::string("?")) : "?";
  Inputs in = std::move(d.inputs);
  const Batch& b = in.batch;
  if (in.x.dim(1) != cfg.hidden)
    throw UsageError(who + ": its x is " + shape_string(in.x.shape) + " (hidden size " + std::to_string(in.x.dim(1)) +
                     ") but model '" + cfg.name + "' has hidden size " + std::to_string(cfg.hidden) +
                     "; the dump was made with model '" + dump_model + "', pass that as --model");
  for (const auto& c : in.kv_cache)
    if (c.dim(2) != cfg.cache_row())
      throw UsageError(who + ": its kv_cache rows hold " + std::to_string(c.dim(2)) + " values but model '" +
                       cfg.name + "' caches kv_lora_rank + qk_rope = " + std::to_string(cfg.cache_row()) +
                       "; the dump was made with model '" + dump_model + "'");

  bool uniform = true;
  for (int n : b.new_lens) uniform = uniform && n == b.new_lens[0];
  RunSpec ds;
  const bool has_spec = !d.meta.run_options.is_null();
  if (has_spec) {
    ds = d.spec();
  } else {  // a foreign dump: infer the mode from the batch
    bool ctx = false, single = true;
    for (int c : b.context_lens) ctx = ctx || c > 0;
    for (int n : b.new_lens) single = single && n == 1;
    ds.mode = !ctx ? Mode::Mode_prefill : single ? Mode::Mode_decode : Mode::Mode_chunked;
    ds.form = default_form(ds.mode);
    ds.layers = std::max<int>(1, static_cast<int>(in.kv_cache.size()));
    ds.input_norm = false;
  }
  const auto fixed = [&](const char* opt, bool differs, const std::string& value) {
    if (cmd.count(opt) && differs)
      throw UsageError(who + ": the dump's inputs fix " + opt + " " + value + "; drop " + opt +
                       " or make a new dump with it");
  };
  std::vector<int> ctx_spec;
  if (uniform) {
    ctx_spec = b.context_lens;
    bool same = true;
    for (int c : ctx_spec) same = same && c == ctx_spec[0];
    if (same) ctx_spec.resize(1);
  }
  std::string ctx_text;
  for (int c : b.context_lens) ctx_text += (ctx_text.empty() ? "" : ",") + std::to_string(c);
  fixed("--mode", spec.mode != ds.mode, mode_name(ds.mode));
  fixed("--batch", spec.batch != (uniform ? b.num_seqs() : 1), std::to_string(b.num_seqs()));
  fixed("--tokens", spec.tokens != (uniform ? b.new_lens[0] : b.tokens()),
        uniform ? std::to_string(b.new_lens[0]) : "(sequences of different lengths)");
  {
    std::vector<int> given = spec.context;
    if (given.size() == 1 && uniform) given.assign(b.num_seqs(), given[0]);
    fixed("--context", given != b.context_lens, ctx_text);
  }
  spec.mode = ds.mode;
  spec.batch = uniform ? b.num_seqs() : 1;
  spec.tokens = uniform ? b.new_lens[0] : b.tokens();
  spec.context = spec.mode == Mode::Mode_prefill ? std::vector<int>{} : ctx_spec;
  spec.position_offset = ds.position_offset;
  if (!cmd.count("--attention")) spec.form = ds.form;
  if (!cmd.count("--layers")) spec.layers = ds.layers;
  if (!cmd.count("--seed")) spec.seed = ds.seed;
  if (!cmd.count("--weight-seed") && has_spec && d.meta.run_options.contains("weight_seed"))
    weight_seed = d.meta.run_options.at("weight_seed").get<uint64_t>();

  // x is h (stacked layers start at input_layernorm) or the attention input itself; that cannot change.
  const bool dump_h = ds.graph_shape().input_norm;
  spec.input_norm = dump_h;
  if (!dump_h && spec.layers > 1)
    throw UsageError(who + ": the dump's x is the attention input of one layer (no input_layernorm); "
                           "--layers " + std::to_string(spec.layers) + " needs a dump whose x is h");
  bool any_ctx = false;
  for (int c : b.context_lens) any_ctx = any_ctx || c > 0;
  if (static_cast<int>(in.kv_cache.size()) < spec.layers) {
    if (any_ctx)
      throw UsageError(who + ": the dump holds kv caches for " + std::to_string(in.kv_cache.size()) +
                       " layers, --layers is " + std::to_string(spec.layers));
    in.kv_cache.assign(spec.layers, Tensor({b.num_blocks, kPageSize, cfg.cache_row()}));
  }
  in.kv_cache.resize(spec.layers);
  complete_index_cache(in, cfg, spec.layers, who);
  if (!in.index_cache.empty()) in.index_cache.resize(spec.layers);
  return in;
}

// --out before any work: a directory is refused; a journal left by a killed run there is folded into its dump
// (or set aside when it cannot be), and any earlier dump at the path is renamed FILE.previous, so that a run
// killed during setup never leaves an older result under the name of this one.
void refuse_out_directory(const std::string& out) {
  std::error_code ec;
  if (!out.empty() && std::filesystem::is_directory(out, ec))
    throw UsageError("--out " + out + ": is a directory; --out names the dump file to write, e.g. " +
                     (std::filesystem::path(out) / "run.h5").string());
}

void move_previous_dump_aside(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string journal = path + ".journal";
  if (fs::exists(journal, ec)) {
    const int fd = ::open(journal.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      const bool live = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
      ::close(fd);
      if (live)
        throw UsageError("--out " + path + ": another run is writing this dump now (" + journal +
                         " is locked by it); give this run another --out");
    }
    try {
      recover_dump(path);  // the killed run's records, folded into its dump (moved aside below)
    } catch (const std::exception&) {
    }
    if (fs::exists(journal, ec)) {
      fs::rename(journal, path + ".previous.journal", ec);
      std::cerr << "note: --out " << path << ": the journal of an earlier run there is now " << path
                << ".previous.journal\n";
    }
  }
  if (fs::exists(path, ec)) {
    fs::rename(path, path + ".previous", ec);
    if (ec) throw UsageError("--out " + path + ": cannot move the earlier dump there aside: " + ec.message());
    std::cerr << "note: --out " << path << ": the earlier dump there is now " << path
              << ".previous (this run writes a new one)\n";
  }
}

// The stage the run is in, for an allocation failure that still happens.
class StageTracker : public ProbeSink {
 public:
  void stage_begin(int layer, Stage stage, int rank) override {
    where_ = "in layer " + std::to_string(layer) + " stage " + stage_name(stage) + " (rank " + std::to_string(rank) + ")";
  }
  void record(int, const ProbeSpec&, int, const ProbeRecord&) override {}
  const std::string& where() const { return where_; }

 private:
  std::string where_ = "before the first stage";
};

// Runs `f`; an allocation failure becomes an OutOfMemoryError (exit 3) naming where and the run's estimate.
template <class F>
auto out_of_memory_names(const std::function<std::string()>& where, const std::string& estimate, F&& f) {
  try {
    return f();
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError("out of memory " + where() + ": " + e.what() + "; " + estimate);
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError("out of memory " + where() + ": an allocation failed; " + estimate);
  }
}

int run_run(const RunCmdOptions& o, const CLI::App& cmd) {
  const ProgressLog log(!o.quiet);
  ProgressTicks ticks(log);  // the weights' synthesis and quantization, the Runner's stages and weight records
  refuse_out_directory(o.out);
  const MlaConfig cfg = o.run.load_config();
  RunSpec spec = o.run.to_spec();
  uint64_t weight_seed = o.run.weight_seed;
  Inputs inputs;
  if (!o.input.empty()) inputs = inputs_from_dump(o.input, cfg, cmd, spec, weight_seed);
  const ProbePlan plan = o.run.to_plan();
  Runner runner(cfg, spec);
  o.run.check_full_probes({runner.graph()});
  ProcessRank process = resolve_process_rank(o.rank, o.rendezvous, spec.tp);
  process.rendezvous_timeout_s = o.rendezvous_timeout;
  const EngineSpec engine_spec = EngineSpec::parse(o.engine);
  if (process.per_process() && !engine_runs_per_process(engine_spec.name))
    throw UsageError("--rank: engine '" + engine_spec.name + "' cannot run one process per rank (reference and "
                     "cuda can); drop --rank to run every rank in this process");
  auto engine = make_engine(engine_spec);
  const auto injections = parse_injections(o.inject);
  for (const auto& inj : injections) {
    if (inj.rank >= spec.tp)
      throw UsageError("--inject " + inj.text + ": rank " + std::to_string(inj.rank) + " does not exist at --tp " +
                       std::to_string(spec.tp));
    if (inj.layer >= spec.layers)
      throw UsageError("--inject " + inj.text + ": layer " + std::to_string(inj.layer) +
                       " does not exist at --layers " + std::to_string(spec.layers));
  }
  engine->set_injections(engine_injections(injections));  // weight injections act in load_weights
  // Before any work: a run that cannot fit in this machine's memory is refused now, not after minutes.
  const WeightSpec ws = o.run.weight_spec();
  MemoryCheck mem;
  mem.engine = engine->name();
  mem.device = engine.get();
  mem.dump = !o.out.empty();
  mem.quantized = !ws.format.empty();
  mem.local_rank = process.per_process() ? process.local_rank : -1;
  const std::string estimate = check_run_memory(cfg, spec, plan, mem);
  // One process per rank: the launch id and the engine's communicator id, through the rendezvous file (after
  // every check of the command line, so a bad option fails at once rather than after waiting for rank 0).
  rendezvous_launch(process, engine->communicator_id_bytes(), [&] { return engine->make_communicator_id(); });
  runner.set_process_rank(process);
  const auto t0 = std::chrono::steady_clock::now();
  // One process per rank: each writes FILE.rank<R>.h5 with its rank's records; read_dump(FILE.h5) merges the set.
  const std::string out_path = process.per_process() && !o.out.empty() ? rank_dump_path(o.out, process.rank) : o.out;
  if (process.per_process() && !o.out.empty()) {
    // The set owns the --out name now: an older dump of one process there would be read instead of the set.
    std::error_code ec;
    std::filesystem::remove(o.out, ec);
    std::filesystem::remove(o.out + ".journal", ec);
  }
  const auto make_meta = [&](const std::string& weights_loaded) {
    const RunDescription run{o.run.dump_options(spec, weight_seed, o.input.empty() ? std::string("synthetic") : o.input),
                             o.run.probe_level, o.inject, command_line(cmd)};
    DumpMeta meta = run_dump_meta(*engine, cfg, spec, run, weights_loaded);
    if (process.per_process()) {
      meta.process_rank = process.rank;
      meta.processes = process.world;
      meta.launch_id = process.launch_id;
    }
    return meta;
  };
  // The journal exists from here on, before the slow setup (weights, inputs): a run killed now reads as stopped
  // during setup, never as the earlier dump that was at this path.
  std::unique_ptr<DumpWriter> writer;
  if (!o.out.empty()) {
    move_previous_dump_aside(out_path);
    DumpMeta setup = make_meta("not loaded yet");
    setup.run_options["setup"] = "loading the weights, making the inputs";
    writer = std::make_unique<DumpWriter>(out_path, setup, nullptr);
  }
  StageTracker tracker;
  const auto setup_where = [] { return std::string("during setup (loading the weights, making the inputs)"); };
  // The CUDA engine uploads quantized weights as stored and dequantizes them on its device (kernels/dequant.cu),
  // injected bugs included; unquantized synthetic weights need no packed copy.
  const bool keep_packed = engine_dequantizes(engine->name(), ws);
  log.step("setup: weights (" + o.run.weights + "), model " + cfg.name + ", engine " + engine->name());
  // In a bisect's child run the weights the bisect loaded come from its cache folder (MLA_WEIGHT_CACHE).
  const std::string weight_cache = weight_cache_dir_from_env();
  bool cached = false;
  const LoadedWeights loaded = out_of_memory_names(setup_where, estimate, [&] {
    return load_weights_shared(weight_cache, ws, cfg, spec, weight_seed, injections, keep_packed, &cached);
  });
  if (cached) log.step("setup: weights read from " + weight_cache + " (loaded once, shared by the bisect's runs)");
  if (keep_packed) runner.set_packed_weights(&loaded.packed, dequant_bugs(injections));
  const auto& weights = loaded.layers;
  log.step("setup: inputs (" + (o.input.empty() ? std::string("synthetic") : o.input) + ")");
  if (o.input.empty())
    inputs = out_of_memory_names(setup_where, estimate, [&] { return synthetic_inputs(cfg, spec, weights); });
  TableSink table(spec.tp);
  TeeSink tee;
  tee.add(table);
  tee.add(tracker);
  if (writer) {
    writer.reset();  // the setup journal is replaced by the run's, with its inputs
    writer = std::make_unique<DumpWriter>(out_path, make_meta(loaded.description), &inputs);
    tee.add(*writer);
  }
  WatchdogSink watchdog(tee, o.watchdog);
  ProgressSink progress(watchdog, log, spec.layers, static_cast<int>(runner.graph().stages.size()),
                        process.per_process() ? 1 : spec.tp);
  const auto t1 = std::chrono::steady_clock::now();
  out_of_memory_names([&] { return tracker.where(); }, estimate, [&] {
    runner.run(*engine, weights, inputs, plan, progress);
    return 0;
  });
  const auto t2 = std::chrono::steady_clock::now();
  log.step("run done (" + std::to_string(spec.layers) + " layer(s), setup " +
           fmt_seconds(std::chrono::duration<double>(t1 - t0).count()) + ", stages " +
           fmt_seconds(std::chrono::duration<double>(t2 - t1).count()) + ")");
  if (o.no_table) return 0;
  std::cout << "model " << cfg.name << "  engine " << engine->name() << ":" << engine->options() << "  mode "
            << mode_name(spec.mode) << "  attention " << form_name(spec.form) << "  tokens " << inputs.batch.tokens()
            << "  tp " << spec.tp << "  layers " << spec.layers << "  seed " << spec.seed << "\n"
            << (process.per_process() ? "process " + describe_process_rank(process) + ": probes of rank " +
                                            std::to_string(process.rank) + " only\n"
                                      : std::string())
            << "softmax scale " << cfg.softmax_scale << "  rope cos/sin scale " << cfg.rope_mscale << "\n"
            << "weights " << loaded.description << "\n\n";
  table.print(std::cout);
  std::cout << "\nsetup " << std::chrono::duration<double>(t1 - t0).count() << " s, run "
            << std::chrono::duration<double>(t2 - t1).count() << " s\n";
  if (writer)
    std::cout << "dump " << out_path
              << (process.per_process() ? " (rank " + std::to_string(process.rank) + " of " +
                                              std::to_string(process.world) + "; commands read the set as " + o.out + ")"
                                        : std::string())
              << "\n";
  return 0;
}
}  // namespace

void setup_run(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunCmdOptions>();
  auto* cmd = app.add_subcommand("run", "Run one engine over every MLA stage and print each probe's shape, L2 norm "
                                        "and absmax");
  add_run_options(*cmd, o->run);
  cmd->add_option("--engine", o->engine, "Engine and options, e.g. reference, reference:precision=bf16, cuda")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Write every probe to this HDF5 dump (crash-safe: FILE.h5.journal is kept "
                                   "while the run is alive and folded into FILE.h5 by any later read). An earlier "
                                   "dump at the path is renamed FILE.h5.previous when the run starts");
  cmd->add_option("--input", o->input, "Take the layer input, batch layout and kv caches from this dump's /inputs "
                                       "instead of synthetic ones (mode, tokens, batch, context and layers follow "
                                       "the dump)");
  cmd->add_option("--inject", o->inject,
                  "Plant bugs in this engine: NAME[,NAME...] from docs/bugs.md, nan-at:PROBE:INDEX[@rank], "
                  "hang-at:STAGE[@rank], crash-at:STAGE[@rank], fault-at:STAGE[:LAYER][@rank] (cuda: a device fault), "
                  "slow-at:STAGE:MS[@rank] (STAGE * for every stage)");
  cmd->add_option("--watchdog", o->watchdog, "Exit 3 when a stage makes no progress for this many seconds, closing "
                                             "the dump with the rank and stage that hung (0: off)")
      ->check(finite_number(0, false, "seconds (0: off)"));
  cmd->add_flag("--quiet", o->quiet, "No progress lines on stderr");
  cmd->add_flag("--no-table", o->no_table, "Do not print the probe table (the dump holds every record)");
  cmd->add_option("--rank", o->rank,
                  "One process per tensor-parallel rank: this process's rank, a number (0..tp-1) or 'auto' (from the "
                  "launcher: MLA_RANK/MLA_WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_*, MPICH's PMI_RANK/PMI_SIZE, srun's "
                  "SLURM_PROCID/SLURM_NTASKS; the world size must equal --tp). The process records only its rank: "
                  "--out FILE.h5 writes FILE.rank<R>.h5, and every command reading FILE.h5 merges the set. Engines "
                  "reference (computes every rank in each process) and cuda (one GPU per process, local rank picks "
                  "it; NCCL)")
      ->type_name("N|auto");
  cmd->add_option("--rendezvous", o->rendezvous,
                  "With --rank at tp > 1: a file every process can see, through which rank 0 publishes the "
                  "launch id (recorded in every rank's dump) and the engine's communicator id (cuda: NCCL's); it "
                  "must not exist before the launch (a fresh path per launch, e.g. "
                  "/shared/mla-id.$SLURM_JOB_ID)")
      ->type_name("PATH");
  cmd->add_option("--rendezvous-timeout", o->rendezvous_timeout,
                  "Seconds the ranks other than 0 wait for the rendezvous file")
      ->capture_default_str()
      ->check(finite_number(0, true, "seconds"));
  cmd->callback([o, cmd, &exit_code] { exit_code = run_run(*o, *cmd); });
}

}  // namespace mla::cli
