#include "controller/controller.h"

#include <algorithm>
#include <future>
#include <cinttypes>
#include <cstdio>
#include <thread>

#include "delta/inbox.h"
#include "routing/json_text.h"
#include "routing/plan_io.h"
#include "routing/planner.h"
#include "routing/rank_plan.h"
#include "routing/spec_io.h"

namespace wsync::controller {

using nlohmann::json;

namespace {

// An inference spec (wsync.inference/v1) with every region descriptor
// blanked: two registrations of the same layout in different memory.
// The world's text with every region's descriptor blanked: an inference
// rank that registers again with new memory changes only those.
std::string TextWithoutDescriptors(InferenceSpec spec) {
  for (InferenceRank& r : spec.ranks)
    for (MemoryRegion& m : r.regions) m.descriptor.clear();
  return ToJsonText(spec);
}

constexpr size_t kMaxErrors = 50;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string FormatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

std::string RankList(const std::vector<int32_t>& ranks) { return json(ranks).dump(); }

// 64-bit FNV-1a of the plan document: equal plans have equal ids.
std::string PlanDigest(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, h);
  return buf;
}


// The mapping to plan with: the controller's own (--mapping, identity by
// default), unless the inference ranks bring one (engines that derive it
// from the model they built, wsync.vllm). Then every rank brings the same
// one, and a --mapping given beside it must say the same.
StatusOr<const MappingSpec*> PlanMapping(const MappingSpec& given, const InferenceSpec& inference) {
  const InferenceRank* first = nullptr;
  std::vector<int32_t> without;
  for (const InferenceRank& r : inference.ranks) {
    if (!r.mapping) {
      without.push_back(r.rank);
      continue;
    }
    if (!first) {
      first = &r;
      continue;
    }
    if (ToJson(*r.mapping) != ToJson(*first->mapping))
      return InvalidArgument("inference registrations: rank " + std::to_string(r.rank) + "'s mapping '" +
                             r.mapping->name + "' differs from rank " + std::to_string(first->rank) + "'s ('" +
                             first->mapping->name + "'); every rank of the world must bring the same one");
  }
  if (!first) return &given;
  if (!without.empty())  // named first: the rank the registrations blame (CulpritOf)
    return InvalidArgument("inference registrations: rank " + std::to_string(without.front()) +
                           " brings no mapping, but rank " + std::to_string(first->rank) + " brings '" +
                           first->mapping->name + "' (ranks without one: " + RankList(without) +
                           "); every rank of the world must bring the same one");
  if (ToJson(given) != ToJson(IdentityMapping()) && ToJson(given) != ToJson(*first->mapping))
    return InvalidArgument("inference registrations: the ranks bring mapping '" + first->mapping->name +
                           "', which differs from the controller's --mapping '" + given.name +
                           "'; start the controller without --mapping to plan with theirs");
  return &*first->mapping;
}

}  // namespace

MappingSpec IdentityMapping() {
  MappingSpec m;
  m.name = "identity";
  MappingRule rule;
  rule.kind = MappingRule::Kind::kDirect;
  rule.engine = "{*}";
  MappingPart part;
  part.source = "{*}";
  rule.parts.push_back(part);
  m.rules.push_back(rule);
  return m;
}

Controller::Controller(ControllerOptions options)
    : options_(std::move(options)),
      started_(Clock::now()),
      store_(options_.state_dir),
      trainers_(options_.trainers),
      versions_(options_.trainers, options_.inference, options_.version_timeout_s) {}

Controller::~Controller() { Shutdown(); }

StatusOr<std::unique_ptr<Controller>> Controller::Create(ControllerOptions options) {
  if (options.trainers <= 0 || options.inference <= 0)
    return InvalidArgument("the world needs at least one trainer and one inference rank (got " +
                           std::to_string(options.trainers) + " trainers, " +
                           std::to_string(options.inference) + " inference)");
  if (options.mapping.rules.empty()) options.mapping = IdentityMapping();
  std::unique_ptr<Controller> c(new Controller(std::move(options)));
  std::lock_guard<std::mutex> lock(c->mu_);
  WSYNC_RETURN_IF_ERROR(c->store_.Init());
  WSYNC_RETURN_IF_ERROR(c->LoadStateLocked());
  return c;
}

void Controller::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

