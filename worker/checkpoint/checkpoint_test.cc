// Checkpoint save/load: CRC32C test vectors, round trip, corruption and truncation detection,
// a save SIGKILLed mid-write (never loadable; Load falls back), `latest` naming a missing
// directory, stale temp directories, and argument errors.
#include "worker/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace switchyard {
namespace {

namespace fs = std::filesystem;

#define EXPECT_STATUS(expr, code_, substr)                                      \
  do {                                                                          \
    const absl::Status s_ = (expr);                                             \
    EXPECT_EQ(s_.code(), (code_)) << s_;                                        \
    EXPECT_NE(std::string(s_.message()).find(substr), std::string::npos) << s_; \
  } while (0)

std::string FreshRoot(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string root = std::string(dir != nullptr ? dir : "/tmp") + "/ckpt_" + name;
  fs::remove_all(root);
  return root;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A small training state whose values depend on `step`.
struct State {
  std::vector<float> w;
  std::vector<BF16> b;
  std::vector<double> m;
  explicit State(int64_t step) {
    for (int i = 0; i < 24; ++i) w.push_back(static_cast<float>(step * 100 + i) * 0.5f);
    for (int i = 0; i < 8; ++i) b.push_back(BF16::FromFloat(static_cast<float>(step - i)));
    for (int i = 0; i < 6; ++i) m.push_back(1.0 / (step + i + 1));
  }
};

absl::StatusOr<std::string> SaveState(const std::string& root, int64_t step) {
  State s(step);
  CheckpointWriter w;
  w.AddTensor("model.safetensors", "layer.w",
              Tensor(DType::kF32, {4, 6}, Device::Cpu(), s.w.data()));
  w.AddTensor("model.safetensors", "layer.b", Tensor(DType::kBF16, {8}, Device::Cpu(), s.b.data()));
  w.AddTensor("optim.safetensors", "layer.w.exp_avg",
              Tensor(DType::kF64, {2, 3}, Device::Cpu(), s.m.data()));
  w.SetMetadata("data.consumed_samples", step * 32);
  w.SetMetadata("rng.mt19937_64", "1 2 3 " + std::to_string(step));
  w.SetMetadata("note", "checkpoint of step " + std::to_string(step));
  return w.Commit(root, step);
}

void ExpectState(const Checkpoint& c, int64_t step) {
  State s(step);
  EXPECT_EQ(c.step(), step);
  auto w = c.Get("model.safetensors", "layer.w");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->dtype, DType::kF32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(std::memcmp(w->data, s.w.data(), 24 * 4), 0);
  auto b = c.Get("model.safetensors", "layer.b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(b->data, s.b.data(), 8 * 2), 0);
  auto m = c.Get("optim.safetensors", "layer.w.exp_avg");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(m->data, s.m.data(), 6 * 8), 0);
  EXPECT_EQ(c.GetInt("data.consumed_samples").value_or(-1), step * 32);
  EXPECT_EQ(c.GetString("rng.mt19937_64").value_or(""), "1 2 3 " + std::to_string(step));
}

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 (iSCSI) B.4 test vectors and the classic check value.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(inc), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32cTest, IncrementalMatchesOneShotAtEverySplit) {
  std::mt19937 rng(std::random_device{}());
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const uint32_t whole = Crc32c(data);
  for (size_t split = 0; split <= data.size(); split += 37) {
    const absl::string_view v(data);
    EXPECT_EQ(Crc32c(v.substr(split), Crc32c(v.substr(0, split))), whole) << split;
  }
}

TEST(CheckpointTest, RoundTrip) {
  const std::string root = FreshRoot("roundtrip");
  auto dir = SaveState(root, 7);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root + "/step_7");
  EXPECT_EQ(ReadFile(root + "/latest"), "step_7\n");
  ASSERT_TRUE(SaveState(root, 12).ok());
  EXPECT_EQ(ReadFile(root + "/latest"), "step_12\n");

