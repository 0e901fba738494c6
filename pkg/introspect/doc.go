// Package introspect is what operators ask the running dispatchers, in one place: one type
// per question (LanesQuestion, DueLanesQuestion, DeliveredQuestion, HistoryQuestion,
// BudgetQuestion, ActivityQuestion), the answer type each gets (LanesAnswer, ...), and
// Answer, with which a dispatcher (an Answerer) answers every question.
//
// A question goes to every dispatcher at once over NATS (core request/reply on
// dispatch.ctl.lanes; pkg/queue carries it, nothing is stored) and each answers for
// itself; pkg/admin gathers the answers for its API and the console. The question's name
// rides in a header. Its body, for the version that follows the earlier single query type
// (a set of flags, request.LaneQuery before), is that query's JSON, so that a dispatcher not yet
// upgraded answers a new admin; and each answer has the keys of the earlier combined
// answer, so that a new admin reads an old dispatcher's. A query without a name is the
// earlier one, answered as before, for an admin not yet upgraded.
package introspect
