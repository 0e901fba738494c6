// Package client is the Go client of the dispatcher's ingest HTTP API: it stores
// requests for raven with ingest and follows them until they are delivered.
//
// Do is penguin's call to raven, durable and spaced: it stores the request once and
// returns raven's answer when the request is final (or ctx ends):
//
//	c, err := client.New("https://ingest.example", client.WithToken(token))
//	if err != nil {
//		return err
//	}
//	status, err := c.Do(ctx, "penguin-7", []byte(`{"fish":3}`))
//	if err != nil {
//		return err // a *client.NotSubmittedError (perhaps not stored), or not final before ctx ended
//	}
//	if status.Response != nil { // raven's answer: delivered, or the one that dead-lettered it
//		body, _ := status.Response.Body()
//		fmt.Println(status.State, status.Response.Status, string(body))
//	}
//
// Do is Submit then Wait. A service that does not wait for raven submits, and may ask
// later:
//
//	receipt, err := c.Submit(ctx, "penguin-7", []byte(`{"fish":3}`))
//	if err != nil {
//		return err // a *client.Problem when ingest said no; errors.As finds it
//	}
//	status, err := c.Wait(ctx, receipt.ClientID, receipt.ID) // until delivered, dead-lettered or ctx ends
//	fmt.Println(status.State, status.RavenStatus)
//
// Statuses are kept by clientId, and clientIds are case-sensitive: Status and Wait name
// the request with the Receipt's ClientID and ID.
//
// # Retries
//
// Every call retries what may succeed later, and nothing else, until its context ends
// or the RetryPolicy's MaxAttempts run out:
//
//   - a connection error, including a connection reset or closed before any answer
//     (but not a TLS certificate that fails verification);
//   - 429 Too Many Requests and 503 Service Unavailable from ingest, and 502 and 504
//     from a proxy in front of it.
//
// It never retries another answer: 400, 401, 403, 404, 408, 413 and 415 say the
// request itself must change, and a 500 is a bug in ingest (which does not answer 500
// by design), not something that waiting fixes.
//
// Retrying a submit is safe: every submit carries an Idempotency-Key, the caller's or
// one generated once per Submit (and once per batch item) and reused on each retry, so
// ingest stores the request once however many times it is sent.
//
// Before retry number n (n = 0 for the first retry) a call waits
//
//	uniform[0, min(Max, Base·2^n)]                       when ingest asked for no wait
//	RetryAfter + uniform[0, min(RetryAfter, Base·2^n)]   when it asked for RetryAfter
//
// where RetryAfter is what ingest's Retry-After header (or a batch item's retryAfter)
// asked for. The wait is therefore never shorter than ingest asked, nor longer than
// twice that, and the random part ("full jitter") keeps many clients that were turned
// away together from coming back together.
//
// When a call stops retrying because its context ended, the error it returns wraps
// both the context's error and the last failure, so errors.Is(err,
// context.DeadlineExceeded) and errors.As(err, &problem) both hold. When MaxAttempts ran
// out, it wraps the last failure.
package client
