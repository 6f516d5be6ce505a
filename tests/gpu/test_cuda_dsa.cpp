// DSA's device kernels (kernels/dsa_indexer.cu, kernels/attention_sparse.cu) against the reference's functions
// (reference/dsa_indexer.cpp, reference/attention.cpp) on the same bf16-exact inputs, on tiny-like dims and on
// GLM-5's (Hi 32, Di 128, R 64; L 512, P 192, V 256) and DeepSeek-V3.2's indexer (Hi 64, neox), over batches of
// sequences with ragged contexts that cross pages, decode and prefill-like steps alike.
//
// Tolerances: the indexer's outputs (rope, idx_k, weights) are bf16 roundings of what the fp32 reference computes
// (rel L2 ≤ 1e-2; ~2^-9 expected); the scores are fp32 sums of exact bf16 products (rel 1e-3, expected ~1e-6), with
// exact zeros where a token sees no key; the top-k fed the reference's own scores must give exactly its keys (the
// tie rule, −0 = +0, the −1 padding, columns a token does not see never read); sparse attention given the same
// selection: rel L2 ≤ 1e-2 of attend_selected, lse to 1e-3 (−inf where nothing is selected).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/model/batch.h"
#include "core/model/tensor.h"
#include "core/model/weights.h"
#include "kernels/attention_sparse.cuh"
#include "kernels/dsa_indexer.cuh"
#include "kernels/linear.cuh"
#include "kernels/rank_context.cuh"
#include "reference/stages.h"
#include "tests/gpu/gpu_test_util.h"