Status Controller::LoadStateLocked() {
  WSYNC_ASSIGN_OR_RETURN(std::optional<PersistedWorld> world, store_.LoadWorld());
  if (!world) return Status::Ok();
  const std::string where = "state dir " + store_.dir();
  if (world->trainer_ranks != options_.trainers || world->inference_ranks != options_.inference)
    return FailedPrecondition(where + " holds a world of " + std::to_string(world->trainer_ranks) +
                              " trainer + " + std::to_string(world->inference_ranks) +
                              " inference ranks, but this controller expects " +
                              std::to_string(options_.trainers) + " + " +
                              std::to_string(options_.inference) +
                              "; pass the same sizes or use a fresh --state-dir");
  if (world->mapping != ToJson(options_.mapping))
    return FailedPrecondition(where + " was planned with mapping '" +
                              world->mapping.value("name", std::string("?")) +
                              "', which differs from the one given ('" + options_.mapping.name +
                              "'); pass the same --mapping or use a fresh --state-dir");
  WSYNC_ASSIGN_OR_RETURN(TrainerSpec trainer, ParseTrainerSpec(world->trainer, where + "/world.json"));
  WSYNC_ASSIGN_OR_RETURN(InferenceSpec inference,
                         ParseInferenceSpec(world->inference, where + "/world.json"));
  // Re-plan from the persisted specs (the planner is deterministic) and
  // check the digest, so the restarted controller provably serves the plan
  // its agents already hold. plan.json alone is not enough: it does not
  // keep source holders, which per-rank extraction needs.
  std::string plan_text;
  WSYNC_ASSIGN_OR_RETURN(std::shared_ptr<const PlanState> plan,
                         BuildPlan(trainer, inference, ToJsonText(trainer), ToJsonText(inference), &plan_text));
  if (plan->plan_id != world->plan_id)
    return FailedPrecondition(where + ": re-planning the persisted world gives plan " + plan->plan_id +
                              ", not the persisted " + world->plan_id +
                              " (the planner changed?); use a fresh --state-dir and restart every agent");
  // plan.json is derived from world.json: one that is missing or differs
  // is written again, and said so.
  WSYNC_ASSIGN_OR_RETURN(std::string plan_file_wrong, store_.CheckPlanFile(plan_text));
  if (!plan_file_wrong.empty())
    Log(where + ": plan.json was " + plan_file_wrong + "; written again from world.json (plan " + plan->plan_id + ")");
  WSYNC_ASSIGN_OR_RETURN(PersistedVersions v, store_.LoadVersions());
  if (world->versions_required && !v.found)
    return FailedPrecondition(where + ": versions.json is missing, so the latest complete version is unknown "
                              "(serving on would let an older version number count as new); put it back, or use "
                              "a fresh --state-dir and restart every agent");
  InstallPlanLocked(plan);
  epoch_ = world->epoch;
  if (v.has_complete) versions_.RestoreLatestComplete(v.latest_complete, v.update_seconds, v.finished_unix);
  if (v.landed != 0) {
    versions_.RestoreLanded(v.landed, v.committing, Clock::now());
    Log("version " + std::to_string(v.landed) + " had landed everywhere before the restart; waiting for " +
        std::to_string(v.committing.size()) + " shadow inference rank(s) to copy it out");
  }
  if (v.running != 0 && v.running != v.landed && !(v.has_complete && v.running <= v.latest_complete)) {
    if (versions_.Start(v.running, Clock::now()).ok())
      Log("version " + std::to_string(v.running) + " was running at the restart; it runs on with a new deadline "
          "(its ranks' reports complete or fail it)");
  }
  Log("restored plan " + plan_->plan_id + " from " + store_.dir() + " (" + std::to_string(WriteCount(plan_->table.ops)) +
      " writes per update); latest complete version: " +
      (v.has_complete ? std::to_string(v.latest_complete) : std::string("none")) + "; epoch " +
      std::to_string(epoch_));
  return Status::Ok();
}

StatusOr<std::shared_ptr<const Controller::PlanState>> Controller::BuildPlan(
    TrainerSpec trainer, InferenceSpec inference, std::string trainer_text, std::string inference_text,
    std::string* plan_text) const {
  PlanOptions plan_options;
  plan_options.validate = false;  // the specs come from the strict loaders, which validate
  plan_options.trainer_source = "trainer registrations";  // CulpritOf reads these prefixes
  plan_options.inference_source = "inference registrations";
  plan_options.mapping_source = "mapping";
  plan_options.exchange = options_.exchange;
  plan_options.min_shard_piece_bytes = options_.min_shard_piece_bytes;
  WSYNC_ASSIGN_OR_RETURN(const MappingSpec* mapping, PlanMapping(options_.mapping, inference));
  StatusOr<RoutingTable> table = Plan(trainer, inference, *mapping, plan_options);
  if (!table.ok()) return InvalidArgument(table.status().message());
  auto plan = std::make_shared<PlanState>();
  plan->table = std::move(table).value();
  // The summary reads the table while this thread indexes and serializes
  // it: the exchange's unshard traffic is only known rank by rank (without
  // it the summary would predict full_tensor's), and that takes as long as
  // the rest of the pass.
  std::future<StatusOr<PlanSummary>> summary = std::async(std::launch::async, [&] {
    return options_.exchange ? SummarizeFromRankPlans(plan->table, trainer, inference, LinkModel{})
                             : StatusOr<PlanSummary>(Summarize(plan->table, LinkModel{}));
  });
  plan->ops_by_trainer.resize(trainer.ranks.size());
  plan->ops_by_inference.resize(inference.ranks.size());
  for (size_t i = 0; i < plan->table.ops.size(); ++i) {
    const WriteOp& op = plan->table.ops[i];
    if (op.src_rank >= 0 && static_cast<size_t>(op.src_rank) < plan->ops_by_trainer.size())
      plan->ops_by_trainer[op.src_rank].push_back(static_cast<uint32_t>(i));
    if (op.dst_rank >= 0 && static_cast<size_t>(op.dst_rank) < plan->ops_by_inference.size())
      plan->ops_by_inference[op.dst_rank].push_back(static_cast<uint32_t>(i));
  }
  *plan_text = PlanToText(plan->table);
  StatusOr<PlanSummary> summarized = summary.get();
  if (!summarized.ok()) return Internal("rank plans for the summary: " + summarized.status().message());
  plan->summary = std::move(summarized).value();
  plan->trainer = std::move(trainer);
  plan->inference = std::move(inference);
  plan->trainer_text = std::move(trainer_text);
  plan->inference_text = std::move(inference_text);
  // plan.json does not keep what each rank exchanges: the digest tells the
  // two kinds of plan apart, so a controller restarted with the other kind
  // refuses the persisted world instead of serving different slices.
  plan->plan_id = PlanDigest(options_.exchange ? *plan_text + "\nunshard=exchange" : *plan_text);
  return std::shared_ptr<const PlanState>(std::move(plan));
}

void Controller::InstallPlanLocked(std::shared_ptr<const PlanState> plan) {
  plan_ = std::move(plan);
  // Engine-paced ranks: a gate keeps its place across epochs (an engine
  // inside update() keeps it open); a rank that changed its pacing starts
  // again from that pacing's default.
  for (const InferenceRank& r : plan_->inference.ranks)
    if (versions_.PacingOf(r.rank) != r.pacing) versions_.SetPacing(r.rank, r.pacing);
  // Delta versions go to the ranks that registered inboxes (delta/inbox.h).
  std::set<int32_t> inboxes;
  for (const InferenceRank& r : plan_->inference.ranks)
    for (const MemoryRegion& m : r.regions)
      if (delta::IsInboxRegionId(m.id)) inboxes.insert(r.rank);
  versions_.ConfigureDeltas(options_.full_every, std::move(inboxes));
  trainer_slices_.clear();
  inference_slices_.clear();
  planned_ = true;
  cv_.notify_all();
}

bool Controller::WorldFullLocked() const {
  return static_cast<int32_t>(trainers_.ranks().size()) >= options_.trainers &&
         static_cast<int32_t>(inference_ranks_.size()) >= options_.inference;
}

void Controller::WaitCommitLocked(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [&] { return !committing_ || shutdown_; });
}

Status Controller::MaybePlanLocked(std::unique_lock<std::mutex>& lock) {
  if (planned_ || planning_ || !WorldFullLocked()) return Status::Ok();
  planning_ = true;
  Status result = Status::Ok();
  int passes = 0;
  while (!shutdown_ && !planned_ && WorldFullLocked()) {
    ++passes;
    // The snapshot shares the registration documents: O(ranks) under the lock.
    const uint64_t gen = registrations_gen_;
    RankJsons trainer_ranks = trainers_.ranks();
    const json mesh_groups = trainers_.mesh_groups();
    RankJsons inference_ranks = inference_ranks_;
    lock.unlock();
    if (options_.planning_hook) options_.planning_hook();
    const Clock::time_point t_hook = Clock::now();
    StatusOr<AssembledWorld> world = AssembleWorld(trainer_ranks, mesh_groups, inference_ranks);
    const Clock::time_point t_assembled = Clock::now();
    std::string plan_text;
    StatusOr<std::shared_ptr<const PlanState>> plan =
        world.ok() ? BuildPlan(std::move(world->trainer), std::move(world->inference),
                               std::move(world->trainer_text), std::move(world->inference_text), &plan_text)
                   : StatusOr<std::shared_ptr<const PlanState>>(world.status());
    const Clock::time_point t_planned = Clock::now();
    lock.lock();
    if (registrations_gen_ != gen) continue;  // a rank registered again meanwhile: plan what is there now
    if (!plan.ok()) {
      result = plan.status();
      break;
    }
    // Persist first: a plan agents act on must survive a restart. Nothing
    // else writes the store before the plan exists; registrations arriving
    // now wait for the plan (WaitCommitLocked).
    committing_ = true;
    lock.unlock();
    const json mapping = ToJson(options_.mapping);
    Status saved = store_.SaveWorld({options_.trainers, options_.inference, (*plan)->trainer_text,
                                     (*plan)->inference_text, mapping, (*plan)->plan_id},
                                    plan_text);
    const Clock::time_point t_saved = Clock::now();
    // What only this pass needed goes before the lock is taken again.
    plan_text = std::string();
    world = Aborted("released");
    trainer_ranks.clear();
    inference_ranks.clear();
    lock.lock();
    committing_ = false;
    if (!saved.ok()) {
      result = saved;
      break;
    }
    plan_seconds_ = std::chrono::duration<double>(t_saved - t_hook).count();
    assemble_seconds_ = std::chrono::duration<double>(t_assembled - t_hook).count();
    persist_seconds_ = std::chrono::duration<double>(t_saved - t_planned).count();
    InstallPlanLocked(std::move(plan).value());
    assembly_error_.clear();
    // The plan's specs are what counts from now on (re-registrations are
    // checked against them); the registration documents are not needed.
    // Freed here, under the lock: freeing them after unlocking, while the
    // 384 slices were being built, delayed this reply by ~40 s in one
    // bench run at Kimi-K2 scale (malloc arena contention, most likely).
    trainers_ = TrainerRegistry(options_.trainers);
    inference_ranks_.clear();
    char secs[96];
    std::snprintf(secs, sizeof(secs), "%.3f s (assemble %.3f s, plan %.3f s, persist %.3f s)", plan_seconds_,
                  assemble_seconds_, plan_seconds_ - assemble_seconds_ - persist_seconds_, persist_seconds_);
    Log("world complete: " + std::to_string(options_.trainers) + " trainer + " +
        std::to_string(options_.inference) + " inference ranks; plan " + plan_->plan_id + ": " +
        std::to_string(WriteCount(plan_->table.ops)) + " writes, " + std::to_string(plan_->summary.wire_bytes) +
        " bytes per update; unshard " +
        (options_.exchange ? "by exchange (" + std::to_string(plan_->summary.exchange_bytes) + " bytes against " +
                                 std::to_string(plan_->summary.full_tensor_bytes) + " for full_tensor)"
                           : std::string("by full_tensor")) +
        "; planned in " + secs +
        (passes > 1 ? ", " + std::to_string(passes) + " passes (ranks registered again meanwhile)"
                    : std::string()));
  }
  planning_ = false;
  cv_.notify_all();
  if (result.ok() && shutdown_ && !planned_) return Aborted("controller is shutting down");
  return result;
}

bool Controller::DropCulpritLocked(Role role, int32_t rank, const std::string& error) {
  std::optional<Culprit> culprit = CulpritOf(error);
  if (!culprit) return false;
  const Role at_fault = culprit->trainer ? Role::kTrainer : Role::kInference;
  if (at_fault == role && culprit->rank == rank) return false;
  if (at_fault == Role::kTrainer) trainers_.Remove(culprit->rank);
  else inference_ranks_.erase(culprit->rank);
  ++registrations_gen_;
  rejected_[{at_fault, culprit->rank}] = error;
  RecordErrorLocked(at_fault, culprit->rank, error + " (registration dropped when the world was assembled)");
  cv_.notify_all();  // its agent may be waiting for the plan
  return true;
}

void Controller::RecordErrorLocked(Role role, int32_t rank, const std::string& error) {
  ++registration_errors_;
  // A refusal may quote the body it refused (an unknown key, a name): keep
  // an excerpt, so twelve refused 8 MB bodies cost neither log nor status.
  const std::string line = Excerpt(error);
  errors_.push_back({UnixNow(), role, rank, line});
  if (errors_.size() > kMaxErrors) errors_.erase(errors_.begin());
  Log("rejected " + std::string(RoleName(role)) + " registration: " + line);
}

json Controller::RegisterReplyLocked(Role role, int32_t rank) {
  SeenLocked(role, rank, Clock::now());  // a lost rank registering again has restarted
  const int32_t registered =
      planned_ ? options_.trainers + options_.inference
               : static_cast<int32_t>(trainers_.ranks().size() + inference_ranks_.size());
  return {{"role", RoleName(role)},
          {"rank", rank},
          {"registered", registered},
          {"world", options_.trainers + options_.inference},
          {"phase", PhaseLocked()},
          {"plan_id", planned_ ? plan_->plan_id : std::string()}};
}

