// The reference engine: the functions of reference/stages.h behind the Engine interface, with tensor
// parallelism emulated (one tensor table and one weight shard per rank) and optional precision emulation
// (stage outputs and weights rounded to bf16/fp16; accumulation stays fp32).
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/engine/engine.h"

namespace mla {

class ReferenceEngine : public Engine {
 public:
  explicit ReferenceEngine(const std::map<std::string, std::string>& options);
  std::string name() const override { return "reference"; }
  std::string options() const override;
  std::string dtype() const override { return precision_name(precision_); }

  void prepare(const RunContext& ctx) override;
  void run_stage(const StageSpec& stage, int layer, int rank) override;
  Tensor download(int rank, const std::string& name) override;
  const Tensor* weight(int layer, int rank, const std::string& name, Tensor& scratch) override;
  void upload(int rank, const std::string& name, const Tensor& t) override;
  void set_injections(const std::vector<Injection>& list) override;

 private:
  struct RankState {
    std::map<std::string, Tensor> tensors;  // by probe name, this rank's shard
    std::vector<Tensor> cache;               // per layer [blocks, 64, L+R] (replicated: each rank its own)
    std::vector<Tensor> index_cache;         // DSA: per layer [blocks, 64, Di]
    // Per layer, when tp > 1: the head-sharded weights, each cut when a stage (or a weight record) first reads it,
    // so a run that stops early never copies the later stages' projections.
    mutable std::vector<LayerWeights> shards;
    Tensor cache_before_write;               // decode-empty-cache: the cache as attention wrongly sees it
  };
  bool planted(const char* name) const { return has_injection(injections_, name); }
  const LayerWeights& global(int layer) const { return (*weights_)[layer]; }
  const Tensor& sharded(int layer, int rank, const Tensor LayerWeights::*w) const;
  Tensor& get(int rank, const std::string& name);
  void put(int rank, const std::string& name, Tensor t);
  void put_exact(int rank, const std::string& name, Tensor t);  // not rounded: DSA's scores (fp32) and indices

  Precision precision_ = Precision::Precision_fp32;
  // kv_cache_dtype=fp8_e4m3 (with kv_cache_scale=S): the latent cache stores fp8 e4m3 codes at a per-tensor scale,
  // so each row written is rounded to q(x / S) · S (saturating at ±448, nearest even), the kv_cache probe included.
  bool cache_fp8_ = false;
  double cache_scale_ = 1.0;
  RunContext ctx_;
  // The weights it computes with (global): the run's own at FP32, else rounded_, a copy at the engine's precision.
  const std::vector<LayerWeights>* weights_ = nullptr;
  std::vector<LayerWeights> rounded_;
  std::vector<RankState> ranks_;
  mutable std::mutex shards_mu_;  // the lazily cut shards
};

}  // namespace mla
