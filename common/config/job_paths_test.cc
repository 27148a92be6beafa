// Job paths (job_paths.h): the relative-path rules a spec passes at CreateJob, the resolution
// under the roots, and the worker's on-disk containment check against real directories and
// symlinks under $TEST_TMPDIR. Every case prints the value and the verdict.
#include "common/config/job_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

// A fresh directory under $TEST_TMPDIR (resolved, so expectations can name real paths).
std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/job_paths_", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return fs::canonical(dir).string();
}

void ExpectRejected(const v1::JobSpec& spec, const std::string& field, const std::string& rule) {
  const absl::Status s = CheckJobSpecPaths(spec);
  std::printf("  %-70s -> %s\n", spec.ShortDebugString().c_str(), s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << spec.ShortDebugString();
  EXPECT_TRUE(absl::StrContains(s.message(), field)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), rule)) << s;
}

v1::JobSpec WithSave(const std::string& save) {
  v1::JobSpec spec;
  spec.mutable_training()->set_save(save);
  return spec;
}

v1::JobSpec WithLoad(const std::string& load) {
  v1::JobSpec spec;
  spec.mutable_training()->set_load(load);
  return spec;
}

TEST(RelativePathViolation, AcceptsPlainRelativePaths) {
  for (const char* ok : {"a", "a/b", "ckpt.v2/run-1", "jobs/3/step_600", "...", "a..b"}) {
    std::printf("  \"%s\" -> ok\n", ok);
    EXPECT_EQ(RelativePathViolation(ok), "") << ok;
  }
}

TEST(RelativePathViolation, RejectsEachBrokenRule) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "must not be empty"},
      {"/etc/cron.d", "must not be absolute"},
      {"..", "\"..\" components"},
      {"../../etc", "\"..\" components"},
      {"a/../b", "\"..\" components"},
      {"a/..", "\"..\" components"},
      {"./a", "\".\" components"},
      {"a//b", "empty components"},
      {"a/", "empty components"},
      {std::string("a\0b", 3), "control characters"},
      {"a\nb", "control characters"},
      {"a\x1b[2Jb", "control characters"},
      {"a\x7f", "control characters"},
      // C1 controls (UTF-8 encoded U+0080..U+009F): the hand-written byte check missed them.
      {"run\xc2\x85x", "control characters (byte 0xc2 at offset 3)"},
      {"a/\xc2\x9b"
       "2J",
       "control characters (byte 0xc2 at offset 2)"},
  };
  for (const auto& [path, rule] : cases) {
    const std::string why = RelativePathViolation(path);
    std::printf("  \"%s\" -> %s\n", absl::CHexEscape(path).c_str(), why.c_str());
    EXPECT_TRUE(absl::StrContains(why, rule)) << absl::CHexEscape(path) << ": " << why;
  }
}

TEST(CheckJobSpecPaths, NamesTheFieldAndTheRule) {
  ExpectRejected(WithSave("/etc/cron.d"), "training.save (\"/etc/cron.d\")",
                 "must be a relative path under the job's checkpoint directory: must not be "
                 "absolute");
  ExpectRejected(WithSave("../../etc"), "training.save", "\"..\" components");
  ExpectRejected(WithSave("a/../b"), "training.save", "\"..\" components");
  ExpectRejected(WithSave("a\nb"), "training.save (\"a\\nb\")", "control characters");
  ExpectRejected(WithLoad("/etc/shadow"), "training.load", "must not be absolute");
  ExpectRejected(WithLoad("jobs/3/../4"), "training.load", "\"..\" components");
  ExpectRejected(WithLoad("other"), "training.load", "must start with jobs/<id>");
  ExpectRejected(WithLoad("jobs"), "training.load", "must start with jobs/<id>");
  ExpectRejected(WithLoad("jobs/0"), "training.load", "must start with jobs/<id>");
  ExpectRejected(WithLoad("jobs/03"), "training.load", "must start with jobs/<id>");
  v1::JobSpec data;
  data.mutable_data()->add_data_path("/etc/shadow");
  ExpectRejected(data, "data.data_path[0] (\"/etc/shadow\")",
                 "must be a relative path under the data root: must not be absolute");
  data.clear_data();
  for (const char* p : {"0.7", "wiki", "0.3", "../code"}) data.mutable_data()->add_data_path(p);
  ExpectRejected(data, "data.data_path[3]", "\"..\" components");
  data.clear_data();
  data.mutable_data()->set_tokenizer_model("/models/tok.json");
  ExpectRejected(data, "data.tokenizer_model", "must not be absolute");
}

