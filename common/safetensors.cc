#include "common/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

// The byte buffer is little-endian; tensors are read and written in host order without swapping.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a LE host");

namespace switchyard {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference's MAX_HEADER_SIZE
constexpr char kMetadataKey[] = "__metadata__";

struct DTypeInfo {
  const char* name;
  int bits;
  bool supported;  // has a DType
  DType dtype;
};

// Every dtype of the format, in the reference's enum order (increasing alignment): the writer
// lays tensors out in decreasing order of this index, as the reference does.
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 8, true, DType::kBool},       {"F4", 4, false, DType::kU8},
    {"F6_E2M3", 6, false, DType::kU8},     {"F6_E3M2", 6, false, DType::kU8},
    {"U8", 8, true, DType::kU8},           {"I8", 8, false, DType::kU8},
    {"F8_E5M2", 8, false, DType::kU8},     {"F8_E4M3", 8, false, DType::kU8},
    {"F8_E8M0", 8, false, DType::kU8},     {"F8_E4M3FNUZ", 8, false, DType::kU8},
    {"F8_E5M2FNUZ", 8, false, DType::kU8}, {"I16", 16, false, DType::kU8},
    {"U16", 16, false, DType::kU8},        {"F16", 16, true, DType::kF16},
    {"BF16", 16, true, DType::kBF16},      {"I32", 32, true, DType::kI32},
    {"U32", 32, false, DType::kU8},        {"F32", 32, true, DType::kF32},
    {"C64", 64, false, DType::kU8},        {"F64", 64, true, DType::kF64},
    {"I64", 64, true, DType::kI64},        {"U64", 64, false, DType::kU8},
};
constexpr int kNumDTypes = sizeof(kDTypes) / sizeof(kDTypes[0]);

int FindDType(absl::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == kDTypes[i].name) return i;
  }
  return -1;
}

int DTypeIndex(DType dtype) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kDTypes[i].supported && kDTypes[i].dtype == dtype) return i;
  }
  return -1;
}

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  const int i = DTypeIndex(dtype);
  return i < 0 ? "?" : kDTypes[i].name;
}

// ---------------------------------------------------------------------------------------------
// Reader

struct SafetensorsFile::State {
  struct Entry {
    int dtype_index = 0;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
    const void* data = nullptr;
  };

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  absl::Status Error(absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
  }
  // Parses and validates the image [bytes, bytes + size), which outlives this State.
  absl::Status Parse(const char* bytes, uint64_t size);
  absl::Status ParseEntry(const std::string& name, const Json& value, Entry* entry) const;

  std::string path;
  MappedFile mapping;                                  // the file's mapping (Open)
  std::vector<uint64_t> image;                         // the file's bytes (FromBytes)
  std::vector<std::unique_ptr<uint64_t[]>> realigned;  // copies of misaligned tensors
  std::map<std::string, Entry, std::less<>> entries;
  std::map<std::string, std::string> metadata;
};

