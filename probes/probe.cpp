// Host-side probe statistics and sketches (the reference engine's, and the checker for the GPU ones).
#include "probes/probe.h"

#include <cmath>
#include <cstring>

#include "harness/model/errors.h"
#include "probes/probe_hash.h"

static_assert(mla::kSketchDim == mla::kSketchLanes);

namespace mla {

const char* probe_level_name(ProbeLevel l) {
  switch (l) {
    case ProbeLevel::ProbeLevel_stats: return "stats";
    case ProbeLevel::ProbeLevel_sketch: return "sketch";
    case ProbeLevel::ProbeLevel_full: return "full";
  }
  return "?";
}

ProbeLevel parse_probe_level(const std::string& s) {
  if (s == "stats") return ProbeLevel::ProbeLevel_stats;
  if (s == "sketch") return ProbeLevel::ProbeLevel_sketch;
  if (s == "full") return ProbeLevel::ProbeLevel_full;
  throw UsageError("unknown probe level '" + s + "' (expected stats, sketch or full)");
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  auto p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t probe_key(const std::string& name) { return fnv1a(name.data(), name.size()); }

float sketch_coeff(uint64_t key, int64_t column, int lane) { return sketch_coeff_at(key, column, lane); }

ProbeRequest make_probe_request(const ProbeSpec& p, int tp, int rank, ProbeLevel level) {
  ProbeRequest r;
  r.level = level;
  const auto local = local_shape(p, tp);
  r.tokens = local.empty() ? 0 : local[0];  // a weight's rows (rows contract: this rank's block)
  r.probe_key = probe_key(p.name);
  if (p.heads_axis >= 0) r.heads = local[p.heads_axis];
  if (p.contract == Contract::Contract_heads || p.contract == Contract::Contract_columns) {
    const int64_t cols = r.tokens ? shape_numel(local) / r.tokens : 0;
    r.col_offset = static_cast<int64_t>(rank) * cols;
  }
  return r;
}

ProbeRecord compute_probe_record(const Tensor& t, const std::string& dtype, const ProbeRequest& req) {
  ProbeRecord rec;
  rec.shape = t.shape;
  rec.dtype = dtype;
  rec.level = req.level;
  const int64_t n = t.numel();
  const int64_t T = req.tokens > 0 ? req.tokens : 1;
  const int64_t C = n / T;
  double sum = 0, sumsq = 0, amax = 0;
  uint64_t h = 0;
  // The checksum walks each row with its multiplier's power of A (probes/probe_hash.h): row hash · A^(c >> 3).
  uint64_t row_hash = 0, power = 1;
  for (int64_t i = 0, r = 0, c = 0; i < n; ++i, ++c) {
    if (c == C) {
      ++r;
      c = 0;
    }
    if (c == 0) {
      row_hash = checksum_row_hash(static_cast<uint64_t>(r));
      power = 1;
    }
    const float v = t.data[i];
    if (std::isnan(v)) { ++rec.nan; }
    else if (std::isinf(v)) { ++rec.inf; }
    else {
      sum += v;
      sumsq += static_cast<double>(v) * v;
      amax = std::max(amax, static_cast<double>(std::fabs(v)));
    }
    uint32_t bits;
    if (dtype == "bf16") bits = to_bf16_bits(v);
    else if (dtype == "fp16") bits = to_fp16_bits(v);
    else std::memcpy(&bits, &v, 4);
    h += checksum_multiplier_at(row_hash, power, static_cast<uint64_t>(c)) * (2ull * bits + 1ull);
    if ((c & 7) == 7) power *= kChecksumBase;
  }
  const int64_t finite = n - rec.nan - rec.inf;
  rec.l2 = std::sqrt(sumsq);
  rec.absmax = amax;
  rec.mean = finite ? sum / finite : 0.0;
  rec.std = finite ? std::sqrt(std::max(0.0, sumsq / finite - rec.mean * rec.mean)) : 0.0;
  rec.checksum = h;

  // Non-finite values propagate into the per-token maps on purpose: a NaN token shows as NaN.
  rec.token_l2.assign(T, 0.f);
  for (int64_t r = 0; r < T; ++r) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += static_cast<double>(t.data[r * C + c]) * t.data[r * C + c];
    rec.token_l2[r] = static_cast<float>(std::sqrt(s));
  }
  if (req.heads > 0) {
    const int64_t X = C / req.heads;
    rec.head_l2.assign(T * req.heads, 0.f);
    for (int64_t r = 0; r < T; ++r)
      for (int64_t hd = 0; hd < req.heads; ++hd) {
        double s = 0;
        const float* p = t.ptr() + r * C + hd * X;
        for (int64_t c = 0; c < X; ++c) s += static_cast<double>(p[c]) * p[c];
        rec.head_l2[r * req.heads + hd] = static_cast<float>(std::sqrt(s));
      }
  }
  if (req.level != ProbeLevel::ProbeLevel_stats) {
    rec.sketch.assign(T * kSketchDim, 0.f);
    std::vector<float> coeff(C * kSketchDim);
    for (int64_t c = 0; c < C; ++c)
      for (int k = 0; k < kSketchDim; ++k) coeff[c * kSketchDim + k] = sketch_coeff(req.probe_key, req.col_offset + c, k);
    for (int64_t r = 0; r < T; ++r) {
      double acc[kSketchDim] = {};
      const float* row = t.ptr() + r * C;
      for (int64_t c = 0; c < C; ++c) {
        const float* cf = &coeff[c * kSketchDim];
        for (int k = 0; k < kSketchDim; ++k) acc[k] += static_cast<double>(row[c]) * cf[k];
      }
      for (int k = 0; k < kSketchDim; ++k) rec.sketch[r * kSketchDim + k] = static_cast<float>(acc[k]);
    }
  }
  if (req.level == ProbeLevel::ProbeLevel_full) rec.data = t;
  return rec;
}

void TeeSink::stage_begin(int layer, Stage stage, int rank) {
  for (auto* s : sinks_) s->stage_begin(layer, stage, rank);
}

void TeeSink::waiting(int layer, Stage stage, int rank) {
  for (auto* s : sinks_) s->waiting(layer, stage, rank);
}

void TeeSink::waiting_over() {
  for (auto* s : sinks_) s->waiting_over();
}

void TeeSink::record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  for (auto* s : sinks_) s->record(layer, spec, rank, rec);
}

void TeeSink::record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  for (auto* s : sinks_) s->record_weight(layer, spec, rank, rec);
}

void TeeSink::finish(const std::string& status) {
  for (auto* s : sinks_) s->finish(status);
}

}  // namespace mla
