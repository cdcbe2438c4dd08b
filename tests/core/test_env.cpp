// Environment variables are validated like flags (core/env.h): a bad value is an InvalidArgument
// naming the variable, never atoi's silent 0 or a silent default.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "kiln/core/cpu_features.h"
#include "kiln/core/env.h"
#include "kiln/core/thread_pool.h"

namespace kiln {
namespace {

// Sets one variable for the scope of a test and restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(Env, IntParsesTheWholeValueInRange) {
  {
    ScopedEnv e("KILN_TEST_INT", nullptr);
    auto v = env_int("KILN_TEST_INT", 1, 10);
    ASSERT_TRUE(v.ok());
    EXPECT_FALSE(v->has_value());
  }
  {
    ScopedEnv e("KILN_TEST_INT", "");  // empty means unset
    auto v = env_int("KILN_TEST_INT", 1, 10);
    ASSERT_TRUE(v.ok());
    EXPECT_FALSE(v->has_value());
  }
  {
    ScopedEnv e("KILN_TEST_INT", "7");
    auto v = env_int("KILN_TEST_INT", 1, 10);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(**v, 7);
  }
  for (const char* bad : {"abc", "0", "11", "-3", "4x", " 4x", "1e3", "99999999999999999999999"}) {
    ScopedEnv e("KILN_TEST_INT", bad);
    auto v = env_int("KILN_TEST_INT", 1, 10);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find("KILN_TEST_INT"), std::string::npos) << v.status().message();
    EXPECT_NE(v.status().message().find(bad), std::string::npos) << v.status().message();
  }
}

TEST(Env, ValidateNamesTheBadVariable) {
  ASSERT_TRUE(validate_environment().ok()) << validate_environment().message();  // the test's own environment
  const struct {
    const char* name;
    const char* value;
  } bad[] = {{"KILN_NUM_THREADS", "abc"},   {"KILN_NUM_THREADS", "0"},     {"KILN_NUM_THREADS", "100000"},
             {"KILN_SIMD", "avx9"},         {"KILN_SIMD", "AVX2 "},         {"KILN_PIN_THREADS", "maybe"},
             {"KILN_TUNE_FILE", "/"},       {"KILN_COMM_CALIBRATION", "/"}};
  for (const auto& b : bad) {
    ScopedEnv e(b.name, b.value);
    const Status st = validate_environment();
    ASSERT_FALSE(st.ok()) << b.name << "=" << b.value;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(b.name), std::string::npos) << st.message();
  }
  for (const auto& [name, value] : {std::pair{"KILN_NUM_THREADS", "2"}, std::pair{"KILN_SIMD", "scalar"},
                                    std::pair{"KILN_PIN_THREADS", "off"}, std::pair{"KILN_PIN_THREADS", "1"},
                                    std::pair{"KILN_TUNE_FILE", "/tmp/kiln-no-such-tune.json"}}) {
    ScopedEnv e(name, value);
    EXPECT_TRUE(validate_environment().ok()) << name << "=" << value << ": " << validate_environment().message();
  }
}

TEST(Env, SimdTargetFromEnv) {
  {
    ScopedEnv e("KILN_SIMD", "scalar");
    auto t = simd_target_from_env();
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(**t, SimdTarget::kScalar);
  }
  {
    ScopedEnv e("KILN_SIMD", nullptr);
    auto t = simd_target_from_env();
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(t->has_value());
  }
  for (SimdTarget target : {SimdTarget::kAvx2, SimdTarget::kAvx512}) {  // refused only where unsupported
    const std::string name(simd_target_name(target));
    ScopedEnv e("KILN_SIMD", name.c_str());
    EXPECT_EQ(simd_target_from_env().ok(), simd_target_supported(target)) << name;
  }
}

TEST(Env, PinModeFromEnv) {
  const std::pair<const char*, const char*> good[] = {{nullptr, "auto"}, {"auto", "auto"}, {"on", "on"},
                                                      {"1", "on"},       {"off", "off"},   {"0", "off"}};
  for (const auto& [value, mode] : good) {
    ScopedEnv e("KILN_PIN_THREADS", value);
    auto m = pin_mode_from_env();
    ASSERT_TRUE(m.ok()) << (value ? value : "(unset)");
    EXPECT_EQ(*m, mode);
  }
  ScopedEnv e("KILN_PIN_THREADS", "yes please");
  auto m = pin_mode_from_env();
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("KILN_PIN_THREADS"), std::string::npos);
}

}  // namespace
}  // namespace kiln
