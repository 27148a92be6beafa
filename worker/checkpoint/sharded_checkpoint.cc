// File: worker/checkpoint/sharded_checkpoint.cc
#include "worker/checkpoint/sharded_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace switchyard {
namespace {

std::mutex g_hook_mu;
std::function<void(int)>* g_hook = nullptr;

int64_t Prod(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return ss.str();
}

std::string ShardFile(int rank) { return absl::StrCat("shard_", rank, ".safetensors"); }
std::string IndexFile(int rank) { return absl::StrCat("shard_", rank, ".index.json"); }

nlohmann::json RunsToJson(const ShardSlice& s) {
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& dim : s.runs) {
    nlohmann::json d = nlohmann::json::array();
    for (const DimRun& r : dim) d.push_back({r.global_begin, r.length});
    runs.push_back(std::move(d));
  }
  return runs;
}

// Parses "global_shape", "runs" and "flat" of `j` (throws nlohmann exceptions on bad types).
absl::StatusOr<ShardSlice> SliceFromJson(const nlohmann::json& shape, const nlohmann::json& j) {
  ShardSlice s;
  if (!shape.is_array()) return absl::InvalidArgumentError("global_shape is not an array");
  for (const auto& v : shape) s.global_shape.push_back(v.get<int64_t>());
  if (!j.contains("runs") || !j["runs"].is_array() || !j.contains("flat") ||
      !j["flat"].is_array() || j["flat"].size() != 2) {
    return absl::InvalidArgumentError("a shard lacks \"runs\" (array) or \"flat\" ([begin, end])");
  }
  for (const auto& d : j["runs"]) {
    std::vector<DimRun> dim;
    for (const auto& r : d) {
      if (!r.is_array() || r.size() != 2) {
        return absl::InvalidArgumentError("a run is not [global_begin, length]");
      }
      dim.push_back(DimRun{r[0].get<int64_t>(), r[1].get<int64_t>()});
    }
    s.runs.push_back(std::move(dim));
  }
  s.flat_begin = j["flat"][0].get<int64_t>();
  s.flat_end = j["flat"][1].get<int64_t>();
  SY_RETURN_IF_ERROR(ValidateShardSlice(s, "shard"));
  return s;
}

template <typename D, typename S>
void CopyConvert(D* dst, const S* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<D>(src[i]);
}

void CopyElements(const Tensor& dst, int64_t dst_at, const Tensor& src, int64_t src_at, int64_t n) {
  if (dst.dtype == DType::kF32) {
    if (src.dtype == DType::kF32) {
      std::copy_n(src.as<float>() + src_at, n, dst.as<float>() + dst_at);
    } else {
      CopyConvert(dst.as<float>() + dst_at, src.as<double>() + src_at, n);
    }
  } else if (src.dtype == DType::kF64) {
    std::copy_n(src.as<double>() + src_at, n, dst.as<double>() + dst_at);
  } else {
    CopyConvert(dst.as<double>() + dst_at, src.as<float>() + src_at, n);
  }
}

bool FloatDType(DType d) { return d == DType::kF32 || d == DType::kF64; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// ShardSlice

ShardSlice ShardSlice::Whole(const std::vector<int64_t>& shape) {
  ShardSlice s;
  s.global_shape = shape;
  for (int64_t n : shape) s.runs.push_back({DimRun{0, n}});
  return s;
}

std::vector<int64_t> ShardSlice::LocalShape() const {
  std::vector<int64_t> out;
  for (const auto& dim : runs) {
    int64_t n = 0;
    for (const DimRun& r : dim) n += r.length;
    out.push_back(n);
  }
  return out;
}

int64_t ShardSlice::LocalNumel() const { return Prod(LocalShape()); }

int64_t ShardSlice::NumElements() const {
  return (flat_end < 0 ? LocalNumel() : flat_end) - flat_begin;
}

absl::Status ValidateShardSlice(const ShardSlice& s, absl::string_view what) {
  if (s.runs.size() != s.global_shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".runs: ", s.runs.size(), " dimensions, global_shape [",
                     absl::StrJoin(s.global_shape, ","), "] has ", s.global_shape.size()));
  }
  for (size_t d = 0; d < s.runs.size(); ++d) {
    if (s.global_shape[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".global_shape[", d, "] (", s.global_shape[d], ") must be >= 0"));
    }
    for (const DimRun& r : s.runs[d]) {
      if (r.length <= 0 || r.global_begin < 0 || r.global_begin + r.length > s.global_shape[d]) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ".runs[", d, "]: run [", r.global_begin, ", +", r.length,
                         ") must have length > 0 and lie inside [0, ", s.global_shape[d], ")"));
      }
    }
  }
  const int64_t n = s.LocalNumel();
  const int64_t end = s.flat_end < 0 ? n : s.flat_end;
  if (s.flat_begin < 0 || s.flat_begin > end || end > n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".flat: [", s.flat_begin, ", ", end, ") must lie inside [0, ", n, "]"));
  }
  return absl::OkStatus();
}