namespace mla::gputest {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// --- Host and device data -----------------------------------------------------------------------------------

// A step of sequences with their own new and cached token counts, laid out as make_batch does (positions from the
// context on, pages shuffled by `seed`, one spare page per block-table row).
Batch ragged_batch(const std::vector<int>& new_lens, const std::vector<int>& ctx_lens, uint64_t seed) {
  Batch b;
  b.new_lens = new_lens;
  b.context_lens = ctx_lens;
  const int B = static_cast<int>(new_lens.size());
  int pages = 0;
  for (int i = 0; i < B; ++i) {
    const int n = (ctx_lens[i] + new_lens[i] + kPageSize - 1) / kPageSize;
    b.max_blocks = std::max(b.max_blocks, n);
    pages += n;
  }
  b.max_blocks += 1;
  b.num_blocks = pages + 1;
  std::vector<int> ids(b.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.block_table.assign(static_cast<size_t>(B) * b.max_blocks, ids.back());
  int next = 0;
  for (int i = 0; i < B; ++i) {
    const int len = ctx_lens[i] + new_lens[i];
    for (int j = 0; j < (len + kPageSize - 1) / kPageSize; ++j) b.block_table[i * b.max_blocks + j] = ids[next++];
    for (int t = 0; t < new_lens[i]; ++t) {
      b.positions.push_back(ctx_lens[i] + t);
      b.token_seq.push_back(i);
    }
  }
  return b;
}

int64_t cache_row(const Batch& b, int seq, int s) {
  return static_cast<int64_t>(b.page(seq, s)) * kPageSize + s % kPageSize;
}
int total_len(const Batch& b, int seq) { return b.context_lens[seq] + b.new_lens[seq]; }
int max_total(const Batch& b) {
  int m = 0;
  for (int i = 0; i < b.num_seqs(); ++i) m = std::max(m, total_len(b, i));
  return m;
}
// Keys token t sees (causal: its context and the new tokens up to itself).
int visible(const Batch& b, int t, bool causal) {
  const int seq = b.token_seq[t], i = t - b.first_token(seq);
  return causal ? b.context_lens[seq] + i + 1 : total_len(b, seq);
}

// N(0, stddev) values rounded to bf16 (bit for bit: what the device holds).
Tensor random_bf16(std::vector<int64_t> shape, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  Tensor t(std::move(shape));
  fill_normal_bf16(t.ptr(), t.numel(), seed, 0, stddev);
  if (mean != 0.0f)
    for (float& v : t.data) v = round_bf16(v + mean);
  return t;
}

// Rows [r0, r0 + n) of x [T, ...].
Tensor rows_of(const Tensor& x, int64_t r0, int64_t n) {
  std::vector<int64_t> shape = x.shape;
  const int64_t per = x.numel() / x.dim(0);
  shape[0] = n;
  Tensor out(shape);
  std::copy_n(x.ptr() + r0 * per, n * per, out.ptr());
  return out;
}

// The rows of sequence `seq`'s keys 0 .. total − 1 from a paged cache [blocks, 64, W], in key order: [total, W].
Tensor gather_keys(const Tensor& cache, const Batch& b, int seq) {
  const int64_t W = cache.dim(-1), total = total_len(b, seq);
  Tensor out({total, W});
  for (int s = 0; s < total; ++s) std::copy_n(cache.ptr() + cache_row(b, seq, s) * W, W, out.ptr() + s * W);
  return out;
}

void sync() { CUDA_CHECK(cudaDeviceSynchronize()); }

DeviceBuffer upload_bytes(const void* src, size_t bytes) {
  DeviceBuffer d(0, std::max<size_t>(bytes, 16));
  if (bytes) CUDA_CHECK(cudaMemcpy(d.get(), src, bytes, cudaMemcpyHostToDevice));
  sync();  // the kernels run on the rank's own (non-blocking) stream
  return d;
}
template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  return upload_bytes(v.data(), v.size() * sizeof(T));
}
DeviceBuffer upload_bf16(const Tensor& t) {
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = to_bf16_bits(t.data[i]);
  return upload(bits);
}
DeviceBuffer device_zeros(size_t bytes, int byte_value = 0) {
  DeviceBuffer d(0, std::max<size_t>(bytes, 16));
  CUDA_CHECK(cudaMemset(d.get(), byte_value, std::max<size_t>(bytes, 16)));
  sync();
  return d;
}
template <class T>
std::vector<T> download(const DeviceBuffer& d, size_t n) {
  sync();
  std::vector<T> v(n);
  if (n) CUDA_CHECK(cudaMemcpy(v.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
Tensor download_bf16(const DeviceBuffer& d, std::vector<int64_t> shape) {
  Tensor t(std::move(shape));
  const std::vector<uint16_t> bits = download<uint16_t>(d, static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < bits.size(); ++i) t.data[i] = from_bf16_bits(bits[i]);
  return t;
}
template <class T>
const T* ptr(const DeviceBuffer& d) {
  return static_cast<const T*>(d.get());
}
template <class T>
T* mut(DeviceBuffer& d) {
  return static_cast<T*>(d.get());
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double d2 = 0, b2 = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    d2 += d * d;
    b2 += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d2) / std::max(std::sqrt(b2), 1e-30);
}
double rel_l2(const Tensor& a, const Tensor& b) { return rel_l2(a.data, b.data); }

// --- Indexer dims -------------------------------------------------------------------------------------------

struct IndexerDims {
  std::string name;
  int Hi, D, R;
  bool neox;
  double theta;
  std::vector<double> inv_freq() const {
    std::vector<double> f(R / 2);
    for (int i = 0; i < R / 2; ++i) f[i] = 1.0 / std::pow(theta, 2.0 * i / R);
    return f;
  }
  RopeStyle style() const { return neox ? RopeStyle::RopeStyle_neox : RopeStyle::RopeStyle_interleaved; }
};
const IndexerDims kTinyIdx{"tiny", 4, 16, 8, false, 1e4};
const IndexerDims kGlm5Idx{"glm-5", 32, 128, 64, false, 1e6};
const IndexerDims kV32Idx{"deepseek-v3.2", 64, 128, 64, true, 1e4};

// RoPE of the reference on lanes [0, R) of each row of x [T, ..., D].
Tensor ref_rope_leading(const Tensor& x, const std::vector<int>& positions, const IndexerDims& d) {
  const int64_t T = x.dim(0), rows = x.numel() / d.D;
  Tensor lanes({T, rows / T, d.R});
  for (int64_t r = 0; r < rows; ++r) std::copy_n(x.ptr() + r * d.D, d.R, lanes.ptr() + r * d.R);
  const Tensor rotated = ref::rope(lanes, positions, d.inv_freq(), 1.0, d.style());
  Tensor y = x;
  for (int64_t r = 0; r < rows; ++r) std::copy_n(rotated.ptr() + r * d.R, d.R, y.ptr() + r * d.D);
  return y;
}

TEST(CudaDsa, RopeOnLeadingLanesMatchesReference) {
  MLA_REQUIRE_GPU();
  for (const IndexerDims& d : {kTinyIdx, kGlm5Idx, kV32Idx}) {
    SCOPED_TRACE(d.name);
    const int T = 37;
    std::vector<int> pos(T);
    std::mt19937 rng(3);
    for (int& p : pos) p = static_cast<int>(rng() % 200000);
    const Tensor x = random_bf16({T, d.Hi, d.D}, 11);
    DeviceBuffer dx = upload_bf16(x), dpos = upload(pos), dfreq = upload(d.inv_freq());
    cuda::launch_rope_leading(mut<bf16>(dx), int64_t{T} * d.Hi, d.Hi, d.D, d.R, ptr<int>(dpos), ptr<double>(dfreq),
                              d.neox, nullptr);
    const Tensor got = download_bf16(dx, x.shape), want = ref_rope_leading(x, pos, d);
    EXPECT_LT(rel_l2(got, want), 4e-3);
    for (int64_t r = 0; r < x.numel() / d.D; ++r)  // lanes past R untouched, and each lane within a bf16 rounding
      for (int c = 0; c < d.D; ++c) {
        const float g = got.data[r * d.D + c], w = want.data[r * d.D + c];
        if (c >= d.R) ASSERT_EQ(g, x.data[r * d.D + c]) << "row " << r << " lane " << c;
        else ASSERT_NEAR(g, w, std::ldexp(std::fabs(w), -8) + 1e-6) << "row " << r << " lane " << c;
      }
  }
}

TEST(CudaDsa, IndexerQKAndWeightsMatchReference) {
  MLA_REQUIRE_GPU();
  cuda::RankContext rc(0, 0);
  const Batch batch = ragged_batch({5, 1, 9}, {0, 63, 130}, 5);
  rc.upload_batch(batch);
  const auto& db = rc.batch();
  const int T = batch.tokens();
  for (const IndexerDims& d : {kTinyIdx, kGlm5Idx, kV32Idx}) {
    SCOPED_TRACE(d.name);
    const int H = d.D == 16 ? 64 : 1024, Lq = d.D == 16 ? 48 : 512;
    const Tensor x = random_bf16({T, H}, 21), q_c = random_bf16({T, Lq}, 22);
    const Tensor wq_b = random_bf16({int64_t{d.Hi} * d.D, Lq}, 23, 1.0f / std::sqrt(float(Lq)));
    const Tensor wk = random_bf16({d.D, H}, 24, 1.0f / std::sqrt(float(H)));
    const Tensor norm_w = random_bf16({d.D}, 25, 0.1f, 1.0f), norm_b = random_bf16({d.D}, 26, 0.1f);
    const Tensor w_proj = random_bf16({d.Hi, H}, 27, 1.0f / std::sqrt(float(H)));
    DeviceBuffer dx = upload_bf16(x), dqc = upload_bf16(q_c), dwq = upload_bf16(wq_b), dwk = upload_bf16(wk);
    DeviceBuffer dnw = upload_bf16(norm_w), dnb = upload_bf16(norm_b), dwp = upload_bf16(w_proj);
    DeviceBuffer dfreq = upload(d.inv_freq());
    DeviceBuffer idx_q = device_zeros(size_t(T) * d.Hi * d.D * 2), k_lin = device_zeros(size_t(T) * d.D * 2);
    DeviceBuffer idx_k = device_zeros(size_t(T) * d.D * 2), idx_w = device_zeros(size_t(T) * d.Hi * 2);
    DeviceBuffer cache = device_zeros(size_t(batch.num_blocks) * kPageSize * d.D * 2);

    cuda::launch_indexer_q(rc.cublas(), rc.stream(), ptr<bf16>(dqc), Lq, ptr<bf16>(dwq), mut<bf16>(idx_q), T, Lq,
                           d.Hi, d.D, d.R, db.i32(db.positions), ptr<double>(dfreq), d.neox);
    cuda::gemm_xwt(rc.cublas(), ptr<bf16>(dx), H, ptr<bf16>(dwk), mut<bf16>(k_lin), d.D, T, H, d.D);
    cuda::launch_indexer_k_finish(ptr<bf16>(k_lin), ptr<bf16>(dnw), ptr<bf16>(dnb), 1e-6f, db.i32(db.positions),
                                  ptr<double>(dfreq), d.R, d.neox, T, d.D, mut<bf16>(idx_k), mut<bf16>(cache),
                                  db.i64(db.slot_mapping), rc.stream());
    cuda::launch_indexer_weights(rc.cublas(), ptr<bf16>(dx), H, ptr<bf16>(dwp), mut<bf16>(idx_w), T, H, d.Hi);

    const Tensor want_q = ref::indexer_q(q_c, wq_b, d.Hi, batch.positions, d.inv_freq(), d.style());
    const Tensor want_k =
        ref::indexer_k(x, wk, norm_w, norm_b, 1e-6, batch.positions, d.inv_freq(), d.style());
    const Tensor want_w = ref::indexer_weights(x, w_proj);
    const Tensor got_q = download_bf16(idx_q, want_q.shape), got_k = download_bf16(idx_k, want_k.shape);
    EXPECT_LT(rel_l2(got_q, want_q), 1e-2);
    EXPECT_LT(rel_l2(got_k, want_k), 1e-2);
    const Tensor got_w = download_bf16(idx_w, want_w.shape);
    EXPECT_LT(rel_l2(got_w, want_w), 1e-2);
    // Each token's idx_k row is also its index cache row.
    const Tensor got_cache = download_bf16(cache, {int64_t{batch.num_blocks} * kPageSize, d.D});
    for (int t = 0; t < T; ++t) {
      const int seq = batch.token_seq[t], s = batch.context_lens[seq] + t - batch.first_token(seq);
      for (int c = 0; c < d.D; ++c)
        ASSERT_EQ(got_cache.data[cache_row(batch, seq, s) * d.D + c], got_k.data[t * d.D + c]) << "token " << t;
    }
    // The plain scale kernel: bf16(x·s), exact for a power of two.
    cuda::launch_scale_bf16(mut<bf16>(idx_w), int64_t{T} * d.Hi, 0.5f, rc.stream());
    const Tensor halved = download_bf16(idx_w, want_w.shape);
    for (int64_t i = 0; i < halved.numel(); ++i) ASSERT_EQ(halved.data[i], 0.5f * got_w.data[i]) << "element " << i;
  }
}

// --- Scores -------------------------------------------------------------------------------------------------

struct ScoreCase {
  std::string name;
  IndexerDims dims;
  std::vector<int> new_lens, ctx_lens;
  bool causal = true;
};

// The reference's scores of every token over the batch's K columns: its visible keys' scores, 0 elsewhere.
std::vector<float> reference_scores(const Tensor& q, const Tensor& w, const Tensor& cache, const Batch& b, int K,
                                    bool causal) {
  const int T = b.tokens();
  std::vector<float> out(static_cast<size_t>(T) * K, 0.f);
  for (int seq = 0; seq < b.num_seqs(); ++seq) {
    const int t0 = b.first_token(seq), n = b.new_lens[seq];
    const Tensor keys = gather_keys(cache, b, seq);
    // Causal: the sequence's queries at once (bottom-right); without the mask each query alone sees every key.
    const int blocks = causal ? 1 : n, per = causal ? n : 1;
    for (int j = 0; j < blocks; ++j) {
      const Tensor s = ref::indexer_scores(rows_of(q, t0 + j * per, per), keys, rows_of(w, t0 + j * per, per));
      for (int r = 0; r < per; ++r)
        for (int64_t c = 0; c < std::min<int64_t>(K, keys.dim(0)); ++c) {
          const float v = s.data[r * keys.dim(0) + c];
          if (v != kNegInf) out[static_cast<size_t>(t0 + j * per + r) * K + c] = v;
        }
    }
  }
  return out;
}

TEST(CudaDsa, ScoresMatchReference) {
  MLA_REQUIRE_GPU();
  const std::vector<ScoreCase> cases = {
      {"tiny_mixed", kTinyIdx, {1, 5, 12, 3}, {0, 37, 64, 130}},
      {"tiny_mixed_no_mask", kTinyIdx, {1, 5, 12, 3}, {0, 37, 64, 130}, false},
      {"glm5_decode", kGlm5Idx, {1, 1, 1, 1, 1, 1, 1, 1}, {5000, 4999, 64, 1, 130, 2047, 2048, 3000}},
      {"glm5_prefill", kGlm5Idx, {64, 7}, {300, 0}},
      {"glm5_prefill_no_mask", kGlm5Idx, {64, 7}, {300, 0}, false},
      {"v32_sq3", kV32Idx, {3, 1, 2}, {200, 70, 0}},
  };
  for (const ScoreCase& c : cases) {
    SCOPED_TRACE(c.name);
    const IndexerDims& d = c.dims;
    cuda::RankContext rc(0, 0);
    const Batch batch = ragged_batch(c.new_lens, c.ctx_lens, 9);
    rc.upload_batch(batch);
    const int T = batch.tokens(), K = max_total(batch) + 5;  // columns past every sequence too
    const Tensor q = random_bf16({T, d.Hi, d.D}, 31), w = random_bf16({T, d.Hi}, 32);
    const Tensor cache = random_bf16({batch.num_blocks, kPageSize, d.D}, 33);
    DeviceBuffer dq = upload_bf16(q), dw = upload_bf16(w), dc = upload_bf16(cache);
    DeviceBuffer scores = device_zeros(size_t(T) * K * 4, 0xFF);  // NaN: a column never written shows
    cuda::launch_index_scores(ptr<bf16>(dq), ptr<bf16>(dw), ptr<bf16>(dc), rc.batch(), T, d.Hi, d.D, K,
                              mut<float>(scores), c.causal, rc.stream());
    const std::vector<float> got = download<float>(scores, size_t(T) * K);
    const std::vector<float> want = reference_scores(q, w, cache, batch, K, c.causal);
    for (int t = 0; t < T; ++t) {
      const int vis = visible(batch, t, c.causal);
      std::vector<float> g(got.begin() + int64_t{t} * K, got.begin() + int64_t{t} * K + vis);
      std::vector<float> e(want.begin() + int64_t{t} * K, want.begin() + int64_t{t} * K + vis);
      double scale = 0;
      for (float v : e) scale = std::max(scale, std::fabs(double(v)));
      EXPECT_LE(rel_l2(g, e), 1e-3) << "token " << t;
      for (int s = 0; s < vis; ++s)
        ASSERT_NEAR(g[s], e[s], 1e-3 * scale + 1e-6) << "token " << t << " key " << s;
      for (int s = vis; s < K; ++s)
        ASSERT_EQ(got[int64_t{t} * K + s], 0.0f) << "token " << t << " column " << s << " (not seen)";
    }
  }
}

// --- Top-k --------------------------------------------------------------------------------------------------

enum class Values { kNormal, kTies, kEqual };

// Scores of the keys each token sees; the columns it does not see hold 1e30 (they must never be read).
std::vector<float> planted_scores(const Batch& b, int K, bool causal, Values kind, uint64_t seed) {
  const int T = b.tokens();
  std::vector<float> s(static_cast<size_t>(T) * K, 1e30f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const float ties[] = {-1.0f, -0.5f, -0.0f, 0.0f, 0.5f, 1.0f, 2.0f};
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < std::min(K, visible(b, t, causal)); ++c)
      s[static_cast<size_t>(t) * K + c] = kind == Values::kNormal ? normal(rng)
                                          : kind == Values::kTies ? ties[rng() % 7]
                                                                  : 0.25f;
  return s;
}

// The reference's selection of each token (topk_keys on its visible scores, −inf elsewhere), ascending, −1 padded.
std::vector<int> reference_topk(const std::vector<float>& scores, const Batch& b, int K, int k, bool causal) {
  const int T = b.tokens();
  std::vector<int> out(static_cast<size_t>(T) * k, -1);
  for (int t = 0; t < T; ++t) {
    const int vis = std::min(K, visible(b, t, causal));
    Tensor row({1, vis});
    for (int c = 0; c < vis; ++c) row.data[c] = scores[static_cast<size_t>(t) * K + c];
    std::vector<int> keys = ref::topk_keys(row, k)[0];
    std::sort(keys.begin(), keys.end());
    std::copy(keys.begin(), keys.end(), out.begin() + int64_t{t} * k);
  }
  return out;
}

struct TopkCase {
  std::string name;
  std::vector<int> new_lens, ctx_lens;
  int k;
  bool causal = true;
};

TEST(CudaDsa, TopkEqualsReferenceSelectionExactly) {
  MLA_REQUIRE_GPU();
  const std::vector<TopkCase> cases = {
      {"tiny", {1, 3, 12, 2}, {0, 5, 37, 130}, 12},
      {"tiny_no_mask", {1, 3, 12, 2}, {0, 5, 37, 130}, 12, false},
      {"glm5_decode", {1, 1, 1, 1, 1, 1}, {5000, 2047, 2046, 1, 3000, 4095}, 2048},
      {"glm5_prefill", {40, 3}, {2030, 9000}, 2048},
      // Longer than the kernel's shared key cache (32768): every row read from global memory.
      {"long_rows", {2, 1}, {33000, 2100}, 2048},
  };
  cuda::RankContext rc(0, 0);
  for (const TopkCase& c : cases) {
    const Batch batch = ragged_batch(c.new_lens, c.ctx_lens, 13);
    rc.upload_batch(batch);
    const int T = batch.tokens(), K = max_total(batch) + 3;
    for (Values kind : {Values::kNormal, Values::kTies, Values::kEqual}) {
      SCOPED_TRACE(c.name + " values " + std::to_string(static_cast<int>(kind)));
      const std::vector<float> scores = planted_scores(batch, K, c.causal, kind, 41);
      const std::vector<int> want = reference_topk(scores, batch, K, c.k, c.causal);
      DeviceBuffer ds = upload(scores);
      DeviceBuffer ti = device_zeros(size_t(T) * c.k * 4, 0x7F), tf = device_zeros(size_t(T) * c.k * 4, 0x7F);
      cuda::launch_topk(ptr<float>(ds), rc.batch(), T, K, c.k, c.causal, mut<float>(tf), mut<int>(ti), 0,
                        rc.stream());
      const std::vector<int> got = download<int>(ti, size_t(T) * c.k);
      const std::vector<float> got_f = download<float>(tf, size_t(T) * c.k);
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < c.k; ++j) {
          const size_t i = static_cast<size_t>(t) * c.k + j;
          ASSERT_EQ(got[i], want[i]) << "token " << t << " slot " << j << " (sees " << visible(batch, t, c.causal)
                                     << " keys)";
          ASSERT_EQ(got_f[i], static_cast<float>(want[i])) << "token " << t << " slot " << j;
        }
    }
  }
}

TEST(CudaDsa, TopkShiftPlantsAnOffByOne) {
  MLA_REQUIRE_GPU();
  cuda::RankContext rc(0, 0);
  const Batch batch = ragged_batch({2, 1}, {100, 3}, 17);
  rc.upload_batch(batch);
  const int T = batch.tokens(), K = max_total(batch), k = 16;
  const std::vector<float> scores = planted_scores(batch, K, true, Values::kNormal, 43);
  const std::vector<int> want = reference_topk(scores, batch, K, k, true);
  DeviceBuffer ds = upload(scores), tf = device_zeros(size_t(T) * k * 4);
  cuda::launch_topk(ptr<float>(ds), rc.batch(), T, K, k, true, mut<float>(tf), nullptr, 1, rc.stream());
  const std::vector<float> got = download<float>(tf, size_t(T) * k);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i] < 0 ? -1.0f : want[i] + 1.0f) << "slot " << i;
}

