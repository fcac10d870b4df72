// Run-time data folder (common/data_dir.h) and model names as the Python package spells them
// (fetch/model_catalogue.h).
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/data_dir.h"
#include "fetch/model_catalogue.h"

namespace kvzap {

TEST(DataDir, EnvironmentThenSetThenSourceTree) {
  ::unsetenv("KVZAP_DATA_DIR");
  set_data_dir("");
  // The test binary has no data/ beside it: the source tree's.
  EXPECT_EQ(data_dir(), std::string(KVZAP_SOURCE_DIR) + "/data");
  set_data_dir("/opt/kvzap-data");
  EXPECT_EQ(data_dir(), "/opt/kvzap-data");
  ::setenv("KVZAP_DATA_DIR", "/env/data", 1);
  EXPECT_EQ(data_dir(), "/env/data");
  ::unsetenv("KVZAP_DATA_DIR");
  set_data_dir("");
  EXPECT_EQ(data_dir(), std::string(KVZAP_SOURCE_DIR) + "/data");
}

TEST(ModelCatalogue, FindsTheModelByItsOwnName) {
  const std::vector<CatalogueEntry> cat = model_catalogue();
  const CatalogueEntry* exact = find_catalogue_entry(cat, "smollm2-135m");
  ASSERT_NE(exact, nullptr);
  EXPECT_EQ(find_catalogue_entry(cat, "SmolLM2-135M-Instruct"), exact);
  EXPECT_EQ(find_catalogue_entry(cat, "SMOLLM2-135M"), exact);
  const CatalogueEntry* qwen = find_catalogue_entry(cat, "Qwen2.5-Coder-0.5B-Instruct");
  ASSERT_NE(qwen, nullptr);
  EXPECT_EQ(qwen->name, "qwen2.5-coder-0.5b");
  EXPECT_EQ(find_catalogue_entry(cat, "SmolLM2"), nullptr);
  EXPECT_EQ(find_catalogue_entry(cat, "no-such-model"), nullptr);
}

}  // namespace kvzap
