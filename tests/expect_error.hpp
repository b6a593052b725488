// The one check every validation test makes: the call throws tessel::Error with the expected
// code, and the message names the op ("tessel::<op>:"), the argument ('<arg>'), what was
// expected and what it got (and contains `extra` if given).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>

#include "tessel/tensor.hpp"

namespace tessel::test {

inline void expect_error(const std::function<void()>& call, tessel_status_t code,
                         const std::string& op, const std::string& arg,
                         const std::string& extra = "") {
  try {
    call();
    ADD_FAILURE() << "expected tessel::Error for argument '" << arg << "' of tessel::" << op
                  << ", nothing was thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), code) << msg;
    EXPECT_NE(msg.find("tessel::" + op + ":"), std::string::npos) << "op not named: " << msg;
    EXPECT_NE(msg.find("'" + arg + "'"), std::string::npos) << "argument not named: " << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got"), std::string::npos) << msg;
    if (!extra.empty()) EXPECT_NE(msg.find(extra), std::string::npos) << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected tessel::Error, got another exception: " << e.what();
  }
}

inline void expect_invalid(const std::function<void()>& call, const std::string& op,
                           const std::string& arg, const std::string& extra = "") {
  expect_error(call, TESSEL_ERROR_INVALID_ARGUMENT, op, arg, extra);
}

}  // namespace tessel::test
