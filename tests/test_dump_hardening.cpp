// Dumps against hostile or half-written files: a journal replaced by rename (never emptied in place, so a run killed
// while it starts reads as stopped), sizes from attributes bounded by what the file stores, dataset values the file
// does not hold refused before allocation, counts that would overflow refused, journals whose records disagree
// refused before they are folded, links out of the file refused, and compare's drill-down claiming no per-head count
// it cannot support. (tests/fuzz/fuzz_dump.cpp fuzzes the same reader.)
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "core/model/errors.h"
#include "probes/dump.h"
#include "probes/h5.h"
#include "probes/journal.h"

namespace mla {
namespace {

namespace fs = std::filesystem;
using test::CliResult;
using test::run_cli;
using test::ScratchDir;
using test::slurp;
using test::spit;

// A small complete dump made by the binary (tiny model, 8 tokens).
std::string make_dump(const ScratchDir& dir, const std::string& name, const std::string& extra = "") {
  const std::string out = dir.path(name);
  const CliResult r = run_cli("run --model tiny --tokens 8 --quiet --out '" + out + "' " + extra, {true});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return out;
}

// The framed header record of a run of the tiny model, as a writer puts it first in its journal.
std::string header_record() {
  journal::Header h;
  h.meta.engine = "reference";
  h.meta.engine_options = "precision=fp32";
  h.meta.engine_dtype = "fp32";
  h.meta.device = "cpu";
  h.meta.mode = "prefill";
  h.meta.probe_level = "stats";
  h.meta.command = "mla-bisect run --model tiny --out k.h5";
  h.created_utc = "2026-01-01T00:00:00Z";
  h.tool_version = "test";
  h.git_sha = "0";
  return journal::frame(journal::RecordType::RecordType_header, journal::encode_header(h));
}

// ---------------------------------------------------------------------------------------------------
// The journal is replaced by rename
// ---------------------------------------------------------------------------------------------------

// Killed between the old journal's end and the new header: the journal is empty (as earlier writers left it) and the
// new code path's temporary file holds the header. compare reads the run as stopped (exit 3) and names its engine.
TEST(DumpHardening, EmptyJournalWithTemporaryHeaderReadsAsStopped) {
  ScratchDir dir("hard_empty_journal");
  const std::string ref = make_dump(dir, "ref.h5");
  const std::string k = dir.path("k.h5");
  spit(journal::journal_path(k), "");
  spit(journal::temp_path(journal::journal_path(k), 999999), header_record());
  const CliResult r = run_cli("compare --candidate '" + k + "' --reference '" + ref + "'");
  EXPECT_EQ(r.exit_code, 3) << test::describe("compare", r);
  EXPECT_CONTAINS(r.out, "stopped");
  EXPECT_CONTAINS(r.out, "before the first probe");
  EXPECT_EQ(r.err.find("no intact header"), std::string::npos) << r.err;
  // The fold wrote k.h5 from the header and removed both journals.
  EXPECT_TRUE(fs::exists(k));
  EXPECT_FALSE(fs::exists(journal::journal_path(k)));
  EXPECT_FALSE(fs::exists(journal::temp_path(journal::journal_path(k), 999999)));
  const CliResult i = run_cli("inspect '" + k + "'");
  EXPECT_CONTAINS(i.out, "reference:precision=fp32");
  EXPECT_CONTAINS(i.out, "status    stopped");
}

// An empty journal and nothing else: stopped before the header, said so (exit 3), nothing made up.
TEST(DumpHardening, EmptyJournalAloneReadsAsStoppedBeforeTheHeader) {
  ScratchDir dir("hard_empty_alone");
  const std::string ref = make_dump(dir, "ref.h5");
  const std::string k = dir.path("k.h5");
  spit(journal::journal_path(k), "");
  const CliResult r = run_cli("compare --candidate '" + k + "' --reference '" + ref + "'");
  EXPECT_EQ(r.exit_code, 3) << test::describe("compare", r);
  EXPECT_CONTAINS(r.out, "stopped: before the run wrote its header");
  EXPECT_CONTAINS(r.out, "k.h5.journal is empty");
  // Killed before the rename with no journal there: only the temporary file, and the path still reads as stopped.
  fs::remove(journal::journal_path(k));
  spit(journal::temp_path(journal::journal_path(k), 999998), "");
  const CliResult t = run_cli("compare --candidate '" + k + "' --reference '" + ref + "'");
  EXPECT_EQ(t.exit_code, 3) << test::describe("compare", t);
  EXPECT_CONTAINS(t.out, "stopped: before the run wrote its header");
}

// A new writer leaves the journal it replaces whole until its own header is on disk, then swaps it in.
TEST(DumpHardening, WriterReplacesTheJournalByRename) {
  ScratchDir dir("hard_writer_rename");
  const std::string j = dir.path("w.h5.journal");
  const std::string old_bytes = header_record();
  spit(j, old_bytes);
  {
    journal::Writer w(j);
    EXPECT_EQ(slurp(j), old_bytes) << "the journal was changed before the new header was on disk";
    EXPECT_TRUE(fs::exists(journal::temp_path(j, getpid())));
    w.append(journal::RecordType::RecordType_finish, journal::encode_finish("complete"));
    EXPECT_EQ(slurp(j), old_bytes);
    w.sync();
    EXPECT_FALSE(fs::exists(journal::temp_path(j, getpid())));
    EXPECT_EQ(slurp(j), journal::frame(journal::RecordType::RecordType_finish, journal::encode_finish("complete")));
    // A second writer while this one lives is refused, and leaves the journal as it is.
    EXPECT_THROW(journal::Writer again(j), UsageError);
    w.remove();
  }
  EXPECT_FALSE(fs::exists(j));
  // No journal before: the writer's first sync puts one in place.
  {
    journal::Writer w(j);
    EXPECT_FALSE(fs::exists(j));
    w.append(journal::RecordType::RecordType_finish, journal::encode_finish("x"));
    w.sync();
    EXPECT_TRUE(fs::exists(j));
  }
  EXPECT_TRUE(fs::exists(j));  // destroyed after the sync: the journal stays for recovery
}

// Neither journal writer (C++, Python) empties a journal in place.
TEST(DumpHardening, NoJournalWriterTruncatesInPlace) {
  const std::string cpp = slurp(std::string(MLA_SOURCE_DIR) + "/probes/journal.cpp");
  const std::string py = slurp(std::string(MLA_SOURCE_DIR) + "/python/mla_bisect/journal.py");
  ASSERT_FALSE(cpp.empty());
  ASSERT_FALSE(py.empty());
  for (const char* s : {"ftruncate", "O_TRUNC", "truncate("}) EXPECT_EQ(cpp.find(s), std::string::npos) << s;
  for (const char* s : {"ftruncate", "O_TRUNC", "truncate=True", ".truncate("}) EXPECT_EQ(py.find(s), std::string::npos) << s;
}

// The Python writer: the journal it replaces stays whole until its header is synced.
TEST(DumpHardening, PythonWriterReplacesTheJournalByRename) {
  const std::string py = MLA_PYTHON_EXE;
  if (py.empty() || test::run_shell("'" + py + "' -c 'import numpy' 2>/dev/null; echo $?").out != "0\n")
    GTEST_SKIP() << "no Python with numpy";
  ScratchDir dir("hard_py_rename");
  const std::string j = dir.path("p.h5.journal");
  spit(j, "old journal bytes");
  const std::string script = dir.path("t.py");
  spit(script,
       "import os, sys\n"
       "sys.path.insert(0, os.path.join(sys.argv[2], 'python'))\n"
       "from mla_bisect import journal as jr\n"
       "p = sys.argv[1]\n"
       "w = jr.Writer(p)\n"
       "assert open(p, 'rb').read() == b'old journal bytes', 'changed before the header was synced'\n"
       "w.append(jr.FINISH, jr.encode_finish('s'))\n"
       "assert open(p, 'rb').read() == b'old journal bytes'\n"
       "w.sync()\n"
       "assert open(p, 'rb').read() == jr.frame(jr.FINISH, jr.encode_finish('s'))\n"
       "assert not [n for n in os.listdir(os.path.dirname(p)) if '.tmp.' in n]\n"
       "w.remove()\n"
       "assert not os.path.exists(p)\n"
       "print('ok')\n");
  const CliResult r = test::run_shell("'" + py + "' '" + script + "' '" + j + "' '" MLA_SOURCE_DIR "' 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_CONTAINS(r.out, "ok");
}

// ---------------------------------------------------------------------------------------------------
// Sizes from attributes are bounded by what the file stores
// ---------------------------------------------------------------------------------------------------

// Under a 3 GB address-space limit: an allocation of the attribute's size would end in bad_alloc.
CliResult inspect_limited(const std::string& path) {
  return test::run_shell("ulimit -v 3000000; '" MLA_BINARY "' inspect '" + path + "' 2>&1");
}

TEST(DumpHardening, NumBlocksWithoutAStoredCacheIsBounded) {
  ScratchDir dir("hard_num_blocks");
  const std::string src = make_dump(dir, "src.h5");
  Dump d = read_dump(src);
  d.inputs.kv_cache.clear();  // no stored cache: the reader makes empty ones of num_blocks pages
  d.inputs.batch.num_blocks = 1 << 19;
  const std::string bad = dir.path("bad.h5");
  write_dump_h5(d, bad);
  EXPECT_LT(fs::file_size(bad), 1u << 20);
  const CliResult r = inspect_limited(bad);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "bad.h5:/inputs: attribute 'num_blocks' is 524288");
  EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;

  // The same dump with the writer's own page count reads.
  d.inputs.batch.num_blocks = read_dump(src).inputs.batch.num_blocks;
  const std::string good = dir.path("good.h5");
  write_dump_h5(d, good);
  EXPECT_EQ(inspect_limited(good).exit_code, 0) << inspect_limited(good).out;
}

TEST(DumpHardening, LayersWithoutAStoredCacheAreBounded) {
  ScratchDir dir("hard_layers");
  Dump d = read_dump(make_dump(dir, "src.h5"));
  d.inputs.kv_cache.clear();
  d.meta.run_options["layers"] = 100000;
  const std::string bad = dir.path("bad.h5");
  write_dump_h5(d, bad);
  const CliResult r = inspect_limited(bad);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "bad.h5:/: attribute 'run_options' has layers 100000");
  EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;
  // A stored cache: its extents bound the layers (an existing check), so the cache must hold them all.
  Dump s = read_dump(dir.path("src.h5"));
  s.meta.run_options["layers"] = 100000;
  write_dump_h5(s, bad);
  const CliResult c = inspect_limited(bad);
  EXPECT_EQ(c.exit_code, 2) << c.out;
  EXPECT_EQ(c.out.find("bad_alloc"), std::string::npos) << c.out;
}

// ---------------------------------------------------------------------------------------------------
// Links out of the file are refused
// ---------------------------------------------------------------------------------------------------

struct RawFile {
  hid_t id;
  explicit RawFile(const std::string& p) : id(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {}
  ~RawFile() { H5Fclose(id); }
};

TEST(DumpHardening, ExternalLinkIsRefusedNamingTheObject) {
  ScratchDir dir("hard_external");
  const std::string a = make_dump(dir, "a.h5");
  const std::string other = dir.path("other.h5");
  write_dump_h5(read_dump(a), other);
  {
    RawFile f(a);
    ASSERT_GE(f.id, 0);
    ASSERT_GE(H5Ldelete(f.id, "/layer0/q_a", H5P_DEFAULT), 0);
    ASSERT_GE(H5Lcreate_external(other.c_str(), "/layer0/q_a", f.id, "/layer0/q_a", H5P_DEFAULT, H5P_DEFAULT), 0);
  }
  const CliResult r = run_cli("inspect '" + a + "'");
  EXPECT_EQ(r.exit_code, 2) << test::describe("inspect", r);
  EXPECT_CONTAINS(r.err, "a.h5:/layer0/q_a: an external link to " + other + ":/layer0/q_a");
}

TEST(DumpHardening, SoftLinkLeavingTheFileIsRefused) {
  ScratchDir dir("hard_soft");
  const std::string a = make_dump(dir, "a.h5");
  const std::string other = dir.path("other.h5");
  write_dump_h5(read_dump(a), other);
  {
    RawFile f(a);
    ASSERT_GE(f.id, 0);
    ASSERT_GE(H5Lcreate_external(other.c_str(), "/layer0", f.id, "/elsewhere", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_GE(H5Ldelete(f.id, "/layer0/q_c", H5P_DEFAULT), 0);
    ASSERT_GE(H5Lcreate_soft("/elsewhere/q_c", f.id, "/layer0/q_c", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_GE(H5Lcreate_soft("/layer0/x", f.id, "/layer0/inside", H5P_DEFAULT, H5P_DEFAULT), 0);
  }
  const h5::File f = h5::File::open_read(a);
  const h5::Group layer = f.open_group("layer0");
  try {
    layer.open_group("q_c");
    ADD_FAILURE() << "a soft link through an external link was followed";
  } catch (const UsageError& e) {
    EXPECT_CONTAINS(e.what(), "a.h5:/layer0/q_c: a soft link to '/elsewhere/q_c'");
  }
  EXPECT_THROW(f.has("elsewhere"), UsageError);
  EXPECT_TRUE(layer.has_group("inside"));  // a soft link inside the file is an object of the file
  // The whole dump: refused, exit 2 (the external link at the root is named, whichever object is met first).
  const CliResult r = run_cli("inspect '" + a + "'");
  EXPECT_EQ(r.exit_code, 2) << test::describe("inspect", r);
}

// ---------------------------------------------------------------------------------------------------
// Datasets: values the file does not hold are refused before anything is allocated
// ---------------------------------------------------------------------------------------------------

// Replaces dataset `name` of `path` by one of `dims` (float32) whose storage `dcpl` describes, writing nothing.
void replace_unwritten(const std::string& path, const char* name, std::vector<hsize_t> dims, hid_t dcpl) {
  RawFile f(path);
  ASSERT_GE(f.id, 0);
  ASSERT_GE(H5Ldelete(f.id, name, H5P_DEFAULT), 0);
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t d = H5Dcreate2(f.id, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  H5Dclose(d);
  H5Sclose(space);
}

// A 200 KB file declaring 2^46 inputs (chunks never written: HDF5 would hand back fill values): refused naming the
// dataset, with no allocation of its size. Likewise contiguous storage never written, extents multiplying past 2^62,
// and values kept in another file (external storage).
TEST(DumpHardening, DatasetValuesTheFileDoesNotHoldAreRefused) {
  ScratchDir dir("hard_unstored");
  const std::string src = make_dump(dir, "src.h5");
  const auto fresh = [&](const char* name) {
    const std::string p = dir.path(name);
    fs::copy_file(src, p, fs::copy_options::overwrite_existing);
    return p;
  };
  const hid_t chunked = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t chunk[2] = {64, 64};
  H5Pset_chunk(chunked, 2, chunk);
  const std::string a = fresh("chunked.h5");
  replace_unwritten(a, "/inputs/x", {hsize_t{1} << 40, 64}, chunked);
  CliResult r = inspect_limited(a);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "chunked.h5:/inputs/x: declares 70368744177664 elements, but stores 0 of its");
  EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;

  const std::string b = fresh("contiguous.h5");
  replace_unwritten(b, "/inputs/x", {hsize_t{1} << 26, 64}, H5P_DEFAULT);
  r = inspect_limited(b);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "contiguous.h5:/inputs/x: declares 4294967296 elements, but stores 0 bytes of them");

  const std::string c = fresh("overflow.h5");
  replace_unwritten(c, "/inputs/x", {hsize_t{1} << 32, hsize_t{1} << 32}, chunked);
  r = inspect_limited(c);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "overflow.h5:/inputs/x: its extents multiply past 2^62 elements");
  H5Pclose(chunked);

  const std::string e = fresh("external.h5");
  spit(dir.path("raw.bin"), std::string(8 * 64 * 4, '\0'));
  const hid_t external = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_external(external, dir.path("raw.bin").c_str(), 0, H5F_UNLIMITED);
  replace_unwritten(e, "/inputs/x", {8, 64}, external);
  H5Pclose(external);
  r = inspect_limited(e);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "external.h5:/inputs/x: its values are stored in another file (external storage)");

  // The writer's own deflated chunks (a cache of 64 KiB and more) all read.
  const std::string big = make_dump(dir, "big.h5", "--mode decode --context 1000");
  EXPECT_EQ(inspect_limited(big).exit_code, 0) << inspect_limited(big).out;
}

// Counts and shapes of a record whose sums would overflow int64: refused, not wrapped.
TEST(DumpHardening, RecordCountsAndShapesDoNotOverflow) {
  ScratchDir dir("hard_counts");
  const std::string a = make_dump(dir, "a.h5");
  {
    RawFile f(a);
    ASSERT_GE(f.id, 0);
    const hid_t rank = H5Gopen2(f.id, "/layer0/q_a/rank0", H5P_DEFAULT);
    ASSERT_GE(rank, 0);
    const hid_t scalar = H5Screate(H5S_SCALAR);
    for (const char* name : {"nan", "inf"}) {
      H5Adelete(rank, name);
      const int64_t v = std::numeric_limits<int64_t>::max();
      const hid_t at = H5Acreate2(rank, name, H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(at, H5T_NATIVE_INT64, &v);
      H5Aclose(at);
    }
    H5Sclose(scalar);
    H5Gclose(rank);
  }
  CliResult r = run_cli("inspect '" + a + "'");
  EXPECT_EQ(r.exit_code, 2) << test::describe("inspect", r);
  EXPECT_CONTAINS(r.err, "a.h5:/layer0/q_a/rank0: nan 9223372036854775807 and inf 9223372036854775807 do not fit");

  // A probe of three axes of 2^40 each, in a dump without a model (shapes are checked by their axes only).
  Dump d = read_dump(make_dump(dir, "b.h5"));
  d.meta.model = nullptr;
  d.meta.run_options = nullptr;
  d.has_inputs = false;
  d.inputs = {};
  for (auto& p : d.probes)
    if (p.name == "q_nope") p.shape = {8, int64_t{1} << 40, int64_t{1} << 40};
  const std::string b = dir.path("b2.h5");
  write_dump_h5(d, b);
  r = run_cli("inspect '" + b + "'");
  EXPECT_EQ(r.exit_code, 2) << test::describe("inspect", r);
  EXPECT_CONTAINS(r.err, "b2.h5:/layer0/q_nope: shape [8,1099511627776,1099511627776] is not valid");
}

// run_options' integers are JSON integers in range: 1e20 tokens is refused, not converted (undefined behaviour).
TEST(DumpHardening, RunOptionsIntegersAreIntegers) {
  ScratchDir dir("hard_run_ints");
  Dump d = read_dump(make_dump(dir, "a.h5"));
  d.meta.run_options["tokens"] = 1e20;
  const std::string bad = dir.path("bad.h5");
  write_dump_h5(d, bad);
  CliResult r = run_cli("inspect '" + bad + "'");
  EXPECT_EQ(r.exit_code, 2) << test::describe("inspect", r);
  EXPECT_CONTAINS(r.err, "'tokens' must be an integer");
  d.meta.run_options["tokens"] = 8;
  d.meta.run_options["context"] = {2.5};
  write_dump_h5(d, bad);
  r = run_cli("inspect '" + bad + "'");
  EXPECT_EQ(r.exit_code, 2) << test::describe("inspect", r);
  EXPECT_CONTAINS(r.err, "'context' must be an integer");
}

// ---------------------------------------------------------------------------------------------------
// Journals whose records disagree are refused before they are folded or written
// ---------------------------------------------------------------------------------------------------

// A header with one sequence of one token (hidden 64) and its inputs, for journals made by hand.
journal::Header header_with_inputs() {
  journal::Header h;
  h.meta.engine = "reference";
  h.meta.mode = "prefill";
  h.has_inputs = true;
  auto& b = h.inputs.batch;
  h.inputs.x = Tensor({1, 64});
  b.new_lens = {1};
  b.context_lens = {0};
  b.positions = {0};
  b.token_seq = {0};
  b.max_blocks = 2;
  b.num_blocks = 2;
  b.block_table = {0, 1};
  return h;
}

std::string header_frame(const journal::Header& h) {
  return journal::frame(journal::RecordType::RecordType_header, journal::encode_header(h));
}

std::string read_error(const std::string& path) {
  try {
    read_dump(path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(read)";
}

// A block table shorter than its sequences x columns: folding wrote past its end (a heap overflow); now refused.
TEST(DumpHardening, JournalInputsThatDisagreeAreRefused) {
  ScratchDir dir("hard_journal_inputs");
  const std::string k = dir.path("k.h5");
  journal::Header h = header_with_inputs();
  h.inputs.batch.block_table = {0};
  spit(journal::journal_path(k), header_frame(h));
  EXPECT_CONTAINS(read_error(k), "k.h5.journal: inputs' block table holds 1 entries, not 1 sequences x 2 columns");
  EXPECT_TRUE(fs::exists(journal::journal_path(k)));  // left in place
  h = header_with_inputs();
  h.inputs.batch.context_lens = {};
  spit(journal::journal_path(k), header_frame(h));
  EXPECT_CONTAINS(read_error(k), "inputs hold 1 sequence lengths and 0 context lengths");
  // The same inputs, consistent, fold and read.
  spit(journal::journal_path(k), header_frame(header_with_inputs()));
  EXPECT_EQ(read_error(k), "(read)");
}

// A tensor whose extents multiply past int64 (to 0 mod 2^64, as its empty values): refused, not wrapped.
TEST(DumpHardening, JournalTensorExtentsDoNotWrap) {
  ScratchDir dir("hard_journal_extents");
  const std::string k = dir.path("k.h5");
  journal::Header h = header_with_inputs();
  h.inputs.x.shape = {int64_t{1} << 62, 4};
  h.inputs.x.data.clear();
  spit(journal::journal_path(k), header_frame(h));
  EXPECT_CONTAINS(read_error(k), "unreadable journal header: tensor of shape [4611686018427387904,4] holds 0 values");
}

// tp and stage markers bound what the fold allocates per rank: a header's tp 2^30 and a marker of rank 2^24 made
// vectors of that many strings.
TEST(DumpHardening, JournalRanksAreBoundedByTp) {
  ScratchDir dir("hard_journal_tp");
  const std::string k = dir.path("k.h5");
  journal::Header h = header_with_inputs();
  h.meta.tp = 1 << 30;
  spit(journal::journal_path(k), header_frame(h));
  EXPECT_CONTAINS(read_error(k), "k.h5.journal: the journal's header says tp 1073741824 (1 to 4096)");

  h.meta.tp = 1;
  spit(journal::journal_path(k),
       header_frame(h) + journal::frame(journal::RecordType::RecordType_stage,
                                        journal::encode_stage(0, Stage::Stage_rope, 1 << 24)));
  const Dump d = read_dump(k);
  EXPECT_CONTAINS(d.status, "a stage marker of rank 16777216 at tp 1");
  EXPECT_EQ(d.last_stage.size(), 1u);
}

// A header's integers are JSON integers in range ("tp": 1e20 was converted to int: undefined behaviour).
TEST(DumpHardening, JournalHeaderIntegersAreIntegers) {
  ScratchDir dir("hard_journal_ints");
  const std::string k = dir.path("k.h5");
  std::string payload = journal::encode_header(header_with_inputs());
  // [u64 length][magic][u32 version][u64 length][metadata JSON][inputs]
  const size_t at = 8 + std::strlen(journal::kHeaderMagic) + 4;
  uint64_t len;
  std::memcpy(&len, payload.data() + at, 8);
  nlohmann::json j = nlohmann::json::parse(payload.substr(at + 8, len));
  j["tp"] = 1e20;
  const std::string text = j.dump();
  const uint64_t new_len = text.size();
  payload = payload.substr(0, at) + std::string(reinterpret_cast<const char*>(&new_len), 8) + text +
            payload.substr(at + 8 + len);
  spit(journal::journal_path(k), journal::frame(journal::RecordType::RecordType_header, payload));
  EXPECT_CONTAINS(read_error(k), "unreadable journal header: header metadata: 'tp' is 1e+20, not an integer in range");
}

// A fold the directory or HDF5 will not take is read back from a temporary copy, checked as every dump is; it was
// handed on unchecked.
TEST(DumpHardening, UnwritableFoldIsChecked) {
  ScratchDir dir("hard_unwritable_fold");
  const std::string k = dir.path("k.h5");
  ProbeSpec p;  // a name HDF5 takes for a path into a group that is not there
  p.name = "no/such";
  p.stage = Stage::Stage_rope;
  p.contract = Contract::Contract_replicated;
  p.shape = {1, 4};
  ProbeRecord rec;
  rec.shape = {1, 4};
  rec.dtype = "fp32";
  rec.token_l2 = {1.f};
  spit(journal::journal_path(k), header_frame(header_with_inputs()) +
                                     journal::frame(journal::RecordType::RecordType_probe,
                                                    journal::encode_probe(0, p, 0, rec)));
  EXPECT_CONTAINS(read_error(k), "k.h5: its journal " + journal::journal_path(k) + " does not fold into a valid dump");
  EXPECT_CONTAINS(read_error(k), "cannot create group 'no/such'");
  EXPECT_TRUE(fs::exists(journal::journal_path(k)));
}

// ---------------------------------------------------------------------------------------------------
// compare's drill-down on sketch dumps
// ---------------------------------------------------------------------------------------------------

TEST(DumpHardening, SketchDrillDownClaimsNoHeadCount) {
  ScratchDir dir("hard_sketch_heads");
  const std::string r0 = dir.path("ref.h5"), c0 = dir.path("cand.h5");
  ASSERT_EQ(run_cli("run --model tiny --probe-level sketch --quiet --out '" + r0 + "'", {true}).exit_code, 0);
  ASSERT_EQ(run_cli("run --model tiny --probe-level sketch --inject rope-neox --engine reference:precision=bf16 "
                    "--quiet --out '" + c0 + "'", {true})
                .exit_code,
            0);
  const CliResult r = run_cli("compare --candidate '" + c0 + "' --reference '" + r0 + "'");
  EXPECT_EQ(r.exit_code, 1) << test::describe("compare", r);
  EXPECT_FALSE(std::regex_search(r.out, std::regex("heads: +0 of [0-9]+"))) << r.out;
  EXPECT_CONTAINS(r.out, "heads:    not available on the sketch basis");
}

}  // namespace
}  // namespace mla