  auto latest = LoadCheckpoint(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ExpectState(*latest, 12);
  EXPECT_EQ(latest->Files(), (std::vector<std::string>{"model.safetensors", "optim.safetensors"}));
  EXPECT_EQ(latest->GetString("note").value_or(""), "checkpoint of step 12");
  auto old = LoadCheckpoint(root, 7);
  ASSERT_TRUE(old.ok()) << old.status();
  ExpectState(*old, 7);

  // Nothing but the two steps and `latest` is left behind.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_12", "step_7"}));

  EXPECT_STATUS(LoadCheckpoint(root, 8).status(), absl::StatusCode::kNotFound, "step_8");
  EXPECT_STATUS(latest->Get("model.safetensors", "nope").status(), absl::StatusCode::kNotFound,
                "nope");
  EXPECT_STATUS(latest->Get("nope.safetensors", "layer.w").status(), absl::StatusCode::kNotFound,
                "nope.safetensors");
  EXPECT_STATUS(latest->GetInt("note").status(), absl::StatusCode::kInvalidArgument, "note");
  // Steps are immutable.
  EXPECT_STATUS(SaveState(root, 12).status(), absl::StatusCode::kAlreadyExists, "step_12");
}

// Checkpoints are private: every directory Commit creates is 0700, every file 0600, whatever
// the umask allows (a umask of 0 would otherwise make them world-readable).
TEST(CheckpointTest, DirectoriesAre0700AndFiles0600) {
  const std::string base = FreshRoot("modes");
  const std::string root = base + "/jobs/7/run";  // three levels created by Commit
  const mode_t old_umask = umask(0);
  absl::StatusOr<std::string> dir = SaveState(root, 3);
  umask(old_umask);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto mode_of = [](const std::string& path) {
    struct stat st;
    EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
    return st.st_mode & 07777;
  };
  for (const std::string& d : {base + "/jobs", base + "/jobs/7", root, *dir}) {
    std::printf("  %-60s %04o\n", d.c_str(), mode_of(d));
    EXPECT_EQ(mode_of(d), 0700u) << d;
  }
  for (const char* f : {"model.safetensors", "optim.safetensors", "manifest.json"}) {
    const std::string path = *dir + "/" + f;
    std::printf("  %-60s %04o\n", path.c_str(), mode_of(path));
    EXPECT_EQ(mode_of(path), 0600u) << path;
  }
  std::printf("  %-60s %04o\n", (root + "/latest").c_str(), mode_of(root + "/latest"));
  EXPECT_EQ(mode_of(root + "/latest"), 0600u);
}

TEST(CheckpointTest, CorruptedByteIsDetected) {
  const std::string root = FreshRoot("corrupt");
  ASSERT_TRUE(SaveState(root, 1).ok());
  ASSERT_TRUE(SaveState(root, 2).ok());
  const std::string victim = root + "/step_2/optim.safetensors";
  std::string bytes = ReadFile(victim);
  std::mt19937 rng(std::random_device{}());
  const size_t pos = bytes.size() - 1 - rng() % 48;  // Inside the tensor data: still valid format.
  bytes[pos] ^= static_cast<char>(1 + rng() % 255);
  WriteFile(victim, bytes);
  std::printf("flipped byte %zu of %zu in %s\n", pos, bytes.size(), victim.c_str());

  EXPECT_STATUS(LoadCheckpoint(root, 2).status(), absl::StatusCode::kDataLoss,
                "step_2/optim.safetensors: CRC32C");
  // Without a step: `latest` names step_2, which fails; fall back to step_1.
  auto c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 1);
}

TEST(CheckpointTest, CorruptedManifestIsDetected) {
  const std::string root = FreshRoot("corrupt_manifest");
  ASSERT_TRUE(SaveState(root, 1).ok());
  ASSERT_TRUE(SaveState(root, 2).ok());
  // Change the data position (2 * 32 = 64) to 65: still valid JSON with valid file checksums.
  const std::string manifest = root + "/step_2/manifest.json";
  std::string text = ReadFile(manifest);
  const size_t pos = text.find("\"data.consumed_samples\": 64");
  ASSERT_NE(pos, std::string::npos) << text;
  text[pos + 26] = '5';
  WriteFile(manifest, text);
  EXPECT_STATUS(LoadCheckpoint(root, 2).status(), absl::StatusCode::kDataLoss,
                "step_2/manifest.json: malformed manifest: CRC32C");
  auto c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 1);
}