// --- Sparse attention ---------------------------------------------------------------------------------------

// A selection per token: the reference's top-k of random scores over the keys it sees (fewer than k: all, padded).
std::vector<int> random_selection(const Batch& b, int k, uint64_t seed, bool causal = true) {
  const int K = max_total(b);
  return reference_topk(planted_scores(b, K, causal, Values::kNormal, seed), b, K, k, causal);
}
// The keys of token t in that selection (padding dropped).
std::vector<int> keys_of(const std::vector<int>& sel, int t, int k) {
  std::vector<int> keys;
  for (int j = 0; j < k; ++j)
    if (sel[static_cast<size_t>(t) * k + j] >= 0) keys.push_back(sel[static_cast<size_t>(t) * k + j]);
  return keys;
}

// [T, Nl, A] ++ [T, Nl or 1, B] -> [T, Nl, A+B] (b broadcast over heads when it has one).
Tensor concat_heads(const Tensor& a, const Tensor& b, bool b_shared) {
  const int64_t T = a.dim(0), Nl = a.dim(1), A = a.dim(2), B = b.dim(-1);
  Tensor out({T, Nl, A + B});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Nl; ++h) {
      std::copy_n(a.ptr() + (t * Nl + h) * A, A, out.ptr() + (t * Nl + h) * (A + B));
      std::copy_n(b.ptr() + (b_shared ? t : t * Nl + h) * B, B, out.ptr() + (t * Nl + h) * (A + B) + A);
    }
  return out;
}

