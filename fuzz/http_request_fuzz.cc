// The controller's HTTP request parser (controller/http_request.h): every
// byte a client can send reaches it before any signature is checked.
//
// The input is fed twice, whole and in pieces whose sizes come from the
// input's own first byte, as sockets split it. Both must end in the same
// state with the same request (or the same error): a parser whose answer
// depends on how TCP cut the bytes can be steered past a check. Also
// checked: the body never exceeds the limit given, an error always says
// what, and a finished request's declared length is the body's.
#include <algorithm>
#include <cstdint>
#include <string>

#include "controller/http_request.h"
#include "fuzz/fuzz_support.h"

using wsync::controller::HttpRequest;
using wsync::controller::RequestParser;

namespace {

constexpr size_t kLimit = 4096;

struct Outcome {
  RequestParser::State state = RequestParser::State::kHead;
  int status = 0;
  std::string message, method, target, path, body;
  size_t headers = 0, params = 0, left = 0;
  bool operator==(const Outcome& o) const {
    return state == o.state && status == o.status && message == o.message && method == o.method &&
           target == o.target && path == o.path && body == o.body && headers == o.headers && params == o.params &&
           left == o.left;
  }
};

Outcome Run(const std::string& bytes, size_t step) {
  RequestParser p;
  size_t at = 0;
  while (at < bytes.size()) {
    if (p.state() == RequestParser::State::kHeadDone) p.ExpectBody(kLimit);
    const size_t n = std::min(step, bytes.size() - at);
    const size_t used = p.Feed(bytes.data() + at, n);
    if (used > n) wsync::fuzz::Broken("Feed took more bytes than it was given");
    at += used;
    if (used == 0 && p.state() != RequestParser::State::kHeadDone) break;
  }
  if (p.state() == RequestParser::State::kHeadDone) p.ExpectBody(kLimit);
  const HttpRequest& r = p.request();
  Outcome o;
  o.state = p.state();
  if (p.state() == RequestParser::State::kError) {
    o.status = p.error().http_status;
    o.message = p.error().message;
    if (o.message.empty()) wsync::fuzz::Broken("an error without a message");
    if (o.status < 400 || o.status > 599) wsync::fuzz::Broken("an error status outside 4xx/5xx");
    return o;  // how far a broken request got is not part of the contract
  }
  o.method = r.method;
  o.target = r.target;
  o.path = r.path;
  o.body = r.body;
  o.headers = r.headers.size();
  o.params = r.params.size();
  o.left = bytes.size() - at;
  if (r.body.size() > kLimit) wsync::fuzz::Broken("a body past its limit");
  if (p.state() == RequestParser::State::kDone && p.declared_length() && *p.declared_length() != r.body.size())
    wsync::fuzz::Broken("a finished body that is not its declared length");
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 23;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Outcome whole = Run(bytes, bytes.size() + 1);
  const Outcome pieces = Run(bytes, step);
  if (!(whole == pieces))
    wsync::fuzz::Broken("fed whole and in pieces of " + std::to_string(step) + " bytes, the parser disagrees");
  return 0;
}