TEST(CheckpointTest, TruncatedFileIsDetected) {
  const std::string root = FreshRoot("truncated");
  ASSERT_TRUE(SaveState(root, 3).ok());
  ASSERT_TRUE(SaveState(root, 4).ok());
  const std::string victim = root + "/step_4/model.safetensors";
  const auto size = fs::file_size(victim);
  fs::resize_file(victim, size - 5);
  EXPECT_STATUS(LoadCheckpoint(root, 4).status(), absl::StatusCode::kDataLoss,
                "step_4/model.safetensors: size");
  auto c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 3);

  // A missing file and a missing manifest are detected too.
  fs::remove(victim);
  EXPECT_STATUS(LoadCheckpoint(root, 4).status(), absl::StatusCode::kDataLoss,
                "step_4/model.safetensors: listed in the manifest but missing");
  fs::remove(root + "/step_4/manifest.json");
  EXPECT_STATUS(LoadCheckpoint(root, 4).status(), absl::StatusCode::kDataLoss,
                "step_4/manifest.json: missing");
  // A garbled manifest.
  WriteFile(root + "/step_4/manifest.json", "{\"format\": \"switchyard-checkpoint\", \"vers");
  EXPECT_STATUS(LoadCheckpoint(root, 4).status(), absl::StatusCode::kDataLoss,
                "step_4/manifest.json: malformed");
  // A manifest from another step.
  fs::copy_file(root + "/step_3/manifest.json", root + "/step_4/manifest.json",
                fs::copy_options::overwrite_existing);
  EXPECT_STATUS(LoadCheckpoint(root, 4).status(), absl::StatusCode::kDataLoss,
                "does not match the directory");
  c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 3);
}

TEST(CheckpointTest, SaveKilledMidWriteIsNeverLoaded) {
  const std::string root = FreshRoot("killed");
  ASSERT_TRUE(SaveState(root, 1).ok());

  // 256 MiB: large enough that the child is still writing when the parent sees its first bytes.
  const size_t n = size_t{64} << 20;
  std::vector<float> big(n, 1.5f);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CheckpointWriter w;
    w.AddTensor("big.safetensors", "x",
                Tensor(DType::kF32, {int64_t(n)}, Device::Cpu(), big.data()));
    w.SetMetadata("data.consumed_samples", int64_t{64});
    const bool ok = w.Commit(root, 2).ok();
    _exit(ok ? 0 : 1);
  }
  const std::string tmp_dir = root + "/.tmp_step_2_" + std::to_string(child);
  const std::string partial = tmp_dir + "/big.safetensors.tmp." + std::to_string(child);
  uintmax_t seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    seen = fs::file_size(partial, ec);
    if (!ec && seen > 0) break;
    seen = 0;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "the child finished its save before it was killed (status " << wstatus
      << "); the test did not exercise a mid-write kill";
  ASSERT_GT(seen, 0u) << "never saw the child's partial file " << partial;
  std::printf("killed child %d after it had written >= %ju of %zu bytes\n", child, seen, n * 4);

  EXPECT_TRUE(fs::exists(tmp_dir));            // The partial save is left as a temp dir ...
  EXPECT_FALSE(fs::exists(root + "/step_2"));  // ... never as a step directory.
  EXPECT_EQ(ReadFile(root + "/latest"), "step_1\n");
  EXPECT_STATUS(LoadCheckpoint(root, 2).status(), absl::StatusCode::kNotFound, "step_2");
  auto c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 1);
  // Even with `latest` gone, the fallback scan ignores the temp directory.
  fs::remove(root + "/latest");
  c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 1);

  // The dead child's temp dir is stale and can be cleaned up; a new save of step 2 succeeds.
  auto removed = RemoveStaleCheckpointTempDirs(root);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1);
  EXPECT_FALSE(fs::exists(tmp_dir));
  ASSERT_TRUE(SaveState(root, 2).ok());
  c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 2);
}

TEST(CheckpointTest, LatestNamingMissingDirFallsBack) {
  const std::string root = FreshRoot("latest_missing");
  ASSERT_TRUE(SaveState(root, 5).ok());
  ASSERT_TRUE(SaveState(root, 9).ok());
  WriteFile(root + "/latest", "step_11\n");
  auto c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 9);
  // Garbage in `latest` also falls back.
  WriteFile(root + "/latest", "../../etc\n");
  c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 9);
  // `latest` wins over a newer complete step that it does not name yet (crash between the
  // rename and the update of `latest`).
  WriteFile(root + "/latest", "step_5\n");
  c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 5);
}

