#include "controller/http_reactor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace wsync::controller {
namespace {

using Clock = std::chrono::steady_clock;

const char* Reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
  }
  return "Status";
}

std::string JsonError(const std::string& message) {
  // Messages here are ours and plain ASCII; quotes and backslashes escaped.
  std::string out = "{\"error\":\"";
  for (char c : message) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 32) out += c;
  }
  return out + "\"}";
}

HttpResponse ErrorResponse(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = JsonError(message);
  r.close = true;
  return r;
}

// A fixed-size pool running one lane's handlers.
class Lane {
 public:
  explicit Lane(size_t threads) {
    for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
  }
  ~Lane() { Join(); }
  void Post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  size_t busy() {
    std::lock_guard<std::mutex> lock(mu_);
    return busy_;
  }
  void Join() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left to answer
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      ++busy_;
      lock.unlock();
      task();
      lock.lock();
      --busy_;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  size_t busy_ = 0;
  std::vector<std::thread> workers_;
};

enum class Phase {
  kReading,  // a request is arriving (or the connection idles between requests)
  kWorking,  // its handler runs on a lane; the socket is not watched
  kWriting,  // its answer is being sent
  kLinger,   // answered with close: reading and dropping until EOF or the deadline
};

struct Conn {
  uint64_t id = 0;
  int fd = -1;
  SSL* ssl = nullptr;
  std::string remote;
  Phase phase = Phase::kReading;
  RequestParser parser;
  bool started = false;  // a byte of the current request arrived
  Clock::time_point deadline;
  std::string in;  // read but not yet parsed (a pipelined next request)
  std::string out;
  std::shared_ptr<const std::string> out_body;
  size_t out_at = 0;       // bytes of out, then out_body, sent
  bool close_after = false;
  bool tls_wants_read = false;   // SSL_write needs the socket readable
  bool tls_wants_write = false;  // SSL_read needs the socket writable
  uint32_t watching = 0;         // epoll events registered; 0: not registered
  size_t body_reserved = 0;      // counted in the body budget
  std::optional<Admission> admission;  // the owner's word on the request being read
};

enum class Io { kOk, kAgain, kClosed };

}  // namespace

struct HttpReactor::Impl {
  ReactorOptions options;
  AdmitFn admit;
  RefusedFn refused;

  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  int port = -1;
  SSL_CTX* tls = nullptr;
  std::thread thread;
  std::vector<std::unique_ptr<Lane>> lanes;
  std::atomic<bool> stopping{false};
  bool started = false;
  bool stopped = false;

  // Reactor-thread state.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  std::map<std::string, size_t> per_address;
  uint64_t next_id = 1;
  size_t body_in_flight = 0;
  size_t max_connections = 0;
  bool accept_paused = false;  // out of file descriptors: retried on the next tick
  std::atomic<size_t> open{0};

  // Answers from the lanes, picked up by the reactor.
  std::mutex done_mu;
  std::vector<std::pair<uint64_t, HttpResponse>> done;

  ~Impl() {
    if (tls != nullptr) SSL_CTX_free(tls);
    for (int fd : {listen_fd, epoll_fd, wake_fd}) {
      if (fd >= 0) ::close(fd);
    }
  }

  Status Bind();
  void Loop();
  void Accept();
  void Watch(Conn& c);
  void Unwatch(Conn& c);
  void Close(Conn& c);
  void OnEvent(Conn& c, uint32_t events);
  Io Read(Conn& c, char* buf, size_t size, size_t* got);
  Io Write(Conn& c, const char* data, size_t size, size_t* put);
  void ReadRequest(Conn& c);
  void Parse(Conn& c);
  bool Admit(Conn& c);
  void Dispatch(Conn& c);
  void Respond(Conn& c, HttpResponse response);
  void Refuse(Conn& c, const std::string& reason, HttpResponse response);
  void Flush(Conn& c);
  void Linger(Conn& c);
  void NextRequest(Conn& c);
  void CheckDeadlines();
  void TakeAnswers();
  void ReleaseBody(Conn& c) {
    body_in_flight -= c.body_reserved;
    c.body_reserved = 0;
  }
  Clock::time_point In(double seconds) const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
};

