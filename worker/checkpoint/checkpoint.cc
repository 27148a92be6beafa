#include "worker/checkpoint/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace switchyard {

// ---------------------------------------------------------------------------------------------
// CRC32C

namespace {

using Crc32cTables = std::array<std::array<uint32_t, 256>, 8>;

Crc32cTables MakeCrc32cTables() {
  constexpr uint32_t kPoly = 0x82F63B78u;
  Crc32cTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
  }
  return t;
}

const Crc32cTables& Tables() {
  static const Crc32cTables tables = MakeCrc32cTables();
  return tables;
}

}  // namespace

uint32_t Crc32c(absl::string_view data, uint32_t crc) {
  const Crc32cTables& t = Tables();
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  uint32_t c = ~crc;
  // Slicing-by-8: eight table lookups per 8 input bytes (byte order independent of the host).
  while (n >= 8) {
    const uint32_t lo = c ^ (static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                             static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
    c = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
        t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xffu];
  return ~c;
}

// ---------------------------------------------------------------------------------------------
// File helpers

namespace {

constexpr char kManifestName[] = "manifest.json";
constexpr char kLatestName[] = "latest";
constexpr char kManifestCrcKey[] = "manifest_crc32c";
constexpr char kTensorsKey[] = "tensors";
constexpr char kFormat[] = "switchyard-checkpoint";
constexpr int kVersion = 1;
constexpr char kStepPrefix[] = "step_";
constexpr char kTempPrefix[] = ".tmp_step_";

absl::Status ErrnoError(int err, const std::string& what) { return absl::ErrnoToStatus(err, what); }

// Checkpoints are private to the user the workers run as: directories 0700, files 0600.
constexpr mode_t kDirMode = 0700;
constexpr mode_t kFileMode = 0600;

// Writes `bytes` to `dir`/`name` atomically (common/file_util.h), mode kFileMode.
absl::Status WriteFileAtomic(const std::string& dir, const std::string& name,
                             absl::string_view bytes) {
  return WriteFileAtomically(absl::StrCat(dir, "/", name), bytes, kFileMode);
}

// mkdir -p `dir`: each missing directory is created with kDirMode (existing ones keep theirs).
absl::Status MakeDirectories(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(dir, ": not a directory"));
  }
  const size_t last = dir.find_last_not_of('/');
  const size_t slash = last == std::string::npos ? std::string::npos : dir.rfind('/', last);
  if (slash != std::string::npos && slash > 0) {
    SY_RETURN_IF_ERROR(MakeDirectories(dir.substr(0, slash)));
  }
  if (mkdir(dir.c_str(), kDirMode) != 0 && errno != EEXIST) {
    return ErrnoError(errno, absl::StrCat(dir, ": create checkpoint directory"));
  }
  return absl::OkStatus();
}

// Reads a small file whole. kNotFound if it does not exist.
// Reads `path` from start to end in chunks of at most `chunk_bytes`, handing each to `consume`,
// and stops at the first error: open / read failures as ErrnoError naming the path, or what
// `consume` returns. The one read loop of ReadSmallFile and DigestFile (EINTR retried, the
// descriptor closed on every path).
absl::Status ForEachChunk(const std::string& path, size_t chunk_bytes,
                          const std::function<absl::Status(absl::string_view)>& consume) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, absl::StrCat(path, ": open"));
  std::vector<char> buf(chunk_bytes);
  absl::Status status;
  while (status.ok()) {
    const ssize_t r = read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      status = ErrnoError(err, absl::StrCat(path, ": read"));
      break;
    }
    if (r == 0) break;
    status = consume(absl::string_view(buf.data(), static_cast<size_t>(r)));
  }
  close(fd);
  return status;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  std::string out;
  SY_RETURN_IF_ERROR(ForEachChunk(path, 65536, [&](absl::string_view chunk) {
    out.append(chunk.data(), chunk.size());
    if (out.size() > max_bytes) {
      return absl::DataLossError(absl::StrCat(path, ": larger than ", max_bytes, " bytes"));
    }
    return absl::OkStatus();
  }));
  return out;
}

struct FileDigest {
  uint64_t size = 0;
  uint32_t crc32c = 0;
};

// Size and CRC32C of the bytes of `path` as read back from the file system.
absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  FileDigest d;
  SY_RETURN_IF_ERROR(ForEachChunk(path, size_t{4} << 20, [&](absl::string_view chunk) {
    d.crc32c = Crc32c(chunk, d.crc32c);
    d.size += static_cast<uint64_t>(chunk.size());
    return absl::OkStatus();
  }));
  return d;
}