TEST(CheckJobSpecPaths, AcceptsEmptyAndRelativeForms) {
  v1::JobSpec spec;
  EXPECT_TRUE(CheckJobSpecPaths(spec).ok());  // everything empty: job dir, own checkpoints
  spec.mutable_training()->set_save("ckpt");
  spec.mutable_training()->set_load("jobs/3/step_600");  // another job's checkpoint, by name
  for (const char* p : {"0.7", "wiki/text_document", "0.3", "code_text_document"}) {
    spec.mutable_data()->add_data_path(p);
  }
  spec.mutable_data()->set_tokenizer_model("tokenizers/gpt2.json");
  const absl::Status s = CheckJobSpecPaths(spec);
  std::printf("  %s -> %s\n", spec.ShortDebugString().c_str(), s.ToString().c_str());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ResolveJobSpecPaths, PutsEveryPathUnderItsRoot) {
  const JobRoots roots{"/ck", "/data/"};
  v1::JobSpec spec;
  ASSERT_TRUE(ResolveJobSpecPaths(roots, 7, &spec).ok());
  EXPECT_EQ(spec.training().save(), "/ck/jobs/7");
  EXPECT_EQ(spec.training().load(), "/ck/jobs/7");  // resume the job's own checkpoints
  EXPECT_EQ(spec.data().data_path_size(), 0);       // the worker's default corpus
  EXPECT_EQ(spec.data().tokenizer_model(), "");

  spec.Clear();
  spec.mutable_training()->set_save("run1");
  spec.mutable_training()->set_load("jobs/3/step_600");
  for (const char* p : {"0.7", "wiki", "0.3", "code"}) spec.mutable_data()->add_data_path(p);
  spec.mutable_data()->set_tokenizer_model("tok.json");
  ASSERT_TRUE(ResolveJobSpecPaths(roots, 7, &spec).ok());
  std::printf("  resolved: %s\n", spec.ShortDebugString().c_str());
  EXPECT_EQ(spec.training().save(), "/ck/jobs/7/run1");
  EXPECT_EQ(spec.training().load(), "/ck/jobs/3/step_600");
  EXPECT_EQ(spec.data().data_path(0), "0.7");  // weights stay weights
  EXPECT_EQ(spec.data().data_path(1), "/data/wiki");
  EXPECT_EQ(spec.data().data_path(3), "/data/code");
  EXPECT_EQ(spec.data().tokenizer_model(), "/data/tok.json");
}

TEST(ResolveJobSpecPaths, RefusesAStoredAbsolutePath) {
  v1::JobSpec spec = WithSave("/etc/cron.d");  // stored before the rules existed
  const absl::Status s = ResolveJobSpecPaths(JobRoots{}, 7, &spec);
  std::printf("  %s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.training().save(), "/etc/cron.d");  // untouched
}

// The on-disk layout of the containment tests: root/ (checkpoint root) with jobs/3/ and a
// symlink inside pointing inside, a symlink pointing out, a dangling symlink; outside/ beside it.
class OnDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = FreshDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    fs::create_directories(root_ + "/jobs/3");
    fs::create_directories(outside_);
    fs::create_directory_symlink(root_ + "/jobs/3", root_ + "/jobs/alias3");
    fs::create_directory_symlink(outside_, root_ + "/jobs/escape");
    fs::create_symlink(outside_ + "/not_yet", root_ + "/jobs/dangling");
  }
  absl::Status Check(const std::string& path) {
    const absl::Status s = CheckInsideRoot("training.save", path, root_, "the checkpoint root");
    std::printf("  %s -> %s\n", path.c_str(), s.ToString().c_str());
    return s;
  }
  std::string base_, root_, outside_;
};