absl::Status SafetensorsFile::State::ParseEntry(const std::string& name, const Json& value,
                                                Entry* entry) const {
  const std::string what = absl::StrCat("tensor \"", name, "\"");
  if (!value.is_object()) return Error(absl::StrCat(what, ": entry is not a JSON object"));
  const auto dtype = value.find("dtype");
  const auto shape = value.find("shape");
  const auto offsets = value.find("data_offsets");
  if (dtype == value.end() || shape == value.end() || offsets == value.end()) {
    return Error(absl::StrCat(what, ": entry needs \"dtype\", \"shape\" and \"data_offsets\""));
  }
  if (!dtype->is_string()) return Error(absl::StrCat(what, ": dtype is not a string"));
  entry->dtype_index = FindDType(dtype->get_ref<const std::string&>());
  if (entry->dtype_index < 0) {
    return Error(absl::StrCat(what, ": unknown dtype ", dtype->dump()));
  }
  if (!shape->is_array()) return Error(absl::StrCat(what, ": shape is not an array"));
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& d : *shape) {
    if (!d.is_number_integer()) {
      return Error(absl::StrCat(what, ": shape ", shape->dump(), " holds a non-integer"));
    }
    if (!d.is_number_unsigned() && d.get<int64_t>() < 0) {
      return Error(absl::StrCat(what, ": negative dim ", d.dump(), " in shape ", shape->dump()));
    }
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    overflow = overflow || __builtin_mul_overflow(numel, v, &numel);
    entry->shape.push_back(static_cast<int64_t>(v));
  }
  if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    return Error(absl::StrCat(what, ": data_offsets ", offsets->dump(),
                              " is not a pair of non-negative integers"));
  }
  entry->begin = (*offsets)[0].get<uint64_t>();
  entry->end = (*offsets)[1].get<uint64_t>();
  if (entry->begin > entry->end) {
    return Error(absl::StrCat(what, ": data_offsets ", offsets->dump(), " has begin > end"));
  }
  uint64_t bits = 0;
  overflow = overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
             __builtin_mul_overflow(numel, uint64_t(kDTypes[entry->dtype_index].bits), &bits);
  if (overflow) {
    return Error(absl::StrCat(what, ": the size of shape ", shape->dump(), " overflows"));
  }
  if (bits % 8 != 0 || bits / 8 != entry->end - entry->begin) {
    return Error(absl::StrCat(what, ": data_offsets ", offsets->dump(), " span ",
                              entry->end - entry->begin, " bytes but ", dtype->dump(), " ",
                              shape->dump(), " needs ", bits / 8.0, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsFile::State::Parse(const char* bytes, uint64_t size) {
  if (size < 8) {
    return Error(absl::StrCat("file has ", size, " bytes, fewer than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > kMaxHeaderBytes) {
    return Error(absl::StrCat("header length ", n, " exceeds the limit of ", kMaxHeaderBytes));
  }
  if (n > size - 8) {
    return Error(absl::StrCat("header length ", n, " is larger than the ", size - 8,
                              " bytes that follow it in the file"));
  }

  // nlohmann's lexer takes a NUL byte for the end of input; valid JSON never holds a raw one.
  if (std::memchr(bytes + 8, '\0', n) != nullptr) {
    return Error("header is not valid JSON: it contains a NUL byte");
  }
  // Duplicate keys, which nlohmann would silently merge, are caught as the parser meets them.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == Json::parse_event_t::key && duplicate.empty() && !open_objects.empty() &&
               !open_objects.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(bytes + 8, bytes + 8 + n, callback);
  } catch (const Json::exception& e) {
    return Error(absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return Error(absl::StrCat("header has duplicate key ", Json(duplicate).dump()));
  }
  if (!header.is_object()) return Error("header is not a JSON object");

  const char* buffer = bytes + 8 + n;
  const uint64_t buffer_len = size - 8 - n;
  std::vector<std::pair<const std::string*, const Entry*>> by_offset;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (value.is_null()) continue;
      if (!value.is_object()) return Error("__metadata__ is not a JSON object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) {
          return Error(absl::StrCat("__metadata__ value of ", Json(key).dump(), " is ", v.dump(),
                                    ", not a string"));
        }
        metadata[key] = v.get<std::string>();
      }
      continue;
    }
    Entry entry;
    SY_RETURN_IF_ERROR(ParseEntry(name, value, &entry));
    if (entry.end > buffer_len) {
      return Error(absl::StrCat("tensor \"", name, "\": data_offsets [", entry.begin, ", ",
                                entry.end, "] out of range of the ", buffer_len,
                                "-byte data buffer"));
    }
    auto it = entries.emplace(name, std::move(entry)).first;
    by_offset.emplace_back(&it->first, &it->second);
  }

  // Sorted by offset, the tensors must tile the buffer exactly (as the reference requires).
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second->begin, a.second->end) <
           std::make_pair(b.second->begin, b.second->end);
  });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const auto& [name, entry] : by_offset) {
    if (entry->begin < covered) {
      return Error(absl::StrCat("tensor \"", *name, "\" at [", entry->begin, ", ", entry->end,
                                ") overlaps tensor \"", *previous, "\" ending at ", covered));
    }
    if (entry->begin > covered) {
      return Error(absl::StrCat("gap in the data buffer: bytes [", covered, ", ", entry->begin,
                                ") belong to no tensor"));
    }
    covered = entry->end;
    previous = name;
  }
  if (covered != buffer_len) {
    return Error(
        absl::StrCat("the data buffer has ", buffer_len, " bytes but the tensors cover ", covered));
  }

  for (auto& [name, entry] : entries) {
    const char* data = buffer + entry.begin;
    const size_t nbytes = entry.end - entry.begin;
    const DTypeInfo& info = kDTypes[entry.dtype_index];
    if (info.supported && reinterpret_cast<uintptr_t>(data) % DTypeSize(info.dtype) != 0) {
      realigned.emplace_back(new uint64_t[(nbytes + 7) / 8]);
      std::memcpy(realigned.back().get(), data, nbytes);
      data = reinterpret_cast<const char*>(realigned.back().get());
    }
    entry.data = data;
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  auto state = std::make_shared<State>();
  state->path = path;
  // Its errors already read "<path>: not a regular file" etc., as State::Error would.
  SY_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const uint64_t size = file.size();
  if (size < 8) return state->Parse("", size);  // the "too short" error
  state->mapping = std::move(file);
  SY_RETURN_IF_ERROR(state->Parse(state->mapping.data(), size));
  return SafetensorsFile(std::move(state));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(absl::string_view bytes,
                                                           std::string label) {
  auto state = std::make_shared<State>();
  state->path = std::move(label);
  state->image.resize((bytes.size() + 7) / 8);
  if (!bytes.empty()) std::memcpy(state->image.data(), bytes.data(), bytes.size());
  SY_RETURN_IF_ERROR(
      state->Parse(reinterpret_cast<const char*>(state->image.data()), bytes.size()));
  return SafetensorsFile(std::move(state));
}

const std::string& SafetensorsFile::path() const { return state_->path; }

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(state_->entries.size());
  for (const auto& [name, entry] : state_->entries) names.push_back(name);
  return names;
}