bool ValidFileName(absl::string_view file) {
  if (file.empty() || file.size() > 255 || file[0] == '.' || file == kManifestName) return false;
  for (char ch : file) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

// Parses "step_<N>" (N decimal, no sign, no leading '+').
std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  if (name.substr(0, 5) != kStepPrefix) return std::nullopt;
  const absl::string_view digits = name.substr(5);
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(digits, &step)) return std::nullopt;
  return step;
}

std::string StepDirName(int64_t step) { return absl::StrCat(kStepPrefix, step); }

bool PathExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

void RemoveTreeBestEffort(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

// Names of the entries of `dir` (without "." and "..").
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoError(errno, absl::StrCat(dir, ": opendir"));
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

}  // namespace

std::string CheckpointStepDir(const std::string& root, int64_t step) {
  return absl::StrCat(root, "/", StepDirName(step));
}

// ---------------------------------------------------------------------------------------------
// CheckpointWriter

void CheckpointWriter::AddTensor(const std::string& file, std::string name,
                                 const Tensor& cpu_tensor) {
  if (!ValidFileName(file)) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(absl::StrCat(
          "CheckpointWriter::AddTensor: file \"", file,
          "\" must be 1-255 characters of [A-Za-z0-9._-], not start with '.', and not be \"",
          kManifestName, "\""));
    }
    return;
  }
  files_[file].Add(std::move(name), cpu_tensor);
}

void CheckpointWriter::SetMetadata(std::string key, std::string value) {
  if (key.empty()) {
    if (error_.ok()) error_ = absl::InvalidArgumentError("CheckpointWriter: empty metadata key");
    return;
  }
  metadata_[std::move(key)] = std::move(value);
}

void CheckpointWriter::SetMetadata(std::string key, int64_t value) {
  if (key.empty()) {
    if (error_.ok()) error_ = absl::InvalidArgumentError("CheckpointWriter: empty metadata key");
    return;
  }
  metadata_[std::move(key)] = value;
}

absl::StatusOr<std::string> BeginCheckpointTempDir(const std::string& root, int64_t step,
                                                   uint64_t token) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint commit: step (", step, ") must be >= 0"));
  }
  if (root.empty()) return absl::InvalidArgumentError("checkpoint commit: empty root");
  SY_RETURN_IF_ERROR(MakeDirectories(root));
  const std::string final_dir = absl::StrCat(root, "/", StepDirName(step));
  if (PathExists(final_dir)) {
    return absl::AlreadyExistsError(
        absl::StrCat(final_dir, ": checkpoint step ", step, " already exists"));
  }
  const std::string tmp_dir = absl::StrCat(root, "/", kTempPrefix, step, "_", token);
  RemoveTreeBestEffort(tmp_dir);  // Left by an earlier failed commit of this process.
  if (mkdir(tmp_dir.c_str(), kDirMode) != 0) {
    return ErrnoError(errno, absl::StrCat(tmp_dir, ": mkdir"));
  }
  return tmp_dir;
}

absl::StatusOr<CheckpointFileDigest> SealCheckpointFile(const std::string& dir,
                                                        const std::string& name) {
  if (!ValidFileName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint file \"", name,
        "\" must be 1-255 characters of [A-Za-z0-9._-], not start with '.', and not be \"",
        kManifestName, "\""));
  }
  const std::string path = absl::StrCat(dir, "/", name);
  // The temp directory is 0700, so nobody else could open the file before this.
  if (chmod(path.c_str(), kFileMode) != 0) {
    return ErrnoError(errno, absl::StrCat(path, ": chmod"));
  }
  SY_ASSIGN_OR_RETURN(const FileDigest digest, DigestFile(path));
  return CheckpointFileDigest{name, digest.size, digest.crc32c};
}