HttpReactor::HttpReactor(ReactorOptions options, AdmitFn admit, RefusedFn refused) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->admit = std::move(admit);
  impl_->refused = std::move(refused);
}

HttpReactor::~HttpReactor() { Stop(); }

int HttpReactor::port() const { return impl_->port; }
size_t HttpReactor::open_connections() const { return impl_->open.load(); }
size_t HttpReactor::busy_workers(size_t lane) const {
  return lane < impl_->lanes.size() ? impl_->lanes[lane]->busy() : 0;
}

Status HttpReactor::Impl::Bind() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(options.port);
  const std::string where = options.host + ":" + service;
  if (::getaddrinfo(options.host.c_str(), service.c_str(), &hints, &found) != 0 || found == nullptr)
    return Unavailable("cannot listen on " + where + " (not an address of this host)");
  std::string why = "no usable address";
  for (addrinfo* a = found; a != nullptr && listen_fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listen_fd = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (listen_fd < 0) return Unavailable("cannot listen on " + where + ": " + why);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return Status::Ok();
}

Status HttpReactor::Start() {
  Impl& s = *impl_;
  const ReactorOptions& o = s.options;
  if (!o.tls_cert_file.empty()) {
    s.tls = SSL_CTX_new(TLS_server_method());
    if (s.tls == nullptr || SSL_CTX_use_certificate_chain_file(s.tls, o.tls_cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(s.tls, o.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(s.tls) != 1) {
      ERR_clear_error();
      return InvalidArgument("TLS: cannot use certificate '" + o.tls_cert_file + "' with key '" + o.tls_key_file +
                             "' (unreadable, not PEM, or the key does not match)");
    }
    SSL_CTX_set_min_proto_version(s.tls, TLS1_2_VERSION);
    // OpenSSL writes to the socket with write(2), not send(MSG_NOSIGNAL): a
    // client that hangs up must not kill the process.
    std::signal(SIGPIPE, SIG_IGN);
    SSL_CTX_set_mode(s.tls, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  }
  // Every connection is a descriptor: take the hard limit, and cap
  // connections below it with room for the rest of the process.
  rlimit fds{};
  if (::getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur < fds.rlim_max) {
    fds.rlim_cur = fds.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &fds);
  }
  const size_t fd_room = fds.rlim_cur > 512 ? static_cast<size_t>(fds.rlim_cur) - 256 : 256;
  s.max_connections = std::min(o.max_connections, fd_room);
  WSYNC_RETURN_IF_ERROR(s.Bind());
  s.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.epoll_fd < 0 || s.wake_fd < 0) return Internal(std::string("epoll/eventfd: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // the listening socket
  ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.listen_fd, &ev);
  ev.data.u64 = UINT64_MAX;  // the wake-up eventfd
  ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.wake_fd, &ev);
  for (size_t n : o.lane_threads) s.lanes.push_back(std::make_unique<Lane>(std::max<size_t>(n, 1)));
  s.thread = std::thread([&s] { s.Loop(); });
  s.started = true;
  return Status::Ok();
}

void HttpReactor::Stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  s.stopping = true;
  const uint64_t one = 1;
  (void)!::write(s.wake_fd, &one, sizeof(one));
  s.thread.join();
  for (auto& lane : s.lanes) lane->Join();
  for (auto& [id, c] : s.conns) {
    if (c->ssl != nullptr) SSL_free(c->ssl);
    ::close(c->fd);
  }
  s.conns.clear();
  s.open = 0;
}

