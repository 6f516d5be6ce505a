// Reference engine: dispatch of stages to reference/stages.h, per-rank state, precision emulation.
#include "reference/reference_engine.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "core/model/errors.h"
#include "reference/cpu_threads.h"
#include "reference/injections.h"
#include "reference/stages.h"

namespace mla {

ReferenceEngine::ReferenceEngine(const std::map<std::string, std::string>& options) {
  ref::set_eigen_threads();
  for (auto& [k, v] : options) {
    if (k == "precision") {
      precision_ = parse_precision(v);
    } else if (k == "kv_cache_dtype") {
      if (v != "fp8_e4m3" && v != "auto")
        throw UsageError("reference engine: kv_cache_dtype '" + v + "' (known: auto, fp8_e4m3)");
      cache_fp8_ = v == "fp8_e4m3";
    } else if (k == "kv_cache_scale") {
      char* end = nullptr;
      cache_scale_ = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end || !std::isfinite(cache_scale_) || cache_scale_ <= 0)
        throw UsageError("reference engine: kv_cache_scale '" + v + "' is not a positive number");
    } else {
      throw UsageError("reference engine: unknown option '" + k +
                       "' (known: precision=fp32|bf16|fp16, kv_cache_dtype=auto|fp8_e4m3, kv_cache_scale=S)");
    }
  }
}

std::string ReferenceEngine::options() const {
  std::string s = std::string("precision=") + precision_name(precision_);
  if (cache_fp8_) {
    char scale[32];
    std::snprintf(scale, sizeof scale, "%.9g", cache_scale_);
    s += std::string(",kv_cache_dtype=fp8_e4m3,kv_cache_scale=") + scale;
  }
  return s;
}

namespace {

// The nearest FP8 e4m3 (fn) value: 3 mantissa bits, normals from 2^-6, subnormals in steps of 2^-9, saturating at
// ±448, ties to even.
float round_e4m3(float x) {
  if (!std::isfinite(x)) return x;
  const float a = std::fabs(x);
  if (a >= 448.0f) return std::copysign(448.0f, x);
  int e;
  std::frexp(a, &e);  // a = m · 2^e, m in [0.5, 1)
  const int lsb = std::max(e - 4, -9);
  const float r = std::ldexp(std::nearbyint(std::ldexp(a, -lsb)), lsb);  // nearbyint: ties to even
  return std::copysign(std::min(r, 448.0f), x);
}

// A tensor as an fp8 e4m3 cache at per-tensor scale s stores and reads it back: q(x / s) · s.
Tensor through_e4m3(Tensor t, double s) {
  for (float& v : t.data) v = static_cast<float>(round_e4m3(static_cast<float>(v / s)) * s);
  return t;
}

// Every weight already holds values of precision `p` (bf16 checkpoints, synthetic weights): nothing to round.
bool exact_at(const std::vector<LayerWeights>& weights, Precision p) {
  for (const auto& w : weights)
    for (const Tensor* t : w.tensors()) {
      const float* v = t->ptr();
      const int64_t n = t->numel();
      int64_t off = 0;
      if (p == Precision::Precision_bf16) {
        // bf16 holds a float exactly when its low 16 bits are 0 (a NaN counts as held, as below).
#pragma omp parallel for schedule(static) reduction(+ : off) if (n > (1 << 16))
        for (int64_t i = 0; i < n; ++i) {
          uint32_t b;
          std::memcpy(&b, &v[i], 4);
          off += (b & 0xffffu) != 0 && (b & 0x7fffffffu) <= 0x7f800000u;
        }
      } else {
#pragma omp parallel for schedule(static) reduction(+ : off) if (n > (1 << 16))
        for (int64_t i = 0; i < n; ++i) {
          const float r = round_fp16(v[i]);
          off += !(r == v[i] || (std::isnan(r) && std::isnan(v[i])));
        }
      }
      if (off) return false;
    }
  return true;
}

}  // namespace

void ReferenceEngine::prepare(const RunContext& ctx) {
  ctx_ = ctx;
  const int tp = ctx.spec->tp;
  rounded_.clear();
  weights_ = ctx.weights;
  if (precision_ != Precision::Precision_fp32 && !exact_at(*ctx.weights, precision_)) {
    rounded_ = *ctx.weights;
    for (auto& w : rounded_)
      for (Tensor* t : w.tensors()) round_in_place(*t, precision_);
    weights_ = &rounded_;
  }
  ranks_.assign(tp, {});
  for (int r = 0; r < tp; ++r) {
    auto& rs = ranks_[r];
    rs.cache = ctx.inputs->kv_cache;
    for (auto& c : rs.cache) round_in_place(c, precision_);
    rs.index_cache = ctx.inputs->index_cache;
    for (auto& c : rs.index_cache) round_in_place(c, precision_);
    if (tp > 1)
      rs.shards.resize(weights_->size());
    Tensor x = ctx.inputs->x;
    round_in_place(x, precision_);
    rs.tensors[ctx.graph->stages.front().outputs.front()] = std::move(x);
  }
}