StatusOr<json> Controller::ReRegisterLocked(Role role, int32_t rank, const json& rank_json,
                                            const json* mesh_groups) {
  const bool trainer = role == Role::kTrainer;
  const std::string& planned_text = trainer ? plan_->trainer_text : plan_->inference_text;
  json doc = trainer ? ToJson(plan_->trainer) : ToJson(plan_->inference);
  if (mesh_groups) doc["mesh_groups"] = *mesh_groups;
  for (json& r : doc["ranks"])
    if (r.value("rank", -1) == rank) r = rank_json;
  const std::string source = std::string(RoleName(role)) + " registrations";
  std::string normalized;
  std::optional<InferenceSpec> inference;
  if (trainer) {
    StatusOr<TrainerSpec> spec = ParseTrainerSpec(doc, source);
    if (!spec.ok()) return InvalidArgument(spec.status().message());
    normalized = ToJsonText(*spec);
  } else {
    StatusOr<InferenceSpec> spec = ParseInferenceSpec(doc, source);
    if (!spec.ok()) return InvalidArgument(spec.status().message());
    normalized = ToJsonText(*spec);
    inference = std::move(spec).value();
  }
  if (inference && normalized != planned_text &&
      TextWithoutDescriptors(*inference) == TextWithoutDescriptors(plan_->inference))
    return NewEpochLocked(Role::kInference, rank, std::make_pair(std::move(*inference), std::move(normalized)));
  if (normalized != planned_text)
    return FailedPrecondition(std::string(RoleName(role)) + " rank " + std::to_string(rank) +
                              ": metadata differs from the plan this controller serves (plan " +
                              plan_->plan_id +
                              "); the plan is static: restart the controller with a fresh "
                              "--state-dir and every agent to plan again");
  if (trainer) {
    // A trainer agent that restarted: its peers' collective groups still
    // hold pairs to its old process, so every trainer rebuilds them (a new
    // executor at the new epoch) before the next version, together.
    return NewEpochLocked(Role::kTrainer, rank, std::nullopt);
  }
  Log(std::string(RoleName(role)) + " rank " + std::to_string(rank) + " registered again (same metadata)");
  return RegisterReplyLocked(role, rank);
}

StatusOr<json> Controller::NewEpochLocked(Role role, int32_t rank,
                                          std::optional<std::pair<InferenceSpec, std::string>> inference) {
  auto plan = std::make_shared<PlanState>(*plan_);  // the routing is unchanged: at most descriptors moved
  if (inference) {
    plan->inference = std::move(inference->first);
    plan->inference_text = std::move(inference->second);
  }
  if (epoch_ >= kMaxEpoch)
    return FailedPrecondition("registration epoch " + std::to_string(epoch_) +
                              " is at its bound; restart the job with a fresh --state-dir");
  const uint64_t epoch = epoch_ + 1;
  const json mapping = ToJson(options_.mapping);
  // Persist first: a restarted controller must serve what agents now hold.
  WSYNC_RETURN_IF_ERROR(store_.SaveWorld({options_.trainers, options_.inference, plan->trainer_text,
                                          plan->inference_text, mapping, plan->plan_id, epoch},
                                         PlanToText(plan->table)));
  epoch_ = epoch;
  InstallPlanLocked(std::move(plan));
  const std::string why = std::string(RoleName(role)) + " rank " + std::to_string(rank) + " registered again" +
                          (inference ? " with new memory" : "") + " (epoch " + std::to_string(epoch) + ")";
  const int failed = FailVersionsOfLostLocked(role, rank, why, Clock::now());
  Log(why + (inference ? "; trainers re-import its descriptors at their next version"
                       : "; trainers rebuild their groups at their next version") +
      (failed > 0 ? "; " + std::to_string(failed) + " running version(s) failed" : std::string()));
  return RegisterReplyLocked(role, rank);
}

StatusOr<json> Controller::RegisterTrainer(json body) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitCommitLocked(lock);
  TickLocked(Clock::now());
  const int32_t peek = body.is_object() && body.value("rank", json()).is_number_integer()
                           ? body["rank"].get<int32_t>() : -1;
  if (planned_) {
    if (peek < 0 || peek >= options_.trainers || !body.value("mesh_groups", json()).is_array()) {
      Status s = InvalidArgument("trainer registration: needs an integer 'rank' in 0.." +
                                 std::to_string(options_.trainers - 1) + " and 'mesh_groups'");
      RecordErrorLocked(Role::kTrainer, peek, s.message());
      return s;
    }
    json rank_json = body;
    rank_json.erase("mesh_groups");
    StatusOr<json> reply = ReRegisterLocked(Role::kTrainer, peek, rank_json, &body["mesh_groups"]);
    if (!reply.ok()) RecordErrorLocked(Role::kTrainer, peek, reply.status().message());
    return reply;
  }
  // A rank registering again (its agent restarted) replaces itself; check
  // it against the others only, and put the old one back on error.
  std::optional<TrainerRegistration> old;
  if (auto it = trainers_.ranks().find(peek); it != trainers_.ranks().end()) {
    old = TrainerRegistration{peek, *it->second, trainers_.mesh_groups()};
    trainers_.Remove(peek);
  }
  StatusOr<TrainerRegistration> reg = trainers_.Check(std::move(body));  // body is not read after
  if (!reg.ok()) {
    if (old) trainers_.Add(*old);
    RecordErrorLocked(Role::kTrainer, peek, reg.status().message());
    return reg.status();
  }
  const int32_t rank = reg->rank;
  trainers_.Add(std::move(reg).value());
  ++registrations_gen_;
  const RankJson mine = trainers_.ranks().at(rank);
  Log("registered trainer rank " + std::to_string(rank) + " (" +
      std::to_string(trainers_.ranks().size()) + "/" + std::to_string(options_.trainers) + " trainers, " +
      std::to_string(inference_ranks_.size()) + "/" + std::to_string(options_.inference) + " inference)");
  rejected_.erase({Role::kTrainer, rank});
  Status planned = MaybePlanLocked(lock);
  if (!planned.ok()) {
    if (planned.code() == StatusCode::kAborted) return planned;
    assembly_error_ = planned.message();
    if (DropCulpritLocked(Role::kTrainer, rank, planned.message()))
      return RegisterReplyLocked(Role::kTrainer, rank);
    // This registration completed a world that does not plan: drop it (if
    // it is still the one registered: the rank may have registered again
    // while the world was planned).
    if (auto it = trainers_.ranks().find(rank); it != trainers_.ranks().end() && it->second == mine) {
      trainers_.Remove(rank);
      if (old) trainers_.Add(*old);
      ++registrations_gen_;
    }
    RecordErrorLocked(Role::kTrainer, rank, planned.message());
    return planned;
  }
  return RegisterReplyLocked(Role::kTrainer, rank);
}