void HttpReactor::Impl::Loop() {
  constexpr int kMaxEvents = 256;
  epoll_event events[kMaxEvents];
  Clock::time_point next_check = Clock::now();
  while (!stopping) {
    const int n = ::epoll_wait(epoll_fd, events, kMaxEvents, 100);
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == 0) {
        Accept();
      } else if (key == UINT64_MAX) {
        uint64_t count;
        (void)!::read(wake_fd, &count, sizeof(count));
        TakeAnswers();
      } else {
        auto it = conns.find(key);
        if (it != conns.end()) OnEvent(*it->second, events[i].events);
      }
    }
    if (Clock::now() >= next_check) {
      CheckDeadlines();
      next_check = Clock::now() + std::chrono::milliseconds(100);
    }
  }
}

void HttpReactor::Impl::Accept() {
  // A bounded batch per wake: connections already open keep being served
  // while a flood of new ones arrives.
  for (int batch = 0; batch < 64; ++batch) {
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: stop watching the listener until the next
        // deadline check frees some, instead of spinning on it.
        accept_paused = true;
        ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
        refused("", "out of file descriptors", "cannot accept a connection: " + std::string(std::strerror(errno)));
      }
      return;
    }
    char host[INET6_ADDRSTRLEN] = "?";
    if (peer.ss_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr, host, sizeof(host));
    else if (peer.ss_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr, host, sizeof(host));
    const std::string remote = host;
    const size_t from_here = per_address.count(remote) != 0 ? per_address[remote] : 0;
    const bool over_total = conns.size() >= max_connections;
    if (over_total || from_here >= options.max_connections_per_address) {
      const std::string what =
          over_total ? "too many connections (" + std::to_string(max_connections) + " open); try again later"
                     : "too many connections from " + remote + " (" +
                           std::to_string(options.max_connections_per_address) + " open); try again later";
      refused(remote, over_total ? "connection limit" : "connection limit per address", what);
      if (tls == nullptr) {
        // A best-effort answer on a fresh socket (its send buffer is empty).
        const std::string body = JsonError(what);
        const std::string text = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                 "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
                                 std::to_string(body.size()) + "\r\n\r\n" + body;
        (void)!::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      ::close(fd);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Conn>();
    c->id = next_id++;
    c->fd = fd;
    c->remote = remote;
    c->deadline = In(options.request_timeout_s);
    if (tls != nullptr) {
      c->ssl = SSL_new(tls);
      SSL_set_fd(c->ssl, fd);
      SSL_set_accept_state(c->ssl);
    }
    ++per_address[remote];
    Conn& ref = *c;
    conns.emplace(c->id, std::move(c));
    open = conns.size();
    Watch(ref);
  }
}

void HttpReactor::Impl::Watch(Conn& c) {
  uint32_t want = 0;
  switch (c.phase) {
    case Phase::kReading:
      want = EPOLLIN | ((c.out_at < c.out.size() || c.tls_wants_write) ? uint32_t{EPOLLOUT} : 0u);
      break;
    case Phase::kWriting: want = EPOLLOUT | (c.tls_wants_read ? uint32_t{EPOLLIN} : 0u); break;
    case Phase::kLinger: want = EPOLLIN; break;
    case Phase::kWorking: want = 0; break;
  }
  if (want == c.watching) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  if (want == 0) {
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
  } else {
    ::epoll_ctl(epoll_fd, c.watching == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd, &ev);
  }
  c.watching = want;
}

void HttpReactor::Impl::Unwatch(Conn& c) {
  if (c.watching != 0) ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
  c.watching = 0;
}

void HttpReactor::Impl::Close(Conn& c) {
  Unwatch(c);
  ReleaseBody(c);
  if (c.ssl != nullptr) SSL_free(c.ssl);
  ::close(c.fd);
  auto at = per_address.find(c.remote);
  if (at != per_address.end() && --at->second == 0) per_address.erase(at);
  conns.erase(c.id);  // destroys c
  open = conns.size();
}

