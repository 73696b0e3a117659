#include "controller/http_request.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace wsync::controller {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) --b;
  return s.substr(a, b - a);
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A token (RFC 9110 tchar): method names and header names.
bool IsToken(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 32 || u >= 127 || std::strchr("()<>@,;:\\\"/[]?={}", c) != nullptr) return false;
  }
  return true;
}

// Digits only, no sign, no overflow past 2^63.
std::optional<uint64_t> ParseLength(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

}  // namespace

std::optional<std::string> PercentDecode(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    const int hi = i + 1 < s.size() ? HexDigit(s[i + 1]) : -1;
    const int lo = i + 2 < s.size() ? HexDigit(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

const std::string& HttpRequest::Header(const std::string& name) const {
  static const std::string kEmpty;
  const std::string lower = Lower(name);
  for (const auto& [k, v] : headers) {
    if (k == lower) return v;
  }
  return kEmpty;
}

bool HttpRequest::HasHeader(const std::string& name) const {
  const std::string lower = Lower(name);
  return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return h.first == lower; });
}

std::optional<std::string> HttpRequest::Param(const std::string& name) const {
  auto it = params.find(name);
  if (it == params.end()) return std::nullopt;
  return it->second;
}

void RequestParser::Fail(int http_status, std::string message) {
  state_ = State::kError;
  error_ = {http_status, std::move(message)};
}

size_t RequestParser::Feed(const char* data, size_t size) {
  switch (state_) {
    case State::kHead: return FeedHead(data, size);
    case State::kBody: return chunked_ ? FeedChunked(data, size) : FeedBody(data, size);
    default: return 0;
  }
}

size_t RequestParser::FeedHead(const char* data, size_t size) {
  // Leading empty lines before a request line are allowed (RFC 9112 2.2).
  size_t used = 0;
  while (used < size && head_.empty() && (data[used] == '\r' || data[used] == '\n')) ++used;
  const size_t before = head_.size();
  head_.append(data + used, std::min(size - used, kMaxHeadBytes + 4 - head_.size()));
  // The end of the head may straddle the previous feed.
  const size_t from = before >= 3 ? before - 3 : 0;
  const size_t end = head_.find("\r\n\r\n", from);
  if (end == std::string::npos) {
    if (head_.size() > kMaxHeadBytes) {
      Fail(431, "request head over " + std::to_string(kMaxHeadBytes) + " bytes");
      return size;
    }
    return size;
  }
  const size_t head_end = end + 4;
  if (head_end > kMaxHeadBytes) {
    Fail(431, "request head over " + std::to_string(kMaxHeadBytes) + " bytes");
    return size;
  }
  // Bytes past the head were appended but belong to the body or the next
  // request: give them back.
  const size_t taken = used + (head_end - before);
  head_.resize(head_end);
  if (ParseHead()) state_ = State::kHeadDone;
  return taken;
}

bool RequestParser::ParseHead() {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < head_.size()) {
    const size_t eol = head_.find("\r\n", at);
    if (eol == at) break;  // the empty line
    lines.push_back(head_.substr(at, eol - at));
    at = eol + 2;
  }
  if (lines.empty()) {
    Fail(400, "empty request line");
    return false;
  }
  // METHOD SP target SP HTTP/1.x
  const std::string& rl = lines[0];
  const size_t sp1 = rl.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : rl.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || rl.find(' ', sp2 + 1) != std::string::npos) {
    Fail(400, "malformed request line (METHOD TARGET HTTP/1.1)");
    return false;
  }
  HttpRequest& r = request_;
  r.method = rl.substr(0, sp1);
  r.target = rl.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string version = rl.substr(sp2 + 1);
  if (!IsToken(r.method)) {
    Fail(400, "malformed method");
    return false;
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    Fail(505, "unsupported protocol version (HTTP/1.1 or HTTP/1.0)");
    return false;
  }
  if (r.target.empty() || r.target[0] != '/') {
    Fail(400, "request target must be an absolute path");
    return false;
  }
  for (char c : r.target) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 32 || u == 127) {
      Fail(400, "control character or space in the request target");
      return false;
    }
  }
  const size_t q = r.target.find('?');
  std::optional<std::string> path = PercentDecode(r.target.substr(0, q));
  if (!path) {
    Fail(400, "malformed percent-encoding in the path");
    return false;
  }
  r.path = std::move(*path);
  if (q != std::string::npos) {
    const std::string query = r.target.substr(q + 1);
    size_t from = 0;
    while (from <= query.size()) {
      size_t amp = query.find('&', from);
      if (amp == std::string::npos) amp = query.size();
      const std::string pair = query.substr(from, amp - from);
      if (!pair.empty()) {
        const size_t eq = pair.find('=');
        std::optional<std::string> k = PercentDecode(pair.substr(0, eq));
        std::optional<std::string> v = PercentDecode(eq == std::string::npos ? "" : pair.substr(eq + 1));
        if (!k || !v) {
          Fail(400, "malformed percent-encoding in the query");
          return false;
        }
        r.params.emplace(std::move(*k), std::move(*v));
      }
      from = amp + 1;
    }
  }
  if (lines.size() - 1 > kMaxHeaders) {
    Fail(431, "more than " + std::to_string(kMaxHeaders) + " headers");
    return false;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const size_t colon = line.find(':');
    if (colon == std::string::npos || !IsToken(line.substr(0, colon))) {
      Fail(400, "malformed header line " + std::to_string(i));
      return false;
    }
    std::string value = Trim(line.substr(colon + 1));
    for (char c : value) {
      const unsigned char u = static_cast<unsigned char>(c);
      if ((u < 32 && c != '\t') || u == 127) {
        Fail(400, "control character in header " + line.substr(0, colon));
        return false;
      }
    }
    r.headers.emplace_back(Lower(line.substr(0, colon)), std::move(value));
  }
  const std::string connection = Lower(r.Header("connection"));
  r.keep_alive = version == "HTTP/1.1" ? connection.find("close") == std::string::npos
                                       : connection.find("keep-alive") != std::string::npos;
  expects_continue_ = Lower(r.Header("expect")) == "100-continue";

  const bool has_length = r.HasHeader("content-length");
  const std::string te = Lower(r.Header("transfer-encoding"));
  if (!te.empty()) {
    // Both headers at once is how requests are smuggled (RFC 9112 6.1).
    if (has_length) {
      Fail(400, "both Transfer-Encoding and Content-Length");
      return false;
    }
    if (te != "chunked") {
      Fail(501, "unsupported Transfer-Encoding '" + te.substr(0, 32) + "' (chunked only)");
      return false;
    }
    chunked_ = true;
    return true;
  }
  if (has_length) {
    size_t count = 0;
    for (const auto& h : r.headers) count += h.first == "content-length";
    std::optional<uint64_t> n = ParseLength(r.Header("content-length"));
    if (count != 1 || !n) {
      Fail(400, "malformed Content-Length (one header, digits only)");
      return false;
    }
    length_ = *n;
  }
  return true;
}