StatusOr<json> Controller::RegisterInference(json body) {
  // An inference rank is checked on its own (the strict loader and
  // validator), so without the lock.
  StatusOr<int32_t> rank = CheckInferenceRegistration(body, options_.inference);
  std::unique_lock<std::mutex> lock(mu_);
  WaitCommitLocked(lock);
  TickLocked(Clock::now());
  if (!rank.ok()) {
    const int32_t peek = body.is_object() && body.value("rank", json()).is_number_integer()
                             ? body["rank"].get<int32_t>() : -1;
    RecordErrorLocked(Role::kInference, peek, rank.status().message());
    return rank.status();
  }
  if (planned_) {
    versions_.ForgetHeld(*rank);  // a restarted rank's memory holds no version a delta could build on
    StatusOr<json> reply = ReRegisterLocked(Role::kInference, *rank, body, nullptr);
    if (!reply.ok()) RecordErrorLocked(Role::kInference, *rank, reply.status().message());
    return reply;
  }
  RankJson old;
  if (auto it = inference_ranks_.find(*rank); it != inference_ranks_.end()) old = it->second;
  const RankJson mine = std::make_shared<const json>(std::move(body));
  inference_ranks_[*rank] = mine;
  ++registrations_gen_;
  Log("registered inference rank " + std::to_string(*rank) + " (" +
      std::to_string(trainers_.ranks().size()) + "/" + std::to_string(options_.trainers) + " trainers, " +
      std::to_string(inference_ranks_.size()) + "/" + std::to_string(options_.inference) + " inference)");
  rejected_.erase({Role::kInference, *rank});
  Status planned = MaybePlanLocked(lock);
  if (!planned.ok()) {
    if (planned.code() == StatusCode::kAborted) return planned;
    assembly_error_ = planned.message();
    if (DropCulpritLocked(Role::kInference, *rank, planned.message()))
      return RegisterReplyLocked(Role::kInference, *rank);
    if (auto it = inference_ranks_.find(*rank); it != inference_ranks_.end() && it->second == mine) {
      if (old) it->second = old;
      else inference_ranks_.erase(it);
      ++registrations_gen_;
    }
    RecordErrorLocked(Role::kInference, *rank, planned.message());
    return planned;
  }
  return RegisterReplyLocked(Role::kInference, *rank);
}

std::vector<int32_t> Controller::MissingLocked(Role role) const {
  std::vector<int32_t> missing;
  if (planned_) return missing;
  const int32_t n = role == Role::kTrainer ? options_.trainers : options_.inference;
  for (int32_t r = 0; r < n; ++r) {
    const bool have = role == Role::kTrainer ? trainers_.ranks().count(r) > 0
                                             : inference_ranks_.count(r) > 0;
    if (!have) missing.push_back(r);
  }
  return missing;
}

std::string Controller::MissingTextLocked() const {
  return "missing trainer ranks " + RankList(MissingLocked(Role::kTrainer)) + ", inference ranks " +
         RankList(MissingLocked(Role::kInference));
}

std::string Controller::PhaseLocked() const {
  if (planned_) return "planned";
  if (planning_) return "planning";
  return world_timed_out_ ? "failed_to_assemble" : "assembling";
}

json Controller::WorldSummary() {
  std::lock_guard<std::mutex> lock(mu_);
  TickLocked(Clock::now());
  return {{"phase", PhaseLocked()},
          {"missing",
           {{"trainer", MissingLocked(Role::kTrainer)}, {"inference", MissingLocked(Role::kInference)}}}};
}

StatusOr<json> Controller::PlanSlice(Role role, int32_t rank, Clock::duration wait) {
  WSYNC_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> text, PlanSliceText(role, rank, wait));
  return json::parse(*text);
}