Io HttpReactor::Impl::Read(Conn& c, char* buf, size_t size, size_t* got) {
  *got = 0;
  if (c.ssl == nullptr) {
    const ssize_t n = ::recv(c.fd, buf, size, 0);
    if (n > 0) {
      *got = static_cast<size_t>(n);
      return Io::kOk;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Io::kAgain;
    return Io::kClosed;
  }
  c.tls_wants_write = false;
  const int n = SSL_read(c.ssl, buf, static_cast<int>(size));
  if (n > 0) {
    *got = static_cast<size_t>(n);
    return Io::kOk;
  }
  switch (SSL_get_error(c.ssl, n)) {
    case SSL_ERROR_WANT_READ: return Io::kAgain;
    case SSL_ERROR_WANT_WRITE: c.tls_wants_write = true; return Io::kAgain;
    default: ERR_clear_error(); return Io::kClosed;  // EOF, a failed handshake (plain HTTP), a reset
  }
}

Io HttpReactor::Impl::Write(Conn& c, const char* data, size_t size, size_t* put) {
  *put = 0;
  if (c.ssl == nullptr) {
    const ssize_t n = ::send(c.fd, data, size, MSG_NOSIGNAL);
    if (n >= 0) {
      *put = static_cast<size_t>(n);
      return Io::kOk;
    }
    return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? Io::kAgain : Io::kClosed;
  }
  c.tls_wants_read = false;
  const int n = SSL_write(c.ssl, data, static_cast<int>(std::min<size_t>(size, 1 << 30)));
  if (n > 0) {
    *put = static_cast<size_t>(n);
    return Io::kOk;
  }
  switch (SSL_get_error(c.ssl, n)) {
    case SSL_ERROR_WANT_WRITE: return Io::kAgain;
    case SSL_ERROR_WANT_READ: c.tls_wants_read = true; return Io::kAgain;
    default: ERR_clear_error(); return Io::kClosed;
  }
}

void HttpReactor::Impl::OnEvent(Conn& c, uint32_t events) {
  const uint64_t id = c.id;
  switch (c.phase) {
    case Phase::kReading:
      if (c.out_at < c.out.size() && (events & EPOLLOUT)) {
        Flush(c);  // a "100 Continue" still going out
        if (conns.count(id) == 0) return;
      }
      ReadRequest(c);
      break;
    case Phase::kWriting: Flush(c); break;
    case Phase::kLinger: Linger(c); break;
    case Phase::kWorking: break;
  }
}

void HttpReactor::Impl::ReadRequest(Conn& c) {
  const uint64_t id = c.id;
  char buf[64 * 1024];
  // Until the socket has nothing more (TLS may hold decrypted bytes that
  // epoll cannot see), or the request is complete and dispatched.
  while (conns.count(id) != 0 && c.phase == Phase::kReading) {
    size_t got = 0;
    const Io io = Read(c, buf, sizeof(buf), &got);
    if (io == Io::kClosed) {
      // A client that hangs up mid-request or between requests.
      return Close(c);
    }
    if (io == Io::kAgain) {
      Watch(c);
      return;
    }
    if (!c.started) {
      c.started = true;
      c.deadline = In(options.request_timeout_s);
    }
    c.in.append(buf, got);
    Parse(c);
  }
}

void HttpReactor::Impl::Parse(Conn& c) {
  while (c.phase == Phase::kReading) {
    switch (c.parser.state()) {
      case RequestParser::State::kHeadDone:
        if (!Admit(c)) return;  // answered (and maybe closed) already
        continue;
      case RequestParser::State::kDone: return Dispatch(c);
      case RequestParser::State::kError: {
        const RequestParser::Error& e = c.parser.error();
        const HttpRequest& r = c.parser.request();
        const std::string where = r.method.empty() ? std::string() : r.method + " " + r.path + ": ";
        return Refuse(c, e.http_status == 413 ? "body too large" : "malformed request",
                      ErrorResponse(e.http_status, where + e.message));
      }
      case RequestParser::State::kHead:
      case RequestParser::State::kBody: break;
    }
    if (c.in.empty()) return;
    const size_t used = c.parser.Feed(c.in.data(), c.in.size());
    c.in.erase(0, used);
  }
}

bool HttpReactor::Impl::Admit(Conn& c) {
  HttpRequest& head = c.parser.request();
  head.remote_addr = c.remote;
  Admission a = admit(head);
  if (a.refuse) {
    a.refuse->close = true;  // its body, if any, is never read
    Respond(c, std::move(*a.refuse));
    return false;
  }
  const std::optional<uint64_t> declared = c.parser.declared_length();
  const size_t reserve = declared ? static_cast<size_t>(std::min<uint64_t>(*declared, a.body_limit)) : a.body_limit;
  if (reserve > 0 && body_in_flight + reserve > options.max_body_bytes_in_flight) {
    HttpResponse busy = ErrorResponse(503, head.method + " " + head.path + ": the controller is reading " +
                                               std::to_string(body_in_flight >> 20) +
                                               " MiB of request bodies already; try again later");
    busy.headers.emplace_back("Retry-After", "1");
    Refuse(c, "body memory", std::move(busy));
    return false;
  }
  c.body_reserved = reserve;
  body_in_flight += reserve;
  c.parser.ExpectBody(a.body_limit);  // 413 (kError) past the limit, before a byte of the body
  if (c.parser.state() == RequestParser::State::kBody && c.parser.expects_continue()) {
    c.out = "HTTP/1.1 100 Continue\r\n\r\n";
    c.out_at = 0;
  }
  c.admission = std::move(a);
  return true;
}

void HttpReactor::Impl::Dispatch(Conn& c) {
  c.phase = Phase::kWorking;
  Unwatch(c);
  c.out.clear();
  c.out_at = 0;
  Admission a = std::move(*c.admission);
  c.admission.reset();
  auto request = std::make_shared<HttpRequest>(std::move(c.parser.request()));
  const uint64_t id = c.id;
  Lane& lane = *lanes[std::min(a.lane, lanes.size() - 1)];
  lane.Post([this, id, request, handler = std::move(a.handler)]() mutable {
    HttpResponse response;
    try {
      handler(*request, response);
    } catch (const std::exception& e) {
      response = ErrorResponse(500, request->method + " " + request->path + ": internal error: " + e.what());
      response.close = false;
    } catch (...) {
      response = ErrorResponse(500, request->method + " " + request->path + ": internal error");
      response.close = false;
    }
    if (!request->keep_alive) response.close = true;
    request.reset();  // the body's memory goes back before the answer is queued
    {
      std::lock_guard<std::mutex> lock(done_mu);
      done.emplace_back(id, std::move(response));
    }
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof(one));
  });
}