TEST_F(OnDisk, InsideTheRootIsAccepted) {
  EXPECT_TRUE(Check(root_).ok());
  EXPECT_TRUE(Check(root_ + "/jobs/3").ok());
  EXPECT_TRUE(Check(root_ + "/jobs/4/not/yet/created").ok());  // missing parts are appended
  EXPECT_TRUE(Check(root_ + "/jobs/alias3/step_5").ok());      // symlink inside the root
  EXPECT_EQ(*ResolveOnDisk(root_ + "/jobs/alias3/step_5"), root_ + "/jobs/3/step_5");
}

TEST_F(OnDisk, EscapesAreRefusedNamingTheField) {
  absl::Status s = Check(root_ + "/jobs/escape/x");  // symlink out of the root
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "training.save")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "resolves to " + outside_ +
                                                 "/x, outside the "
                                                 "checkpoint root " +
                                                 root_))
      << s;
  s = Check(outside_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = Check(root_ + "/../outside");  // ".." even where it would land inside is refused
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "\"..\" components")) << s;
  s = Check(root_ + "/jobs/3/../../../outside");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = Check("jobs/3");  // relative: the worker's working directory is no root
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "must be absolute")) << s;
  s = Check(root_ + "x");  // a sibling sharing the root's name as a prefix
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = Check(root_ + "/jobs/dangling");  // writing through it would create outside/not_yet
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "dangling")) << s;
  EXPECT_FALSE(fs::exists(outside_ + "/not_yet"));
}

TEST_F(OnDisk, AssignedSpecChecksEveryField) {
  const JobRoots roots{root_, base_ + "/data"};
  fs::create_directories(roots.data_root);
  std::ofstream(roots.data_root + "/text.bin") << "x";
  std::ofstream(roots.data_root + "/text.idx") << "x";
  fs::create_symlink("/etc/passwd", roots.data_root + "/evil.idx");
  v1::JobSpec spec;
  spec.mutable_training()->set_save(root_ + "/jobs/4");
  spec.mutable_training()->set_load(root_ + "/jobs/3");  // another job's, named
  spec.mutable_data()->add_data_path(roots.data_root + "/text");
  EXPECT_TRUE(CheckAssignedSpecPaths(spec, roots).ok());

  v1::JobSpec bad = spec;
  bad.mutable_training()->set_load("/etc");
  absl::Status s = CheckAssignedSpecPaths(bad, roots);
  std::printf("  load /etc -> %s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "training.load")) << s;

  bad = spec;
  bad.mutable_data()->set_data_path(0, roots.data_root + "/evil");  // evil.idx -> /etc/passwd
  s = CheckAssignedSpecPaths(bad, roots);
  std::printf("  data evil -> %s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "data.data_path[0]")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "/etc/passwd")) << s;

  bad = spec;
  bad.mutable_data()->set_tokenizer_model(root_ + "/jobs/3/tok.json");  // not the data root
  s = CheckAssignedSpecPaths(bad, roots);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "data.tokenizer_model")) << s;
}

TEST(SplitStepDirectory, RecognisesStepDirectoriesOnly) {
  auto s = SplitStepDirectory("/ck/jobs/3/step_600");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->first, "/ck/jobs/3");
  EXPECT_EQ(s->second, 600);
  EXPECT_FALSE(SplitStepDirectory("/ck/jobs/3").has_value());
  EXPECT_FALSE(SplitStepDirectory("/ck/jobs/3/step_").has_value());
  EXPECT_FALSE(SplitStepDirectory("/ck/jobs/3/step_06").has_value());
  EXPECT_FALSE(SplitStepDirectory("/ck/jobs/3/step_-1").has_value());
}

}  // namespace
}  // namespace switchyard
