// attention_mha version 4's block order (kernels/flash_block_order.h): every (head, query block) of a sequence's
// grid is one block, exactly once, whatever the group size; within a group the query blocks come longest first
// with the group's heads side by side; and the group size follows the L2 budget.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/flash_block_order.h"

namespace mla {
namespace {

using cuda::flash_block;
using cuda::flash_head_group;

TEST(FlashBlockOrder, EveryHeadAndQueryBlockExactlyOnce) {
  for (const int heads : {1, 2, 3, 7, 16, 128, 130})
    for (const int nq : {1, 2, 5, 32})
      for (const int g : {1, 2, 3, 8, 16, 128, heads}) {
        if (g > heads) continue;  // flash_head_group never returns more than the heads
        std::vector<int> seen(static_cast<size_t>(heads * nq), 0);
        for (int id = 0; id < heads * nq; ++id) {
          const auto b = flash_block(id, nq, heads, g);
          ASSERT_GE(b.head, 0);
          ASSERT_LT(b.head, heads);
          ASSERT_GE(b.qblock, 0);
          ASSERT_LT(b.qblock, nq);
          ++seen[static_cast<size_t>(b.head * nq + b.qblock)];
        }
        for (int i = 0; i < heads * nq; ++i)
          ASSERT_EQ(seen[static_cast<size_t>(i)], 1)
              << "heads " << heads << " nq " << nq << " group " << g << ": head " << i / nq << " block " << i % nq;
      }
}

TEST(FlashBlockOrder, GroupsOfHeadsLongestBlocksFirst) {
  const int heads = 20, nq = 4, group = 8;  // groups of 8, 8 and 4 heads
  std::vector<cuda::FlashBlock> order;
  for (int id = 0; id < heads * nq; ++id) order.push_back(flash_block(id, nq, heads, group));
  // The first group's 32 blocks: heads 0..7 at query block 3, then 0..7 at 2, ...
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(order[i].head, i % 8) << i;
    EXPECT_EQ(order[i].qblock, 3 - i / 8) << i;
  }
  // The last group has 4 heads: 16..19, longest first.
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(order[64 + i].head, 16 + i % 4) << i;
    EXPECT_EQ(order[64 + i].qblock, 3 - i / 4) << i;
  }
  // One group of every head is the plain order: every head's longest block first.
  for (int id = 0; id < heads * nq; ++id) {
    const auto b = flash_block(id, nq, heads, heads);
    EXPECT_EQ(b.head, id % heads);
    EXPECT_EQ(b.qblock, nq - 1 - id / heads);
  }
}

TEST(FlashBlockOrder, HeadGroupFollowsTheL2Budget) {
  const int64_t l2 = 50 << 20;  // an H100's or H200's 50 MB
  // DeepSeek-V3 at T 4096: K (128 lanes) and V (128) of a head are 2 MiB; half of L2 holds 12 of them.
  EXPECT_EQ(flash_head_group(l2, 4096, 128, 128, 128), 12);
  EXPECT_EQ(flash_head_group(l2, 4096, 128, 128, 8), 8);       // never more than the heads
  EXPECT_EQ(flash_head_group(l2, 1 << 20, 128, 128, 128), 1);  // a million keys: one head at a time
  EXPECT_EQ(flash_head_group(l2, 0, 128, 128, 16), 16);        // no keys: any order is as good
}

}  // namespace
}  // namespace mla