void HttpReactor::Impl::TakeAnswers() {
  std::vector<std::pair<uint64_t, HttpResponse>> answers;
  {
    std::lock_guard<std::mutex> lock(done_mu);
    answers.swap(done);
  }
  for (auto& [id, response] : answers) {
    auto it = conns.find(id);
    if (it != conns.end()) Respond(*it->second, std::move(response));
  }
}

void HttpReactor::Impl::Refuse(Conn& c, const std::string& reason, HttpResponse response) {
  const std::string what = response.body;
  refused(c.remote, reason, what);
  response.close = true;
  Respond(c, std::move(response));
}

void HttpReactor::Impl::Respond(Conn& c, HttpResponse r) {
  ReleaseBody(c);
  c.admission.reset();
  const size_t body_size = r.shared_body ? r.shared_body->size() : r.body.size();
  std::string head = "HTTP/1.1 " + std::to_string(r.status) + " " + Reason(r.status) + "\r\n";
  head += "Content-Type: " + r.content_type + "\r\n";
  head += "Content-Length: " + std::to_string(body_size) + "\r\n";
  for (const auto& [k, v] : r.headers) head += k + ": " + v + "\r\n";
  head += r.close ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
  // Whatever of a "100 Continue" has not gone out goes first.
  c.out = c.out.substr(c.out_at) + head;
  if (!r.shared_body) c.out += r.body;
  c.out_body = std::move(r.shared_body);
  c.out_at = 0;
  c.close_after = r.close;
  c.phase = Phase::kWriting;
  c.deadline = In(options.request_timeout_s);
  Flush(c);
}

