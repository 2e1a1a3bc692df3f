package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/watermill-inbox/inbox"
)

// recordJSON is a record in -json output. Its field names are those of
// protocol v1's GET /v1/inbox/{key} answer (status is the state), so that one
// parser reads both; the fields the protocol does not carry follow its
// camelCase. A field without a value is left out, as in the protocol;
// status and attempts are always there.
type recordJSON struct {
	Status      string     `json:"status"`
	Attempts    int        `json:"attempts"`
	FirstSeen   *time.Time `json:"firstSeen,omitempty"`
	LastSeen    *time.Time `json:"lastSeen,omitempty"`
	LeaseUntil  *time.Time `json:"leaseUntil,omitempty"`
	RetryAt     *time.Time `json:"retryAt,omitempty"`
	Owner       string     `json:"owner,omitempty"`
	PayloadHash string     `json:"payloadHash,omitempty"`
	Reason      string     `json:"reason,omitempty"`
}

// keyedJSON is the output of get, and of ls for each record.
type keyedJSON struct {
	Key string `json:"key"`
	recordJSON
}

// changeJSON is the output of release and forget: the record before and
// after the command; with -dry-run, dryRun true and no after.
type changeJSON struct {
	Key    string      `json:"key"`
	Before recordJSON  `json:"before"`
	After  *recordJSON `json:"after,omitempty"`
	DryRun bool        `json:"dryRun,omitempty"`
}

// gateJSON is an order key's gate in -json output: its head's record
// (left out when nothing waits) and the keys waiting behind it.
type gateJSON struct {
	Head    *keyedJSON `json:"head,omitempty"`
	Waiting []string   `json:"waiting"`
}

// orderJSON is the output of order.
type orderJSON struct {
	OrderKey string `json:"orderKey"`
	gateJSON
}

// orderChangeJSON is the output of order-release: the gate before and
// after; with -dry-run, dryRun true and no after.
type orderChangeJSON struct {
	OrderKey string    `json:"orderKey"`
	Before   gateJSON  `json:"before"`
	After    *gateJSON `json:"after,omitempty"`
	DryRun   bool      `json:"dryRun,omitempty"`
}

func (g orderGate) toJSON() gateJSON {
	out := gateJSON{Waiting: g.Waiting}
	if out.Waiting == nil {
		out.Waiting = []string{}
	}
	if g.Head != "" {
		out.Head = &keyedJSON{Key: g.Head, recordJSON: toJSON(g.head)}
	}
	return out
}

// writeGate is order's text output.
func writeGate(w io.Writer, orderKey string, g orderGate) error {
	if g.Head == "" {
		_, err := fmt.Fprintf(w, "%s: nothing waits (no message of the order key waits behind another)\n", showKey(orderKey))
		return err
	}
	is := summary(g.head)
	if g.head.State == inbox.StateNotFound {
		is = "no record (its message has not run since it waited, or its record was forgotten or expired)"
	}
	fmt.Fprintf(w, "order key  %s\nhead       %s\n  is:      %s\n", showKey(orderKey), showKey(g.Head), is)
	keys := "keys"
	if len(g.Waiting) == 1 {
		keys = "key"
	}
	fmt.Fprintf(w, "waiting    %d %s, in their order:\n", len(g.Waiting), keys)
	for _, k := range g.Waiting {
		fmt.Fprintf(w, "  %s\n", showKey(k))
	}
	if g.head.State == inbox.StateDead {
		_, err := fmt.Fprintf(w, "blocked: the head is dead; inboxctl order-release %s lets the next key run\n", showKey(orderKey))
		return err
	}
	return nil
}

// gateSummary is a gate on one line, for order-release.
func gateSummary(g orderGate) string {
	if g.Head == "" {
		return "nothing waits"
	}
	is := summary(g.head)
	if g.head.State == inbox.StateNotFound {
		is = "no record"
	}
	return fmt.Sprintf("head %s (%s), %d waiting", showKey(g.Head), is, len(g.Waiting))
}

func toJSON(r inbox.Record) recordJSON {
	t := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		u := t.UTC()
		return &u
	}
	return recordJSON{
		Status: r.State.String(), Attempts: r.Attempts,
		FirstSeen: t(r.FirstSeen), LastSeen: t(r.LastSeen), LeaseUntil: t(r.LeaseUntil), RetryAt: t(r.RetryAt),
		Owner: r.Owner, PayloadHash: r.PayloadHash, Reason: r.Reason,
	}
}

// writeJSON writes v as one line of JSON.
func (r *runner) writeJSON(v any) error {
	enc := json.NewEncoder(r.env.Stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// showKey returns key as is, or quoted when it holds characters that would
// make it ambiguous in text output (spaces at its ends, control or invisible
// characters, a leading quote).
func showKey(key string) string {
	if key != strings.TrimSpace(key) || strings.HasPrefix(key, `"`) {
		return strconv.Quote(key)
	}
	return showText(key)
}

// showText returns s as is, or quoted when it holds a character that is not
// printable (a line break, a tab, a control character).
func showText(s string) string {
	for _, c := range s {
		if !unicode.IsPrint(c) {
			return strconv.Quote(s)
		}
	}
	return s
}

func showTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeRecord is get's text output.
func writeRecord(w io.Writer, key string, r inbox.Record) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range [][2]string{
		{"key", showKey(key)},
		{"state", r.State.String()},
		{"attempts", strconv.Itoa(r.Attempts)},
		{"first seen", showTime(r.FirstSeen)},
		{"last seen", showTime(r.LastSeen)},
		{"lease until", showTime(r.LeaseUntil)},
		{"retry at", showTime(r.RetryAt)},
		{"owner", orDash(showText(r.Owner))},
		{"payload hash", orDash(showText(r.PayloadHash))},
		{"reason", orDash(showText(r.Reason))},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", f[0], f[1])
	}
	return tw.Flush()
}

// maxReason is the length at which ls's table cuts reasons.
const maxReason = 60

// writeTable is ls's text output.
func writeTable(w io.Writer, items []inbox.ListItem) error {
	if len(items) == 0 {
		_, err := fmt.Fprintln(w, "no records match")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tATTEMPTS\tLAST SEEN\tLEASE UNTIL\tRETRY AT\tOWNER\tREASON")
	for _, it := range items {
		reason := it.Reason
		if utf8.RuneCountInString(reason) > maxReason {
			reason = string([]rune(reason)[:maxReason-1]) + "…"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", showKey(it.Key), it.State, it.Attempts,
			showTime(it.LastSeen), showTime(it.LeaseUntil), showTime(it.RetryAt), orDash(showText(it.Owner)), orDash(showText(reason)))
	}
	return tw.Flush()
}

// summary is a record on one line, for release and forget.
func summary(r inbox.Record) string {
	if r.State == inbox.StateNotFound {
		return "NotFound"
	}
	parts := []string{r.State.String(), "attempts " + strconv.Itoa(r.Attempts)}
	add := func(name, v string) { parts = append(parts, name+" "+v) }
	if !r.LeaseUntil.IsZero() {
		add("lease until", showTime(r.LeaseUntil))
	}
	if !r.RetryAt.IsZero() {
		add("retry at", showTime(r.RetryAt))
	}
	if r.Owner != "" {
		add("owner", strconv.Quote(r.Owner))
	}
	if r.Reason != "" {
		add("reason", strconv.Quote(r.Reason))
	}
	add("last seen", showTime(r.LastSeen))
	return strings.Join(parts, ", ")
}
