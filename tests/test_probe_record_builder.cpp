// The probe record builder (core/engine/probe_record_builder.h), the CUDA engine's worker that ships queued
// probes and builds their records off the launching thread: records come back in push order whatever order the
// jobs complete in, take(false) never skips a job that is not built yet, every queued job is shipped before the
// oldest one is waited for, a failure hands back the records before it and drops the rest, and clear() and the
// destructor do not wait for queued jobs. Jobs here are plain functions (on the GPU they are ProbeCapture slots).
#include "core/engine/probe_record_builder.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace mla {
namespace {

using namespace std::chrono_literals;

ProbeRecord record(uint64_t tag) {
  ProbeRecord r;
  r.checksum = tag;
  return r;
}

// A job that finishes only once opened (from the test's thread), and says when its ship and finish began.
struct Gate {
  std::atomic<bool> open{false}, shipped{false}, finishing{false};
  ProbeRecordBuilder::Job job(uint64_t tag) {
    return {[this] { shipped = true; },
            [this, tag] {
              finishing = true;
              while (!open) std::this_thread::sleep_for(1ms);
              return record(tag);
            }};
  }
};

template <class F>
bool eventually(F done) {
  for (int i = 0; i < 5000 && !done(); ++i) std::this_thread::sleep_for(1ms);
  return done();
}

std::vector<uint64_t> tags(const std::vector<ProbeRecord>& recs) {
  std::vector<uint64_t> t;
  for (const auto& r : recs) t.push_back(r.checksum);
  return t;
}

TEST(ProbeRecordBuilder, RecordsComeBackInPushOrderWhateverTheirTimes) {
  ProbeRecordBuilder b;
  std::vector<uint64_t> want;
  for (uint64_t i = 0; i < 40; ++i) {
    const auto pause = std::chrono::microseconds((i * 7919) % 300);  // uneven build times
    b.push({[] {}, [i, pause] {
              std::this_thread::sleep_for(pause);
              return record(i);
            }});
    want.push_back(i);
  }
  std::vector<ProbeRecord> got;
  b.take(got, true);
  EXPECT_EQ(tags(got), want);
  got.clear();
  b.take(got, true);  // nothing left
  EXPECT_TRUE(got.empty());
}

TEST(ProbeRecordBuilder, TakeWithoutWaitingStopsAtTheFirstJobNotBuilt) {
  ProbeRecordBuilder b;
  Gate gate;
  b.push({[] {}, [] { return record(0); }});
  b.push(gate.job(1));
  b.push({[] {}, [] { return record(2); }});
  std::vector<ProbeRecord> got;
  ASSERT_TRUE(eventually([&] {
    b.take(got, false);
    return gate.finishing.load();
  }));
  std::this_thread::sleep_for(20ms);  // job 2 would be built by now if the builder skipped the gate
  b.take(got, false);
  EXPECT_EQ(tags(got), std::vector<uint64_t>{0});
  gate.open = true;
  b.take(got, true);
  EXPECT_EQ(tags(got), (std::vector<uint64_t>{0, 1, 2}));
}

TEST(ProbeRecordBuilder, EveryQueuedJobIsShippedBeforeTheOldestIsWaitedFor) {
  ProbeRecordBuilder b;
  Gate gate;
  b.push(gate.job(100));
  ASSERT_TRUE(eventually([&] { return gate.finishing.load(); }));
  // Queued while the gate is being built: the next round ships all three before finishing the first.
  auto shipped = std::make_shared<std::vector<std::atomic<bool>>>(3);
  for (uint64_t i = 0; i < 3; ++i)
    b.push({[shipped, i] { (*shipped)[i] = true; },
            [shipped, i] {
              bool all = true;
              for (auto& s : *shipped) all = all && s;
              return record(all ? i : 1000 + i);  // 1000 + i: finished before a newer job was shipped
            }});
  gate.open = true;
  std::vector<ProbeRecord> got;
  b.take(got, true);
  EXPECT_EQ(tags(got), (std::vector<uint64_t>{100, 0, 1, 2}));
}

TEST(ProbeRecordBuilder, AFailureHandsBackTheRecordsBeforeItAndDropsTheRest) {
  ProbeRecordBuilder b;
  Gate gate;
  b.push({[] {}, [] { return record(0); }});
  b.push({[] {}, [] { return record(1); }});
  b.push({[] {}, []() -> ProbeRecord { throw std::runtime_error("device fault in job 2"); }});
  std::atomic<int> later{0};
  for (int i = 0; i < 5; ++i) b.push({[] {}, [&later] { ++later; return record(99); }});
  std::vector<ProbeRecord> got;
  try {
    b.take(got, true);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "device fault in job 2");
  }
  EXPECT_EQ(tags(got), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(later.load(), 0) << "jobs after the failed one were built";
  // The builder goes on with new jobs; the dropped ones stay dropped.
  b.push({[] {}, [] { return record(7); }});
  got.clear();
  b.take(got, true);
  EXPECT_EQ(tags(got), std::vector<uint64_t>{7});
  EXPECT_EQ(later.load(), 0);
}

TEST(ProbeRecordBuilder, AFailedShipFailsItsJobAfterTheOlderOnesAreBuilt) {
  ProbeRecordBuilder b;
  Gate gate;
  b.push(gate.job(0));
  ASSERT_TRUE(eventually([&] { return gate.finishing.load(); }));
  std::atomic<bool> finished2{false};
  b.push({[] {}, [] { return record(1); }});
  b.push({[] { throw std::runtime_error("copy refused"); }, [&finished2] { finished2 = true; return record(2); }});
  gate.open = true;  // the next round ships jobs 1 and 2 (2's throws), builds 1, then fails at 2
  std::vector<ProbeRecord> got;
  try {
    b.take(got, true);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "copy refused");
  }
  EXPECT_EQ(tags(got), (std::vector<uint64_t>{0, 1}));
  EXPECT_FALSE(finished2.load()) << "a job whose ship failed was finished";
}

TEST(ProbeRecordBuilder, ClearAndDestructionDoNotRunQueuedJobs) {
  std::atomic<int> ran{0};
  {
    ProbeRecordBuilder b;
    Gate gate;
    b.push(gate.job(0));
    ASSERT_TRUE(eventually([&] { return gate.finishing.load(); }));
    for (int i = 0; i < 50; ++i) b.push({[] {}, [&ran] { ++ran; return record(1); }});
    std::thread opener([&] {
      std::this_thread::sleep_for(30ms);
      gate.open = true;
    });
    b.clear();  // waits for the gate's build, drops it and the 50
    opener.join();
    std::vector<ProbeRecord> got;
    b.take(got, true);
    EXPECT_TRUE(got.empty());
    EXPECT_EQ(ran.load(), 0);
    for (int i = 0; i < 1000; ++i)
      b.push({[] {}, [&ran] {
                ++ran;
                std::this_thread::sleep_for(1ms);
                return record(2);
              }});
  }  // the destructor stops after the job in hand
  EXPECT_LT(ran.load(), 1000);
}

}  // namespace
}  // namespace mla