StatusOr<std::shared_ptr<const std::string>> Controller::PlanSliceText(Role role, int32_t rank,
                                                                       Clock::duration wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const int32_t n = role == Role::kTrainer ? options_.trainers : options_.inference;
  if (rank < 0 || rank >= n)
    return InvalidArgument(std::string(RoleName(role)) + " rank " + std::to_string(rank) +
                           " is outside 0.." + std::to_string(n - 1));
  const Clock::time_point until = Clock::now() + wait;
  while (!planned_ && !shutdown_) {
    if (auto it = rejected_.find({role, rank}); it != rejected_.end())
      return InvalidArgument(it->second + " (this registration was dropped when the world was assembled; "
                             "fix the metadata and register again)");
    TickLocked(Clock::now());
    if (Clock::now() >= until) break;
    cv_.wait_until(lock, std::min(until, Clock::now() + std::chrono::milliseconds(500)));
  }
  if (shutdown_) return Aborted("controller is shutting down");
  if (!planned_ && planning_)
    return FailedPrecondition("world complete, plan being computed (phase planning); ask again");
  if (!planned_) {
    std::string msg = "world incomplete: " + MissingTextLocked();
    if (world_timed_out_) msg += " (world timeout of " + FormatSeconds(options_.world_timeout_s) + " s passed)";
    if (!assembly_error_.empty()) msg += "; last assembly error: " + assembly_error_;
    return FailedPrecondition(msg);
  }
  auto& cache = role == Role::kTrainer ? trainer_slices_ : inference_slices_;
  const std::pair<Role, int32_t> me{role, rank};
  // Agents retry on FailedPrecondition, as while the plan is computed.
  const auto busy = [&] {
    return FailedPrecondition("planned; " + std::to_string(building_.size()) +
                              " slices being built (a few at once); ask again");
  };
  while (true) {
    if (auto it = cache.find(rank); it != cache.end()) return it->second;
    if (shutdown_) return Aborted("controller is shutting down");
    if (building_.count(me) > 0) {  // another request of this rank builds it (an agent asking again)
      if (cv_.wait_until(lock, until) == std::cv_status::timeout && cache.count(rank) == 0 && !shutdown_)
        return busy();
      continue;
    }
    if (!TakeSliceSlotLocked(lock, until)) {
      if (shutdown_) return Aborted("controller is shutting down");
      return busy();
    }
    // While this request queued, another of the same rank may have built it.
    if (cache.count(rank) == 0 && building_.count(me) == 0 && !shutdown_) break;
    ReleaseSliceSlotLocked();
  }
  building_.insert(me);
  // Extract without the lock: the plan is immutable and shared.
  const std::shared_ptr<const PlanState> plan = plan_;
  const uint64_t epoch = epoch_;  // changes only with plan_
  lock.unlock();
  StatusOr<std::shared_ptr<const std::string>> text = BuildSlice(*plan, epoch, role, rank);
  lock.lock();
  building_.erase(me);
  ReleaseSliceSlotLocked();
  if (text.ok() && plan_ == plan) cache.emplace(rank, *text);
  cv_.notify_all();  // a request of the same rank waiting for this build
  return text;
}

bool Controller::TakeSliceSlotLocked(std::unique_lock<std::mutex>& lock, Clock::time_point until) {
  // A few at once: a build holds its rank's plan and text (hundreds of MB
  // per build for Kimi-K2's exchange plan).
  const size_t slots = std::max(2u, std::thread::hardware_concurrency());
  if (shutdown_) return false;
  if (slice_slots_taken_ < slots && slice_slot_queue_.empty()) {
    ++slice_slots_taken_;
    return true;
  }
  SliceSlotWaiter me;
  slice_slot_queue_.push_back(&me);
  me.cv.wait_until(lock, until, [&] { return me.granted || shutdown_; });
  if (me.granted) return true;  // the slot is ours; the caller releases it
  slice_slot_queue_.erase(std::find(slice_slot_queue_.begin(), slice_slot_queue_.end(), &me));
  return false;
}

void Controller::ReleaseSliceSlotLocked() {
  if (slice_slot_queue_.empty()) {
    --slice_slots_taken_;
    return;
  }
  // Notified under the lock: the waiter cannot return (and destroy its
  // condition variable) before we release it.
  SliceSlotWaiter* next = slice_slot_queue_.front();
  slice_slot_queue_.pop_front();
  next->granted = true;
  next->cv.notify_one();
}

StatusOr<std::shared_ptr<const std::string>> Controller::BuildSlice(const PlanState& plan, uint64_t epoch, Role role,
                                                                    int32_t rank) {
  // Written as text (ToJsonText): a tree of every write of 384 slices cost
  // most of the time to serve them at Kimi-K2 scale.
  json head = {{"schema", "wsync.plan_slice/v1"},
               {"role", RoleName(role)},
               {"rank", rank},
               {"plan_id", plan.plan_id},
               {"epoch", epoch}};
  std::string plan_text;
  if (role == Role::kTrainer) {
    StatusOr<TrainerRankPlan> rank_plan =
        ExtractTrainerRankPlan(plan.table, plan.trainer, plan.inference, rank, &plan.ops_by_trainer[rank]);
    if (!rank_plan.ok())
      return Internal("trainer rank " + std::to_string(rank) + ": " + rank_plan.status().message());
    plan_text = ToJsonText(*rank_plan);
  } else {
    InferenceRankPlan rank_plan = ExtractInferenceRankPlan(plan.table, rank, &plan.ops_by_inference[rank]);
    std::map<int32_t, std::pair<uint64_t, uint64_t>> by_trainer;  // rank -> writes, bytes
    for (uint32_t i : plan.ops_by_inference[rank]) {
      const WriteOp& op = plan.table.ops[i];
      by_trainer[op.src_rank].first += op.planes;
      by_trainer[op.src_rank].second += op.bytes;
    }
    json per = json::array();
    for (const auto& [src, wb] : by_trainer)
      per.push_back({{"rank", src}, {"writes", wb.first}, {"bytes", wb.second}});
    head["expected_writes"] = WriteCount(rank_plan);
    head["expected_bytes"] = rank_plan.bytes;
    head["writes_by_trainer"] = std::move(per);
    plan_text = ToJsonText(rank_plan);
  }
  return std::make_shared<const std::string>(ObjectTextWith(head, "plan", plan_text));
}

void Controller::KvSet(const std::string& key, std::string value) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_[key] = std::move(value);
  cv_.notify_all();
}

StatusOr<std::string> Controller::KvGet(const std::string& key, Clock::duration wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const Clock::time_point until = Clock::now() + wait;
  cv_.wait_until(lock, until, [&] { return shutdown_ || kv_.count(key) > 0; });
  if (auto it = kv_.find(key); it != kv_.end()) return it->second;
  if (shutdown_) return Aborted("controller is shutting down");
  return NotFound("key '" + key + "' not set after " +
                  std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()) +
                  " ms");
}

