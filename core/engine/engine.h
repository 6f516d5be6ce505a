// The Engine interface: an engine owns its tensors (host memory for the reference, device memory for CUDA),
// runs one stage for one rank on them, and computes probe records on its own side. The Runner owns the
// dataflow; engines never write files.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/engine/process_rank.h"
#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/injection.h"
#include "core/model/inputs.h"
#include "core/model/stage_graph.h"
#include "core/model/weights.h"
#include "core/weights/dequant.h"
#include "core/probe/probe.h"

namespace mla {

// "reference:precision=bf16,attention=absorbed" -> name "reference", options {precision: bf16, ...}.
struct EngineSpec {
  std::string name;
  std::map<std::string, std::string> options;
  static EngineSpec parse(const std::string& text);  // throws UsageError
  std::string to_string() const;
};

// Everything an engine needs for one run; the referenced objects outlive the run.
struct RunContext {
  const MlaConfig* cfg = nullptr;
  const RunSpec* spec = nullptr;
  const StageGraph* graph = nullptr;
  const std::vector<LayerWeights>* weights = nullptr;  // global FP32, one per layer
  const Inputs* inputs = nullptr;
  // Optional (LoadedWeights::packed, when loaded with keep_packed): per layer the projections as stored, by
  // field name, and the dequantization bugs the run plants. An engine that dequantizes on its own side (cuda)
  // uploads these and applies `dequant_bugs` itself; `weights` already holds their (injected) dequantization.
  const std::vector<std::map<std::string, PackedWeight>>* packed = nullptr;
  DequantBugs dequant_bugs;
  // One process per rank (`run --rank`): which rank this process is and where rank 0 publishes the communicator
  // id (harness/run/rendezvous.h). An engine that can split (cuda) sets up only that rank and its communicator
  // and says so through owns_rank; the reference owns every rank and computes them all in each process.
  ProcessRank process;
};

class EngineTiming;

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;
  virtual std::string options() const = 0;       // canonical option string, recorded in dumps
  virtual std::string dtype() const = 0;         // activation dtype: fp32, bf16, fp16
  virtual std::string device() const { return "cpu"; }
  // Device engines: the GPUs the ranks are spread over and the smallest free memory among them (bytes), or that of
  // `only_device` alone (one process per rank), for the memory estimate made before any work; {0, -1}: a host
  // engine, or unknown.
  struct DeviceMemory {
    int devices = 0;
    double free_bytes = -1;
  };
  virtual DeviceMemory device_memory(int only_device = -1) {
    (void)only_device;
    return {};
  }

