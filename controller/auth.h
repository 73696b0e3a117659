// Authentication of the control plane (docs/CONTROL_PLANE.md, "Security").
//
// Every job has a secret: the bytes of a file only its owner can read,
// named by --secret-file or $WSYNC_SECRET_FILE on every command. Each
// request carries four headers:
//
//   X-Wsync-Timestamp       unix seconds when it was signed
//   X-Wsync-Nonce           32 hex digits, never reused
//   X-Wsync-Content-Sha256  hex SHA-256 of the body
//   X-Wsync-Signature       hex HMAC-SHA256(secret, canonical request)
//
// where the canonical request is, one per line: the scheme name
// "wsync-hmac-sha256-v1", the method, the request target (path and query as
// sent), the timestamp, the nonce and the hex SHA-256 of the body. The
// controller refuses (401) a request whose signature is missing or wrong
// (forged or altered), whose timestamp is further than the allowed skew from
// its clock, or whose nonce it has seen within that window (replayed) -- all
// from the head, before a byte of the body is read -- and then one whose
// body does not hash to what was signed.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/status.h"

namespace wsync::controller {

inline constexpr char kTimestampHeader[] = "X-Wsync-Timestamp";
inline constexpr char kNonceHeader[] = "X-Wsync-Nonce";
inline constexpr char kSignatureHeader[] = "X-Wsync-Signature";
inline constexpr char kContentHashHeader[] = "X-Wsync-Content-Sha256";
inline constexpr char kSecretFileEnv[] = "WSYNC_SECRET_FILE";

class JobSecret {
 public:
  // The file's bytes, trailing whitespace dropped. Refused: a file that group
  // or others may read (like an SSH key), or fewer than 16 bytes.
  static StatusOr<JobSecret> FromFile(const std::string& path);
  // For tests and in-process servers.
  static StatusOr<JobSecret> FromBytes(std::string bytes, std::string source = "in-memory secret");

  const std::string& source() const { return source_; }  // the file it came from
  // hex HMAC-SHA256 of `message`.
  std::string Hmac(const std::string& message) const;

 private:
  JobSecret(std::string bytes, std::string source) : bytes_(std::move(bytes)), source_(std::move(source)) {}
  std::string bytes_;
  std::string source_;
};

// `flag_path` if set, else $WSYNC_SECRET_FILE if set, else none (an open
// control plane). A named file that cannot be used is an error, never a
// silent fall-back to no secret.
StatusOr<std::optional<JobSecret>> LoadJobSecret(const std::string& flag_path);

// Writes a fresh 64-hex-digit secret to `path` with mode 0600; refuses to
// overwrite an existing file.
Status WriteNewSecret(const std::string& path);

struct RequestSignature {
  std::string timestamp;
  std::string nonce;
  std::string signature;
  std::string content_sha256;  // the body's, as signed
};

std::string Sha256Hex(const std::string& data);
// `body_sha256`: Sha256Hex of the body.
std::string CanonicalRequest(const std::string& method, const std::string& target, const std::string& body_sha256,
                             const std::string& timestamp, const std::string& nonce);

// Signs with the current time and a random nonce.
RequestSignature SignRequest(const JobSecret& secret, const std::string& method, const std::string& target,
                             const std::string& body);
RequestSignature SignRequestAt(const JobSecret& secret, const std::string& method, const std::string& target,
                               const std::string& body, int64_t unix_seconds, const std::string& nonce);

// Checks signatures and remembers nonces for twice the allowed skew.
// Thread-safe.
class RequestVerifier {
 public:
  explicit RequestVerifier(JobSecret secret, double max_skew_s = 60);

  // Everything but the body: the signature over the declared body hash,
  // the timestamp, the nonce (remembered from here on). Unauthenticated
  // naming what was wrong (missing header, bad signature, stale timestamp,
  // replayed nonce); `now_unix` is injected by tests.
  Status VerifyHead(const std::string& method, const std::string& target, const RequestSignature& sig,
                    double now_unix);
  Status VerifyHead(const std::string& method, const std::string& target, const RequestSignature& sig);
  // The body, once read, against the hash VerifyHead accepted.
  static Status VerifyBody(const std::string& body, const RequestSignature& sig);
  // Both.
  Status Verify(const std::string& method, const std::string& target, const std::string& body,
                const RequestSignature& sig, double now_unix);

 private:
  void PruneLocked(double now_unix);

  const JobSecret secret_;
  const double max_skew_s_;
  std::mutex mu_;
  std::unordered_map<std::string, double> nonces_;  // nonce -> forget after (unix s)
  size_t prune_at_ = 1024;
};

double UnixSeconds();

}  // namespace wsync::controller
