// The probe's row kernel, for the tensors the tile kernel (probe_tiles.cu) does not take: fp32 tensors such as lse,
// odd widths, heads narrower than 32 columns. One warp per token row, warp-level reductions only: one pass over the
// row for the finite sum, sum of squares, absmax, NaN/Inf counts, the checksum's partial sum and the sketch (in
// double); a second pass (from L1/L2) for the head L2. The token L2 is NaN when the row has a NaN, else Inf when it
// has an Inf, as on the host. The unit of stats is the row.
#include "kernels/cuda_check.cuh"
#include "kernels/probe_kernels.cuh"
#include "kernels/probe_stats_device.cuh"

namespace mla::cuda {

namespace {
using namespace probe_device;

constexpr int kThreads = 256;  // at most: fewer when the rows are too few for a block on every SM (launch_probe_rows)

// One step of warp_sum_transposed: lanes `o` apart exchange halves of their first 2·o values.
template <int O>
__device__ __forceinline__ void transposed_step(double (&v)[kSketchLanes], int lane) {
  const bool upper = lane & O;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const double lo = v[i], hi = v[i + O];
    const double recv = __shfl_xor_sync(0xffffffffu, upper ? lo : hi, O);
    v[i] = (upper ? hi : lo) + recv;
  }
}

// Lane k gets the warp's sum of v[k] (32 values a lane), bit for bit the sum warp_sum(v[k]) gives (the same two
// values added at each of its five steps, own + partner's), in 31 shuffles instead of 160: at each step a lane
// keeps half of its values, whose partner's halves it takes, and sends the other half. (Each step's count is a
// constant, so that v stays in registers.)
__device__ __forceinline__ double warp_sum_transposed(double (&v)[kSketchLanes], int lane) {
  static_assert(kSketchLanes == 32, "a value per lane");
  transposed_step<16>(v, lane);
  transposed_step<8>(v, lane);
  transposed_step<4>(v, lane);
  transposed_step<2>(v, lane);
  transposed_step<1>(v, lane);
  return v[0];
}

template <class T>
__global__ void __launch_bounds__(kThreads) probe_stats_kernel(const ProbeStatsArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= a.rows) return;
  const T* x = static_cast<const T*>(a.data) + r * a.cols;
  // Column c's checksum multiplier is H(r)·A^(c >> 3) + step·(c & 7); a lane's columns step by 32, its power by A^4.
  const uint64_t row_hash = checksum_row_hash(static_cast<uint64_t>(r));
  uint64_t power = pow_mod64(kChecksumBase, static_cast<uint64_t>(lane >> 3));
  constexpr uint64_t kA4 = pow_mod64(kChecksumBase, 4);
  const auto value = [&](int64_t c) {
    if constexpr (sizeof(T) == 2) return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(x)[c]);
    else return x[c];
  };
  RowAcc acc;
  double skacc[kSketchLanes];
#pragma unroll
  for (int k = 0; k < kSketchLanes; ++k) skacc[k] = 0;
  // Column c's value into the lane's sums, in the order of the columns (the additions, and so the bits, are the
  // same however far ahead the values were loaded).
  const auto take = [&](int64_t c, float v) {
    uint32_t bits;
    if constexpr (sizeof(T) == 2) bits = __float_as_uint(v) >> 16;  // exact: v is the bf16 value
    else bits = __float_as_uint(v);
    acc.add(v, bits, checksum_multiplier_at(row_hash, power, static_cast<uint64_t>(c)));
    power *= kA4;
    if (a.sketch_bits) {
      const double d = v;
      const uint32_t* words = a.sketch_bits + (c / 8) * 8;  // lane k: word k % 8, bit sign_bit(k / 8, c % 8)
      const int i = static_cast<int>(c & 7);
#pragma unroll
      for (int k = 0; k < kSketchLanes; ++k) skacc[k] += ((words[k & 7] >> sign_bit(k >> 3, i)) & 1u) ? -d : d;
    }
  };
  // A warp a row leaves few warps per SM (decode's 64 rows of DSA's idx_scores: one), so each lane loads kAhead
  // columns at once before it adds them: kAhead loads in flight instead of one round trip to memory per column.
  constexpr int kAhead = 32;
  int64_t c = lane;
  for (; c + 32 * (kAhead - 1) < a.cols; c += 32 * kAhead) {
    float v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) v[u] = value(c + 32 * u);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) take(c + 32 * u, v[u]);
  }
  for (; c < a.cols; c += 32) take(c, value(c));
  warp_fold(acc);
  if (lane == 0) store_row(a, r, acc);
  if (a.sketch_bits) {
    const double s = warp_sum_transposed(skacc, lane);
    a.sketch_out[r * kSketchLanes + lane] = static_cast<float>(s * kSketchScale);
  }
  if (a.heads > 0) {
    const int64_t X = a.cols / a.heads;
    if (X < 32) {  // narrow heads (lse: one column each): a lane per head
      for (int h = lane; h < a.heads; h += 32) {
        double s = 0;
        for (int64_t c = 0; c < X; ++c) s += static_cast<double>(value(h * X + c)) * value(h * X + c);
        a.head_l2[r * a.heads + h] = static_cast<float>(sqrt(s));
      }
    } else {
      for (int h = 0; h < a.heads; ++h) {
        double s = 0;
        for (int64_t c = lane; c < X; c += 32) s += static_cast<double>(value(h * X + c)) * value(h * X + c);
        s = warp_sum(s);
        if (lane == 0) a.head_l2[r * a.heads + h] = static_cast<float>(sqrt(s));
      }
    }
  }
}
}  // namespace

void launch_probe_rows(const ProbeStatsArgs& a, int sms, cudaStream_t stream) {
  // A warp a row, as many rows a block as leave a block for every SM (decode's 64 rows of DSA's idx_scores, 4097
  // to 16385 columns: on 8 SMs in blocks of 8 warps, on 64 in blocks of one); a row's work is the same either way.
  int warps = kThreads / 32;
  while (warps > 1 && (a.rows + warps - 1) / warps < sms) warps /= 2;
  const auto blocks = static_cast<unsigned>((a.rows + warps - 1) / warps);
  if (a.dtype == DType::DType_bf16)
    probe_stats_kernel<bf16><<<blocks, warps * 32, 0, stream>>>(a);
  else
    probe_stats_kernel<float><<<blocks, warps * 32, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