void SetShardedSaveHookForTest(std::function<void(int rank)> hook) {
  std::lock_guard<std::mutex> lock(g_hook_mu);
  delete g_hook;
  g_hook = hook ? new std::function<void(int)>(std::move(hook)) : nullptr;
}

// ---------------------------------------------------------------------------------------------
// ShardedCheckpointWriter

void ShardedCheckpointWriter::AddShard(std::string name, ShardSlice slice, const Tensor& data) {
  if (!error_.ok()) return;
  const std::string what = absl::StrCat("ShardedCheckpointWriter::AddShard(\"", name, "\")");
  if (name.empty()) {
    error_ = absl::InvalidArgumentError(absl::StrCat(what, ": empty tensor name"));
    return;
  }
  error_ = ValidateShardSlice(slice, what);
  if (!error_.ok()) return;
  if (data.device.is_cuda() || !FloatDType(data.dtype) || data.numel() != slice.NumElements()) {
    error_ = absl::InvalidArgumentError(
        absl::StrCat(what, ": data ", data.DebugString(), " must be a CPU f32/f64 tensor of ",
                     slice.NumElements(), " elements (the slice's)"));
    return;
  }
  if (slice.flat_end < 0) slice.flat_end = slice.LocalNumel();
  entries_.push_back(Entry{std::move(name), std::move(slice), data});
}

void ShardedCheckpointWriter::SetMetadata(std::string key, std::string value) {
  if (key.empty() && error_.ok()) error_ = absl::InvalidArgumentError("empty metadata key");
  metadata_[std::move(key)] = std::move(value);
}

void ShardedCheckpointWriter::SetMetadata(std::string key, int64_t value) {
  if (key.empty() && error_.ok()) error_ = absl::InvalidArgumentError("empty metadata key");
  metadata_[std::move(key)] = value;
}

namespace {

// The outcome of a collective phase once every rank has reported (v[0]: failed ranks, v[1]: the
// sum of their rank + 1, enough to name a single one). On failure rank 0 removes the temp
// directory (best effort: without a manifest the step never loads anyway).
absl::Status PhaseOutcome(const ShardedSave& save, const CheckpointGroup& group,
                          const absl::Status& local, const absl::Status& reduced,
                          const std::vector<double>& v, absl::string_view phase) {
  if (reduced.ok() && v[0] == 0) return absl::OkStatus();
  if (group.rank == 0 && !save.tmp_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(save.tmp_dir, ec);
  }
  if (!local.ok()) return local;
  const std::string where =
      absl::StrCat("checkpoint step ", save.step, " under ", save.root, " (", phase, "): ");
  if (!reduced.ok()) return absl::Status(reduced.code(), absl::StrCat(where, reduced.message()));
  return absl::FailedPreconditionError(absl::StrCat(
      where, v[0], " rank(s) failed",
      v[0] == 1 ? absl::StrCat(" (rank ", v[1] - 1, ")") : std::string(), "; see their logs"));
}

absl::Status Reduce(const CheckpointGroup& group, std::vector<double>* v) {
  if (group.size <= 1 || !group.all_reduce_sum) return absl::OkStatus();
  return group.all_reduce_sum(v);
}

// Every rank learns whether any rank failed, so that no rank goes on to a collective step
// another rank has left.
absl::Status Agree(const ShardedSave& save, const CheckpointGroup& group, const absl::Status& local,
                   absl::string_view phase) {
  std::vector<double> v = {local.ok() ? 0.0 : 1.0, local.ok() ? 0.0 : group.rank + 1.0};
  const absl::Status st = Reduce(group, &v);
  return PhaseOutcome(save, group, local, st, v, phase);
}

}  // namespace

