// Helpers shared by the reference-engine tests (tests/test_<stage>.cpp, test_attention_forms.cpp): presets,
// element coordinates for failure messages, bit-identical comparison, and a paged step layout built by hand.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/tensor.h"

namespace mla::test {

inline std::string seed_trace(uint64_t seed) { return "seed " + std::to_string(seed); }

inline MlaConfig preset(const char* name) {
  auto c = find_preset(name);
  if (!c) throw std::runtime_error(std::string("no preset ") + name);
  return *c;
}

// "[t, h, c]" of a flat index into `shape` (row-major).
inline std::string coords(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> c(shape.size());
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    c[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  return shape_string(c);
}

inline void expect_identical(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape, want.shape) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    // memcmp so NaN poison compares equal to itself.
    if (std::memcmp(&got.data[i], &want.data[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": differs at " << coords(got.shape, i) << " got " << got.data[i] << " want "
                    << want.data[i];
      return;
    }
  }
}

// A step layout built here (not by make_batch): pages handed out in a shuffled order (never the identity: page 0
// is not first), a spare page for unused slots.
inline Batch shuffled_batch(const std::vector<int>& new_lens, const std::vector<int>& ctx, uint64_t seed) {
  Batch b;
  b.new_lens = new_lens;
  b.context_lens = ctx;
  int total = 0, most = 0;
  for (size_t i = 0; i < new_lens.size(); ++i) {
    const int p = (ctx[i] + new_lens[i] + kPageSize - 1) / kPageSize;
    total += p;
    most = std::max(most, p);
  }
  b.max_blocks = most + 1;
  b.num_blocks = total + 2;
  std::vector<int> ids(b.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(seed);
  do std::shuffle(ids.begin(), ids.end(), rng);
  while (ids.front() == 0);
  b.block_table.assign(new_lens.size() * b.max_blocks, ids.back());
  int next = 0;
  for (size_t i = 0; i < new_lens.size(); ++i) {
    const int p = (ctx[i] + new_lens[i] + kPageSize - 1) / kPageSize;
    for (int j = 0; j < p; ++j) b.block_table[i * b.max_blocks + j] = ids[next++];
    for (int t = 0; t < new_lens[i]; ++t) {
      b.positions.push_back(ctx[i] + t);
      b.token_seq.push_back(static_cast<int>(i));
    }
  }
  return b;
}

}  // namespace mla::test
