// The layer I/O command end to end: writes an input safetensors file, runs the real
// moe_layer_io binary on it, and checks its output file against the layer run in-process.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <random>
#include <string>

#include "common/config/config.h"
#include "common/config/config_defaults.h"
#include "common/safetensors.h"
#include "kernels/testing/gpu.h"
#include "worker/model/moe_layer.h"
#include "worker/model/moe_layer_tensors.h"

namespace switchyard::model {
namespace {

using kernels::Buffer;

std::string Runfile(const std::string& rel) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/switchyard/" + rel;
}

TEST(MoELayerIoTest, BinaryMatchesInProcessLayer) {
  const std::string cfg_path = Runfile("worker/model/testdata/small_moe.yaml");
  auto spec = LoadJobSpecFile(cfg_path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ApplyDefaults(&*spec);
  auto config = MoELayerConfig::FromProto(spec->model(), DType::kF32);
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t t = 24, h = config->hidden_size;

  std::mt19937_64 rng(1);
  auto w = MoELayerTensors::Create(*config, Device::Cpu(), DType::kF32, DType::kF32).value();
  ASSERT_TRUE(w.RandomizeOnCpu(rng, 0.3f).ok());
  Buffer x = Buffer::ForTensor(DType::kF32, {t, h}, Device::Cpu()).value();
  Buffer dy = Buffer::ForTensor(DType::kF32, {t, h}, Device::Cpu()).value();
  testing::FillRandom(x.View(), rng);
  testing::FillRandom(dy.View(), rng);
  SafetensorsWriter in;
  in.Add("input", x.View());
  in.Add("grad_output", dy.View());
  for (auto& [name, shape] : MoELayerTensors::ParamShapes(*config)) in.Add(name, w.Param(name));
  const std::string dir = std::getenv("TEST_TMPDIR");
  ASSERT_TRUE(in.Write(dir + "/in.safetensors").ok());

  const std::string cmd = Runfile("worker/model/moe_layer_io") + " --config " + cfg_path +
                          " --in " + dir + "/in.safetensors --out " + dir +
                          "/out.safetensors --device cpu";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;

  // The same computation in-process (the spec's seq_length 8 divides T = 24).
  auto layer = MoELayer::Create(*config, Device::Cpu(), t).value();
  Buffer y = Buffer::ForTensor(DType::kF32, {t, h}, Device::Cpu()).value();
  Buffer dx = Buffer::ForTensor(DType::kF32, {t, h}, Device::Cpu()).value();
  ASSERT_TRUE(layer->Forward(Stream::Cpu(), w.params(), w.router_state(), x.View(), y.View()).ok());
  ASSERT_TRUE(
      layer->Backward(Stream::Cpu(), w.params(), w.grads(), dy.View(), dx.View(), 1.0).ok());

  auto out = SafetensorsFile::Open(dir + "/out.safetensors");
  ASSERT_TRUE(out.ok()) << out.status();
  auto same = [&](const std::string& name, const Tensor& want) {
    auto got = out->Get(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    EXPECT_EQ(got->shape, want.shape) << name;
    EXPECT_EQ(testing::ToFloatVector(*got), testing::ToFloatVector(want)) << name;
  };
  same("output", y.View());
  same("grad_input", dx.View());
  same("router.topk_idx", layer->topk_idx());
  same("router.topk_probs", layer->topk_probs());
  same("grad.router.topk_probs", layer->dtopk_probs());
  same("router.tokens_per_expert", layer->tokens_per_expert());
  same("router.losses", layer->losses());
  for (auto& [name, shape] : MoELayerTensors::ParamShapes(*config)) {
    same("grad." + name, w.Grad(name));
  }
  EXPECT_EQ(out->Names().size(), 7 + MoELayerTensors::ParamShapes(*config).size());
}

TEST(MoELayerIoTest, RejectsMissingTensorWithItsName) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  std::vector<float> v(16 * 4, 1.0f);
  SafetensorsWriter in;
  in.Add("input", Tensor(DType::kF32, {4, 16}, Device::Cpu(), v.data()));
  ASSERT_TRUE(in.Write(dir + "/bad.safetensors").ok());
  const std::string cmd = Runfile("worker/model/moe_layer_io") + " --config " +
                          Runfile("worker/model/testdata/small_moe.yaml") + " --in " + dir +
                          "/bad.safetensors --out " + dir + "/never.safetensors 2>" + dir +
                          "/err.txt";
  const int rc = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
  std::FILE* f = std::fopen((dir + "/err.txt").c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[512] = {};
  std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  EXPECT_NE(std::string(buf).find("grad_output"), std::string::npos) << buf;
  EXPECT_EQ(std::fopen((dir + "/never.safetensors").c_str(), "r"), nullptr);
}

}  // namespace
}  // namespace switchyard::model
