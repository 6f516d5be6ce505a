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

ProbeRecord record_at_level(const ProbeRecord& rec, ProbeLevel level) {
  ProbeRecord r;
  r.shape = rec.shape;
  r.dtype = rec.dtype;
  r.l2 = rec.l2;
  r.absmax = rec.absmax;
  r.mean = rec.mean;
  r.std = rec.std;
  r.nan = rec.nan;
  r.inf = rec.inf;
  r.checksum = rec.checksum;
  r.token_l2 = rec.token_l2;
  r.head_l2 = rec.head_l2;
  r.level = std::min(level, rec.level);
  if (r.level != ProbeLevel::ProbeLevel_stats) r.sketch = rec.sketch;
  if (r.level == ProbeLevel::ProbeLevel_full) r.data = rec.data;
  return r;
}

namespace {

// One row's checksum terms summed (mod 2^64), regrouped: with the multiplier H·A^q + S·j of the column 8q + j
// (core/probe/probe_hash.h), the row's sum is  H · Σ_q A^q · G_q  +  S · Σ_j j · Σ_q (2·bits + 1)  where G_q sums
// (2·bits + 1) over group q. Ring arithmetic mod 2^64: the same bits as the element-by-element walk, in 8 lanes.
template <class Bits>
uint64_t row_checksum(const float* row, int64_t C, uint64_t r, Bits bits) {
  uint64_t weighted[8] = {}, plain[8] = {};
  uint64_t power = 1;
  int64_t c = 0;
  for (; c + 8 <= C; c += 8, power *= kChecksumBase)
    for (int j = 0; j < 8; ++j) {
      const uint64_t v = 2ull * bits(row[c + j]) + 1ull;
      weighted[j] += v * power;
      plain[j] += v;
    }
  for (int j = 0; c + j < C; ++j) {
    const uint64_t v = 2ull * bits(row[c + j]) + 1ull;
    weighted[j] += v * power;
    plain[j] += v;
  }
  uint64_t w = 0, p = 0;
  for (int j = 0; j < 8; ++j) {
    w += weighted[j];
    p += static_cast<uint64_t>(j) * plain[j];
  }
  return checksum_row_hash(r) * w + kChecksumStep * p;
}

uint64_t raw_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits;
}

// The squares of `R` rows summed at once, each row's in column order from `begin` to `end` (the record's rounding: a
// double chain per row, as the Python writer and the docs' example compute it); the R chains overlap in the
// pipeline. `seg` gets the same sums over [begin, end) alone (a head's share), `row` keeps adding the whole row's.
template <int R>
void square_chains(const float* const* rows, int64_t begin, int64_t end, double* row, double* seg) {
  double acc[R], part[R];
  for (int i = 0; i < R; ++i) acc[i] = row[i], part[i] = 0.0;
  for (int64_t c = begin; c < end; ++c)
    for (int i = 0; i < R; ++i) {
      const double x = rows[i][c];
      acc[i] += x * x;
      part[i] += x * x;
    }
  for (int i = 0; i < R; ++i) row[i] = acc[i], seg[i] = part[i];
}

// The largest |value| of a row of finite values (order-free: vector lanes).
float row_absmax(const float* v, int64_t n) {
  float m[16] = {};
  int64_t c = 0;
  for (; c + 16 <= n; c += 16)
    for (int j = 0; j < 16; ++j) m[j] = std::max(m[j], std::fabs(v[c + j]));
  for (; c < n; ++c) m[0] = std::max(m[0], std::fabs(v[c]));
  float r = 0;
  for (float x : m) r = std::max(r, x);
  return r;
}

// A row holding a NaN or an Inf, element by element: its counts, and its finite values' largest |value|.
struct NonFinite {
  int64_t nan = 0, inf = 0;
  double amax = 0;
};

NonFinite count_nonfinite(const float* v, int64_t n) {
  NonFinite f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) ++f.nan;
    else if (std::isinf(v[i])) ++f.inf;
    else f.amax = std::max(f.amax, static_cast<double>(std::fabs(v[i])));
  }
  return f;
}