bool SafetensorsFile::Has(absl::string_view name) const {
  return state_->entries.find(name) != state_->entries.end();
}

absl::StatusOr<Tensor> SafetensorsFile::Get(absl::string_view name) const {
  const auto it = state_->entries.find(name);
  if (it == state_->entries.end()) {
    return absl::NotFoundError(absl::StrCat(state_->path, ": no tensor \"", name, "\""));
  }
  const State::Entry& entry = it->second;
  const DTypeInfo& info = kDTypes[entry.dtype_index];
  if (!info.supported) {
    return absl::UnimplementedError(absl::StrCat(state_->path, ": tensor \"", name, "\" has dtype ",
                                                 info.name,
                                                 ", which Switchyard's DType cannot represent"));
  }
  // const_cast: Tensor has no read-only variant; the header documents that views are read-only.
  return Tensor(info.dtype, entry.shape, Device::Cpu(), const_cast<void*>(entry.data));
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return state_->metadata;
}

// ---------------------------------------------------------------------------------------------
// Writer

void SafetensorsWriter::Add(std::string name, const Tensor& cpu_tensor) {
  absl::string_view problem;
  if (name == kMetadataKey) {
    problem = "the name is reserved for the metadata entry";
  } else if (names_.count(name) != 0) {
    problem = "duplicate name";
  } else if (cpu_tensor.device.is_cuda()) {
    problem = "not a CPU tensor (copy it to the host first)";
  } else if (std::any_of(cpu_tensor.shape.begin(), cpu_tensor.shape.end(),
                         [](int64_t d) { return d < 0; })) {
    problem = "negative dim";
  } else if (cpu_tensor.numel() > 0 && cpu_tensor.data == nullptr) {
    problem = "null data";
  } else if (DTypeIndex(cpu_tensor.dtype) < 0) {
    problem = "unknown dtype";
  }
  if (!problem.empty()) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(absl::StrCat("SafetensorsWriter::Add(\"", name, "\", ",
                                                       cpu_tensor.DebugString(), "): ", problem));
    }
    return;
  }
  names_.insert(name);
  items_.push_back({std::move(name), cpu_tensor});
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

