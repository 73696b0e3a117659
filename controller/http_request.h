// One HTTP/1.1 request as the controller's server reads it off a socket
// (http_server.cc), and the incremental parser that builds it from bytes as
// they arrive. Pure: no sockets, no clocks, so every byte a client can send
// goes through the same code in unit tests and fuzz/http_request_fuzz.cc.
//
// The parser stops after the head so that the server can refuse a request
// before reading its body: the route, the signature headers and the
// declared length are all known then (docs/CONTROL_PLANE.md, "Bounded
// serving"). Bodies come as Content-Length or chunked; both are held to the
// limit the server sets for the route, counted in decoded bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace wsync::controller {

struct HttpRequest {
  std::string method;
  std::string target;  // path and query, as sent (what a signature covers)
  std::string path;    // percent-decoded
  std::multimap<std::string, std::string> params;        // the query, decoded
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::vector<std::string> matches;  // the route's captures; [0] is the path
  std::string remote_addr;
  bool keep_alive = true;  // HTTP/1.1 without "Connection: close"

  // The first header of that name (any case), "" when absent.
  const std::string& Header(const std::string& name) const;
  bool HasHeader(const std::string& name) const;
  std::optional<std::string> Param(const std::string& name) const;
};

class RequestParser {
 public:
  enum class State {
    kHead,      // reading the request line and headers
    kHeadDone,  // the head is parsed; call ExpectBody() or Reject()
    kBody,      // reading the body
    kDone,      // request() is complete
    kError,     // error() says why; the connection cannot be reused
  };
  struct Error {
    int http_status = 400;
    std::string message;
  };

  static constexpr size_t kMaxHeadBytes = 16 * 1024;
  static constexpr size_t kMaxHeaders = 64;

  // Consumes bytes from `data`; returns how many it took. It takes none
  // while kHeadDone, kDone or kError, so bytes of a pipelined next request
  // stay with the caller.
  size_t Feed(const char* data, size_t size);

  State state() const { return state_; }
  const Error& error() const { return error_; }
  HttpRequest& request() { return request_; }
  const HttpRequest& request() const { return request_; }

  // The body's length from Content-Length, or nullopt for a chunked body
  // (its length is known only at its end). Valid from kHeadDone.
  std::optional<uint64_t> declared_length() const { return chunked_ ? std::nullopt : std::optional(length_); }
  // Whether the client waits for "100 Continue" before it sends the body.
  bool expects_continue() const { return expects_continue_; }

  // From kHeadDone: read a body of at most `limit` decoded bytes (413 past
  // it, before reading more than the chunk that crosses it).
  void ExpectBody(size_t limit);

  // The request line as far as it arrived (at most 200 bytes), to name a
  // request that never arrived whole.
  std::string request_line() const { return head_.substr(0, std::min<size_t>(head_.find("\r\n"), 200)); }

  // Ready for the next request on the same connection.
  void Reset() { *this = RequestParser(); }

 private:
  size_t FeedHead(const char* data, size_t size);
  size_t FeedBody(const char* data, size_t size);
  size_t FeedChunked(const char* data, size_t size);
  bool ParseHead();
  void Fail(int http_status, std::string message);

  State state_ = State::kHead;
  Error error_;
  HttpRequest request_;
  std::string head_;
  bool chunked_ = false;
  bool expects_continue_ = false;
  uint64_t length_ = 0;  // Content-Length
  size_t limit_ = 0;
  // Chunked decoding: the size line being read, or the bytes left of the
  // current chunk, or the CRLF after it, or the trailer.
  enum class Chunk { kSize, kData, kDataEnd, kTrailer } chunk_ = Chunk::kSize;
  std::string line_;
  uint64_t chunk_left_ = 0;
};

// "%2F" -> "/"; '+' stays '+' (paths and our query values never use it
// for a space). nullopt when a '%' is not followed by two hex digits.
std::optional<std::string> PercentDecode(const std::string& s);

}  // namespace wsync::controller
