// RequestParser: what a client's bytes become, fed whole and byte by byte.
#include "controller/http_request.h"

#include <gtest/gtest.h>

#include <string>

namespace wsync::controller {
namespace {

// Feeds `bytes` in pieces of `step` (0: whole), as a socket might deliver
// them; returns the bytes the parser left over.
std::string FeedAll(RequestParser& p, const std::string& bytes, size_t step, size_t limit = 1 << 20) {
  size_t at = 0;
  while (at < bytes.size()) {
    if (p.state() == RequestParser::State::kHeadDone) p.ExpectBody(limit);
    const size_t n = step == 0 ? bytes.size() - at : std::min(step, bytes.size() - at);
    const size_t used = p.Feed(bytes.data() + at, n);
    at += used;
    if (used == 0 && p.state() != RequestParser::State::kHeadDone) break;
  }
  if (p.state() == RequestParser::State::kHeadDone) p.ExpectBody(limit);
  return bytes.substr(at);
}

TEST(RequestParserTest, ParsesAHeadQueryAndBodyWhateverTheSplit) {
  const std::string wire =
      "POST /v1/kv/a%2Fb?wait_ms=10&role=tr%61iner HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
      "X-Wsync-Nonce: abc\r\n\r\nhello";
  for (size_t step : {size_t{0}, size_t{1}, size_t{3}, size_t{17}}) {
    SCOPED_TRACE(step);
    RequestParser p;
    EXPECT_EQ(FeedAll(p, wire, step), "");
    ASSERT_EQ(p.state(), RequestParser::State::kDone);
    const HttpRequest& r = p.request();
    EXPECT_EQ(r.method, "POST");
    EXPECT_EQ(r.target, "/v1/kv/a%2Fb?wait_ms=10&role=tr%61iner");  // as signed
    EXPECT_EQ(r.path, "/v1/kv/a/b");
    EXPECT_EQ(r.Param("wait_ms"), "10");
    EXPECT_EQ(r.Param("role"), "trainer");
    EXPECT_EQ(r.Header("x-wsync-nonce"), "abc");
    EXPECT_EQ(r.Header("X-WSYNC-NONCE"), "abc");
    EXPECT_EQ(r.body, "hello");
    EXPECT_TRUE(r.keep_alive);
  }
}

TEST(RequestParserTest, LeavesAPipelinedNextRequestToTheCaller) {
  RequestParser p;
  const std::string next = "GET /healthz HTTP/1.1\r\n\r\n";
  EXPECT_EQ(FeedAll(p, "GET /v1/status HTTP/1.1\r\nConnection: close\r\n\r\n" + next, 0), next);
  EXPECT_EQ(p.state(), RequestParser::State::kDone);
  EXPECT_FALSE(p.request().keep_alive);
  p.Reset();
  EXPECT_EQ(FeedAll(p, next, 0), "");
  EXPECT_EQ(p.request().path, "/healthz");
}

TEST(RequestParserTest, DecodesChunkedBodiesAndHoldsThemToTheLimit) {
  const std::string head = "PUT /v1/kv/k HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (size_t step : {size_t{0}, size_t{1}, size_t{5}}) {
    SCOPED_TRACE(step);
    RequestParser p;
    EXPECT_EQ(FeedAll(p, head + "3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: x\r\n\r\n", step), "");
    ASSERT_EQ(p.state(), RequestParser::State::kDone);
    EXPECT_FALSE(p.declared_length().has_value());
    EXPECT_EQ(p.request().body, "abcde");
  }
  // An endless chunked body stops at the chunk that crosses the limit, not
  // at some buffer size far past it.
  RequestParser p;
  std::string endless = head;
  for (int i = 0; i < 100; ++i) endless += "400\r\n" + std::string(1024, 'x') + "\r\n";
  FeedAll(p, endless, 0, /*limit=*/4096);
  ASSERT_EQ(p.state(), RequestParser::State::kError);
  EXPECT_EQ(p.error().http_status, 413);
  EXPECT_LE(p.request().body.size(), 4096u);
  EXPECT_NE(p.error().message.find("limit of 4096 bytes"), std::string::npos) << p.error().message;
}

TEST(RequestParserTest, RefusesWhatCouldSmuggleOrOverflow) {
  struct Case {
    std::string wire;
    int status;
    std::string says;
  };
  const Case cases[] = {
      {"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "both"},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400, "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400, "Content-Length"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "chunked only"},
      {"GET / HTTP/2.0\r\n\r\n", 505, "version"},
      {"GET /a b HTTP/1.1\r\n\r\n", 400, "request line"},
      {"GET http://x/ HTTP/1.1\r\n\r\n", 400, "absolute path"},
      {"GET /%zz HTTP/1.1\r\n\r\n", 400, "percent"},
      {"GET / HTTP/1.1\r\nNo colon here\r\n\r\n", 400, "header line 1"},
      {"GET / HTTP/1.1\r\nX: a\x01" "b\r\n\r\n", 400, "control character"},
      {"GET / HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n", 431, "16384"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.wire.substr(0, 60));
    RequestParser p;
    FeedAll(p, c.wire, 0);
    ASSERT_EQ(p.state(), RequestParser::State::kError);
    EXPECT_EQ(p.error().http_status, c.status);
    EXPECT_NE(p.error().message.find(c.says), std::string::npos) << p.error().message;
  }
  // A head that never ends is cut at the bound, not buffered on.
  RequestParser p;
  const std::string junk(1 << 20, 'a');
  EXPECT_EQ(p.Feed(junk.data(), junk.size()), junk.size());
  EXPECT_EQ(p.state(), RequestParser::State::kError);
  EXPECT_EQ(p.error().http_status, 431);
}

TEST(RequestParserTest, ADeclaredBodyOverTheLimitIsRefusedBeforeAByteOfIt) {
  RequestParser p;
  const std::string head = "POST /v1/heartbeat HTTP/1.1\r\nContent-Length: 70000\r\nExpect: 100-continue\r\n\r\n";
  EXPECT_EQ(p.Feed(head.data(), head.size()), head.size());
  ASSERT_EQ(p.state(), RequestParser::State::kHeadDone);
  EXPECT_EQ(p.declared_length(), 70000u);
  EXPECT_TRUE(p.expects_continue());
  p.ExpectBody(65536);
  EXPECT_EQ(p.state(), RequestParser::State::kError);
  EXPECT_EQ(p.error().http_status, 413);
}

}  // namespace
}  // namespace wsync::controller