absl::StatusOr<std::string> SafetensorsWriter::Layout(std::vector<const Item*>* order) const {
  SY_RETURN_IF_ERROR(error_);
  order->clear();
  for (const Item& item : items_) order->push_back(&item);
  std::sort(order->begin(), order->end(), [](const Item* a, const Item* b) {
    const int ra = DTypeIndex(a->tensor.dtype), rb = DTypeIndex(b->tensor.dtype);
    return ra != rb ? ra > rb : a->name < b->name;
  });
  // Compact JSON with the reference's key order; Json::dump escapes strings as serde_json does
  // and throws on invalid UTF-8.
  std::string json = "{";
  try {
    if (!metadata_.empty()) {
      json += "\"__metadata__\":{";
      for (const auto& [key, value] : metadata_) {
        if (json.back() != '{') json += ',';
        absl::StrAppend(&json, Json(key).dump(), ":", Json(value).dump());
      }
      json += '}';
    }
    uint64_t offset = 0;
    for (const Item* item : *order) {
      if (json.size() > 1) json += ',';
      const uint64_t bytes = item->tensor.bytes();
      absl::StrAppend(&json, Json(item->name).dump(), ":{\"dtype\":\"",
                      SafetensorsDTypeName(item->tensor.dtype), "\",\"shape\":[",
                      absl::StrJoin(item->tensor.shape, ","), "],\"data_offsets\":[", offset, ",",
                      offset + bytes, "]}");
      offset += bytes;
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SafetensorsWriter: a tensor name or metadata string is not valid UTF-8: ", e.what()));
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("SafetensorsWriter: header of ", json.size(),
                                                   " bytes exceeds the limit of ",
                                                   kMaxHeaderBytes));
  }
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t{json.size()} >> (8 * i)) & 0xff);
  return out + json;
}

absl::StatusOr<std::string> SafetensorsWriter::ToBytes() const {
  std::vector<const Item*> order;
  SY_ASSIGN_OR_RETURN(std::string out, Layout(&order));
  for (const Item* item : order) {
    out.append(static_cast<const char*>(item->tensor.data), item->tensor.bytes());
  }
  return out;
}

absl::Status SafetensorsWriter::Write(const std::string& path) const {
  std::vector<const Item*> order;
  SY_ASSIGN_OR_RETURN(const std::string head, Layout(&order));
  return WriteFileAtomically(path, [&](int fd, const std::string& tmp) {
    SY_RETURN_IF_ERROR(WriteAll(fd, head.data(), head.size(), tmp));
    for (const Item* item : order) {
      SY_RETURN_IF_ERROR(WriteAll(fd, item->tensor.data, item->tensor.bytes(), tmp));
    }
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// Conversion

absl::Status ConvertTensor(const Tensor& src, const Tensor& dst) {
  auto error = [&](absl::string_view problem) {
    return absl::StrCat("ConvertTensor(", src.DebugString(), " -> ", dst.DebugString(),
                        "): ", problem);
  };
  if (src.device.is_cuda() || dst.device.is_cuda()) {
    return absl::InvalidArgumentError(error("both tensors must be on the CPU"));
  }
  if (src.shape != dst.shape) return absl::InvalidArgumentError(error("shapes differ"));
  for (int64_t d : src.shape) {
    if (d < 0) return absl::InvalidArgumentError(error("negative dim"));
  }
  const int64_t n = src.numel();
  if (n > 0 && (src.data == nullptr || dst.data == nullptr)) {
    return absl::InvalidArgumentError(error("null data"));
  }
  if (src.dtype == dst.dtype) {
    if (n > 0 && src.data != dst.data) std::memcpy(dst.data, src.data, src.bytes());
    return absl::OkStatus();
  }
  auto is_float = [](DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16; };
  if (!is_float(src.dtype) || !is_float(dst.dtype)) {
    return absl::UnimplementedError(
        error("only f32, f64 and bf16 convert into each other (equal dtypes copy)"));
  }
  // Every f32 and bf16 value is exact in a double, so the store is the only rounding (two for
  // f64 -> bf16, as documented).
  for (int64_t i = 0; i < n; ++i) {
    double v;
    switch (src.dtype) {
      case DType::kF32:
        v = src.as<float>()[i];
        break;
      case DType::kF64:
        v = src.as<double>()[i];
        break;
      default:
        v = src.as<BF16>()[i].ToFloat();
        break;
    }
    switch (dst.dtype) {
      case DType::kF32:
        dst.as<float>()[i] = static_cast<float>(v);
        break;
      case DType::kF64:
        dst.as<double>()[i] = v;
        break;
      default:
        dst.as<BF16>()[i] = BF16::FromFloat(static_cast<float>(v));
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace switchyard
