// File: common/config/job_paths.cc
#include "common/config/job_paths.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/validate.h"

namespace switchyard {
namespace {

constexpr absl::string_view kSaveRule =
    "must be a relative path under the job's checkpoint directory";
constexpr absl::string_view kLoadRule =
    "must be empty (resume this job) or name a job's checkpoint relative to the checkpoint root, "
    "jobs/<id>[/<path>]";
constexpr absl::string_view kDataRule = "must be a relative path under the data root";

// The value as it goes into a message: C-escaped, so control characters are visible.
std::string Shown(absl::string_view value) { return absl::CHexEscape(value); }

absl::Status Violation(absl::string_view field, absl::string_view value, absl::string_view rule,
                       absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " (\"", Shown(value), "\") ", rule, ": ", why));
}

// "" when every component of `path` (split on '/') is a plain name, else the rule broken.
std::string ComponentViolation(absl::string_view path) {
  // The shared check (common/config/validate.h): C0, DEL and the UTF-8 encoded C1 controls, which
  // a hand-written byte test missed.
  if (const size_t at = FirstControlCharacter(path); at != absl::string_view::npos) {
    return absl::StrCat("must not contain NUL or control characters (byte 0x",
                        absl::Hex(static_cast<unsigned char>(path[at]), absl::kZeroPad2),
                        " at offset ", at, ")");
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty()) return "must not have empty components (\"//\" or a trailing '/')";
    if (part == "..") return "must not have \"..\" components";
    if (part == ".") return "must not have \".\" components";
  }
  return "";
}

std::string Join(const std::string& root, absl::string_view rel) {
  if (rel.empty()) return root;
  if (!root.empty() && root.back() == '/') return absl::StrCat(root, rel);
  return absl::StrCat(root, "/", rel);
}

bool IsJobId(absl::string_view s) {
  int64_t id = 0;
  return !s.empty() && s.size() <= 18 && absl::ascii_isdigit(s[0]) && absl::SimpleAtoi(s, &id) &&
         id > 0 && absl::StrCat(id) == s;
}

}  // namespace

std::string RelativePathViolation(absl::string_view path) {
  if (path.empty()) return "must not be empty";
  if (path.front() == '/') return "must not be absolute";
  return ComponentViolation(path);
}

std::vector<int> DataPathIndices(const v1::DataConfig& data) {
  std::vector<int> indices;
  const bool weighted = IsWeightedDataPath(data);  // the validator's detection, not a copy
  for (int i = weighted ? 1 : 0; i < data.data_path_size(); i += weighted ? 2 : 1) {
    indices.push_back(i);
  }
  return indices;
}

absl::StatusOr<std::string> LoadedJobName(const v1::JobSpec& spec) {
  const std::string& load = spec.training().load();
  if (load.empty()) return std::string();
  std::string why = RelativePathViolation(load);
  if (why.empty()) {
    const std::vector<absl::string_view> parts = absl::StrSplit(load, '/');
    if (parts.size() < 2 || parts[0] != "jobs" || !IsJobId(parts[1])) {
      why = "must start with jobs/<id> (a positive job number)";
    } else {
      return absl::StrCat(parts[0], "/", parts[1]);
    }
  }
  return Violation("training.load", load, kLoadRule, why);
}

absl::Status CheckJobSpecPaths(const v1::JobSpec& spec) {
  const v1::TrainingConfig& t = spec.training();
  if (!t.save().empty()) {
    if (std::string why = RelativePathViolation(t.save()); !why.empty()) {
      return Violation("training.save", t.save(), kSaveRule, why);
    }
  }
  if (absl::StatusOr<std::string> loaded = LoadedJobName(spec); !loaded.ok()) {
    return loaded.status();
  }
  const v1::DataConfig& d = spec.data();
  for (int i : DataPathIndices(d)) {
    if (std::string why = RelativePathViolation(d.data_path(i)); !why.empty()) {
      return Violation(absl::StrCat("data.data_path[", i, "]"), d.data_path(i), kDataRule, why);
    }
  }
  if (!d.tokenizer_model().empty()) {
    if (std::string why = RelativePathViolation(d.tokenizer_model()); !why.empty()) {
      return Violation("data.tokenizer_model", d.tokenizer_model(), kDataRule, why);
    }
  }
  return absl::OkStatus();
}

std::string JobDirectory(const std::string& checkpoint_root, int64_t job_id) {
  return Join(checkpoint_root, absl::StrCat("jobs/", job_id));
}