void RequestParser::ExpectBody(size_t limit) {
  if (state_ != State::kHeadDone) return;
  limit_ = limit;
  if (!chunked_ && length_ > limit_) {
    Fail(413, "a body of " + std::to_string(length_) + " bytes is over this route's limit of " +
                  std::to_string(limit_) + " bytes");
    return;
  }
  if (!chunked_) request_.body.reserve(length_);
  state_ = (!chunked_ && length_ == 0) ? State::kDone : State::kBody;
}

size_t RequestParser::FeedBody(const char* data, size_t size) {
  const size_t take = static_cast<size_t>(std::min<uint64_t>(size, length_ - request_.body.size()));
  request_.body.append(data, take);
  if (request_.body.size() == length_) state_ = State::kDone;
  return take;
}

size_t RequestParser::FeedChunked(const char* data, size_t size) {
  size_t at = 0;
  constexpr size_t kMaxLine = 256;  // a size line, its extensions, a trailer line
  while (at < size && state_ == State::kBody) {
    switch (chunk_) {
      case Chunk::kSize:
      case Chunk::kTrailer: {
        const char* nl = static_cast<const char*>(std::memchr(data + at, '\n', size - at));
        const size_t n = nl == nullptr ? size - at : static_cast<size_t>(nl - (data + at)) + 1;
        line_.append(data + at, n);
        at += n;
        if (line_.size() > kMaxLine) {
          Fail(400, "chunked body: a size or trailer line over " + std::to_string(kMaxLine) + " bytes");
          return at;
        }
        if (nl == nullptr) break;
        if (line_.size() < 2 || line_[line_.size() - 2] != '\r') {
          Fail(400, "chunked body: a line not ended by CRLF");
          return at;
        }
        std::string line = line_.substr(0, line_.size() - 2);
        line_.clear();
        if (chunk_ == Chunk::kTrailer) {
          if (line.empty()) state_ = State::kDone;  // trailer fields are read and dropped
          break;
        }
        const std::string hex = Trim(line.substr(0, line.find(';')));
        if (hex.empty() || hex.size() > 15) {
          Fail(400, "chunked body: malformed chunk size");
          return at;
        }
        uint64_t v = 0;
        for (char c : hex) {
          const int d = HexDigit(c);
          if (d < 0) {
            Fail(400, "chunked body: malformed chunk size");
            return at;
          }
          v = v * 16 + static_cast<uint64_t>(d);
        }
        if (request_.body.size() + v > limit_) {
          Fail(413, "a chunked body over this route's limit of " + std::to_string(limit_) + " bytes");
          return at;
        }
        chunk_left_ = v;
        chunk_ = v == 0 ? Chunk::kTrailer : Chunk::kData;
        break;
      }
      case Chunk::kData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(chunk_left_, size - at));
        request_.body.append(data + at, take);
        at += take;
        chunk_left_ -= take;
        if (chunk_left_ == 0) chunk_ = Chunk::kDataEnd;
        break;
      }
      case Chunk::kDataEnd: {
        // The CRLF after a chunk's data, possibly split across feeds.
        line_ += data[at++];
        if (line_.size() == 2) {
          if (line_ != "\r\n") {
            Fail(400, "chunked body: chunk data not followed by CRLF");
            return at;
          }
          line_.clear();
          chunk_ = Chunk::kSize;
        }
        break;
      }
    }
  }
  return at;
}

}  // namespace wsync::controller