TEST(CheckpointTest, OldTempDirsAreIgnored) {
  const std::string root = FreshRoot("tempdirs");
  ASSERT_TRUE(SaveState(root, 3).ok());
  // A complete-looking save that never got renamed (killed after the manifest), and an empty one,
  // both at higher steps than the real checkpoint.
  ASSERT_TRUE(SaveState(root, 8).ok());
  fs::rename(root + "/step_8", root + "/.tmp_step_8_999999");
  fs::create_directory(root + "/.tmp_step_10_999998");
  WriteFile(root + "/latest", "step_3\n");

  auto c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 3);
  fs::remove(root + "/latest");
  c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 3);
  // A directory that merely looks like a step but has no manifest is skipped as well.
  fs::create_directory(root + "/step_20");
  c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectState(*c, 3);

  // Nothing complete at all.
  const std::string empty = FreshRoot("tempdirs_empty");
  fs::create_directories(empty + "/.tmp_step_1_999999");
  EXPECT_STATUS(LoadCheckpoint(empty).status(), absl::StatusCode::kNotFound,
                "no complete checkpoint");
}

// The resume probe: committed steps found by listing (no file read, no verification), temp
// dirs and manifest-less step dirs ignored, `latest` preferred when it names a committed step.
TEST(CheckpointTest, LatestCommittedStepProbesWithoutReading) {
  const std::string root = FreshRoot("probe");
  auto none = LatestCommittedStep(root + "/not_there");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(SaveState(root, 3).ok());
  ASSERT_TRUE(SaveState(root, 7).ok());
  fs::create_directory(root + "/step_20");  // no manifest: not committed
  fs::create_directories(root + "/.tmp_step_30_999999");
  auto got = LatestCommittedStep(root);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, 7);
  EXPECT_TRUE(HasCommittedStep(root, 3));
  EXPECT_FALSE(HasCommittedStep(root, 20));
  EXPECT_FALSE(HasCommittedStep(root, 4));
  WriteFile(root + "/latest", "step_3\n");
  got = LatestCommittedStep(root);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, 3) << "latest names a committed step";
  WriteFile(root + "/latest", "step_20\n");
  got = LatestCommittedStep(root);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, 7) << "latest names an uncommitted step: the highest committed one";
  // The probe does not verify: a corrupted data file still counts (Load verifies and reports).
  WriteFile(root + "/step_7/model.safetensors", "garbage");
  got = LatestCommittedStep(root);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, 7);
  // A root that is a file: an error naming it, not "nothing to resume".
  WriteFile(root + "/a_file", "x");
  auto bad = LatestCommittedStep(root + "/a_file");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("a_file"), std::string::npos) << bad.status();
}

TEST(CheckpointTest, ArgumentErrors) {
  const std::string root = FreshRoot("args");
  float x = 1.0f;
  const Tensor t(DType::kF32, {1}, Device::Cpu(), &x);
  for (const std::string bad : {"", ".hidden", "a/b", "manifest.json", "sp ace"}) {
    CheckpointWriter w;
    w.AddTensor(bad, "x", t);
    EXPECT_STATUS(w.Commit(root, 1).status(), absl::StatusCode::kInvalidArgument, "file");
  }
  CheckpointWriter dup;
  dup.AddTensor("a.safetensors", "x", t);
  dup.AddTensor("a.safetensors", "x", t);
  EXPECT_STATUS(dup.Commit(root, 1).status(), absl::StatusCode::kInvalidArgument, "x");
  CheckpointWriter ok;
  ok.AddTensor("a.safetensors", "x", t);
  EXPECT_STATUS(ok.Commit(root, -1).status(), absl::StatusCode::kInvalidArgument, "step");
  // Failed commits leave nothing behind.
  EXPECT_TRUE(!fs::exists(root) || fs::is_empty(root));
  // Metadata only (no tensors) is a valid checkpoint.
  CheckpointWriter meta;
  meta.SetMetadata("k", int64_t{-3});
  ASSERT_TRUE(meta.Commit(root, 0).ok());
  auto c = LoadCheckpoint(root);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step(), 0);
  EXPECT_TRUE(c->Files().empty());
  EXPECT_EQ(c->GetInt("k").value_or(0), -3);
}

}  // namespace
}  // namespace switchyard