absl::StatusOr<ShardedSave> ShardedCheckpointWriter::Begin(const std::string& root, int64_t step,
                                                           const CheckpointGroup& group) const {
  ShardedSave save;
  save.root = root;
  save.step = step;
  const bool leader = group.rank == 0;
  // Rank 0 makes the temp directory; its pid (the directory's token) reaches every rank.
  absl::Status local = error_;
  uint64_t token = static_cast<uint64_t>(getpid());
  if (local.ok() && leader) {
    absl::StatusOr<std::string> t = BeginCheckpointTempDir(root, step, token);
    if (t.ok()) {
      save.tmp_dir = *t;
    } else {
      local = t.status();
    }
  }
  std::vector<double> v = {local.ok() ? 0.0 : 1.0, local.ok() ? 0.0 : group.rank + 1.0,
                           leader ? static_cast<double>(token) : 0.0};
  const absl::Status st = Reduce(group, &v);
  SY_RETURN_IF_ERROR(PhaseOutcome(save, group, local, st, v, "create"));
  token = static_cast<uint64_t>(v[2]);
  // The name BeginCheckpointTempDir gave rank 0 (checkpoint.h: .tmp_step_<step>_<token>).
  save.tmp_dir = absl::StrCat(root, "/.tmp_step_", step, "_", token);
  return save;
}

absl::Status ShardedCheckpointWriter::WriteOwn(const ShardedSave& save,
                                               const CheckpointGroup& group) const {
  const int rank = group.rank;
  const std::string& tmp_dir = save.tmp_dir;
  SafetensorsWriter w;
  nlohmann::json entries = nlohmann::json::array();
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const std::string key = absl::StrCat(i);
    w.Add(key, Tensor(e.data.dtype, {e.data.numel()}, e.data.device, e.data.data));
    entries.push_back({{"name", e.name},
                       {"key", key},
                       {"global_shape", e.slice.global_shape},
                       {"runs", RunsToJson(e.slice)},
                       {"flat", {e.slice.flat_begin, e.slice.flat_end}}});
  }
  SY_RETURN_IF_ERROR(w.Write(absl::StrCat(tmp_dir, "/", ShardFile(rank))));  // fsynced
  SY_ASSIGN_OR_RETURN(CheckpointFileDigest d, SealCheckpointFile(tmp_dir, ShardFile(rank)));
  {
    std::lock_guard<std::mutex> lock(g_hook_mu);
    if (g_hook != nullptr) (*g_hook)(rank);
  }
  nlohmann::json index = {{"file", d.name},
                          {"size", d.size},
                          {"crc32c", d.crc32c},
                          {"rank", rank},
                          {"entries", std::move(entries)}};
  std::string text;
  try {
    text = index.dump(1) + "\n";
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint index of rank ", rank,
                                                   ": a tensor name is not UTF-8: ", e.what()));
  }
  return WriteFileAtomically(absl::StrCat(tmp_dir, "/", IndexFile(rank)), text, 0600);
}