StatusOr<int64_t> Controller::KvAdd(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t value = 0;
  if (auto it = kv_.find(key); it != kv_.end()) {
    char* end = nullptr;
    value = std::strtoll(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0')
      return InvalidArgument("key '" + key + "' holds a non-integer value; add needs a decimal counter");
  }
  if (__builtin_add_overflow(value, delta, &value))
    return InvalidArgument("key '" + key + "': adding " + std::to_string(delta) + " overflows the 64-bit counter");
  kv_[key] = std::to_string(value);
  cv_.notify_all();
  return value;
}

Status Controller::CheckReportLocked(Role role, int32_t rank) const {
  if (!planned_) return FailedPrecondition("no plan yet (world incomplete: " + MissingTextLocked() + ")");
  const int32_t n = role == Role::kTrainer ? options_.trainers : options_.inference;
  if (rank < 0 || rank >= n)
    return InvalidArgument(std::string(RoleName(role)) + " rank " + std::to_string(rank) +
                           " is outside 0.." + std::to_string(n - 1));
  return Status::Ok();
}

void Controller::LogVersionLocked(const VersionRecord& r) {
  // A failed version was persisted as running (or landed): it is over now.
  if (r.state == VersionState::kFailed) SaveVersionsLocked();
  if (r.state == VersionState::kComplete) {
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.3f", r.seconds);
    Log("version " + std::to_string(r.version) + " complete in " + secs + " s");
  } else if (r.state == VersionState::kFailed) {
    const RankFailure& f = r.failures.front();
    Log("version " + std::to_string(r.version) + " failed: " + f.role +
        (f.rank >= 0 ? " rank " + std::to_string(f.rank) : std::string()) + ": " + f.error);
  }
}

void Controller::SaveVersionsLocked() {
  PersistedVersions v;
  v.has_complete = versions_.has_complete();
  v.latest_complete = versions_.latest_complete();
  v.update_seconds = versions_.last_update_seconds();
  if (const VersionRecord* r = versions_.Find(v.latest_complete)) v.finished_unix = r->finished_unix;
  if (const VersionRecord* r = versions_.Landed()) {
    v.landed = r->version;
    v.committing.assign(r->committing.begin(), r->committing.end());
  }
  for (const auto& [u, r] : versions_.records()) {
    if (!r.finished() && !r.landed) v.running = u;  // one in flight
  }
  Status s = store_.SaveVersions(v);
  if (!s.ok()) Log("cannot persist versions: " + s.message());
}

StatusOr<json> Controller::StartVersion(uint64_t v, int32_t rank, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  TickLocked(now);
  WSYNC_RETURN_IF_ERROR(CheckReportLocked(Role::kTrainer, rank));
  SeenLocked(Role::kTrainer, rank, now);
  // A trainer holding descriptors of memory that is gone must not write:
  // it fetches its slice again first.
  if (epoch != 0 && epoch != epoch_)
    return FailedPrecondition(std::string(kStaleEpochPrefix) + " " + std::to_string(epoch) + ": trainer rank " +
                              std::to_string(rank) + " holds the plan slice of epoch " + std::to_string(epoch) +
                              ", the controller serves epoch " + std::to_string(epoch_) +
                              " (an inference rank registered again); fetch the plan slice again");
  // One version in flight: the first start of v is refused (503) while an
  // older one runs. Its writes would otherwise land in memory where the
  // older version's last writes are still arriving (trainer ranks leave a
  // version at different times), and a version called complete could hold
  // bytes of the next. The older one finishes by its deadline at the latest;
  // the trainer asks again (trainer_agent::StartVersion), holding no server
  // thread meanwhile.
  if (versions_.Find(v) == nullptr) {
    for (const auto& [u, rec] : versions_.records()) {
      // Versions start in increasing order: an older number than one
      // already running would land its writes under the newer one.
      if (u > v && !rec.finished())
        return FailedPrecondition("version " + std::to_string(v) + " is older than version " + std::to_string(u) +
                                  ", which is running; trainer rank " + std::to_string(rank) +
                                  " must start a higher version number");
      if (u < v && rec.state == VersionState::kFailed && now < rec.deadline) {
        // A failed delta version: a rank that took it may still be applying
        // its deltas into the weights (InferenceAgent::ApplyDeltas), and the
        // next version's writes must not land under that. It waits until
        // each such rank reported on it, failed, or the deadline passed.
        for (int32_t r : rec.delta_ranks) {
          const bool failed = std::any_of(rec.failures.begin(), rec.failures.end(), [&](const RankFailure& f) {
            return f.role == "inference" && f.rank == r;
          });
          if (rec.inference_done.count(r) == 0 && !failed)
            return Unavailable(std::string(kOlderRunningPrefix) + ": version " + std::to_string(u) +
                               " failed, and inference rank " + std::to_string(r) +
                               " may still be applying its deltas; trainer rank " + std::to_string(rank) +
                               " starts version " + std::to_string(v) + " once it has reported");
        }
      }
      if (u >= v || rec.finished()) continue;
      return Unavailable(std::string(kOlderRunningPrefix) + ": version " + std::to_string(u) +
                         " has not finished" +
                         (rec.landed ? " (shadow inference ranks are copying it out)" : std::string()) +
                         "; trainer rank " + std::to_string(rank) + " starts version " + std::to_string(v) +
                         " once it has");
    }
  }
  const bool known = versions_.Find(v) != nullptr;
  WSYNC_ASSIGN_OR_RETURN(const VersionRecord* r, versions_.Start(v, now));
  if (!known) {
    Log("version " + std::to_string(v) + " started by trainer rank " + std::to_string(rank));
    SaveVersionsLocked();  // a restart runs it on: its ranks' reports still count
    cv_.notify_all();  // the inference agents' status long polls
    // A version that starts while a rank is lost cannot complete: say so now.
    for (const auto& [who, since] : lost_) FailVersionsOfLostLocked(who.first, who.second, LostReason(), now);
    r = versions_.Find(v);
  }
  return r->ToJson(now);
}

// After a report: a version that just finished is logged, waiters wake, and
// a complete one is persisted (a failed one needs no persisting).
void Controller::VersionFinishedLocked(bool was_finished, const VersionRecord& r) {
  if (was_finished || !r.finished()) return;
  LogVersionLocked(r);
  if (r.state == VersionState::kComplete) SaveVersionsLocked();
  cv_.notify_all();
}

StatusOr<json> Controller::ReportDone(uint64_t v, Role role, int32_t rank, bool ok, const std::string& error,
                                      const json& stats, bool commit) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  TickLocked(now);
  WSYNC_RETURN_IF_ERROR(CheckReportLocked(role, rank));
  SeenLocked(role, rank, now);
  const VersionRecord* before = versions_.Find(v);
  const bool was_finished = before && before->finished();
  const bool was_landed = before && before->landed;
  WSYNC_ASSIGN_OR_RETURN(const VersionRecord* r,
                         role == Role::kTrainer ? versions_.TrainerDone(v, rank, ok, error, now, stats)
                                                : versions_.InferenceDone(v, rank, ok, error, now, commit, stats));
  // Landed and waiting for shadow ranks: a restarted controller must know.
  if (!was_landed && r->landed && !r->finished()) SaveVersionsLocked();
  VersionFinishedLocked(was_finished, *r);
  cv_.notify_all();  // VersionChecksums waits for every trainer's report, shadow ranks for `landed`
  return r->ToJson(now);
}

