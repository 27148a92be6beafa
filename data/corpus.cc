#include "data/corpus.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace switchyard {
namespace {

constexpr char kHint[] =
    "run tools/setup.sh (or tools/prepare_corpus.sh) to build the default corpus, or set "
    "SWITCHYARD_DATA_DIR to the data directory that holds it";

std::string HomeDir() {
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return home;
  const passwd* pw = getpwuid(getuid());
  return pw != nullptr && pw->pw_dir != nullptr ? pw->pw_dir : "";
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::Status CheckExists(const std::string& path, absl::string_view what) {
  if (FileExists(path)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("corpus ", what, " ", path, " is missing: ", kHint));
}

// Accumulates counts; H = ln N - (1/N) sum c ln c.
template <typename Map>
double EntropyFromCounts(const Map& counts, int64_t n) {
  if (n == 0) return 0.0;
  double sum_c_log_c = 0.0;
  for (const auto& [token, c] : counts) {
    sum_c_log_c += static_cast<double>(c) * std::log(static_cast<double>(c));
  }
  const double h = std::log(static_cast<double>(n)) - sum_c_log_c / static_cast<double>(n);
  return h < 0.0 ? 0.0 : h;  // rounding of a constant stream
}

}  // namespace

std::string DataDir() {
  const char* dir = std::getenv(kDataDirEnv);
  if (dir != nullptr && dir[0] != '\0') return dir;
  return HomeDir() + "/.cache/switchyard/data";
}

std::string DefaultCorpusDir() { return absl::StrCat(DataDir(), "/", kDefaultCorpusName); }

absl::StatusOr<CorpusInfo> LoadCorpusInfo(const std::string& dir) {
  const std::string path = dir + "/corpus.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("no corpus manifest ", path, ": ", kHint));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
  if (!m.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not an object"));
  auto get_string = [&](const char* key, std::string* out) -> absl::Status {
    if (!m.contains(key) || !m[key].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": field \"", key, "\" must be a string"));
    }
    *out = m[key].get<std::string>();
    return absl::OkStatus();
  };
  auto get_count = [&](const char* key, int64_t* out) -> absl::Status {
    if (!m.contains(key) || !m[key].is_number_integer() || m[key].get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": field \"", key, "\" must be an integer >= 0"));
    }
    *out = m[key].get<int64_t>();
    return absl::OkStatus();
  };
  CorpusInfo info;
  info.dir = dir;
  std::string prefix, tokenizer;
  SY_RETURN_IF_ERROR(get_string("name", &info.name));
  SY_RETURN_IF_ERROR(get_string("dataset_prefix", &prefix));
  SY_RETURN_IF_ERROR(get_string("tokenizer", &tokenizer));
  SY_RETURN_IF_ERROR(get_string("source_package", &info.source_package));
  SY_RETURN_IF_ERROR(get_string("package_version", &info.package_version));
  SY_RETURN_IF_ERROR(get_string("bin_sha256", &info.bin_sha256));
  SY_RETURN_IF_ERROR(get_count("documents", &info.documents));
  SY_RETURN_IF_ERROR(get_count("tokens", &info.tokens));
  SY_RETURN_IF_ERROR(get_count("vocab_size", &info.vocab_size));
  if (prefix.empty() || tokenizer.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"dataset_prefix\" and \"tokenizer\" must be non-empty"));
  }
  info.dataset_prefix = dir + "/" + prefix;
  info.tokenizer_path = dir + "/" + tokenizer;
  SY_RETURN_IF_ERROR(CheckExists(info.dataset_prefix + ".bin", "dataset"));
  SY_RETURN_IF_ERROR(CheckExists(info.dataset_prefix + ".idx", "dataset index"));
  SY_RETURN_IF_ERROR(CheckExists(info.tokenizer_path, "tokenizer"));
  return info;
}

absl::StatusOr<CorpusInfo> FindDefaultCorpus() { return LoadCorpusInfo(DefaultCorpusDir()); }

double UnigramEntropyNats(absl::Span<const int32_t> tokens) {
  absl::flat_hash_map<int32_t, int64_t> counts;
  for (int32_t t : tokens) ++counts[t];
  return EntropyFromCounts(counts, static_cast<int64_t>(tokens.size()));
}

absl::StatusOr<double> DatasetUnigramEntropyNats(const IndexedDataset& dataset) {
  absl::flat_hash_map<int32_t, int64_t> counts;
  std::vector<int32_t> buf;
  int64_t n = 0;
  for (int64_t i = 0; i < dataset.num_sequences(); ++i) {
    buf.resize(static_cast<size_t>(dataset.SequenceLength(i)));
    SY_RETURN_IF_ERROR(
        Annotate(dataset.ReadTokens(i, 0, absl::MakeSpan(buf)), absl::StrCat("sequence ", i)));
    for (int32_t t : buf) ++counts[t];
    n += static_cast<int64_t>(buf.size());
  }
  return EntropyFromCounts(counts, n);
}

}  // namespace switchyard