// The bounds: the output is bf16 (2^-9 relative per element), the flash kernels round P to bf16 before P·V and
// the absorbed kernel splits it in two bf16 parts, and the MHA form's context rows are up-projected to bf16 on the
// device where the reference keeps fp32; together a few 1e-3 of relative L2, and 1e-2 leaves room for them. The lse
// is fp32 over scores of the same bf16 keys (the context's rounded as above): 1e-3 relative.
void expect_attention_close(const Tensor& got_out, const std::vector<float>& got_lse, const ref::Attn& want,
                            const std::string& what) {
  EXPECT_LE(rel_l2(got_out, want.out), 1e-2) << what;
  const int64_t rows = want.lse.numel(), Dv = want.out.numel() / rows;
  for (int64_t r = 0; r < rows; ++r) {
    const float l = want.lse.data[r];
    if (l == kNegInf) {
      EXPECT_EQ(got_lse[r], kNegInf) << what << " row " << r;
      for (int64_t d = 0; d < Dv; ++d) ASSERT_EQ(got_out.data[r * Dv + d], 0.0f) << what << " row " << r;
    } else {
      EXPECT_NEAR(got_lse[r], l, 1e-3 * std::max(1.0f, std::fabs(l))) << what << " row " << r;
    }
  }
}

struct MqaCase {
  std::string name;
  int Nl, L, R, k;
  std::vector<int> new_lens, ctx_lens;
  int empty_token = -1;  // >= 0: that token's selection is all padding
};