absl::Status ResolveJobSpecPaths(const JobRoots& roots, int64_t job_id, v1::JobSpec* spec) {
  if (job_id <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("job id (", job_id, ") must be positive"));
  }
  if (roots.checkpoint_root.empty() || roots.data_root.empty()) {
    return absl::InvalidArgumentError("checkpoint root and data root must not be empty");
  }
  absl::Status rules = CheckJobSpecPaths(*spec);
  if (!rules.ok()) return rules;
  v1::TrainingConfig& t = *spec->mutable_training();
  t.set_save(Join(JobDirectory(roots.checkpoint_root, job_id), t.save()));
  t.set_load(t.load().empty() ? t.save() : Join(roots.checkpoint_root, t.load()));
  v1::DataConfig& d = *spec->mutable_data();
  for (int i : DataPathIndices(d)) d.set_data_path(i, Join(roots.data_root, d.data_path(i)));
  if (!d.tokenizer_model().empty()) {
    d.set_tokenizer_model(Join(roots.data_root, d.tokenizer_model()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveOnDisk(const std::string& path) {
  if (path.empty() || path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("\"", Shown(path), "\" must be absolute"));
  }
  if (path != "/") {
    absl::string_view rest = absl::string_view(path).substr(1);
    if (absl::EndsWith(rest, "/")) rest.remove_suffix(1);  // "/root/" names "/root"
    if (std::string why = ComponentViolation(rest); !why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", Shown(path), "\" ", why));
    }
  }
  // Walk up from the full path to the deepest component that exists (lstat: a dangling symlink
  // exists), resolve it, append what is missing.
  std::string existing = path;
  while (existing.size() > 1 && existing.back() == '/') existing.pop_back();
  std::string missing;
  while (true) {
    struct stat st;
    if (lstat(existing.c_str(), &st) == 0) break;
    const int err = errno;
    if (err != ENOENT) {
      return absl::FailedPreconditionError(
          absl::StrCat(existing, ": ", absl::ErrnoToStatus(err, "lstat").message()));
    }
    const size_t slash = existing.rfind('/');
    const std::string name = existing.substr(slash + 1);
    missing = missing.empty() ? name : absl::StrCat(name, "/", missing);
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  char buf[PATH_MAX];
  if (realpath(existing.c_str(), buf) == nullptr) {
    const int err = errno;
    return absl::FailedPreconditionError(
        absl::StrCat(existing, ": ", absl::ErrnoToStatus(err, "cannot be resolved").message(),
                     err == ENOENT ? " (a dangling symbolic link)" : ""));
  }
  return Join(buf, missing);
}

absl::Status CheckInsideRoot(absl::string_view field, const std::string& path,
                             const std::string& root, absl::string_view what) {
  absl::StatusOr<std::string> resolved_root = ResolveOnDisk(root);
  if (!resolved_root.ok()) {
    return absl::Status(resolved_root.status().code(),
                        absl::StrCat(field, ": ", what, " ", resolved_root.status().message()));
  }
  absl::StatusOr<std::string> resolved = ResolveOnDisk(path);
  if (!resolved.ok()) {
    return absl::Status(
        resolved.status().code(),
        absl::StrCat(field, " (\"", Shown(path), "\"): ", resolved.status().message()));
  }
  const std::string& r = *resolved_root;
  const bool inside = *resolved == r || r == "/" ||
                      (absl::StartsWith(*resolved, r) && (*resolved)[r.size()] == '/');
  if (!inside) {
    return absl::InvalidArgumentError(absl::StrCat(field, " (\"", Shown(path), "\") resolves to ",
                                                   *resolved, ", outside ", what, " ", r));
  }
  return absl::OkStatus();
}

absl::Status CheckAssignedSpecPaths(const v1::JobSpec& spec, const JobRoots& roots) {
  constexpr absl::string_view kCheckpointRoot = "the checkpoint root";
  constexpr absl::string_view kDataRoot = "the data root";
  const v1::TrainingConfig& t = spec.training();
  if (!t.save().empty()) {
    absl::Status s =
        CheckInsideRoot("training.save", t.save(), roots.checkpoint_root, kCheckpointRoot);
    if (!s.ok()) return s;
  }
  if (!t.load().empty()) {
    absl::Status s =
        CheckInsideRoot("training.load", t.load(), roots.checkpoint_root, kCheckpointRoot);
    if (!s.ok()) return s;
  }
  const v1::DataConfig& d = spec.data();
  for (int i : DataPathIndices(d)) {
    const std::string field = absl::StrCat("data.data_path[", i, "]");
    for (const char* suffix : {"", ".bin", ".idx"}) {
      absl::Status s =
          CheckInsideRoot(field, absl::StrCat(d.data_path(i), suffix), roots.data_root, kDataRoot);
      if (!s.ok()) return s;
    }
  }
  if (!d.tokenizer_model().empty()) {
    absl::Status s =
        CheckInsideRoot("data.tokenizer_model", d.tokenizer_model(), roots.data_root, kDataRoot);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::optional<std::pair<std::string, int64_t>> SplitStepDirectory(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  const absl::string_view name =
      slash == std::string::npos ? absl::string_view(p) : absl::string_view(p).substr(slash + 1);
  int64_t step = 0;
  if (!absl::StartsWith(name, "step_") || !absl::SimpleAtoi(name.substr(5), &step) || step < 0 ||
      absl::StrCat("step_", step) != name) {
    return std::nullopt;
  }
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
  return std::make_pair(dir, step);
}

absl::StatusOr<int64_t> ParseJobName(absl::string_view name) {
  absl::string_view id_text = name;
  int64_t id = 0;
  bool ok = absl::ConsumePrefix(&id_text, "jobs/") && !id_text.empty() && id_text.size() <= 18 &&
            id_text[0] != '0';
  for (char c : id_text) ok = ok && c >= '0' && c <= '9';
  if (ok) ok = absl::SimpleAtoi(id_text, &id) && id > 0;
  if (ok) return id;
  return absl::InvalidArgumentError(
      absl::StrCat("name (\"", absl::CHexEscape(name.substr(0, 64)), name.size() > 64 ? "..." : "",
                   "\") must be jobs/{id} with id a positive integer"));
}

}  // namespace switchyard
