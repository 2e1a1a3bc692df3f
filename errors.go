package inbox

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Stores and the middleware wrap them with a message that
// says what was wrong and with which value; test with [errors.Is].
var (
	// ErrInvalidArgument is wrapped by every input error: bad keys, leases,
	// lease ids, owners and payload hashes. A call that fails with it changed
	// nothing.
	ErrInvalidArgument = errors.New("inbox: invalid argument")

	// ErrInvalidKey: the key is empty, longer than MaxKeyLen, not valid UTF-8,
	// or holds a NUL byte. Wraps ErrInvalidArgument.
	ErrInvalidKey = fmt.Errorf("%w: invalid key", ErrInvalidArgument)

	// ErrInvalidLease: a lease duration is zero or negative where one is
	// required, negative where zero means the default, or outside the range a
	// store accepts. Wraps ErrInvalidArgument.
	ErrInvalidLease = fmt.Errorf("%w: invalid lease", ErrInvalidArgument)

	// ErrInvalidLeaseID: a lease id is empty or longer than MaxLeaseIDLen.
	// Wraps ErrInvalidArgument.
	ErrInvalidLeaseID = fmt.Errorf("%w: invalid lease id", ErrInvalidArgument)

	// ErrLeaseLost: the lease id no longer holds the key: it expired and
	// another caller acquired the key, or it was released, or it never held
	// it. The caller must stop acting as the key's owner.
	ErrLeaseLost = errors.New("inbox: lease lost")

	// ErrNotSupported: the store cannot do what was asked (for example
	// Extend on a store without lease extension).
	ErrNotSupported = errors.New("inbox: not supported")

	// ErrStoreUnavailable: the store could not be reached or failed (network
	// error, timeout, server fault). Stores wrap backend errors with it; the
	// middleware returns it, so the message is nacked and redelivered later.
	ErrStoreUnavailable = errors.New("inbox: store unavailable")

	// ErrClosed: the store or middleware was closed.
	ErrClosed = errors.New("inbox: closed")

	// ErrBusy: another consumer holds the key's lease and did not finish
	// within the middleware's wait. The message is nacked for the broker to
	// redeliver later. [BusyError] carries the details.
	ErrBusy = errors.New("inbox: key busy")

	// ErrNoKey: the message has no id the middleware could key it by, and
	// the middleware is configured to refuse such messages.
	ErrNoKey = errors.New("inbox: message has no idempotency key")

	// ErrPayloadMismatch: a known key arrived with different content, and the
	// middleware is configured to refuse such messages.
	ErrPayloadMismatch = errors.New("inbox: payload differs from the one recorded for the key")

	// ErrDead: the message's key is dead: its handler failed on the last of
	// the attempts the middleware allows (MaxAttempts; attempts count the
	// key's lease acquisitions, not only its failures). It is not
	// transient: route it to a poison queue. [DeadError] carries the
	// details.
	ErrDead = errors.New("inbox: message is dead")

	// ErrAttemptFailed: the handler failed on an attempt that was not the
	// last one the middleware allows (MaxAttempts): the message is to be
	// redelivered, after the store's backoff. It is transient, so that a
	// filtered poison queue lets the broker redeliver it. [AttemptError]
	// carries the details and wraps the handler's error.
	ErrAttemptFailed = errors.New("inbox: attempt failed; the message will be retried")

	// ErrPermanent marks a handler's error as permanent: retrying cannot
	// help (a malformed message, a rule the message breaks). The middleware
	// marks the key dead at once, whatever MaxAttempts says. Wrap an error
	// with [Permanent]; test with errors.Is.
	ErrPermanent = errors.New("inbox: permanent failure")
)

// Permanent marks err as permanent (see [ErrPermanent]): a handler returns
// inbox.Permanent(err) for a message that no retry can fix, and the
// middleware marks its key dead at once, with err's text as the reason, and
// returns an [inbox.DeadError] (not transient: a filtered poison queue takes
// it). The result matches ErrPermanent and err with errors.Is and
// errors.As. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// PermanentError is the error [Permanent] returns.
type PermanentError struct {
	// Err is the error marked permanent.
	Err error
}

func (e *PermanentError) Error() string { return e.Err.Error() }

// Is makes errors.Is(err, ErrPermanent) true.
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

// Unwrap returns the error marked permanent.
func (e *PermanentError) Unwrap() error { return e.Err }

// AttemptError is returned by the middleware, when MaxAttempts is set, for
// a failed attempt that was not the last one allowed. It matches
// [ErrAttemptFailed], and Err, the handler's error, with errors.Is.
type AttemptError struct {
	// Key is the inbox key.
	Key string
	// Attempt is the attempt that failed (the key's attempt count), of
	// MaxAttempts allowed.
	Attempt, MaxAttempts int
	// RetryAfter is the backoff the store holds the key for.
	RetryAfter time.Duration
	// Err is the handler's error.
	Err error
}

func (e *AttemptError) Error() string {
	return fmt.Sprintf("inbox: key %q: attempt %d of %d failed, retried after %s: %v", e.Key, e.Attempt, e.MaxAttempts, e.RetryAfter, e.Err)
}

// Is makes errors.Is(err, ErrAttemptFailed) true.
func (e *AttemptError) Is(target error) bool { return target == ErrAttemptFailed }

// Unwrap returns the handler's error.
func (e *AttemptError) Unwrap() error { return e.Err }

// DeadError is returned by the middleware for a dead key: by the attempt
// that reached MaxAttempts and marked it dead (Err is then the handler's
// error), and by every later delivery of the key (Err is then an error
// whose text is Reason, the reason the store kept; nil when the store kept
// none). It matches [ErrDead], and Err, with errors.Is.
type DeadError struct {
	// Key is the inbox key.
	Key string
	// Attempts is the key's attempt count.
	Attempts int
	// Reason is the reason recorded with the key (the failing handler's
	// error text).
	Reason string
	// Err is the handler's error when this delivery made the key dead,
	// else an error whose text is Reason.
	Err error
}

func (e *DeadError) Error() string {
	return fmt.Sprintf("inbox: key %q is dead after %d attempts: %s", e.Key, e.Attempts, e.Reason)
}

// Is makes errors.Is(err, ErrDead) true.
func (e *DeadError) Is(target error) bool { return target == ErrDead }

// Unwrap returns Err: the handler's error, or the kept reason.
func (e *DeadError) Unwrap() error { return e.Err }

// BusyError is returned by the middleware when a key stayed busy for the
// whole in-process wait. It matches [ErrBusy] with errors.Is.
type BusyError struct {
	// Key is the inbox key.
	Key string
	// RetryAfter is the time the lease, or the backoff, had left at the
	// last look; 0 when the store did not say.
	RetryAfter time.Duration
	// BackingOff is true when the key was waiting out a failed attempt's
	// backoff (Claim.BackingOff), false when a lease held it.
	BackingOff bool
}

func (e *BusyError) Error() string {
	why := "another consumer holds its lease"
	if e.BackingOff {
		why = "it is waiting out a failed attempt's backoff"
	}
	if e.RetryAfter > 0 {
		return fmt.Sprintf("inbox: key %q busy: %s for %s more", e.Key, why, e.RetryAfter)
	}
	return fmt.Sprintf("inbox: key %q busy: %s", e.Key, why)
}

// Is makes errors.Is(err, ErrBusy) true.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }
