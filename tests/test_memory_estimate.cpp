// The memory estimate counts what the reference holds: one [64, keys] score block per head in flight (the query rows
// are taken 64 at a time), never a [tokens, keys] matrix per thread.
#include <gtest/gtest.h>

#include "core/model/config.h"
#include "harness/run/memory_estimate.h"
#include "reference/stages.h"

namespace mla {
namespace {

double scores_bytes(const MemoryEstimate& e) {
  for (const auto& p : e.parts)
    if (p.what == "attention scores") return p.bytes;
  ADD_FAILURE() << "no attention scores part in " << e.breakdown();
  return 0;
}

MemoryEstimate estimate(Mode mode, AttentionForm form, int tokens, int context, int threads) {
  static const MlaConfig cfg = *find_preset("tiny");
  RunSpec spec;
  spec.mode = mode;
  spec.form = form;
  spec.tokens = tokens;
  if (context > 0) spec.context = {context};
  MemoryEstimateInput in;
  in.cfg = &cfg;
  in.spec = &spec;
  in.threads = threads;
  return estimate_host_memory(in);
}

TEST(MemoryEstimate, ScoresAreOneRowBlockPerThread) {
  const int T = 20000, threads = 8;  // tiny has 8 heads: 8 in flight
  const double block = 4.0 * ref::kAttendRowBlock * T;  // one head's score block, bytes
  const double scores = scores_bytes(estimate(Mode::Mode_prefill, AttentionForm::AttentionForm_mha, T, 0, threads));
  EXPECT_GE(scores, threads * block);
  // The blocks and the stage's own copies (a few rows of Q, K and V per token): far below one [T, T] matrix.
  EXPECT_LT(scores, threads * block + 4.0 * T * 8 * 64 * 4) << "bytes " << scores;
  EXPECT_LT(scores, 4.0 * T * T / 10);
}

TEST(MemoryEstimate, ScoresOfAChunkOverItsContextAndOfADecodeStep) {
  const int threads = 8;
  const double chunk = scores_bytes(estimate(Mode::Mode_chunked, AttentionForm::AttentionForm_mha, 4096, 100000, threads));
  EXPECT_GE(chunk, threads * 4.0 * ref::kAttendRowBlock * (100000 + 4096));
  EXPECT_LT(chunk, 4.0 * 4096 * 100000);  // less than one [tokens, keys] matrix, let alone one per thread
  const double step = scores_bytes(estimate(Mode::Mode_decode, AttentionForm::AttentionForm_absorbed, 1, 100000, threads));
  EXPECT_GE(step, threads * 4.0 * 100001);
  EXPECT_LT(step, threads * 4.0 * ref::kAttendRowBlock * 100001);
}

}  // namespace
}  // namespace mla
