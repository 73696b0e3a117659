#include "controller/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace wsync::controller {
namespace {

constexpr char kScheme[] = "wsync-hmac-sha256-v1";

std::string Hex(const unsigned char* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1) {
    // OpenSSL's CSPRNG failing is not recoverable; an all-zero nonce would
    // be refused as a replay soon after, so stop loudly instead.
    std::fprintf(stderr, "wsync: RAND_bytes failed; cannot make a nonce\n");
    std::abort();
  }
  return Hex(reinterpret_cast<const unsigned char*>(raw.data()), bytes);
}

bool IsHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return Hex(digest, sizeof(digest));
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

StatusOr<JobSecret> JobSecret::FromBytes(std::string bytes, std::string source) {
  while (!bytes.empty() && std::isspace(static_cast<unsigned char>(bytes.back()))) bytes.pop_back();
  if (bytes.size() < 16) {
    return InvalidArgument(source + ": a job secret needs at least 16 bytes (it has " +
                           std::to_string(bytes.size()) + "); make one with `wsync secret PATH`");
  }
  return JobSecret(std::move(bytes), std::move(source));
}

StatusOr<JobSecret> JobSecret::FromFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return NotFound("secret file " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgument("secret file " + path + " is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 0777));
    return InvalidArgument("secret file " + path + " may be read by group or others (mode " + mode +
                           "); `chmod 600 " + path + "` it, as for an SSH key");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("secret file " + path + ": cannot be opened");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return FromBytes(bytes.str(), "secret file " + path);
}

std::string JobSecret::Hmac(const std::string& message) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  return Hex(mac, len);
}

StatusOr<std::optional<JobSecret>> LoadJobSecret(const std::string& flag_path) {
  std::string path = flag_path;
  if (path.empty()) {
    const char* env = std::getenv(kSecretFileEnv);
    if (env != nullptr) path = env;
  }
  if (path.empty()) return std::optional<JobSecret>();
  WSYNC_ASSIGN_OR_RETURN(JobSecret s, JobSecret::FromFile(path));
  return std::optional<JobSecret>(std::move(s));
}

Status WriteNewSecret(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return InvalidArgument("cannot create secret file " + path + ": " + std::strerror(errno));
  const std::string text = RandomHex(32) + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok) return Internal("cannot write secret file " + path);
  return Status::Ok();
}

std::string CanonicalRequest(const std::string& method, const std::string& target, const std::string& body_sha256,
                             const std::string& timestamp, const std::string& nonce) {
  return std::string(kScheme) + "\n" + method + "\n" + target + "\n" + timestamp + "\n" + nonce + "\n" +
         body_sha256;
}

RequestSignature SignRequestAt(const JobSecret& secret, const std::string& method, const std::string& target,
                               const std::string& body, int64_t unix_seconds, const std::string& nonce) {
  RequestSignature s;
  s.timestamp = std::to_string(unix_seconds);
  s.nonce = nonce;
  s.content_sha256 = Sha256Hex(body);
  s.signature = secret.Hmac(CanonicalRequest(method, target, s.content_sha256, s.timestamp, s.nonce));
  return s;
}

RequestSignature SignRequest(const JobSecret& secret, const std::string& method, const std::string& target,
                             const std::string& body) {
  return SignRequestAt(secret, method, target, body, static_cast<int64_t>(UnixSeconds()), RandomHex(16));
}

RequestVerifier::RequestVerifier(JobSecret secret, double max_skew_s)
    : secret_(std::move(secret)), max_skew_s_(max_skew_s) {}

Status RequestVerifier::VerifyHead(const std::string& method, const std::string& target,
                                   const RequestSignature& sig) {
  return VerifyHead(method, target, sig, UnixSeconds());
}

Status RequestVerifier::Verify(const std::string& method, const std::string& target, const std::string& body,
                               const RequestSignature& sig, double now_unix) {
  // The body first: a request refused for it leaves its nonce unused.
  if (!sig.content_sha256.empty()) WSYNC_RETURN_IF_ERROR(VerifyBody(body, sig));
  return VerifyHead(method, target, sig, now_unix);
}

Status RequestVerifier::VerifyBody(const std::string& body, const RequestSignature& sig) {
  const std::string actual = Sha256Hex(body);
  if (sig.content_sha256.size() != actual.size() ||
      CRYPTO_memcmp(sig.content_sha256.data(), actual.data(), actual.size()) != 0) {
    return Unauthenticated("bad signature (the body is not the one that was signed: altered in transit)");
  }
  return Status::Ok();
}

Status RequestVerifier::VerifyHead(const std::string& method, const std::string& target,
                                   const RequestSignature& sig, double now_unix) {
  if (sig.signature.empty() || sig.timestamp.empty() || sig.nonce.empty()) {
    return Unauthenticated("unsigned request (no " + std::string(kSignatureHeader) +
                           "); every agent and command needs the job's --secret-file or $" + kSecretFileEnv);
  }
  if (sig.content_sha256.size() != 64 || !IsHex(sig.content_sha256)) {
    return Unauthenticated("unsigned request (no " + std::string(kContentHashHeader) +
                           ", or not 64 lower-case hex digits): a client older than this controller?");
  }
  char* end = nullptr;
  errno = 0;
  const long long ts = std::strtoll(sig.timestamp.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return Unauthenticated("malformed " + std::string(kTimestampHeader));
  if (sig.nonce.size() < 16 || sig.nonce.size() > 64 || !IsHex(sig.nonce))
    return Unauthenticated("malformed " + std::string(kNonceHeader) + " (16 to 64 lower-case hex digits)");
  const std::string expected =
      secret_.Hmac(CanonicalRequest(method, target, sig.content_sha256, sig.timestamp, sig.nonce));
  if (sig.signature.size() != expected.size() ||
      CRYPTO_memcmp(sig.signature.data(), expected.data(), expected.size()) != 0) {
    return Unauthenticated("bad signature (forged or altered request, or a different job secret)");
  }
  const double skew = now_unix - static_cast<double>(ts);
  if (skew > max_skew_s_ || skew < -max_skew_s_) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "stale request: signed %.0f s %s this controller's clock (allowed %g s)",
                  skew < 0 ? -skew : skew, skew < 0 ? "ahead of" : "behind", max_skew_s_);
    return Unauthenticated(buf);
  }
  std::lock_guard<std::mutex> lock(mu_);
  PruneLocked(now_unix);
  // Seen nonces are kept until no request signed with them could pass the
  // skew check again.
  if (!nonces_.emplace(sig.nonce, static_cast<double>(ts) + 2 * max_skew_s_ + 1).second) {
    return Unauthenticated("replayed request (nonce already used)");
  }
  return Status::Ok();
}

void RequestVerifier::PruneLocked(double now_unix) {
  if (nonces_.size() < prune_at_) return;
  for (auto it = nonces_.begin(); it != nonces_.end();) {
    it = it->second < now_unix ? nonces_.erase(it) : std::next(it);
  }
  prune_at_ = std::max<size_t>(1024, 2 * nonces_.size());
}

}  // namespace wsync::controller