  // Takes the weights (sharding them for its ranks) and the inputs: layer-0 activations, batch, caches.
  virtual void prepare(const RunContext& ctx) = 0;
  // Runs `stage` of `layer` for `rank`. Collective stages (all_reduce) are called for every rank after
  // every rank has run the stage before.
  virtual void run_stage(const StageSpec& stage, int layer, int rank) = 0;
  // Whether this process computes `rank` (after prepare). With RunContext::process per_process(), an engine that
  // holds only its process's rank returns false for the others; the Runner then runs no stage of theirs.
  // One process per rank: the size of the communicator id rank 0 makes for the others (0: none), and making it
  // (cuda: an ncclUniqueId). The id travels through the rendezvous file and arrives in RunContext::process.
  virtual size_t communicator_id_bytes() const { return 0; }
  virtual std::vector<unsigned char> make_communicator_id() { return {}; }
  virtual bool owns_rank(int rank) const {
    (void)rank;
    return true;
  }
  // Tensor by probe name, as this rank holds it (local shape), as float32.
  virtual Tensor download(int rank, const std::string& name) = 0;
  // The weight `name` (build_weights' names) of `layer` as this rank computes with it: its shard, after the
  // engine's own dequantization and rounding, as float32 in the checkpoint's [out, in] layout (a norm: [1, D]).
  // Points at the engine's own tensor where it holds it so (valid until the next call), else at `scratch`, filled.
  // nullptr: this engine does not say (the run records no weights).
  virtual const Tensor* weight(int layer, int rank, const std::string& name, Tensor& scratch) {
    (void)layer, (void)rank, (void)name, (void)scratch;
    return nullptr;
  }
  // Replaces a tensor of this rank (isolation: feed a stage the reference's exact inputs).
  virtual void upload(int rank, const std::string& name, const Tensor& t) = 0;
  // The probe record of a tensor, computed where the tensor lives. Default: download and compute on the host.
  virtual ProbeRecord probe(int rank, const ProbeSpec& spec, const ProbeRequest& req);
  // The same, without waiting (the Runner's way): probe_async starts the record of the tensor as it is now
  // (later stages cannot change what it sees); collect_probes appends records in the order they were
  // started: all of them (wait), or those complete now, up to the first that is not (!wait). When one
  // cannot be completed (a device fault), it appends the ones before it and throws. Defaults: probe() at
  // once.
  virtual void probe_async(int rank, const ProbeSpec& spec, const ProbeRequest& req);
  virtual void collect_probes(std::vector<ProbeRecord>& out, bool wait = true);
  // True when probe_async queues work that collect_probes waits for: the Runner then takes the finished
  // records after each stage and waits for the rest at the end of each layer; otherwise it collects at once.
  virtual bool queues_probes() const { return false; }
  // True when a queuing engine's records of a layer may still be on their way while the next layer runs (nothing
  // the next layer does can change what they saw): the Runner then waits at a layer's end for the records of the
  // layer before it only, so that building them overlaps the device's work; at the run's end, before a planted
  // crash or hang and when the run fails, it waits for every record.
  virtual bool pipelines_probes() const { return false; }
  // A queuing engine may hold the probes started during a layer and launch them together: flush_probes launches
  // whatever it holds (collect_probes with wait does too, and so does any call that would change a held tensor).
  // The Runner calls it before it waits for a layer's records.
  virtual void flush_probes() {}
  // Where `rank`'s device work is, when the engine tracks it: the first stage begun whose device work is not
  // done (`layer`, `stage`); false when it does not say (or everything begun is done). Names a device hang while
  // the records wait at the end of a layer.
  virtual bool device_stage(int rank, int& layer, Stage& stage) const {
    (void)rank, (void)layer, (void)stage;
    return false;
  }
  virtual void synchronize() {}

  // The benchmark's view of an engine that queues work on a device (engine_timing.h); nullptr: a host engine,
  // timed by the host clock alone.
  virtual EngineTiming* timing() { return nullptr; }

  // Plants bugs (docs/bugs.md) in this engine's own computation. nan-at, hang-at, crash-at and slow-at are
  // engine-agnostic (the Runner applies them through upload and at stage entry); an engine accepts the others it
  // implements and throws UsageError naming any it cannot plant.
  virtual void set_injections(const std::vector<Injection>& list);
  const std::vector<Injection>& injections() const { return injections_; }

 protected:
  // The generic injections; engines call this for the ones they do not handle themselves.
  static bool is_generic_injection(const Injection& inj);
  std::vector<Injection> injections_;
  std::vector<ProbeRecord> started_probes_;  // the default probe_async's records
};

// The engines a program can make, by name. The library knows no engine: the program registers those it links
// (harness/cli/engines.cpp for mla-bisect and the test programs) before it makes one.
using EngineMaker = std::function<std::unique_ptr<Engine>(const std::map<std::string, std::string>& options)>;
// `per_process`: runs can split into one process per rank (`run --rank`).
void register_engine(const std::string& name, EngineMaker make, bool per_process);
// A name this build knows but cannot make, and why (make_engine then throws "--engine NAME: WHY").
void register_unavailable_engine(const std::string& name, const std::string& why);
std::unique_ptr<Engine> make_engine(const EngineSpec& spec);  // throws UsageError (unknown engine, no GPU)
std::vector<std::string> engine_names();                      // registered, available or not
// Engines a run can split into one process per rank (`run --rank`): reference (each process computes every rank
// and records its own) and cuda (each process drives one rank on one GPU, all_reduce over NCCL).
bool engine_runs_per_process(const std::string& name);

}  // namespace mla