void HttpReactor::Impl::Flush(Conn& c) {
  while (true) {
    const size_t total = c.out.size() + (c.phase == Phase::kWriting && c.out_body ? c.out_body->size() : 0);
    if (c.out_at >= total) break;
    const bool in_head = c.out_at < c.out.size();
    const char* data = in_head ? c.out.data() + c.out_at : c.out_body->data() + (c.out_at - c.out.size());
    const size_t size = in_head ? c.out.size() - c.out_at : total - c.out_at;
    size_t put = 0;
    const Io io = Write(c, data, size, &put);
    if (io == Io::kClosed) return Close(c);
    if (io == Io::kAgain) return Watch(c);
    c.out_at += put;
  }
  if (c.phase != Phase::kWriting) {
    // A "100 Continue" is out; the body follows.
    c.out.clear();
    c.out_at = 0;
    return Watch(c);
  }
  c.out.clear();
  c.out_body.reset();
  c.out_at = 0;
  if (c.close_after) {
    // Half-close and drop what the client still sends (a body we refused),
    // so that it reads our answer instead of a reset.
    if (c.ssl == nullptr) ::shutdown(c.fd, SHUT_WR);
    c.phase = Phase::kLinger;
    c.deadline = In(std::min(options.request_timeout_s, 2.0));
    Watch(c);
    return Linger(c);
  }
  NextRequest(c);
}

void HttpReactor::Impl::Linger(Conn& c) {
  char buf[64 * 1024];
  for (int i = 0; i < 16; ++i) {
    size_t got = 0;
    const Io io = Read(c, buf, sizeof(buf), &got);
    if (io == Io::kClosed) return Close(c);
    if (io == Io::kAgain) return;
  }
}

void HttpReactor::Impl::NextRequest(Conn& c) {
  c.parser.Reset();
  c.phase = Phase::kReading;
  c.started = !c.in.empty();
  c.deadline = c.started ? In(options.request_timeout_s) : In(options.keep_alive_s);
  const uint64_t id = c.id;
  Parse(c);
  if (conns.count(id) != 0 && c.phase == Phase::kReading) ReadRequest(c);
}

void HttpReactor::Impl::CheckDeadlines() {
  const Clock::time_point now = Clock::now();
  std::vector<uint64_t> late;
  for (const auto& [id, c] : conns) {
    if (c->phase != Phase::kWorking && now >= c->deadline) late.push_back(id);
  }
  for (uint64_t id : late) {
    Conn& c = *conns.at(id);
    if (c.phase == Phase::kReading && c.started) {
      // A request that did not arrive whole in time (a slow or stalled
      // client): answered once, then closed.
      std::string line;
      for (char ch : c.parser.request_line()) line += (ch >= 32 && ch < 127 && ch != '\'') ? ch : '?';
      char limit[32];
      std::snprintf(limit, sizeof(limit), "%g", options.request_timeout_s);
      Refuse(c, "request timeout",
             ErrorResponse(408, "request '" + line + "' did not arrive whole within " + limit +
                                    " s; the connection is closed"));
      if (conns.count(id) != 0 && conns.at(id)->phase == Phase::kLinger) Close(*conns.at(id));
    } else {
      // Idle between requests, never started, an answer nobody reads, or
      // a lingering close: closed without more ado.
      Close(c);
    }
  }
  if (accept_paused && conns.size() < max_connections) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev);
    accept_paused = false;
  }
}

}  // namespace wsync::controller