TEST(CudaDsa, SparseMqaMatchesAttendSelected) {
  MLA_REQUIRE_GPU();
  const std::vector<MqaCase> cases = {
      {"tiny", 8, 32, 8, 12, {1, 1, 1, 2}, {0, 37, 130, 20}, 1},
      // 2 head groups, 8 tokens: several splits of the 32 key tiles, then the combine.
      {"glm5_decode_k2048", 64, 512, 64, 2048, {1, 1, 1, 1, 1, 1, 1, 1}, {5000, 4999, 64, 1, 130, 2047, 2048, 3000},
       6},
      // One tile of keys: one split, bf16 written by the kernel itself.
      {"glm5_decode_k64", 64, 512, 64, 64, {1, 1, 2}, {700, 10, 129}, 0},
      {"heads_20_k200", 20, 512, 64, 200, {1, 1}, {1000, 150}},
  };
  for (const MqaCase& c : cases) {
    SCOPED_TRACE(c.name);
    cuda::RankContext rc(0, 0);
    const Batch batch = ragged_batch(c.new_lens, c.ctx_lens, 19);
    rc.upload_batch(batch);
    const int T = batch.tokens(), W = c.L + c.R;
    const float scale = 1.0f / std::sqrt(static_cast<float>(192 + c.R));
    const Tensor q_lat = random_bf16({T, c.Nl, c.L}, 51), q_pe = random_bf16({T, c.Nl, c.R}, 52);
    const Tensor cache = random_bf16({batch.num_blocks, kPageSize, W}, 53);
    std::vector<int> sel = random_selection(batch, c.k, 54);
    if (c.empty_token >= 0) std::fill_n(sel.begin() + int64_t{c.empty_token} * c.k, c.k, -1);

    DeviceBuffer dql = upload_bf16(q_lat), dqp = upload_bf16(q_pe), dc = upload_bf16(cache), dsel = upload(sel);
    DeviceBuffer out = device_zeros(size_t(T) * c.Nl * c.L * 2, 0xFF), lse = device_zeros(size_t(T) * c.Nl * 4, 0xFF);
    cuda::SparseMqaArgs a;
    a.q_latent = ptr<bf16>(dql);
    a.q_pe_rope = ptr<bf16>(dqp);
    a.cache = ptr<bf16>(dc);
    a.topk = ptr<int>(dsel);
    a.k = c.k;
    a.T = T;
    a.Nl = c.Nl;
    a.L = c.L;
    a.R = c.R;
    a.scale = scale;
    a.attn_latent = mut<bf16>(out);
    a.lse = mut<float>(lse);
    cuda::launch_attention_mqa_sparse(a, rc);
    const Tensor got = download_bf16(out, {T, c.Nl, c.L});
    const std::vector<float> got_lse = download<float>(lse, size_t(T) * c.Nl);

    ref::Attn want{Tensor({T, c.Nl, c.L}), Tensor({T, c.Nl})};
    const Tensor Q = concat_heads(q_lat, q_pe, false);
    for (int seq = 0; seq < batch.num_seqs(); ++seq) {
      const Tensor keys = gather_keys(cache, batch, seq);  // [total, L+R]; value = its first L lanes
      Tensor values({keys.dim(0), c.L});
      for (int64_t s = 0; s < keys.dim(0); ++s) std::copy_n(keys.ptr() + s * W, c.L, values.ptr() + s * c.L);
      const int t0 = batch.first_token(seq), n = batch.new_lens[seq];
      std::vector<std::vector<int>> chosen;
      for (int t = t0; t < t0 + n; ++t) chosen.push_back(keys_of(sel, t, c.k));
      const ref::Attn part = ref::attend_selected(rows_of(Q, t0, n), keys, values, scale, chosen);
      std::copy(part.out.data.begin(), part.out.data.end(), want.out.ptr() + int64_t{t0} * c.Nl * c.L);
      std::copy(part.lse.data.begin(), part.lse.data.end(), want.lse.ptr() + int64_t{t0} * c.Nl);
    }
    expect_attention_close(got, got_lse, want, c.name);
  }
}

