// Hopper (sm_90a) building blocks for the warpgroup kernels: shared-memory matrix descriptors for the 128-byte
// swizzled layout, wgmma (warpgroup MMA, bf16 -> fp32) with its fence / commit / wait, mbarriers, TMA 2-D and 3-D
// tile loads and named barriers (their host side, tensor maps and the sm_90a check: tensor_map.cuh). Everything here
// compiles only for sm_90a (the `a` architecture carries wgmma and the TMA instructions); callers guard their kernels
// with MLA_SM90A.
//
// The one layout used: a tile of rows of 64 bf16 (128 bytes) stored as 8-row atoms of 1024 bytes, the 16-byte unit
// j of row r at unit j XOR (r mod 8) of the row (TMA's CU_TENSOR_MAP_SWIZZLE_128B writes exactly this). A matrix
// of 64-column chunks keeps each chunk's rows contiguous (64 rows = 8 KB a chunk). Read as
//   K-major (A, or B with k along the row): 8-row groups SBO = 1024 bytes apart, k-step of 16 = 32 bytes further
//     along the row (LBO unused);
//   N-major (B with n along the row, rows = k): 64-column chunks LBO bytes apart, 8-row groups SBO = 1024 bytes.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_SM90A 1
#endif

namespace mla::cuda::sm90 {

// Descriptor of a 128-byte-swizzled operand at shared address `addr` (its atom 1024-byte aligned).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16 |
         static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32 | 1ull << 62;
}

#ifdef MLA_SM90A
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma's issue and its wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulators of an m64nN wgmma are N / 2 fp32 registers a thread (d[]), its operands %0 .. %(N/2 − 1).
#define MLA_WG_D8(i)                                                                                             \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define MLA_WG_D32(i) MLA_WG_D8(i), MLA_WG_D8(i + 8), MLA_WG_D8(i + 16), MLA_WG_D8(i + 24)
#define MLA_WG_D64 MLA_WG_D32(0), MLA_WG_D32(32)
#define MLA_WG_D128 MLA_WG_D32(0), MLA_WG_D32(32), MLA_WG_D32(64), MLA_WG_D32(96)
#define MLA_WG_REGS32 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
  "%27,%28,%29,%30,%31}"
#define MLA_WG_REGS64 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
  "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51," \
  "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define MLA_WG_REGS128 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
  "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51," \
  "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76," \
  "%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100," \
  "%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120," \
  "%121,%122,%123,%124,%125,%126,%127}"

// d (64x64) += A (shared, K-major) · B (shared, K-major: 64 rows of k)
__device__ __forceinline__ void mma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MLA_WG_REGS32
               ", %32, %33, p, 1, 1, 0, 0;\n}\n"
               : MLA_WG_D32(0)
               : "l"(da), "l"(db), "r"(scale_d));
}

// d (64x64) += A (registers, the mma.m16n8k16 A fragment of the warp's 16 rows) · B (shared, K-major)
__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MLA_WG_REGS32
               ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
               : MLA_WG_D32(0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// d (64x128) += A (shared, K-major) · B (shared, K-major: 128 rows of k)
__device__ __forceinline__ void mma_m64n128k16_ss(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MLA_WG_REGS64
               ", %64, %65, p, 1, 1, 0, 0;\n}\n"
               : MLA_WG_D64
               : "l"(da), "l"(db), "r"(scale_d));
}

// d (64x128) += A (registers) · B (shared, N-major: 16 rows of 128 columns)
__device__ __forceinline__ void mma_m64n128k16_rs_bmn(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                                      int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MLA_WG_REGS64
               ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
               : MLA_WG_D64
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// d (64x256) += A (shared, K-major) · B (shared, N-major: 16 rows of 256 columns)
__device__ __forceinline__ void mma_m64n256k16_ss_bmn(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " MLA_WG_REGS128
               ", %128, %129, p, 1, 1, 0, 1;\n}\n"
               : MLA_WG_D128
               : "l"(da), "l"(db), "r"(scale_d));
}

// d (64x256) += A (registers) · B (shared, N-major)
__device__ __forceinline__ void mma_m64n256k16_rs_bmn(float (&d)[128], const uint32_t (&a)[4], uint64_t db,
                                                      int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " MLA_WG_REGS128
               ", {%128,%129,%130,%131}, %132, p, 1, 1, 1;\n}\n"
               : MLA_WG_D128
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// Generic-proxy writes to shared memory (st.shared) made visible to the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised mbarriers visible to the async proxy (TMA) before a __syncthreads.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// TMA: the box at (c0 along the inner dimension, c1 along the outer) of `map` into shared memory at dst; the
// bytes count against `bar`'s expected transaction.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// The same for a 3-D map: the box at (c0 inner, c1, c2 outer).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// A warpgroup's register share: give back down to N registers a thread (a producer), or take up to N (consumers);
// every warp of the warpgroup runs the same one.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Named barriers (0 is __syncthreads): `count` threads, a multiple of 32, meet at barrier `id`.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
#endif  // MLA_SM90A

}  // namespace mla::cuda::sm90
