// Host-side probe statistics and sketches (the reference engine's, and the checker for the GPU ones).
#include "core/probe/probe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/model/errors.h"
#include "core/probe/probe_hash.h"

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

namespace {

// One row's checksum terms summed (mod 2^64): the row hash times A^(c >> 3), stepped inside each group of 8.
template <class Bits>
uint64_t row_checksum(const float* row, int64_t C, uint64_t r, Bits bits) {
  const uint64_t row_hash = checksum_row_hash(r);
  uint64_t power = 1, h = 0;
  for (int64_t c = 0; c < C; ++c) {
    h += checksum_multiplier_at(row_hash, power, static_cast<uint64_t>(c)) * (2ull * bits(row[c]) + 1ull);
    if ((c & 7) == 7) power *= kChecksumBase;
  }
  return h;
}

template <class Bits>
uint64_t tensor_checksum(const float* data, int64_t T, int64_t C, Bits bits) {
  uint64_t h = 0;  // a sum modulo 2^64: any order of the rows gives the same bits
#pragma omp parallel for schedule(static) reduction(+ : h) if (T * C > (1 << 16))
  for (int64_t r = 0; r < T; ++r) h += row_checksum(data + r * C, C, static_cast<uint64_t>(r), bits);
  return h;
}

}  // namespace

ProbeRecord compute_probe_record(const Tensor& t, const std::string& dtype, const ProbeRequest& req) {
  ProbeRecord rec;
  rec.shape = t.shape;
  rec.dtype = dtype;
  rec.level = req.level;
  const int64_t n = t.numel();
  const int64_t T = req.tokens > 0 ? req.tokens : 1;
  const int64_t C = n / T;
  const float* data = t.ptr();
  // Rows are independent: everything but sum and sum of squares is computed per row, in parallel, and is the same
  // bits on any number of threads (per-row doubles in column order; integer counts; a max; a sum mod 2^64).
  const bool parallel = n > (1 << 16);

  // Sum and sum of squares in element order, one thread: their rounding is the record's.
  double sum = 0, sumsq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = data[i];
    if (std::isfinite(v)) {
      sum += v;
      sumsq += static_cast<double>(v) * v;
    }
  }
  int64_t nan = 0, inf = 0;
  double amax = 0;
#pragma omp parallel for schedule(static) reduction(+ : nan, inf) reduction(max : amax) if (parallel)
  for (int64_t i = 0; i < n; ++i) {
    const float v = data[i];
    if (std::isnan(v)) ++nan;
    else if (std::isinf(v)) ++inf;
    else amax = std::max(amax, static_cast<double>(std::fabs(v)));
  }
  rec.nan = nan;
  rec.inf = inf;

  // The checksum views the tensor as [T, C] (a tensor whose size T does not divide walks on, row by row of C).
  const auto checksum = [&](auto bits) {
    if (C > 0 && n == T * C) return tensor_checksum(data, T, C, bits);
    return checksum_walk(data, n, C, [&](float v, int64_t) { return bits(v); });
  };
  if (dtype == "bf16") rec.checksum = checksum([](float v) -> uint64_t { return to_bf16_bits(v); });
  else if (dtype == "fp16") rec.checksum = checksum([](float v) -> uint64_t { return to_fp16_bits(v); });
  else
    rec.checksum = checksum([](float v) -> uint64_t {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      return bits;
    });

  const int64_t finite = n - rec.nan - rec.inf;
  rec.l2 = std::sqrt(sumsq);
  rec.absmax = amax;
  rec.mean = finite ? sum / finite : 0.0;
  rec.std = finite ? std::sqrt(std::max(0.0, sumsq / finite - rec.mean * rec.mean)) : 0.0;

  // Non-finite values propagate into the per-token maps on purpose: a NaN token shows as NaN.
  rec.token_l2.assign(T, 0.f);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < T; ++r) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += static_cast<double>(data[r * C + c]) * data[r * C + c];
    rec.token_l2[r] = static_cast<float>(std::sqrt(s));
  }
  if (req.heads > 0) {
    const int64_t X = C / req.heads;
    rec.head_l2.assign(T * req.heads, 0.f);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < T; ++r)
      for (int64_t hd = 0; hd < req.heads; ++hd) {
        double s = 0;
        const float* p = data + r * C + hd * X;
        for (int64_t c = 0; c < X; ++c) s += static_cast<double>(p[c]) * p[c];
        rec.head_l2[r * req.heads + hd] = static_cast<float>(std::sqrt(s));
      }
  }
  if (req.level != ProbeLevel::ProbeLevel_stats) {
    rec.sketch.assign(T * kSketchDim, 0.f);
    // The coefficients as doubles (exactly the float ±1/sqrt(32)): the product with a float is exact either way.
    std::vector<double> coeff(C * kSketchDim);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t c = 0; c < C; ++c)
      for (int k = 0; k < kSketchDim; ++k) coeff[c * kSketchDim + k] = sketch_coeff(req.probe_key, req.col_offset + c, k);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < T; ++r) {
      double acc[kSketchDim] = {};
      const float* row = data + r * C;
      for (int64_t c = 0; c < C; ++c) {
        const double v = row[c];
        const double* cf = &coeff[c * kSketchDim];
        for (int k = 0; k < kSketchDim; ++k) acc[k] += v * cf[k];
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