const Tensor& ReferenceEngine::sharded(int layer, int rank, const Tensor LayerWeights::*w) const {
  if (ranks_.size() <= 1) return (*weights_)[layer].*w;
  const std::lock_guard<std::mutex> lock(shards_mu_);
  Tensor& t = const_cast<Tensor&>(ranks_[rank].shards[layer].*w);  // the member pointer names it const
  if (t.empty()) t = head_shard((*weights_)[layer], *ctx_.cfg, static_cast<int>(ranks_.size()), rank, w);
  return t;
}

Tensor& ReferenceEngine::get(int rank, const std::string& name) {
  auto& m = ranks_.at(rank).tensors;
  auto it = m.find(name);
  if (it == m.end()) throw EngineError("reference engine: rank " + std::to_string(rank) + " has no tensor '" + name + "'");
  return it->second;
}

void ReferenceEngine::put(int rank, const std::string& name, Tensor t) {
  round_in_place(t, precision_);
  ranks_.at(rank).tensors[name] = std::move(t);
}

void ReferenceEngine::put_exact(int rank, const std::string& name, Tensor t) {
  ranks_.at(rank).tensors[name] = std::move(t);
}

Tensor ReferenceEngine::download(int rank, const std::string& name) { return get(rank, name); }

const Tensor* ReferenceEngine::weight(int layer, int rank, const std::string& name, Tensor& scratch) {
  const auto field = weight_field(name);
  if (!field || layer < 0 || layer >= static_cast<int>(weights_->size())) return nullptr;
  // What run_stage computes with: the rank's shard (tp-head-offset: rank r >= 1 takes rank r-1's q_b_proj block).
  const bool head_sharded = field == &LayerWeights::q_b_proj || field == &LayerWeights::kv_b_proj ||
                            field == &LayerWeights::o_proj;
  const int src = field == &LayerWeights::q_b_proj && planted("tp-head-offset") && rank >= 1 ? rank - 1 : rank;
  const Tensor& held = head_sharded ? sharded(layer, src, field) : (*weights_)[layer].*field;
  if (held.shape.size() != 1) return &held;
  scratch = held;  // a norm's weight: one row
  scratch.shape = {1, held.shape[0]};
  return &scratch;
}

void ReferenceEngine::set_injections(const std::vector<Injection>& list) {
  for (const auto& inj : list) {
    const auto* z = find_zoo_entry(inj.name);
    if (!is_generic_injection(inj) && (!z || z->needs_quantized))
      throw UsageError("reference engine cannot plant '" + inj.name + "'" +
                       (z && z->needs_quantized ? " (it corrupts quantized weights: needs --weight-format)"
                        : inj.name == "fault-at" ? " (a device fault: the cuda engine plants it)"
                                                 : ""));
  }
  injections_ = list;
}

void ReferenceEngine::upload(int rank, const std::string& name, const Tensor& t) {
  if (name == "idx_scores" || name == "topk") put_exact(rank, name, t);
  else put(rank, name, t);
}