// The sketch of `rows` consecutive rows: each lane's sum over the columns in column order (doubles; the product of a
// float and a coefficient ±1/sqrt(32) is exact), four rows at a time so each coefficient is loaded once for four.
void sketch_rows(const float* data, int64_t r0, int64_t rows, int64_t C, const double* coeff, float* out) {
  constexpr int K = kSketchDim;
  int64_t r = r0;
  for (; r + 4 <= r0 + rows; r += 4) {
    double acc[4][K] = {};
    const float* row[4] = {data + r * C, data + (r + 1) * C, data + (r + 2) * C, data + (r + 3) * C};
    for (int64_t c = 0; c < C; ++c) {
      const double* cf = coeff + c * K;
      for (int i = 0; i < 4; ++i) {
        const double v = row[i][c];
        for (int k = 0; k < K; ++k) acc[i][k] += v * cf[k];
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < K; ++k) out[(r + i) * K + k] = static_cast<float>(acc[i][k]);
  }
  for (; r < r0 + rows; ++r) {
    double acc[K] = {};
    const float* row = data + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const double v = row[c];
      for (int k = 0; k < K; ++k) acc[k] += v * coeff[c * K + k];
    }
    for (int k = 0; k < K; ++k) out[r * K + k] = static_cast<float>(acc[k]);
  }
}

}  // namespace

namespace {
ProbeRecord record_without_data(const Tensor& t, const std::string& dtype, const ProbeRequest& req);
}  // namespace

ProbeRecord compute_probe_record(const Tensor& t, const std::string& dtype, const ProbeRequest& req) {
  ProbeRecord rec = record_without_data(t, dtype, req);
  if (req.level == ProbeLevel::ProbeLevel_full) rec.data = t;
  return rec;
}

ProbeRecord compute_probe_record(Tensor&& t, const std::string& dtype, const ProbeRequest& req) {
  ProbeRecord rec = record_without_data(t, dtype, req);
  if (req.level == ProbeLevel::ProbeLevel_full) rec.data = std::move(t);
  return rec;
}

