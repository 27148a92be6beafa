// File: data/indexed_dataset.cc
#include "data/indexed_dataset.h"

#include <cassert>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status.h"

namespace switchyard {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the MMIDIDX format is little-endian; this code reads it natively");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr uint64_t kHeaderSize = 9 + 8 + 1 + 8 + 8;  // 34

template <typename T>
T LoadUnaligned(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

bool ValidDTypeCode(uint8_t code) { return code >= 1 && code <= 8; }

}  // namespace

int64_t IndexedDTypeSize(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::kUInt8:
    case IndexedDType::kInt8:
      return 1;
    case IndexedDType::kInt16:
    case IndexedDType::kUInt16:
      return 2;
    case IndexedDType::kInt32:
    case IndexedDType::kFloat32:
      return 4;
    case IndexedDType::kInt64:
    case IndexedDType::kFloat64:
      return 8;
  }
  return 0;
}

const char* IndexedDTypeName(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::kUInt8:
      return "uint8";
    case IndexedDType::kInt8:
      return "int8";
    case IndexedDType::kInt16:
      return "int16";
    case IndexedDType::kInt32:
      return "int32";
    case IndexedDType::kInt64:
      return "int64";
    case IndexedDType::kFloat64:
      return "float64";
    case IndexedDType::kFloat32:
      return "float32";
    case IndexedDType::kUInt16:
      return "uint16";
  }
  return "unknown";
}

bool IndexedDTypeIsInteger(IndexedDType dtype) {
  return dtype != IndexedDType::kFloat32 && dtype != IndexedDType::kFloat64;
}

// ---------------------------------------------------------------------------------------------
// Reader

struct IndexedDataset::State {
  std::string prefix;
  std::string idx_path;
  MappedFile idx;
  MappedFile bin;
  IndexedDType dtype = IndexedDType::kUInt8;
  int64_t item_size = 1;
  int64_t num_sequences = 0;
  int64_t num_doc_entries = 0;  // the document-count field
  const char* lengths = nullptr;
  const char* pointers = nullptr;
  const char* doc_index = nullptr;

  absl::Status Error(absl::string_view field, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(idx_path, ": field ", field, ": ", problem));
  }
  absl::Status Validate();
};

absl::Status IndexedDataset::State::Validate() {
  const uint64_t size = idx.size();
  const char* p = idx.data();
  if (size < kHeaderSize) {
    return Error("header", absl::StrCat("file has ", size, " bytes, the header alone needs ",
                                        kHeaderSize, " (truncated?)"));
  }
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    return Error("magic", "is not \"MMIDIDX\\x00\\x00\" (not a Megatron indexed dataset)");
  }
  const uint64_t version = LoadUnaligned<uint64_t>(p + 9);
  if (version != kVersion) {
    return Error("version", absl::StrCat(version, " is not supported (only 1)"));
  }
  const uint8_t code = LoadUnaligned<uint8_t>(p + 17);
  if (!ValidDTypeCode(code)) {
    return Error("dtype", absl::StrCat("code ", code, " is not one of 1..8"));
  }
  dtype = static_cast<IndexedDType>(code);
  item_size = IndexedDTypeSize(dtype);
  const uint64_t s = LoadUnaligned<uint64_t>(p + 18);
  const uint64_t d = LoadUnaligned<uint64_t>(p + 26);
  const uint64_t body = size - kHeaderSize;
  if (s > body / 12) {
    return Error("sequence_count", absl::StrCat(s, " sequences need ", "12 bytes each but only ",
                                                body, " bytes follow the header (truncated?)"));
  }
  if (d > (body - 12 * s) / 8) {
    return Error("document_count",
                 absl::StrCat(d, " document-index entries need 8 bytes each but only ",
                              body - 12 * s, " bytes follow the sequence arrays (truncated?)"));
  }
  if (d == 0) return Error("document_count", "is 0; the document index must at least hold 0");
  const uint64_t expected = kHeaderSize + 12 * s + 8 * d;
  if (size != expected) {
    return Error("file size",
                 absl::StrCat(size, " bytes, but the header's counts (", s, " sequences, ", d,
                              " document-index entries) give ", expected,
                              " (trailing bytes; multimodal index files "
                              "are not supported)"));
  }
  num_sequences = static_cast<int64_t>(s);
  num_doc_entries = static_cast<int64_t>(d);
  lengths = p + kHeaderSize;
  pointers = lengths + 4 * s;
  doc_index = pointers + 8 * s;

  const uint64_t bin_size = bin.size();
  for (int64_t i = 0; i < num_sequences; ++i) {
    const int32_t len = LoadUnaligned<int32_t>(lengths + 4 * i);
    if (len < 0) return Error(absl::StrCat("sequence_lengths[", i, "]"), "is negative");
    const int64_t ptr = LoadUnaligned<int64_t>(pointers + 8 * i);
    if (ptr < 0) return Error(absl::StrCat("sequence_pointers[", i, "]"), "is negative");
    if (ptr % item_size != 0) {
      return Error(absl::StrCat("sequence_pointers[", i, "]"),
                   absl::StrCat(ptr, " is not a multiple of the ", IndexedDTypeName(dtype),
                                " size ", item_size));
    }
    const uint64_t end = static_cast<uint64_t>(ptr) + static_cast<uint64_t>(len) * item_size;
    if (static_cast<uint64_t>(ptr) > bin_size || end > bin_size) {
      return Error(absl::StrCat("sequence_pointers[", i, "]"),
                   absl::StrCat("sequence bytes [", ptr, ", ", end, ") exceed ", prefix, ".bin of ",
                                bin_size, " bytes (truncated .bin?)"));
    }
  }
  int64_t prev = 0;
  for (int64_t j = 0; j < num_doc_entries; ++j) {
    const int64_t v = LoadUnaligned<int64_t>(doc_index + 8 * j);
    if (j == 0 && v != 0) return Error("document_indices[0]", absl::StrCat(v, " is not 0"));
    if (v < prev) {
      return Error(absl::StrCat("document_indices[", j, "]"),
                   absl::StrCat(v, " is less than the previous entry ", prev));
    }
    if (v > num_sequences) {
      return Error(absl::StrCat("document_indices[", j, "]"),
                   absl::StrCat(v, " exceeds the sequence count ", num_sequences));
    }
    prev = v;
  }
  if (prev != num_sequences) {
    return Error(absl::StrCat("document_indices[", num_doc_entries - 1, "]"),
                 absl::StrCat(prev, " is not the sequence count ", num_sequences));
  }
  return absl::OkStatus();
}