struct MhaCase {
  std::string name;
  int Nl, P, R, V, L, k;
  std::vector<int> new_lens, ctx_lens;
  bool causal = true;     // false: the selection may pick keys after the token (as index-causal-leak does)
  int empty_token = -1;   // >= 0: that token's selection is all padding
};

// Every kernel version: 1 the gather kernel, 2-4 the flash kernels with the selection as bitmaps (4 on wgmma where
// the GPU and dims allow, else 3).
TEST(CudaDsa, SparseMhaMatchesAttendSelected) {
  MLA_REQUIRE_GPU();
  const std::vector<MhaCase> cases = {
      {"tiny", 8, 16, 8, 12, 32, 12, {4, 1, 6}, {0, 37, 130}},
      {"tiny_noncausal_empty", 8, 16, 8, 12, 32, 12, {4, 1, 6}, {0, 37, 130}, false, 5},
      // GLM-5 at tp 8 (8 heads a rank): chunked prefill over a context longer than k, and a short one.
      {"glm5_chunked", 8, 192, 64, 256, 512, 2048, {40, 24}, {3000, 100}},
      {"glm5_prefill", 8, 192, 64, 256, 512, 2048, {64}, {0}},
      // Several query blocks and a k well under the keys, so that both passes are sparse; a selection that looks
      // ahead; a token that selects nothing.
      {"glm5_sparse", 8, 192, 64, 256, 512, 96, {300, 41}, {0, 700}},
      {"glm5_noncausal_empty", 8, 192, 64, 256, 512, 96, {260}, {200}, false, 130},
  };
  for (const MhaCase& c : cases) {
    SCOPED_TRACE(c.name);
    cuda::RankContext rc(0, 0);
    const Batch batch = ragged_batch(c.new_lens, c.ctx_lens, 23);
    rc.upload_batch(batch);
    const int T = batch.tokens(), W = c.L + c.R;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.P + c.R));
    const Tensor q_nope = random_bf16({T, c.Nl, c.P}, 61), q_pe = random_bf16({T, c.Nl, c.R}, 62);
    const Tensor k_nope = random_bf16({T, c.Nl, c.P}, 63), k_pe = random_bf16({T, c.R}, 64);
    const Tensor v = random_bf16({T, c.Nl, c.V}, 65);
    const Tensor cache = random_bf16({batch.num_blocks, kPageSize, W}, 66);
    const Tensor w_kvb = random_bf16({int64_t{c.Nl} * (c.P + c.V), c.L}, 67, 1.0f / std::sqrt(float(c.L)));
    std::vector<int> sel = random_selection(batch, c.k, 68, c.causal);
    if (c.empty_token >= 0) std::fill_n(sel.begin() + int64_t{c.empty_token} * c.k, c.k, -1);

    // Reference keys of each sequence in key order: the context up-projected (fp32), then its new tokens.
    ref::Attn want{Tensor({T, c.Nl, c.V}), Tensor({T, c.Nl})};
    const Tensor Q = concat_heads(q_nope, q_pe, false);
    for (int seq = 0; seq < batch.num_seqs(); ++seq) {
      const int t0 = batch.first_token(seq), n = batch.new_lens[seq], ctx = batch.context_lens[seq];
      const Tensor rows = gather_keys(cache, batch, seq);
      Tensor kv_c({ctx, c.L}), c_pe({ctx, c.R});
      for (int s = 0; s < ctx; ++s) {
        std::copy_n(rows.ptr() + int64_t{s} * W, c.L, kv_c.ptr() + int64_t{s} * c.L);
        std::copy_n(rows.ptr() + int64_t{s} * W + c.L, c.R, c_pe.ptr() + int64_t{s} * c.R);
      }
      Tensor ctx_k_nope, ctx_v;
      if (ctx > 0) ref::split_per_head(ref::linear(kv_c, w_kvb), c.Nl, c.P, c.V, ctx_k_nope, ctx_v);
      const Tensor new_k = concat_heads(rows_of(k_nope, t0, n), rows_of(k_pe, t0, n), true);
      const Tensor ctx_k = ctx > 0 ? concat_heads(ctx_k_nope, c_pe, true) : Tensor();
      const int64_t Dk = c.P + c.R, total = ctx + n;
      Tensor keys({total, c.Nl, Dk}), values({total, c.Nl, c.V});
      if (ctx > 0) {
        std::copy(ctx_k.data.begin(), ctx_k.data.end(), keys.ptr());
        std::copy(ctx_v.data.begin(), ctx_v.data.end(), values.ptr());
      }
      std::copy(new_k.data.begin(), new_k.data.end(), keys.ptr() + int64_t{ctx} * c.Nl * Dk);
      const Tensor new_v = rows_of(v, t0, n);
      std::copy(new_v.data.begin(), new_v.data.end(), values.ptr() + int64_t{ctx} * c.Nl * c.V);
      std::vector<std::vector<int>> chosen;
      for (int t = t0; t < t0 + n; ++t) chosen.push_back(keys_of(sel, t, c.k));
      const ref::Attn part = ref::attend_selected(rows_of(Q, t0, n), keys, values, scale, chosen);
      std::copy(part.out.data.begin(), part.out.data.end(), want.out.ptr() + int64_t{t0} * c.Nl * c.V);
      std::copy(part.lse.data.begin(), part.lse.data.end(), want.lse.ptr() + int64_t{t0} * c.Nl);
    }

    DeviceBuffer dqn = upload_bf16(q_nope), dqp = upload_bf16(q_pe), dkn = upload_bf16(k_nope);
    DeviceBuffer dkp = upload_bf16(k_pe), dv = upload_bf16(v), dc = upload_bf16(cache), dw = upload_bf16(w_kvb);
    DeviceBuffer dsel = upload(sel);
    for (const int kernel : {1, 2, 3, 4}) {
      const std::string what = c.name + " kernel " + std::to_string(kernel);
      DeviceBuffer out = device_zeros(size_t(T) * c.Nl * c.V * 2, 0xFF);
      DeviceBuffer lse = device_zeros(size_t(T) * c.Nl * 4, 0xFF);
      cuda::SparseMhaArgs a;
      a.q_nope = ptr<bf16>(dqn);
      a.q_pe_rope = ptr<bf16>(dqp);
      a.k_nope = ptr<bf16>(dkn);
      a.k_pe_rope = ptr<bf16>(dkp);
      a.v = ptr<bf16>(dv);
      a.cache = ptr<bf16>(dc);
      a.w_kvb = ptr<bf16>(dw);
      a.topk = ptr<int>(dsel);
      a.k = c.k;
      a.T = T;
      a.Nl = c.Nl;
      a.P = c.P;
      a.R = c.R;
      a.V = c.V;
      a.L = c.L;
      a.scale = scale;
      a.kernel = kernel;
      a.attn_out = mut<bf16>(out);
      a.lse = mut<float>(lse);
      cuda::launch_attention_mha_sparse(a, rc);
      const Tensor got = download_bf16(out, {T, c.Nl, c.V});
      expect_attention_close(got, download<float>(lse, size_t(T) * c.Nl), want, what);
    }
  }
}

}  // namespace
}  // namespace mla::gputest
