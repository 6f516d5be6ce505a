// Helpers of the end-to-end tests that run the real binary (MLA_BINARY) in a child process: run it (or any shell
// command) and keep its output and exit code, read and write whole files, and a scratch directory per test.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace mla::test {

struct CliResult {
  int exit_code = -1;  // the command's exit code; 128 + N when killed by signal N
  std::string out;     // stdout (and stderr when merged)
  std::string err;     // stderr, when kept apart
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void spit(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Runs `cmd` through /bin/sh; its stdout is `out` (redirect inside `cmd` for more).
inline CliResult run_shell(const std::string& cmd) {
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

struct CliRun {
  bool merge_stderr = false;  // stderr into `out` (2>&1), else apart in `err`
  int timeout_s = 300;        // a hang must fail the test, not stall CI; 0: no limit (the command has its own)
  std::string env;            // prefix, e.g. "OMP_NUM_THREADS=1"
};

// Runs `mla-bisect ARGS` (ARGS as a shell would read them).
inline CliResult run_cli(const std::string& args, const CliRun& how = {}) {
  static std::atomic<int> calls{0};
  const auto err_path = std::filesystem::temp_directory_path() /
                        ("mla_test_stderr_" + std::to_string(getpid()) + "_" + std::to_string(calls++) + ".txt");
  std::string cmd = how.env.empty() ? "" : how.env + " ";
  if (how.timeout_s > 0) cmd += "timeout " + std::to_string(how.timeout_s) + " ";
  cmd += "'" MLA_BINARY "' " + args + (how.merge_stderr ? " 2>&1" : " 2>'" + err_path.string() + "'");
  CliResult r = run_shell(cmd);
  if (!how.merge_stderr) {
    r.err = slurp(err_path);
    std::error_code ec;
    std::filesystem::remove(err_path, ec);
  }
  return r;
}

// The command, its exit code and its output, for a failure message.
inline std::string describe(const std::string& args, const CliResult& r) {
  return "mla-bisect " + args + "\nexit " + std::to_string(r.exit_code) + "\n--- stdout\n" + r.out + "\n--- stderr\n" +
         r.err;
}

// A fresh directory per test (temp/mla_test_NAME_PID), removed at the end.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : dir_(std::filesystem::temp_directory_path() / ("mla_test_" + name + "_" + std::to_string(getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& file) const { return (dir_ / file).string(); }
  const std::filesystem::path& dir() const { return dir_; }
  std::string str() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace mla::test

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "\"" << (part) << "\" not in:\n" << (text)
