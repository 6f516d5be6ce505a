// The rendezvous file (harness/run/rendezvous.h): rank 0 publishes an id, every other rank reads the same bytes,
// in threads and in forked processes; a missing rank 0 times out with the path, rank and seconds named; a file
// left from an earlier launch, a foreign file, a torn file and an id of another length are refused.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/model/errors.h"
#include "harness/run/rendezvous.h"
#include "tests/cli_util.h"

namespace mla {
namespace {

using test::ScratchDir;
using test::slurp;
using test::spit;

constexpr size_t kIdBytes = 128;  // ncclUniqueId

std::vector<unsigned char> fake_id(unsigned seed) {
  std::vector<unsigned char> id(kIdBytes);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<unsigned char>((i * 131 + seed * 17 + 7) & 0xff);
  return id;
}

auto never_called = []() -> std::vector<unsigned char> {
  ADD_FAILURE() << "make_id called on a rank other than 0";
  return {};
};

TEST(Rendezvous, RankZeroAndThreeReadersInThreadsShareTheSameBytes) {
  ScratchDir dir("rdv_threads");
  const std::string path = dir.path("id");
  const auto id = fake_id(1);
  std::vector<std::vector<unsigned char>> got(4);
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  // The readers start first and poll; rank 0 publishes a little later.
  for (int r = 1; r <= 3; ++r)
    threads.emplace_back([&, r] {
      try {
        got[r] = rendezvous_exchange(path, r, kIdBytes, never_called, 10.0);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  int calls = 0;
  got[0] = rendezvous_exchange(path, 0, kIdBytes, [&] { ++calls; return id; }, 10.0);
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls, 1);
  for (int r = 0; r <= 3; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(got[r], id) << "rank " << r;
  }
  // Nothing but the file is left (the temporary was moved into place).
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.dir())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "id");
  }
  EXPECT_EQ(files, 1);
}

TEST(Rendezvous, ForkedProcessesReadWhatRankZeroWrote) {
  ScratchDir dir("rdv_fork");
  const std::string path = dir.path("id");
  const auto id = fake_id(2);
  std::vector<pid_t> kids;
  for (int r = 1; r <= 3; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // a reader process: exit 0 when it read exactly rank 0's bytes
      int code = 1;
      try {
        code = rendezvous_exchange(path, r, kIdBytes, [] { return std::vector<unsigned char>(); }, 10.0) == id ? 0 : 1;
      } catch (...) {
        code = 2;
      }
      _exit(code);
    }
    kids.push_back(pid);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_EQ(rendezvous_exchange(path, 0, kIdBytes, [&] { return id; }, 10.0), id);
  for (size_t i = 0; i < kids.size(); ++i) {
    int status = 0;
    ASSERT_EQ(waitpid(kids[i], &status, 0), kids[i]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "reader rank " << i + 1 << ": status " << status << " (1: other bytes, 2: an error)";
  }
}

TEST(Rendezvous, AReaderWithoutRankZeroTimesOutNamingPathRankAndSeconds) {
  ScratchDir dir("rdv_timeout");
  const std::string path = dir.path("never");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    rendezvous_exchange(path, 2, kIdBytes, never_called, 0.2);
    FAIL() << "no error";
  } catch (const EngineError& e) {  // exit 3: another process did not come
    const std::string m = e.what();
    EXPECT_CONTAINS(m, path);
    EXPECT_CONTAINS(m, "rank 2");
    EXPECT_CONTAINS(m, "waited 0.2 s");
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.2);
  EXPECT_LT(s, 5.0);
}

TEST(Rendezvous, RankZeroRefusesAPathThatExists) {
  ScratchDir dir("rdv_exists");
  const std::string path = dir.path("id");
  spit(path, "left over from the last launch");
  try {
    rendezvous_exchange(path, 0, kIdBytes, [] { return fake_id(3); }, 1.0);
    FAIL() << "no error";
  } catch (const UsageError& e) {  // exit 2
    EXPECT_CONTAINS(e.what(), path);
    EXPECT_CONTAINS(e.what(), "must not exist before the launch: use a fresh path per launch");
  }
  EXPECT_EQ(slurp(path), "left over from the last launch");  // untouched
  // The second launch of the same path, too: the first one's file is there.
  const std::string p2 = dir.path("id2");
  rendezvous_exchange(p2, 0, kIdBytes, [] { return fake_id(4); }, 1.0);
  EXPECT_THROW(rendezvous_exchange(p2, 0, kIdBytes, [] { return fake_id(5); }, 1.0), UsageError);
}

TEST(Rendezvous, AnIdOfTheWrongSizeFromMakeIdIsAnEngineError) {
  ScratchDir dir("rdv_size");
  EXPECT_THROW(rendezvous_exchange(dir.path("id"), 0, kIdBytes, [] { return std::vector<unsigned char>(3); }, 1.0),
               EngineError);
}

// The bytes of a valid file, written by rank 0 in a scratch directory.
std::string valid_file(const ScratchDir& dir, size_t bytes = kIdBytes) {
  const std::string p = dir.path("valid");
  rendezvous_exchange(p, 0, bytes, [&] { return std::vector<unsigned char>(bytes, 0x5a); }, 1.0);
  const std::string b = slurp(p);
  std::filesystem::remove(p);
  return b;
}

std::string reader_error(const std::string& path, double timeout_s = 0.2) {
  try {
    rendezvous_exchange(path, 1, kIdBytes, never_called, timeout_s);
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a UsageError: ") + e.what();
  }
  return "no error";
}

TEST(Rendezvous, AForeignFileIsRefusedAtOnce) {
  ScratchDir dir("rdv_foreign");
  const std::string path = dir.path("id");
  spit(path, "#!/bin/sh\necho this is not an id\n" + std::string(200, 'x'));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = reader_error(path, 30.0);
  EXPECT_CONTAINS(e, "not an mla-bisect rendezvous file");
  EXPECT_CONTAINS(e, path);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);  // no waiting
}

TEST(Rendezvous, AnIdOfAnotherLengthIsRefusedAtOnce) {
  ScratchDir dir("rdv_length");
  const std::string path = dir.path("id");
  spit(path, valid_file(dir, 64));
  EXPECT_CONTAINS(reader_error(path, 30.0), "holds a 64-byte id, this rank expects 128 bytes");
  // Trailing bytes after a complete id: not a file rank 0 wrote.
  spit(path, valid_file(dir) + "junk");
  EXPECT_CONTAINS(reader_error(path, 30.0), "more than the 144");
}

TEST(Rendezvous, ATornFileIsRejectedAtTheTimeout) {
  ScratchDir dir("rdv_torn");
  const std::string path = dir.path("id");
  const std::string good = valid_file(dir);
  for (const size_t keep : {size_t{0}, size_t{5}, size_t{12}, size_t{16}, good.size() - 1}) {
    SCOPED_TRACE("kept " + std::to_string(keep) + " bytes");
    spit(path, good.substr(0, keep));
    const std::string e = reader_error(path);
    EXPECT_CONTAINS(e, "stayed incomplete");
    EXPECT_CONTAINS(e, "rank 1");
  }
  // A flipped byte of the id: the checksum fails.
  std::string flipped = good;
  flipped.back() ^= 0x01;
  spit(path, flipped);
  EXPECT_CONTAINS(reader_error(path), "fails the checksum");
  // The intact file reads.
  spit(path, good);
  EXPECT_EQ(rendezvous_exchange(path, 1, kIdBytes, never_called, 0.2), std::vector<unsigned char>(kIdBytes, 0x5a));
}

}  // namespace
}  // namespace mla
