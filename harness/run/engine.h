// The Engine interface: an engine owns its tensors (host memory for the reference, device memory for CUDA),
// runs one stage for one rank on them, and computes probe records on its own side. The Runner owns the
// dataflow; engines never write files.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/bisect/injection.h"
#include "harness/model/batch.h"
#include "harness/model/config.h"
#include "harness/model/inputs.h"
#include "harness/model/stage_graph.h"
#include "harness/model/weights.h"
#include "probes/probe.h"

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
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;
  virtual std::string options() const = 0;       // canonical option string, recorded in dumps
  virtual std::string dtype() const = 0;         // activation dtype: fp32, bf16, fp16
  virtual std::string device() const { return "cpu"; }

  // Takes the weights (sharding them for its ranks) and the inputs: layer-0 activations, batch, caches.
  virtual void prepare(const RunContext& ctx) = 0;
  // Runs `stage` of `layer` for `rank`. Collective stages (all_reduce) are called for every rank after
  // every rank has run the stage before.
  virtual void run_stage(const StageSpec& stage, int layer, int rank) = 0;
  // Tensor by probe name, as this rank holds it (local shape), as float32.
  virtual Tensor download(int rank, const std::string& name) = 0;
  // Replaces a tensor of this rank (isolation: feed a stage the reference's exact inputs).
  virtual void upload(int rank, const std::string& name, const Tensor& t) = 0;
  // The probe record of a tensor, computed where the tensor lives. Default: download and compute on the host.
  virtual ProbeRecord probe(int rank, const ProbeSpec& spec, const ProbeRequest& req);
  virtual void synchronize() {}

  // Plants bugs (BUGS.md) in this engine's own computation. nan-at, hang-at and crash-at are engine-agnostic
  // (the Runner applies them through upload and at stage entry); an engine accepts the others it implements
  // and throws UsageError naming any it cannot plant.
  virtual void set_injections(const std::vector<Injection>& list);
  const std::vector<Injection>& injections() const { return injections_; }

 protected:
  // The generic injections; engines call this for the ones they do not handle themselves.
  static bool is_generic_injection(const Injection& inj);
  std::vector<Injection> injections_;
};

std::unique_ptr<Engine> make_engine(const EngineSpec& spec);  // throws UsageError (unknown engine, no GPU)
std::vector<std::string> engine_names();

}  // namespace mla
