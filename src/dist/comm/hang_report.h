// The hang report: on a collective timeout, the logs of the group's ranks (Note [Collective log]) gathered
// without the ranks that hang, this rank's own log printed, and the text that says who never reached the
// collective and what they last did.
//
// Note [Logs across hosts]: a rank cannot read the shared memory of another host, and the rank it would ask
// there may be the one that hangs. So on a job over several hosts every rank runs a responder thread on a
// communicator of its own (a duplicate of the world, made at World::init): it checks for a request every
// kResponderPollMs and answers with the logs of every rank of its host, read from their slots, with their
// /proc states. A rank whose collective times out asks every rank of each host it needs (one request each,
// small enough to go eagerly, so a stopped rank costs nothing) and takes the first answer per host within
// kAnswerWaitS; what no one answered is reported as not known, with its host named. Since a rank's abort
// ends the whole job, a rank that timed out also stays kLingerS after it began its report before it fails,
// answering: the ranks of a hang time out within about a step of each other, so each one's question finds
// the others still there. A report then comes kLingerS after the timeout (kAnswerWaitS where a host never
// answers). A job on one host starts no thread and waits for nothing.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dist/comm/collective_log.h"

namespace cz::dist {

constexpr int kResponderPollMs = 20;
constexpr double kAnswerWaitS = 2.0;
constexpr double kLingerS = 1.0;

// Collective over the world, at World::init after CollectiveLog::attach: the responder where the world spans
// more than one host (`local_size` < the world's size).
void start_log_service(int local_size);
// Before MPI_Finalize (World::finalize): stops the responder and frees its communicator.
void stop_log_service();

// The logs of `ranks` (world ranks): from this host's slots, else from a rank of their host (Note [Logs
// across hosts]). `others`, where given, receives the other ranks' logs that came along (this host's, and the
// rest of each host asked).
std::vector<PeerFacts> gather_logs(const std::vector<int>& ranks, std::vector<PeerFacts>* others = nullptr);

// What a timeout message adds for collective `id` on the communicator `label` of world ranks `members`:
// prints this rank's log to stderr (with the rank prefix) and returns explain_timeout's text. Never throws;
// "" before World::init.
std::string hang_report(const CollectiveId& id, std::string_view label, const std::vector<int>& members);

}  // namespace cz::dist