absl::StatusOr<std::string> FinishCheckpointTempDir(
    const std::string& root, int64_t step, const std::string& tmp_dir,
    const std::vector<CheckpointFileDigest>& files,
    const std::map<std::string, CheckpointValue>& metadata, const std::string& tensors_json) {
  const std::string final_dir = absl::StrCat(root, "/", StepDirName(step));
  auto write_all = [&]() -> absl::Status {
    nlohmann::json listed = nlohmann::json::array();
    for (const CheckpointFileDigest& f : files) {
      if (!ValidFileName(f.name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint commit: bad file name \"", f.name, "\""));
      }
      listed.push_back({{"name", f.name}, {"size", f.size}, {"crc32c", f.crc32c}});
    }
    nlohmann::json meta = nlohmann::json::object();
    for (const auto& [key, value] : metadata) {
      if (const auto* i = std::get_if<int64_t>(&value)) {
        meta[key] = *i;
      } else {
        meta[key] = std::get<std::string>(value);
      }
    }
    nlohmann::json manifest = {{"format", kFormat},
                               {"version", kVersion},
                               {"step", step},
                               {"files", std::move(listed)},
                               {"metadata", std::move(meta)}};
    std::string text;
    try {
      // The shard index of a sharded checkpoint (worker/checkpoint/sharded_checkpoint.h); a
      // loader that does not know the key ignores it (it is still covered by the checksum).
      if (!tensors_json.empty()) manifest[kTensorsKey] = nlohmann::json::parse(tensors_json);
      // Self-checksum: CRC32C of the compact dump of the manifest without this key (nlohmann's
      // object keys are sorted, so the dump is canonical for integers and strings).
      manifest[kManifestCrcKey] = Crc32c(manifest.dump());
      text = manifest.dump(2) + "\n";
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint commit: a metadata string is not valid UTF-8 or the tensor index is not "
          "JSON: ",
          e.what()));
    }
    // The manifest goes last; WriteFileAtomic fsyncs it and tmp_dir.
    SY_RETURN_IF_ERROR(WriteFileAtomic(tmp_dir, kManifestName, text));
    if (rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
      const int err = errno;
      if (err == EEXIST || err == ENOTEMPTY) {
        return absl::AlreadyExistsError(
            absl::StrCat(final_dir, ": checkpoint step ", step, " already exists"));
      }
      return ErrnoError(err, absl::StrCat("rename ", tmp_dir, " -> ", final_dir));
    }
    return absl::OkStatus();
  };
  absl::Status status = write_all();
  if (!status.ok()) {
    RemoveTreeBestEffort(tmp_dir);
    return status;
  }
  SY_RETURN_IF_ERROR(FsyncDirectory(root));
  SY_RETURN_IF_ERROR(WriteFileAtomic(root, kLatestName, StepDirName(step) + "\n"));
  return final_dir;
}

absl::StatusOr<std::string> CheckpointWriter::Commit(const std::string& root, int64_t step) const {
  SY_RETURN_IF_ERROR(error_);
  SY_ASSIGN_OR_RETURN(const std::string tmp_dir,
                      BeginCheckpointTempDir(root, step, static_cast<uint64_t>(getpid())));
  std::vector<CheckpointFileDigest> digests;
  for (const auto& [file, writer] : files_) {
    absl::Status st = writer.Write(absl::StrCat(tmp_dir, "/", file));  // fsynced
    absl::StatusOr<CheckpointFileDigest> d =
        st.ok() ? SealCheckpointFile(tmp_dir, file) : absl::StatusOr<CheckpointFileDigest>(st);
    if (!d.ok()) {
      RemoveTreeBestEffort(tmp_dir);
      return d.status();
    }
    digests.push_back(*d);
  }
  return FinishCheckpointTempDir(root, step, tmp_dir, digests, metadata_, "");
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

std::vector<std::string> Checkpoint::Files() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : files_) names.push_back(name);
  return names;
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::File(absl::string_view file) const {
  auto it = files_.find(std::string(file));
  if (it == files_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": checkpoint has no file \"", file, "\""));
  }
  return &it->second;
}

absl::StatusOr<Tensor> Checkpoint::Get(absl::string_view file, absl::string_view name) const {
  SY_ASSIGN_OR_RETURN(const SafetensorsFile* f, File(file));
  if (!f->Has(name)) {
    return absl::NotFoundError(
        absl::StrCat(dir_, "/", file, ": checkpoint file has no tensor \"", name, "\""));
  }
  return f->Get(name);
}

absl::StatusOr<std::string> Checkpoint::GetString(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no metadata key \"", key, "\""));
  }
  if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
  return absl::InvalidArgumentError(
      absl::StrCat(dir_, ": metadata \"", key, "\" is an integer, not a string"));
}

absl::StatusOr<int64_t> Checkpoint::GetInt(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no metadata key \"", key, "\""));
  }
  if (const auto* i = std::get_if<int64_t>(&it->second)) return *i;
  return absl::InvalidArgumentError(
      absl::StrCat(dir_, ": metadata \"", key, "\" is a string, not an integer"));
}

absl::StatusOr<Checkpoint> OpenCheckpointDir(const std::string& dir,
                                             std::optional<int64_t> expected_step) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such checkpoint directory"));
  }
  const std::string manifest_path = absl::StrCat(dir, "/", kManifestName);
  auto text = ReadSmallFile(manifest_path, size_t{64} << 20);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::DataLossError(
          absl::StrCat(manifest_path, ": missing; the checkpoint is incomplete"));
    }
    return text.status();
  }
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": malformed manifest: ", why));
  };
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  std::vector<std::pair<std::string, FileDigest>> listed;
  try {
    nlohmann::json m = nlohmann::json::parse(*text);
    if (!m.is_object()) return bad("not a JSON object");
    if (!m.contains(kManifestCrcKey) || !m[kManifestCrcKey].is_number_unsigned()) {
      return bad(absl::StrCat("no unsigned \"", kManifestCrcKey, "\""));
    }
    const uint64_t want_crc = m[kManifestCrcKey].get<uint64_t>();
    m.erase(kManifestCrcKey);
    const uint32_t got_crc = Crc32c(m.dump());
    if (want_crc != got_crc) {
      return bad(absl::StrFormat("CRC32C 0x%08x of its content, \"%s\" says 0x%08x (corrupt)",
                                 got_crc, kManifestCrcKey, want_crc));
    }
    if (m.value("format", "") != kFormat)
      return bad(absl::StrCat("format is not \"", kFormat, "\""));
    if (!m.contains("version") || !m["version"].is_number_integer() ||
        m["version"].get<int64_t>() != kVersion) {
      return bad(absl::StrCat("version is not ", kVersion));
    }
    if (!m.contains("step") || !m["step"].is_number_integer() || m["step"].get<int64_t>() < 0) {
      return bad("\"step\" is not a non-negative integer");
    }
    ckpt.step_ = m["step"].get<int64_t>();
    if (expected_step.has_value() && *expected_step != ckpt.step_) {
      return bad(absl::StrCat("step ", ckpt.step_, " does not match the directory (step ",
                              *expected_step, ")"));
    }
    if (!m.contains("files") || !m["files"].is_array()) return bad("\"files\" is not an array");
    for (const auto& f : m["files"]) {
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("size") ||
          !f["size"].is_number_unsigned() || !f.contains("crc32c") ||
          !f["crc32c"].is_number_unsigned() || f["crc32c"].get<uint64_t>() > 0xffffffffu) {
        return bad("a \"files\" entry lacks a string name, an unsigned size or a 32-bit crc32c");
      }
      const std::string name = f["name"].get<std::string>();
      if (!ValidFileName(name)) return bad(absl::StrCat("bad file name \"", name, "\""));
      for (const auto& [prev, unused] : listed) {
        if (prev == name) return bad(absl::StrCat("file \"", name, "\" listed twice"));
      }
      listed.push_back({name, FileDigest{f["size"].get<uint64_t>(),
                                         static_cast<uint32_t>(f["crc32c"].get<uint64_t>())}});
    }
    if (m.contains(kTensorsKey)) {
      if (!m[kTensorsKey].is_object())
        return bad(absl::StrCat("\"", kTensorsKey, "\" is not an object"));
      ckpt.tensors_json_ = m[kTensorsKey].dump();
    }
    if (m.contains("metadata")) {
      if (!m["metadata"].is_object()) return bad("\"metadata\" is not an object");
      for (const auto& [key, value] : m["metadata"].items()) {
        if (value.is_string()) {
          ckpt.metadata_[key] = value.get<std::string>();
        } else if (value.is_number_integer()) {
          ckpt.metadata_[key] = value.get<int64_t>();
        } else {
          return bad(absl::StrCat("metadata \"", key, "\" is neither a string nor an integer"));
        }
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }

  for (const auto& [name, want] : listed) {
    const std::string path = absl::StrCat(dir, "/", name);
    auto got = DigestFile(path);
    if (!got.ok()) {
      if (absl::IsNotFound(got.status())) {
        return absl::DataLossError(absl::StrCat(path, ": listed in the manifest but missing"));
      }
      return got.status();
    }
    if (got->size != want.size) {
      return absl::DataLossError(absl::StrCat(path, ": size ", got->size, " bytes, manifest says ",
                                              want.size, " (truncated or overwritten)"));
    }
    if (got->crc32c != want.crc32c) {
      return absl::DataLossError(absl::StrFormat(
          "%s: CRC32C 0x%08x, manifest says 0x%08x (corrupt)", path, got->crc32c, want.crc32c));
    }
    SY_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
    ckpt.files_.emplace(name, std::move(file));
  }
  return ckpt;
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& root, std::optional<int64_t> step) {
  if (step.has_value()) {
    if (*step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadCheckpoint: step (", *step, ") must be >= 0"));
    }
    return OpenCheckpointDir(absl::StrCat(root, "/", StepDirName(*step)), *step);
  }

  std::optional<int64_t> latest_step;
  const std::string latest_path = absl::StrCat(root, "/", kLatestName);
  auto latest = ReadSmallFile(latest_path, 4096);
  if (latest.ok()) {
    std::string name = *latest;
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) {
      name.pop_back();
    }
    latest_step = ParseStepDirName(name);
    if (!latest_step.has_value()) {
      SY_LOG(WARNING) << latest_path << ": does not name a step directory (\"" << name
                      << "\"); falling back to the highest complete step";
    } else {
      auto ckpt = OpenCheckpointDir(absl::StrCat(root, "/", name), *latest_step);
      if (ckpt.ok()) return ckpt;
      SY_LOG(WARNING) << latest_path << " names " << name << ", which cannot be loaded ("
                      << ckpt.status().message() << "); falling back to the highest complete step";
    }
  } else if (!absl::IsNotFound(latest.status())) {
    SY_LOG(WARNING) << latest.status().message() << "; falling back to the highest complete step";
  }

  SY_ASSIGN_OR_RETURN(const std::vector<std::string> entries, ListDir(root));
  std::vector<int64_t> steps;
  for (const std::string& e : entries) {
    if (auto s = ParseStepDirName(e); s.has_value() && StepDirName(*s) == e) steps.push_back(*s);
  }
  std::sort(steps.rbegin(), steps.rend());
  for (int64_t s : steps) {
    if (latest_step.has_value() && s == *latest_step) continue;  // Already tried and rejected.
    auto ckpt = OpenCheckpointDir(absl::StrCat(root, "/", StepDirName(s)), s);
    if (ckpt.ok()) return ckpt;
    SY_LOG(WARNING) << "skipping checkpoint " << root << "/" << StepDirName(s) << ": "
                    << ckpt.status().message();
  }
  return absl::NotFoundError(absl::StrCat(root, ": no complete checkpoint (", steps.size(),
                                          " step directories, none verifies)"));
}