absl::StatusOr<std::string> ShardedCheckpointWriter::Finish(const ShardedSave& save,
                                                            const absl::Status& own_write,
                                                            const CheckpointGroup& group) const {
  SY_RETURN_IF_ERROR(Agree(save, group, own_write, "write shards"));
  // Rank 0 reads every index, checks that the shards add up, writes the manifest.
  const bool leader = group.rank == 0;
  const std::string& root = save.root;
  const std::string& tmp_dir = save.tmp_dir;
  const int64_t step = save.step;
  std::string dir;
  auto finish = [&]() -> absl::Status {
    std::vector<CheckpointFileDigest> files;
    nlohmann::json tensors = nlohmann::json::object();
    std::map<std::string, int64_t> held;  // elements saved per tensor
    for (int r = 0; r < group.size; ++r) {
      const std::string index_path = absl::StrCat(tmp_dir, "/", IndexFile(r));
      SY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(index_path));
      // Its content goes into the manifest (which is checksummed); the file itself is not kept.
      if (unlink(index_path.c_str()) != 0) {
        return absl::ErrnoToStatus(errno, absl::StrCat(index_path, ": unlink"));
      }
      try {
        const nlohmann::json index = nlohmann::json::parse(text);
        const std::string file = index.at("file").get<std::string>();
        if (file != ShardFile(r)) {
          return absl::InternalError(absl::StrCat(index_path, ": names file ", file));
        }
        files.push_back(CheckpointFileDigest{file, index.at("size").get<uint64_t>(),
                                             index.at("crc32c").get<uint32_t>()});
        for (const auto& e : index.at("entries")) {
          const std::string name = e.at("name").get<std::string>();
          SY_ASSIGN_OR_RETURN(ShardSlice s, SliceFromJson(e.at("global_shape"), e));
          nlohmann::json& t = tensors[name];
          if (!t.contains("global_shape")) {
            t["global_shape"] = e.at("global_shape");
            t["shards"] = nlohmann::json::array();
          } else if (t["global_shape"] != e.at("global_shape")) {
            return absl::InternalError(absl::StrCat(
                "checkpoint: tensor \"", name, "\" saved with global shapes ",
                t["global_shape"].dump(), " and ", e.at("global_shape").dump(), " (rank ", r, ")"));
          }
          t["shards"].push_back({{"file", file},
                                 {"key", e.at("key")},
                                 {"runs", e.at("runs")},
                                 {"flat", e.at("flat")}});
          held[name] += s.NumElements();
        }
      } catch (const nlohmann::json::exception& e) {
        return absl::InternalError(absl::StrCat(index_path, ": malformed: ", e.what()));
      }
    }
    // Disjoint shards that add up to the tensor hold every element once; a caller that saved an
    // element twice or not at all (a mapping bug) is caught here, before anything is committed.
    for (const auto& [name, t] : tensors.items()) {
      const int64_t want = Prod(t["global_shape"].get<std::vector<int64_t>>());
      if (held[name] != want) {
        return absl::InternalError(absl::StrCat("checkpoint: the shards of tensor \"", name,
                                                "\" hold ", held[name], " elements, its shape ",
                                                t["global_shape"].dump(), " has ", want));
      }
    }
    std::map<std::string, CheckpointValue> meta = metadata_;
    meta["world_size"] = static_cast<int64_t>(group.size);
    SY_ASSIGN_OR_RETURN(dir,
                        FinishCheckpointTempDir(root, step, tmp_dir, files, meta, tensors.dump()));
    return absl::OkStatus();
  };
  const absl::Status finished = leader ? finish() : absl::OkStatus();
  // On a failure FinishCheckpointTempDir removed the temp directory (or failed after the rename,
  // leaving a complete step): nothing for PhaseOutcome to remove.
  ShardedSave done = save;
  done.tmp_dir.clear();
  SY_RETURN_IF_ERROR(Agree(done, group, finished, "manifest"));
  if (!leader) dir = CheckpointStepDir(root, step);
  return dir;
}

absl::StatusOr<std::string> ShardedCheckpointWriter::Commit(const std::string& root, int64_t step,
                                                            const CheckpointGroup& group) const {
  SY_ASSIGN_OR_RETURN(const ShardedSave save, Begin(root, step, group));
  return Finish(save, WriteOwn(save, group), group);
}

// ---------------------------------------------------------------------------------------------
// ShardedCheckpointReader

absl::StatusOr<ShardedCheckpointReader> ShardedCheckpointReader::Load(const std::string& root,
                                                                      std::optional<int64_t> step) {
  SY_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(root, step));
  return Open(std::move(ckpt));
}

