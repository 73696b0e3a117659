// TLS on the control plane: a controller with a certificate serves only
// TLS; a client that trusts the CA which signed it gets through (signed
// requests on top), one that trusts another CA or speaks plain HTTP is
// refused at once with one line that says so, and a certificate whose key
// does not match stops the controller from starting. The certificates are
// made here with the openssl command, a CA and a server certificate for
// 127.0.0.1 (what the client checks the name against).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/controller/controller_fixture.h"

namespace wsync::controller::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

JobSecret Secret() {
  StatusOr<JobSecret> s = JobSecret::FromBytes("0123456789abcdef0123456789abcdef");
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

// A CA (`name`.ca.pem) and a certificate for 127.0.0.1 it signed
// (`name`.pem, key `name`.key), in `dir`.
void MakeCertificates(const fs::path& dir, const std::string& name) {
  const std::string d = dir.string() + "/" + name;
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1";
  const std::string script =
      "set -e; cd '" + dir.string() + "'; printf 'subjectAltName=IP:127.0.0.1\\n' > " + name + ".ext; " +
      "openssl req -x509" + ec + " -keyout " + name + ".ca.key -out " + name + ".ca.pem -subj '/CN=wsync test CA " +
      name + "' 2>/dev/null; " + "openssl req" + ec + " -keyout " + name + ".key -out " + name +
      ".csr -subj '/CN=127.0.0.1' 2>/dev/null; " + "openssl x509 -req -in " + name + ".csr -CA " + name +
      ".ca.pem -CAkey " + name + ".ca.key -CAcreateserial -out " + name + ".pem -days 1 -extfile " + name +
      ".ext 2>/dev/null";
  ASSERT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0) << "openssl failed: " << d;
}

class TlsTest : public ControllerTest {
 protected:
  void SetUp() override {
    ControllerTest::SetUp();
    if (std::system("command -v openssl > /dev/null") != 0) GTEST_SKIP() << "no openssl command";
    dir_ = fs::temp_directory_path() / ("wsync_tls_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    MakeCertificates(dir_, "job");
    MakeCertificates(dir_, "other");
  }
  void TearDown() override {
    ControllerTest::TearDown();
    fs::remove_all(dir_);
  }
  std::string File(const std::string& name) const { return (dir_ / name).string(); }

  wsync::Status Serve(const std::string& cert, const std::string& key) {
    server_.reset();  // before the controller it serves
    StatusOr<std::unique_ptr<Controller>> c = Controller::Create(Options());
    if (!c.ok()) return c.status();
    controller_ = std::move(c).value();
    ServerOptions so;
    so.secret = Secret();
    so.tls_cert_file = cert;
    so.tls_key_file = key;
    server_ = std::make_unique<HttpServer>(controller_.get(), so);
    return server_->Start();
  }
  ControllerClient Client(const std::string& ca) const {
    ClientOptions co;
    co.retry_for_s = 2;
    co.secret = Secret();
    co.tls_ca_file = ca;
    return ControllerClient("127.0.0.1", server_->port(), co);
  }

  fs::path dir_;
};

TEST_F(TlsTest, AClientOfTheJobsCaIsServedAndSignsAsBefore) {
  ASSERT_TRUE(Serve(File("job.pem"), File("job.key")).ok());
  StatusOr<nlohmann::json> status = Client(File("job.ca.pem")).GetStatus();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ((*status)["world"]["trainers"], 2) << status->dump();
  // TLS is on top of the signatures, not instead of them.
  ClientOptions unsigned_options;
  unsigned_options.retry_for_s = 2;
  unsigned_options.tls_ca_file = File("job.ca.pem");
  StatusOr<nlohmann::json> refused = ControllerClient("127.0.0.1", server_->port(), unsigned_options).GetStatus();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("unsigned"), std::string::npos) << refused.status().message();
}

TEST_F(TlsTest, AnotherCaOrPlainHttpIsRefusedAtOnceSayingWhy) {
  ASSERT_TRUE(Serve(File("job.pem"), File("job.key")).ok());
  const auto t0 = Clock::now();
  StatusOr<nlohmann::json> wrong_ca = Client(File("other.ca.pem")).GetStatus();
  ASSERT_FALSE(wrong_ca.ok());
  const std::string& m = wrong_ca.status().message();
  EXPECT_NE(m.find("TLS"), std::string::npos) << m;
  EXPECT_NE(m.find("certificate"), std::string::npos) << m;  // OpenSSL's reason, e.g. "unable to get local issuer certificate"
  EXPECT_NE(m.find("other.ca.pem"), std::string::npos) << m;
  StatusOr<nlohmann::json> plain = Client("").GetStatus();
  ASSERT_FALSE(plain.ok());
  EXPECT_NE(plain.status().message().find("--tls-ca"), std::string::npos) << plain.status().message();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2)) << "a refused certificate is not retried";
  // Nothing got in.
  EXPECT_EQ(controller_->StatusJson()["registered"]["trainer"].size(), 0u);
}

TEST_F(TlsTest, ACertificateWithAnotherKeyStopsTheStart) {
  wsync::Status s = Serve(File("job.pem"), File("other.key"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("TLS"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("job.pem"), std::string::npos) << s.message();
  wsync::Status half = Serve(File("job.pem"), "");
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.message().find("--tls-key"), std::string::npos) << half.message();
}

}  // namespace
}  // namespace wsync::controller::testing