bool HasCommittedStep(const std::string& root, int64_t step) {
  return step >= 0 && PathExists(absl::StrCat(CheckpointStepDir(root, step), "/", kManifestName));
}

absl::StatusOr<std::optional<int64_t>> LatestCommittedStep(const std::string& root) {
  struct stat st;
  if (stat(root.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<int64_t>();
    return ErrnoError(errno, absl::StrCat(root, ": stat"));
  }
  auto latest = ReadSmallFile(absl::StrCat(root, "/", kLatestName), 4096);
  if (latest.ok()) {
    std::string name = *latest;
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) {
      name.pop_back();
    }
    if (auto s = ParseStepDirName(name); s.has_value() && HasCommittedStep(root, *s)) {
      return std::optional<int64_t>(*s);
    }
  }
  SY_ASSIGN_OR_RETURN(const std::vector<std::string> entries, ListDir(root));
  std::optional<int64_t> best;
  for (const std::string& e : entries) {
    auto s = ParseStepDirName(e);
    if (s.has_value() && StepDirName(*s) == e && HasCommittedStep(root, *s) &&
        (!best.has_value() || *s > *best)) {
      best = *s;
    }
  }
  return best;
}

absl::StatusOr<int> RemoveStaleCheckpointTempDirs(const std::string& root) {
  SY_ASSIGN_OR_RETURN(const std::vector<std::string> entries, ListDir(root));
  int removed = 0;
  for (const std::string& e : entries) {
    if (e.rfind(kTempPrefix, 0) != 0) continue;
    const size_t underscore = e.rfind('_');
    int64_t pid = 0;
    if (underscore == std::string::npos || !absl::SimpleAtoi(e.substr(underscore + 1), &pid) ||
        pid <= 0) {
      continue;
    }
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // Owner alive.
    std::error_code ec;
    std::filesystem::remove_all(absl::StrCat(root, "/", e), ec);
    if (ec) return ErrnoError(ec.value(), absl::StrCat(root, "/", e, ": remove"));
    ++removed;
  }
  return removed;
}

}  // namespace switchyard