StatusOr<json> Controller::ReportCommitted(uint64_t v, int32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  TickLocked(now);
  WSYNC_RETURN_IF_ERROR(CheckReportLocked(Role::kInference, rank));
  SeenLocked(Role::kInference, rank, now);
  const VersionRecord* before = versions_.Find(v);
  const bool was_finished = before && before->finished();
  WSYNC_ASSIGN_OR_RETURN(const VersionRecord* r, versions_.Committed(v, rank, now));
  if (!r->finished()) SaveVersionsLocked();  // who is still to commit, for a restart
  VersionFinishedLocked(was_finished, *r);
  return r->ToJson(now);
}

StatusOr<json> Controller::ReportFailure(uint64_t v, Role role, int32_t rank, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  TickLocked(now);
  WSYNC_RETURN_IF_ERROR(CheckReportLocked(role, rank));
  SeenLocked(role, rank, now);
  const VersionRecord* before = versions_.Find(v);
  const bool was_finished = before && before->finished();
  WSYNC_ASSIGN_OR_RETURN(const VersionRecord* r,
                         versions_.Fail(v, RoleName(role), rank, error.empty() ? "failed" : error, now));
  VersionFinishedLocked(was_finished, *r);
  return r->ToJson(now);
}

StatusOr<json> Controller::Gate(int32_t rank, GateMove move, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  TickLocked(now);
  WSYNC_RETURN_IF_ERROR(CheckReportLocked(Role::kInference, rank));
  SeenLocked(Role::kInference, rank, now);
  WSYNC_ASSIGN_OR_RETURN(GateState g, versions_.Gate(rank, move, version));
  cv_.notify_all();  // trainers wait for admission, agents' status long polls for it
  return g.ToJson();
}

StatusOr<json> Controller::GetVersion(uint64_t v, Clock::duration wait, Until until_what) {
  std::unique_lock<std::mutex> lock(mu_);
  const Clock::time_point until = Clock::now() + wait;
  while (true) {
    const Clock::time_point now = Clock::now();
    TickLocked(now);
    const VersionRecord* r = versions_.Find(v);
    if (!r) return NotFound("version " + std::to_string(v) + " was never started (or is too old to be kept)");
    if (r->finished() || (until_what == Until::kLanded && r->landed) ||
        (until_what == Until::kAdmitted && r->admitted) || now >= until || shutdown_)
      return r->ToJson(now);
    // Wake at the version's deadline too, so expiry is seen while waiting.
    cv_.wait_until(lock, std::min(until, r->deadline + std::chrono::milliseconds(1)));
  }
}

StatusOr<json> Controller::VersionChecksums(uint64_t v, int32_t rank, Clock::duration wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::string where = "version " + std::to_string(v) + ": checksums for inference rank " + std::to_string(rank);
  if (rank < 0 || rank >= options_.inference)
    return InvalidArgument(where + ": no such rank (the job has " + std::to_string(options_.inference) + ")");
  const Clock::time_point until = Clock::now() + wait;
  while (true) {
    const Clock::time_point now = Clock::now();
    TickLocked(now);
    const VersionRecord* r = versions_.Find(v);
    if (!r) return NotFound(where + ": the version was never started (or is too old to be kept)");
    if (r->state == VersionState::kFailed) {
      const std::string why = r->failures.empty() ? "" : ": " + r->failures.front().role + " rank " +
                                                             std::to_string(r->failures.front().rank) + ": " +
                                                             r->failures.front().error;
      return FailedPrecondition(where + ": the version failed" + why);
    }
    if (static_cast<int32_t>(r->trainer_done.size()) == options_.trainers) {
      std::vector<int32_t> without;
      for (int32_t t : r->trainer_done)
        if (r->checksum_trainers.count(t) == 0) without.push_back(t);
      if (!without.empty()) {
        std::string ranks;
        for (int32_t t : without) ranks += (ranks.empty() ? "" : ", ") + std::to_string(t);
        return FailedPrecondition(where + ": trainer ranks [" + ranks +
                                  "] sent none (run them with --checksums, or TrainerAgent(checksums=True))");
      }
      auto it = r->checksums.find(rank);
      return json{{"version", v}, {"rank", rank}, {"state", VersionStateName(r->state)},
                  {"checksums", it == r->checksums.end() ? json::object() : it->second}};
    }
    if (now >= until || shutdown_) {
      std::string ranks;
      for (int32_t t = 0; t < options_.trainers; ++t)
        if (r->trainer_done.count(t) == 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(t);
      return DeadlineExceeded(where + ": trainer ranks [" + ranks + "] have not reported done");
    }
    cv_.wait_until(lock, std::min(until, r->deadline + std::chrono::milliseconds(1)));
  }
}

void Controller::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  TickLocked(Clock::now());
}

void Controller::TickLocked(Clock::time_point now) {
  if (!planned_ && !planning_ && !world_timed_out_ && now - started_ >= Seconds(options_.world_timeout_s)) {
    world_timed_out_ = true;
    Log("failed to assemble the world within " + FormatSeconds(options_.world_timeout_s) + " s: " +
        MissingTextLocked() + " (still accepting registrations)");
    cv_.notify_all();
  }
  std::vector<const VersionRecord*> expired = versions_.ExpireOverdue(now);
  for (const VersionRecord* r : expired) LogVersionLocked(*r);
  if (!expired.empty()) cv_.notify_all();
  CheckLivenessLocked(now);
}

void Controller::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
  for (SliceSlotWaiter* w : slice_slot_queue_) w->cv.notify_one();
}

}  // namespace wsync::controller