absl::StatusOr<ShardedCheckpointReader> ShardedCheckpointReader::Open(Checkpoint ckpt) {
  ShardedCheckpointReader r;
  r.ckpt_ = std::move(ckpt);
  const std::string where = absl::StrCat(r.ckpt_.dir(), "/manifest.json");
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(where, ": bad shard index: ", why));
  };
  auto add_shard = [&](const std::string& name, const std::vector<int64_t>& shape,
                       Shard shard) -> absl::Status {
    absl::StatusOr<const SafetensorsFile*> f = r.ckpt_.File(shard.file);
    if (!f.ok()) return bad(f.status().message());
    absl::StatusOr<Tensor> t = (*f)->Get(shard.key);
    if (!t.ok()) return bad(t.status().message());
    if (!FloatDType(t->dtype) || t->numel() != shard.slice.NumElements()) {
      return bad(absl::StrCat("tensor \"", name, "\": ", shard.file, ":", shard.key, " is ",
                              t->DebugString(), ", its slice has ", shard.slice.NumElements(),
                              " elements (f32 or f64)"));
    }
    if (shard.slice.flat_end < 0) shard.slice.flat_end = shard.slice.LocalNumel();
    TensorIndex& ti = r.tensors_[name];
    if (ti.shards.empty()) ti.global_shape = shape;
    ti.shards.push_back(std::move(shard));
    return absl::OkStatus();
  };
  if (r.ckpt_.tensors_json().empty()) {
    // CheckpointWriter's format: every tensor whole, under its own name.
    for (const std::string& file : r.ckpt_.Files()) {
      SY_ASSIGN_OR_RETURN(const SafetensorsFile* f, r.ckpt_.File(file));
      for (const std::string& name : f->Names()) {
        if (r.tensors_.count(name) > 0) return bad(absl::StrCat("tensor \"", name, "\" twice"));
        SY_ASSIGN_OR_RETURN(Tensor t, f->Get(name));
        SY_RETURN_IF_ERROR(add_shard(name, t.shape, Shard{file, name, ShardSlice::Whole(t.shape)}));
      }
    }
    return r;
  }
  try {
    const nlohmann::json tensors = nlohmann::json::parse(r.ckpt_.tensors_json());
    for (const auto& [name, t] : tensors.items()) {
      const std::vector<int64_t> shape = t.at("global_shape").get<std::vector<int64_t>>();
      int64_t held = 0;
      for (const auto& s : t.at("shards")) {
        absl::StatusOr<ShardSlice> slice = SliceFromJson(t.at("global_shape"), s);
        if (!slice.ok())
          return bad(absl::StrCat("tensor \"", name, "\": ", slice.status().message()));
        held += slice->NumElements();
        SY_RETURN_IF_ERROR(add_shard(name, shape,
                                     Shard{s.at("file").get<std::string>(),
                                           s.at("key").get<std::string>(), *std::move(slice)}));
      }
      if (held != Prod(shape)) {
        return bad(absl::StrCat("the shards of \"", name, "\" hold ", held, " elements, not ",
                                Prod(shape)));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
  return r;
}

bool ShardedCheckpointReader::Has(absl::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

std::vector<std::string> ShardedCheckpointReader::Names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

absl::StatusOr<std::vector<int64_t>> ShardedCheckpointReader::GlobalShape(
    absl::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat(ckpt_.dir(), ": checkpoint has no tensor \"", name, "\""));
  }
  return it->second.global_shape;
}

absl::StatusOr<DType> ShardedCheckpointReader::StoredDType(absl::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end() || it->second.shards.empty()) {
    return absl::NotFoundError(
        absl::StrCat(ckpt_.dir(), ": checkpoint has no tensor \"", name, "\""));
  }
  const Shard& sh = it->second.shards.front();
  SY_ASSIGN_OR_RETURN(const Tensor t, ckpt_.Get(sh.file, sh.key));
  return t.dtype;
}