absl::StatusOr<IndexedDataset> IndexedDataset::Open(const std::string& prefix) {
  auto state = std::make_shared<State>();
  state->prefix = prefix;
  state->idx_path = prefix + ".idx";
  SY_ASSIGN_OR_RETURN(state->idx, MappedFile::Open(state->idx_path));
  SY_ASSIGN_OR_RETURN(state->bin, MappedFile::Open(prefix + ".bin"));
  SY_RETURN_IF_ERROR(state->Validate());
  return IndexedDataset(std::move(state));
}

const std::string& IndexedDataset::prefix() const { return state_->prefix; }
IndexedDType IndexedDataset::dtype() const { return state_->dtype; }
int64_t IndexedDataset::num_sequences() const { return state_->num_sequences; }
int64_t IndexedDataset::num_documents() const { return state_->num_doc_entries - 1; }

int64_t IndexedDataset::SequenceLength(int64_t i) const {
  assert(i >= 0 && i < state_->num_sequences);
  return LoadUnaligned<int32_t>(state_->lengths + 4 * i);
}

int64_t IndexedDataset::SequencePointer(int64_t i) const {
  assert(i >= 0 && i < state_->num_sequences);
  return LoadUnaligned<int64_t>(state_->pointers + 8 * i);
}

int64_t IndexedDataset::DocumentIndex(int64_t j) const {
  assert(j >= 0 && j < state_->num_doc_entries);
  return LoadUnaligned<int64_t>(state_->doc_index + 8 * j);
}

std::vector<int64_t> IndexedDataset::DocumentIndices() const {
  std::vector<int64_t> out(state_->num_doc_entries);
  if (!out.empty()) std::memcpy(out.data(), state_->doc_index, 8 * out.size());
  return out;
}

const char* IndexedDataset::SequenceData(int64_t i) const {
  const char* base = state_->bin.data();
  return base == nullptr ? nullptr : base + SequencePointer(i);
}

absl::StatusOr<absl::string_view> IndexedDataset::GetBytes(int64_t i) const {
  if (i < 0 || i >= state_->num_sequences) {
    return absl::OutOfRangeError(absl::StrCat(state_->prefix, ": sequence ", i, " is not in [0, ",
                                              state_->num_sequences, ")"));
  }
  const int64_t n = SequenceLength(i) * state_->item_size;
  if (n == 0) return absl::string_view();
  return absl::string_view(SequenceData(i), static_cast<size_t>(n));
}