namespace {

ProbeRecord record_without_data(const Tensor& t, const std::string& dtype, const ProbeRequest& req) {
  ProbeRecord rec;
  rec.shape = t.shape;
  rec.dtype = dtype;
  rec.level = req.level;
  const int64_t n = t.numel();
  const int64_t T = req.tokens > 0 ? req.tokens : 1;
  const int64_t C = n / T;
  const float* data = t.ptr();
  const int bits_kind = dtype == "bf16" ? 1 : dtype == "fp16" ? 2 : 0;
  const bool parallel = n > (1 << 16);
  // Every number of the record has one order of rounding, whatever the number of threads: the tensor's sum and sum
  // of squares (finite values) are one chain in element order, made by one thread while the others take the rows;
  // each row's numbers are made by one thread in column order (its squares' chain, its heads'), in blocks of 4 rows
  // whose chains overlap; counts, maxima and the checksum (a sum mod 2^64) do not depend on order.
  rec.token_l2.assign(T, 0.f);
  const int64_t heads = req.heads > 0 ? req.heads : 0;
  const int64_t X = heads ? C / heads : C;
  if (heads) rec.head_l2.assign(T * heads, 0.f);
  std::vector<uint64_t> row_check(T);
  std::vector<float> row_amax(T);
  std::vector<NonFinite> row_bad(T);
  std::vector<char> row_nonfinite(T);
  double sum = 0, sumsq = 0;
  constexpr int64_t kRows = 4;
  const int64_t blocks = (T + kRows - 1) / kRows;
#pragma omp parallel if (parallel)
  {
#pragma omp single nowait
    for (int64_t i = 0; i < n; ++i) {
      const float v = data[i];
      const double x = std::isfinite(v) ? v : 0.0;  // adding +0.0 leaves a sum that starts at +0.0 as it is
      sum += x;
      sumsq += x * x;
    }
#pragma omp for schedule(dynamic, 4)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * kRows;
      const int nr = static_cast<int>(std::min(kRows, T - r0));
      const float* rows[kRows];
      double row_sq[kRows] = {}, seg_sq[kRows] = {};
      for (int i = 0; i < kRows; ++i) rows[i] = data + (r0 + std::min<int64_t>(i, nr - 1)) * C;
      for (int64_t h = 0; h < std::max<int64_t>(heads, 1); ++h) {
        const int64_t begin = h * X, end = heads && h + 1 < heads ? (h + 1) * X : heads ? heads * X : C;
        square_chains<kRows>(rows, begin, end, row_sq, seg_sq);
        if (heads)
          for (int i = 0; i < nr; ++i) rec.head_l2[(r0 + i) * heads + h] = static_cast<float>(std::sqrt(seg_sq[i]));
      }
      if (heads && heads * X < C)  // columns past the last head: the row's chain only
        square_chains<kRows>(rows, heads * X, C, row_sq, seg_sq);
      for (int i = 0; i < nr; ++i) {
        const int64_t r = r0 + i;
        const float* row = rows[i];
        // Non-finite values propagate into the per-token maps on purpose: a NaN token shows as NaN.
        rec.token_l2[r] = static_cast<float>(std::sqrt(row_sq[i]));
        row_nonfinite[r] = !std::isfinite(row_sq[i]);  // float squares cannot overflow a double: only NaN and Inf
        if (row_nonfinite[r]) row_bad[r] = count_nonfinite(row, C);
        else row_amax[r] = row_absmax(row, C);
        row_check[r] = bits_kind == 1   ? row_checksum(row, C, r, [](float v) -> uint64_t { return to_bf16_bits(v); })
                       : bits_kind == 2 ? row_checksum(row, C, r, [](float v) -> uint64_t { return to_fp16_bits(v); })
                                        : row_checksum(row, C, r, raw_bits);
      }
    }
  }
  double amax = 0;
  uint64_t check = 0;
  for (int64_t r = 0; r < T; ++r) {
    check += row_check[r];
    if (row_nonfinite[r]) {
      amax = std::max(amax, row_bad[r].amax);
      rec.nan += row_bad[r].nan;
      rec.inf += row_bad[r].inf;
    } else {
      amax = std::max(amax, static_cast<double>(row_amax[r]));
    }
  }
  if (const int64_t tail = n - T * C; tail > 0) {
    const NonFinite f = count_nonfinite(data + T * C, tail);
    amax = std::max(amax, f.amax);
    rec.nan += f.nan;
    rec.inf += f.inf;
    // The checksum walks on past the last full row, row by row of C (core/probe/probe_hash.h).
    const auto walk = [&](auto bits) { return checksum_walk(data, n, C, [&](float v, int64_t) { return bits(v); }); };
    check = bits_kind == 1   ? walk([](float v) -> uint64_t { return to_bf16_bits(v); })
            : bits_kind == 2 ? walk([](float v) -> uint64_t { return to_fp16_bits(v); })
                             : walk(raw_bits);
  }
  rec.checksum = check;
  const int64_t finite = n - rec.nan - rec.inf;
  rec.l2 = std::sqrt(sumsq);
  rec.absmax = amax;
  rec.mean = finite ? sum / finite : 0.0;
  rec.std = finite ? std::sqrt(std::max(0.0, sumsq / finite - rec.mean * rec.mean)) : 0.0;

  if (req.level != ProbeLevel::ProbeLevel_stats) {
    rec.sketch.assign(T * kSketchDim, 0.f);
    // The coefficients as doubles (exactly the float ±1/sqrt(32)): the product with a float is exact either way.
    std::vector<double> coeff(C * kSketchDim);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t c = 0; c < C; ++c)
      for (int k = 0; k < kSketchDim; ++k) coeff[c * kSketchDim + k] = sketch_coeff(req.probe_key, req.col_offset + c, k);
    constexpr int64_t kBlock = 16;  // rows per task
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t b = 0; b < (T + kBlock - 1) / kBlock; ++b)
      sketch_rows(data, b * kBlock, std::min(kBlock, T - b * kBlock), C, coeff.data(), rec.sketch.data());
  }
  return rec;
}

}  // namespace

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