absl::Status ShardedCheckpointReader::Read(absl::string_view name, const ShardSlice& target,
                                           const Tensor& out) const {
  const std::string what = absl::StrCat("reading \"", name, "\" of ", ckpt_.dir());
  SY_RETURN_IF_ERROR(ValidateShardSlice(target, absl::StrCat(what, ": target")));
  if (out.device.is_cuda() || !FloatDType(out.dtype) || out.numel() != target.NumElements()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": out ", out.DebugString(),
                                                   " must be a CPU f32/f64 tensor of ",
                                                   target.NumElements(), " elements"));
  }
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(what, ": the checkpoint has no such tensor"));
  }
  const TensorIndex& ti = it->second;
  if (ti.global_shape != target.global_shape) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": saved with global shape [", absl::StrJoin(ti.global_shape, ","),
                     "], the model needs [", absl::StrJoin(target.global_shape, ","),
                     "] (was the checkpoint written for another model?)"));
  }
  const size_t nd = target.global_shape.size();
  const std::vector<int64_t> t_shape = target.LocalShape();
  const int64_t tb = target.flat_begin;
  const int64_t te = target.flat_end < 0 ? target.LocalNumel() : target.flat_end;
  std::vector<int64_t> t_stride(nd, 1);
  for (size_t d = nd; d-- > 1;) t_stride[d - 1] = t_stride[d] * t_shape[d];
  int64_t copied = 0;
  struct Overlap {
    int64_t t_local, s_local, len;
  };
  for (const Shard& sh : ti.shards) {
    // Per dimension, the overlaps of the target's runs with the shard's (local indices of both).
    std::vector<std::vector<Overlap>> ov(nd);
    bool empty = false;
    for (size_t d = 0; d < nd && !empty; ++d) {
      int64_t t_off = 0;
      for (const DimRun& tr : target.runs[d]) {
        int64_t s_off = 0;
        for (const DimRun& sr : sh.slice.runs[d]) {
          const int64_t lo = std::max(tr.global_begin, sr.global_begin);
          const int64_t hi = std::min(tr.global_begin + tr.length, sr.global_begin + sr.length);
          if (lo < hi) {
            ov[d].push_back({t_off + lo - tr.global_begin, s_off + lo - sr.global_begin, hi - lo});
          }
          s_off += sr.length;
        }
        t_off += tr.length;
      }
      empty = ov[d].empty();
    }
    if (empty) continue;
    const std::vector<int64_t> s_shape = sh.slice.LocalShape();
    std::vector<int64_t> s_stride(nd, 1);
    for (size_t d = nd; d-- > 1;) s_stride[d - 1] = s_stride[d] * s_shape[d];
    const int64_t sb = sh.slice.flat_begin, se = sh.slice.flat_end;
    // Only now is the shard's data touched (a view into the mapped file: only the pages of the
    // overlap are read).
    SY_ASSIGN_OR_RETURN(const Tensor src, ckpt_.Get(sh.file, sh.key));
    // Walks the overlap box dimension by dimension; the last dimension's overlaps are contiguous
    // in both tensors. Blocks outside either flat range are skipped whole.
    std::function<void(size_t, int64_t, int64_t)> walk = [&](size_t d, int64_t t_base,
                                                             int64_t s_base) {
      for (const Overlap& o : ov[d]) {
        if (d + 1 == nd) {
          const int64_t t0 = t_base + o.t_local, s0 = s_base + o.s_local;
          const int64_t a = std::max<int64_t>({0, tb - t0, sb - s0});
          const int64_t e = std::min<int64_t>({o.len, te - t0, se - s0});
          if (a < e) {
            CopyElements(out, t0 + a - tb, src, s0 + a - sb, e - a);
            copied += e - a;
          }
          continue;
        }
        for (int64_t k = 0; k < o.len; ++k) {
          const int64_t t = t_base + (o.t_local + k) * t_stride[d];
          const int64_t s = s_base + (o.s_local + k) * s_stride[d];
          if (t + t_stride[d] <= tb || t >= te || s + s_stride[d] <= sb || s >= se) continue;
          walk(d + 1, t, s);
        }
      }
    };
    if (nd == 0) {
      if (tb == 0 && te == 1 && sb == 0 && se == 1) {
        CopyElements(out, 0, src, 0, 1);
        ++copied;
      }
    } else {
      walk(0, 0, 0);
    }
  }
  if (copied != te - tb) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": the saved shards cover ", copied,
                                                      " of the ", te - tb,
                                                      " elements of the target slice"));
  }
  return absl::OkStatus();
}

}  // namespace switchyard