namespace {
template <typename T>
absl::Status Widen(const char* src, absl::Span<int32_t> out, const std::string& what) {
  for (size_t k = 0; k < out.size(); ++k) {
    const T v = LoadUnaligned<T>(src + k * sizeof(T));
    if constexpr (sizeof(T) >= 4 && !std::is_same_v<T, int32_t>) {
      if (v > std::numeric_limits<int32_t>::max() || v < std::numeric_limits<int32_t>::min()) {
        return absl::OutOfRangeError(
            absl::StrCat(what, ": token ", v, " at position ", k, " does not fit int32"));
      }
    }
    out[k] = static_cast<int32_t>(v);
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status IndexedDataset::ReadTokens(int64_t i, int64_t offset, absl::Span<int32_t> out) const {
  SY_ASSIGN_OR_RETURN(absl::string_view bytes, GetBytes(i));
  const int64_t len = SequenceLength(i);
  const int64_t count = static_cast<int64_t>(out.size());
  const std::string what = absl::StrCat(state_->prefix, ": sequence ", i);
  if (offset < 0 || offset > len || count > len - offset) {
    return absl::OutOfRangeError(absl::StrCat(what, ": tokens [", offset, ", ", offset + count,
                                              ") are not within its ", len, " tokens"));
  }
  if (count == 0) return absl::OkStatus();
  const char* src = bytes.data() + offset * state_->item_size;
  switch (state_->dtype) {
    case IndexedDType::kUInt8:
      return Widen<uint8_t>(src, out, what);
    case IndexedDType::kInt8:
      return Widen<int8_t>(src, out, what);
    case IndexedDType::kInt16:
      return Widen<int16_t>(src, out, what);
    case IndexedDType::kUInt16:
      return Widen<uint16_t>(src, out, what);
    case IndexedDType::kInt32:
      return Widen<int32_t>(src, out, what);
    case IndexedDType::kInt64:
      return Widen<int64_t>(src, out, what);
    case IndexedDType::kFloat32:
    case IndexedDType::kFloat64:
      break;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": ReadTokens needs an integer dtype, the dataset holds ", IndexedDTypeName(dtype())));
}

// ---------------------------------------------------------------------------------------------
// Writer

IndexedDatasetWriter::IndexedDatasetWriter(IndexedDType dtype) : dtype_(dtype) {}

namespace {
template <typename T>
absl::Status Narrow(absl::Span<const int64_t> tokens, std::string* bin) {
  const size_t start = bin->size();
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int64_t v = tokens[k];
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      bin->resize(start);
      return absl::OutOfRangeError(absl::StrCat("IndexedDatasetWriter::Add: token ", v,
                                                " at position ", k, " does not fit ",
                                                IndexedDTypeName(IndexedDTypeOf<T>())));
    }
    Append<T>(bin, static_cast<T>(v));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status IndexedDatasetWriter::Add(absl::Span<const int64_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::OutOfRangeError(absl::StrCat("IndexedDatasetWriter::Add: ", tokens.size(),
                                              " tokens exceed the int32 sequence length"));
  }
  const int64_t pointer = static_cast<int64_t>(bin_.size());
  absl::Status status;
  switch (dtype_) {
    case IndexedDType::kUInt8:
      status = Narrow<uint8_t>(tokens, &bin_);
      break;
    case IndexedDType::kInt8:
      status = Narrow<int8_t>(tokens, &bin_);
      break;
    case IndexedDType::kInt16:
      status = Narrow<int16_t>(tokens, &bin_);
      break;
    case IndexedDType::kUInt16:
      status = Narrow<uint16_t>(tokens, &bin_);
      break;
    case IndexedDType::kInt32:
      status = Narrow<int32_t>(tokens, &bin_);
      break;
    case IndexedDType::kInt64:
      status = Narrow<int64_t>(tokens, &bin_);
      break;
    case IndexedDType::kFloat32:
    case IndexedDType::kFloat64:
      return absl::FailedPreconditionError(
          absl::StrCat("IndexedDatasetWriter::Add: integer tokens into a ",
                       IndexedDTypeName(dtype_), " dataset; use AddRaw"));
  }
  SY_RETURN_IF_ERROR(status);
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  pointers_.push_back(pointer);
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::AddRaw(const void* data, int64_t count) {
  if (count < 0 || count > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(
        absl::StrCat("IndexedDatasetWriter::AddRaw: count ", count, " is not in [0, INT32_MAX]"));
  }
  if (count > 0 && data == nullptr) {
    return absl::InvalidArgumentError("IndexedDatasetWriter::AddRaw: data is null");
  }
  pointers_.push_back(static_cast<int64_t>(bin_.size()));
  lengths_.push_back(static_cast<int32_t>(count));
  bin_.append(static_cast<const char*>(data),
              static_cast<size_t>(count * IndexedDTypeSize(dtype_)));
  return absl::OkStatus();
}

void IndexedDatasetWriter::EndDocument() {
  document_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

std::string IndexedDatasetWriter::IndexBytes() const {
  std::vector<int64_t> docs = document_indices_;
  if (docs.back() != num_sequences()) docs.push_back(num_sequences());
  std::string out(kMagic, sizeof(kMagic));
  Append<uint64_t>(&out, kVersion);
  Append<uint8_t>(&out, static_cast<uint8_t>(dtype_));
  Append<uint64_t>(&out, lengths_.size());
  Append<uint64_t>(&out, docs.size());
  out.append(reinterpret_cast<const char*>(lengths_.data()), 4 * lengths_.size());
  out.append(reinterpret_cast<const char*>(pointers_.data()), 8 * pointers_.size());
  out.append(reinterpret_cast<const char*>(docs.data()), 8 * docs.size());
  return out;
}

absl::Status IndexedDatasetWriter::Finalize(const std::string& prefix) const {
  // .bin first: a reader that finds the new .idx also finds the .bin it describes.
  SY_RETURN_IF_ERROR(WriteFileAtomically(prefix + ".bin", bin_));
  return WriteFileAtomically(prefix + ".idx", IndexBytes());
}

}  // namespace switchyard
