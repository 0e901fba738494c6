// Package introspect is what operators ask the running dispatchers, in one place: one type
// per question (LanesQuestion, DueLanesQuestion, DeliveredQuestion, HistoryQuestion,
// BudgetQuestion, ActivityQuestion), the answer type each gets (LanesAnswer, ...), and
// Answer, with which a dispatcher (an Answerer) answers every question.
//
// A question goes to every dispatcher at once over NATS (core request/reply on
// dispatch.ctl.lanes; pkg/queue carries it, nothing is stored) and each answers for
// itself; pkg/admin gathers the answers for its API and the console. The question's name
// rides in a header, and its body is the question's JSON.
package introspect