void ReferenceEngine::run_stage(const StageSpec& st, int layer, int rank) {
  // Planted bugs act through a wrong copy of a constant, an option of the stage function, or a wrong variant.
  MlaConfig cfg = *ctx_.cfg;
  if (planted("rope-neox"))
    cfg.rope_style = cfg.rope_style == RopeStyle::RopeStyle_interleaved ? RopeStyle::RopeStyle_neox
                                                                         : RopeStyle::RopeStyle_interleaved;
  if (planted("rope-mscale") && cfg.rope_scaling == RopeScaling::RopeScaling_yarn)
    cfg.rope_mscale = yarn_get_mscale(cfg.yarn.factor, cfg.yarn.mscale);
  if (planted("softmax-scale")) cfg.softmax_scale = 1.0 / std::sqrt(static_cast<double>(cfg.qk_head()));
  const double q_norm_eps = planted("q-norm-eps") ? 1e-5 : cfg.rms_eps;
  const auto& batch = ctx_.inputs->batch;
  std::vector<int> positions = batch.positions;
  if (planted("position-offset"))
    for (auto& p : positions) p += 1;
  const auto& W = global(layer);
  auto& cache = ranks_[rank].cache[layer];
  // DSA: index-rope-layout pairs the indexer's rope lanes as the other DSA model does (interleaved <-> half-split).
  const RopeStyle index_style =
      planted("index-rope-layout") ? other_rope_style(cfg.index_rope_style) : cfg.index_rope_style;
  // DSA: the keys each token attends to, from the topk stage (attention's input).
  std::optional<ref::Selection> selection;
  if (cfg.has_dsa() && (st.stage == Stage::Stage_attention_mha || st.stage == Stage::Stage_attention_mqa))
    selection = ref::selection_of(get(rank, "topk"));
  switch (st.stage) {
    case Stage::Stage_layer_input:
      if (layer > 0) put(rank, st.outputs[0], get(rank, "h_out"));
      break;
    case Stage::Stage_input_norm: put(rank, "x", ref::rms_norm(get(rank, "h"), W.input_norm, cfg.rms_eps)); break;
    case Stage::Stage_q_a_proj: put(rank, "q_a", ref::linear(get(rank, "x"), W.q_a_proj)); break;
    case Stage::Stage_q_a_norm: {
      // q-norm-width: the mean square over kv_lora_rank channels, the other norm's width (plants nothing where
      // kv_lora_rank >= q_lora_rank: the whole row).
      const ref::NormOptions opt{.width = planted("q-norm-width") ? cfg.kv_lora_rank : 0};
      put(rank, "q_c", ref::rms_norm(get(rank, "q_a"), W.q_a_norm, q_norm_eps, opt));
      break;
    }
    case Stage::Stage_q_b_proj:
    case Stage::Stage_q_proj: {
      const Tensor& in = get(rank, st.stage == Stage::Stage_q_b_proj ? "q_c" : "x");
      const int src = planted("tp-head-offset") && rank >= 1 ? rank - 1 : rank;
      auto q = ref::q_b_proj(in, sharded(layer, src, &LayerWeights::q_b_proj), cfg);
      put(rank, "q_nope", std::move(q.q_nope));
      put(rank, "q_pe", std::move(q.q_pe));
      break;
    }
    case Stage::Stage_kv_a_proj: {
      auto kv = planted("kv-a-rows-tile") ? ref::bug::kv_a_proj_whole_tiles(get(rank, "x"), W.kv_a_proj, cfg, kRowsTileBug)
                                          : ref::kv_a_proj(get(rank, "x"), W.kv_a_proj, cfg);
      put(rank, "kv_c", std::move(kv.kv_c));
      put(rank, "k_pe", std::move(kv.k_pe));
      break;
    }
    case Stage::Stage_kv_a_norm:
      // kv-norm-no-weight: the weight never multiplied; kv-norm-weight-wrap: channel c takes the weight of
      // c mod L/2 (a kernel that handles c and c + L/2 in one thread and loads the weight once).
      put(rank, "kv_c_norm", planted("kv-norm-skip")
                                 ? get(rank, "kv_c")
                                 : ref::rms_norm(get(rank, "kv_c"), W.kv_a_norm, cfg.rms_eps,
                                                 {.weight = !planted("kv-norm-no-weight"),
                                                  .weight_wrap = planted("kv-norm-weight-wrap") ? cfg.kv_lora_rank / 2 : 0}));
      break;
    case Stage::Stage_rope:
      put(rank, "q_pe_rope", ref::rope(get(rank, "q_pe"), positions, cfg.inv_freq, cfg.rope_mscale, cfg.rope_style));
      put(rank, "k_pe_rope", ref::rope(get(rank, "k_pe"), positions, cfg.inv_freq, cfg.rope_mscale, cfg.rope_style));
      break;
    case Stage::Stage_cache_write:
      if (planted("decode-empty-cache")) ranks_[rank].cache_before_write = cache;
      if (cache_fp8_) {  // the rows as the cache stores them: fp8 e4m3 codes at the per-tensor scale
        put(rank, "kv_cache", ref::cache_write(cache, batch, through_e4m3(get(rank, "kv_c_norm"), cache_scale_),
                                               through_e4m3(get(rank, "k_pe_rope"), cache_scale_)));
        round_in_place(cache, precision_);
        break;
      }
      put(rank, "kv_cache", ref::cache_write(cache, batch, get(rank, "kv_c_norm"), get(rank, "k_pe_rope")));
      round_in_place(cache, precision_);
      break;
    case Stage::Stage_indexer_q:
      put(rank, "idx_q",
          ref::indexer_q(get(rank, "q_c"), W.idx_wq_b, cfg.index_n_heads, positions, cfg.inv_freq, index_style));
      break;
    case Stage::Stage_indexer_k: {
      put(rank, "idx_k", ref::indexer_k(get(rank, "x"), W.idx_wk, W.idx_k_norm, W.idx_k_norm_bias,
                                        MlaConfig::kIndexNormEps, positions, cfg.inv_freq, index_style,
                                        /*norm=*/!planted("index-k-norm-skip")));
      ref::index_cache_write(ranks_[rank].index_cache.at(layer), batch, get(rank, "idx_k"));
      break;
    }
    case Stage::Stage_indexer_weights:
      put(rank, "idx_weights", ref::indexer_weights(get(rank, "x"), W.idx_weights_proj));
      break;
    case Stage::Stage_index_scores:
      put_exact(rank, "idx_scores",
                ref::index_scores(get(rank, "idx_q"), get(rank, "idx_weights"), ranks_[rank].index_cache.at(layer),
                                  batch, ctx_.graph->find("idx_scores")->shape[1],
                                  {.weights = !planted("index-weights-skip"),
                                   .causal = !planted("index-causal-leak")}));
      break;
    case Stage::Stage_topk: {
      // topk-off-by-one: one key fewer than index_topk.
      const int k = cfg.index_topk - (planted("topk-off-by-one") ? 1 : 0);
      put_exact(rank, "topk", ref::selection_tensor(ref::select_keys(get(rank, "idx_scores"), batch, k,
                                                                     !planted("index-causal-leak")),
                                                    cfg.index_topk));
      break;
    }
    case Stage::Stage_kv_b_proj: {
      const Tensor& w_kvb = sharded(layer, rank, &LayerWeights::kv_b_proj);
      auto kv = planted("kv-b-split") ? ref::bug::kv_b_proj_split_by_block(get(rank, "kv_c_norm"), w_kvb, cfg)
                                      : ref::kv_b_proj(get(rank, "kv_c_norm"), w_kvb, cfg);
      put(rank, "k_nope", std::move(kv.k_nope));
      put(rank, "v", std::move(kv.v));
      break;
    }
    case Stage::Stage_attention_mha: {
      auto a = ref::attention_mha(get(rank, "q_nope"), get(rank, "q_pe_rope"), get(rank, "k_nope"), get(rank, "k_pe_rope"),
                                  get(rank, "v"), cache, batch, sharded(layer, rank, &LayerWeights::kv_b_proj), cfg,
                                  {.causal = !planted("causal-off"), .lse_base2 = planted("lse-base2"),
                                   .window = planted("sliding-window") ? kSlidingWindowBug : 0,
                                   .keys = selection ? &*selection : nullptr});
      put(rank, "attn_out", std::move(a.out));
      put(rank, "lse", std::move(a.lse));
      break;
    }
    case Stage::Stage_q_absorb: {
      const Tensor& w_kvb = sharded(layer, rank, &LayerWeights::kv_b_proj);
      put(rank, "q_latent", planted("wuk-transpose") ? ref::bug::q_absorb_wuk_transposed(get(rank, "q_nope"), w_kvb, cfg)
                                                     : ref::q_absorb(get(rank, "q_nope"), w_kvb, cfg));
      break;
    }
    case Stage::Stage_attention_mqa: {
      const Batch shifted = planted("page-off-by-one") ? ref::bug::shift_block_table(batch) : batch;
      const Tensor& seen = planted("decode-empty-cache") ? ranks_[rank].cache_before_write : cache;
      auto a = ref::attention_mqa(get(rank, "q_latent"), get(rank, "q_pe_rope"), seen, shifted, cfg,
                                  selection ? &*selection : nullptr);
      put(rank, "attn_latent", std::move(a.out));
      put(rank, "lse", std::move(a.lse));
      break;
    }
    case Stage::Stage_v_up: {
      // v-up-head: the model's last head (the last rank's last local head) reads its neighbour's W_UV.
      const bool last_rank = rank == static_cast<int>(ranks_.size()) - 1;
      const Tensor& w_kvb = sharded(layer, rank, &LayerWeights::kv_b_proj);
      put(rank, "attn_out", planted("v-up-head") && last_rank
                                ? ref::bug::v_up_last_head_from_previous(get(rank, "attn_latent"), w_kvb, cfg)
                                : ref::v_up(get(rank, "attn_latent"), w_kvb, cfg));
      break;
    }
    case Stage::Stage_o_proj:
      put(rank, "o_partial", planted("o-proj-half-heads")
                                 ? ref::bug::o_proj_half_reduction(get(rank, "attn_out"), sharded(layer, rank, &LayerWeights::o_proj))
                                 : ref::o_proj(get(rank, "attn_out"), sharded(layer, rank, &LayerWeights::o_proj)));
      break;
    case Stage::Stage_all_reduce: {
      std::vector<const Tensor*> parts;
      for (size_t r = 0; r < (planted("allreduce-skip") ? 1 : ranks_.size()); ++r)
        parts.push_back(&get(static_cast<int>(r), "o_partial"));
      put(rank, "o", ref::all_reduce(parts));
      break;
    }
    case Stage::Stage_residual:  // residual-drop: the add forgotten, h_out = o
      put(rank, "h_out", planted("residual-drop") ? get(rank, "o") : ref::residual(get(rank, "h"), get(rank, "o")));
      break;
  }
}

}  // namespace mla
